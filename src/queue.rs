//! Queue: the unbounded many-to-one channel that carries requests from sessions to a
//! backend connection and replies back to sessions, drained a batch at a time.
//!
//! Why not tokio's `mpsc::unbounded_channel`: it is lock-free per message, which costs
//! four to five atomic operations for every send (message count, block index, slot ready
//! bits, the receiver's waker) and more on the receiving side (one `try_recv` per message,
//! each walking the block list). On heatshield's request path a message is one request or
//! one reply, so those atomics were about a tenth of the proxy's CPU at GET -P16
//! (docs/design/profile.md). Here a send is one uncontended lock, a push and an unlock, and the
//! receiver takes everything queued under one lock into a buffer of its own, so the
//! messages of a batch cost it no atomic operation at all; the receiver is woken once per
//! batch (by the first send after it last looked). `flume` has the
//! same lock-and-deque shape but allocates a hook each time its receiver waits.
//!
//! A receiver that looks and finds nothing new does not take the lock: a sender raises a
//! flag under the lock, and wakes the receiver when it was down, so with the flag down the
//! queue is as the receiver last left it, its waker in place (a session looks about three
//! times a request at -P1 and finds nothing). The waker stays in the queue once woken, so a
//! receiver that took a batch need not lock again to wait for the next.

use std::collections::VecDeque;
use std::future::poll_fn;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::task::{Context, Poll, Waker};

use parking_lot::{Mutex, MutexGuard};

/// A new queue.
pub fn channel<T>() -> (Sender<T>, Receiver<T>) {
    let shared = Arc::new(Shared {
        state: Mutex::new(State { items: VecDeque::new(), waker: None, rx_closed: false, tx_gone: false }),
        senders: AtomicUsize::new(1),
        news: AtomicBool::new(false),
    });
    (Sender { shared: shared.clone() }, Receiver { shared, local: VecDeque::new(), registered: None })
}

struct Shared<T> {
    state: Mutex<State<T>>,
    /// Live [`Sender`]s (clones count; the receiver learns of the last one's drop).
    senders: AtomicUsize,
    /// Raised (under the state's lock) whenever a sender queues a message or the last
    /// one leaves; lowered by the receiver under the lock when it has looked.
    news: AtomicBool,
}

impl<T> Shared<T> {
    /// Raises the news (under the lock, `s`): the waker to wake when it was down. Later news
    /// finds the receiver woken already.
    #[inline]
    fn raise(&self, s: &State<T>) -> Option<Waker> {
        if self.news.load(Ordering::Relaxed) {
            return None;
        }
        self.news.store(true, Ordering::Release);
        s.waker.clone()
    }
}

struct State<T> {
    items: VecDeque<T>,
    /// The receiver's task, once it waited for a message (kept when woken).
    waker: Option<Waker>,
    /// The receiver is gone or closed: sends fail.
    rx_closed: bool,
    /// Every sender is gone: once empty, the receiver gets `None`.
    tx_gone: bool,
}

/// The sending side; clones share the queue.
pub struct Sender<T> {
    shared: Arc<Shared<T>>,
}

impl<T> Sender<T> {
    /// Queues `v`, waking the receiver if it waits. `Err(v)` when the receiver is gone.
    #[inline]
    pub fn send(&self, v: T) -> Result<(), T> {
        let waker = {
            let mut s = self.shared.state.lock();
            if s.rx_closed {
                return Err(v);
            }
            s.items.push_back(v);
            self.shared.raise(&s)
        };
        if let Some(w) = waker {
            w.wake();
        }
        Ok(())
    }

    /// Queues every message of `items`, in order, under one lock, waking the receiver
    /// once; `items` is left empty (its memory kept for the next batch). When the receiver
    /// is gone they are dropped (as [`Sender::send`]'s `Err` would be) and this returns
    /// false. A deque, so that the messages move over as one or two block copies.
    pub fn send_all(&self, items: &mut VecDeque<T>) -> bool {
        if items.is_empty() {
            return true;
        }
        let waker = {
            let mut s = self.shared.state.lock();
            if s.rx_closed {
                drop(s);
                items.clear();
                return false;
            }
            if items.len() <= 2 {
                // (one or two: moved one by one, cheaper than a block copy's call)
                while let Some(v) = items.pop_front() {
                    s.items.push_back(v);
                }
            } else {
                s.items.append(items);
            }
            self.shared.raise(&s)
        };
        if let Some(w) = waker {
            w.wake();
        }
        true
    }

    /// The receiver is gone (or closed): nothing sent now would be read.
    pub fn is_closed(&self) -> bool {
        self.shared.state.lock().rx_closed
    }
}

impl<T> Clone for Sender<T> {
    fn clone(&self) -> Self {
        self.shared.senders.fetch_add(1, Ordering::Relaxed);
        Sender { shared: self.shared.clone() }
    }
}

impl<T> Drop for Sender<T> {
    fn drop(&mut self) {
        if self.shared.senders.fetch_sub(1, Ordering::AcqRel) == 1 {
            let waker = {
                let mut s = self.shared.state.lock();
                s.tx_gone = true;
                self.shared.news.store(true, Ordering::Release);
                s.waker.take()
            };
            if let Some(w) = waker {
                w.wake();
            }
        }
    }
}

impl<T> std::fmt::Debug for Sender<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sender").finish_non_exhaustive()
    }
}

/// The receiving side.
pub struct Receiver<T> {
    shared: Arc<Shared<T>>,
    /// Messages taken from the queue in one go, handed out without the lock.
    local: VecDeque<T>,
    /// The waker left in the queue at the last look (its data and vtable addresses, as
    /// `Waker::will_wake` compares them), while no news came.
    registered: Option<(usize, usize)>,
}

/// A waker's identity, as `Waker::will_wake` compares it.
#[inline]
fn identity(w: &Waker) -> (usize, usize) {
    (w.data() as usize, w.vtable() as *const _ as usize)
}

impl<T> Receiver<T> {
    /// The next message if one is queued now.
    #[inline]
    pub fn try_recv(&mut self) -> Option<T> {
        if let Some(v) = self.local.pop_front() {
            return Some(v);
        }
        if !self.shared.news.load(Ordering::Acquire) {
            return None;
        }
        let mut s = Self::looked(&self.shared, &mut self.registered);
        if refill(&mut self.local, &mut s) { self.local.pop_front() } else { None }
    }

    /// The state, locked, with the news taken in: until a sender raises the flag again,
    /// the queue holds nothing the receiver has not seen, and its waker is `registered`.
    #[inline]
    fn looked<'a>(shared: &'a Shared<T>, registered: &mut Option<(usize, usize)>) -> MutexGuard<'a, State<T>> {
        let s = shared.state.lock();
        shared.news.store(false, Ordering::Relaxed);
        *registered = s.waker.as_ref().map(identity);
        s
    }

    /// The next message; `None` once every sender is gone and the queue is empty.
    #[inline]
    pub fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Option<T>> {
        if let Some(v) = self.local.pop_front() {
            return Poll::Ready(Some(v));
        }
        // (nothing new, and this task's waker is the one waiting in the queue)
        if !self.shared.news.load(Ordering::Acquire) && self.registered == Some(identity(cx.waker())) {
            return Poll::Pending;
        }
        self.poll_queue(cx)
    }

    /// [`Receiver::poll_recv`] when there may be news: a look under the lock.
    #[inline(never)]
    fn poll_queue(&mut self, cx: &mut Context<'_>) -> Poll<Option<T>> {
        let mut s = Self::looked(&self.shared, &mut self.registered);
        if refill(&mut self.local, &mut s) {
            return Poll::Ready(self.local.pop_front());
        }
        if s.tx_gone {
            return Poll::Ready(None);
        }
        if !s.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
            s.waker = Some(cx.waker().clone());
        }
        drop(s);
        self.registered = Some(identity(cx.waker()));
        Poll::Pending
    }

    /// Waits for the next message; `None` once every sender is gone and the queue is
    /// empty. Cancel-safe: a message is only taken when this returns it.
    pub async fn recv(&mut self) -> Option<T> {
        poll_fn(|cx| self.poll_recv(cx)).await
    }

    /// Every sender is gone.
    pub fn is_closed(&self) -> bool {
        self.shared.state.lock().tx_gone
    }

    /// Messages queued and not yet taken.
    pub fn len(&self) -> usize {
        self.local.len() + self.shared.state.lock().items.len()
    }

    /// Nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Refuses further sends and returns what was queued, oldest first, so the caller can
    /// answer it.
    pub fn close(&mut self) -> Vec<T> {
        let mut rest: Vec<T> = self.local.drain(..).collect();
        let mut s = self.shared.state.lock();
        s.rx_closed = true;
        rest.extend(s.items.drain(..));
        rest
    }
}

/// A buffer that grew past this many messages (a burst) is not kept once empty.
const KEEP: usize = 1024;

/// Moves everything queued to `local` (empty). False when nothing was queued.
#[inline]
fn refill<T>(local: &mut VecDeque<T>, s: &mut State<T>) -> bool {
    if s.items.is_empty() {
        return false;
    }
    // the two buffers trade places, so both keep their capacity, unless a burst made the
    // one that goes back empty large: an idle connection does not hold on to it
    std::mem::swap(local, &mut s.items);
    if s.items.capacity() > KEEP {
        s.items = VecDeque::new();
    }
    true
}

impl<T> Drop for Receiver<T> {
    fn drop(&mut self) {
        // the messages are dropped outside the lock (a message may hold a sender)
        let items = {
            let mut s = self.shared.state.lock();
            s.rx_closed = true;
            s.waker = None;
            std::mem::take(&mut s.items)
        };
        drop(items);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn messages_arrive_in_order_and_end_with_the_last_sender() {
        let (tx, mut rx) = channel::<u32>();
        let tx2 = tx.clone();
        let a = tokio::spawn(async move {
            for i in 0..1000 {
                tx.send(i).unwrap();
                if i % 7 == 0 {
                    tokio::task::yield_now().await;
                }
            }
        });
        let b = tokio::spawn(async move {
            for i in 1000..2000 {
                tx2.send(i).unwrap();
                if i % 5 == 0 {
                    tokio::task::yield_now().await;
                }
            }
        });
        let mut seen = Vec::new();
        while let Some(v) = rx.recv().await {
            seen.push(v);
        }
        a.await.unwrap();
        b.await.unwrap();
        // each sender's messages in its order, all of them, then None
        let first: Vec<u32> = seen.iter().copied().filter(|v| *v < 1000).collect();
        let second: Vec<u32> = seen.iter().copied().filter(|v| *v >= 1000).collect();
        assert_eq!(first, (0..1000).collect::<Vec<_>>());
        assert_eq!(second, (1000..2000).collect::<Vec<_>>());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_waiting_receiver_is_woken_from_another_thread() {
        let (tx, mut rx) = channel::<u64>();
        let t = std::thread::spawn(move || {
            for i in 0..20_000u64 {
                tx.send(i).unwrap();
            }
        });
        let mut sum = 0u64;
        let mut n = 0;
        while let Some(v) = rx.recv().await {
            sum += v;
            n += 1;
        }
        t.join().unwrap();
        assert_eq!(n, 20_000);
        assert_eq!(sum, 20_000 * 19_999 / 2);
    }

    #[test]
    fn sends_fail_once_the_receiver_is_closed_and_close_returns_the_queued() {
        let (tx, mut rx) = channel::<u8>();
        tx.send(1).unwrap();
        tx.send(2).unwrap();
        assert_eq!(rx.try_recv(), Some(1));
        tx.send(3).unwrap();
        assert!(!tx.is_closed());
        assert_eq!(rx.close(), vec![2, 3]);
        assert!(tx.is_closed());
        assert_eq!(tx.send(4), Err(4));
        drop(rx);
        assert_eq!(tx.send(5), Err(5));
    }

    #[test]
    fn send_all_queues_in_order_behind_single_sends_and_fails_once_closed() {
        let (tx, mut rx) = channel::<u32>();
        tx.send(1).unwrap();
        let mut more = VecDeque::from([2, 3, 4]);
        assert!(tx.send_all(&mut more));
        assert!(more.is_empty());
        tx.send(5).unwrap();
        let got: Vec<u32> = std::iter::from_fn(|| rx.try_recv()).collect();
        assert_eq!(got, [1, 2, 3, 4, 5]);
        let _ = rx.close();
        let mut late = VecDeque::from([6, 7]);
        assert!(!tx.send_all(&mut late));
        assert!(late.is_empty());
    }

    #[test]
    fn len_counts_what_is_queued_and_what_was_taken_but_not_handed_out() {
        let (tx, mut rx) = channel::<u8>();
        assert!(rx.is_empty());
        for i in 0..3 {
            tx.send(i).unwrap();
        }
        assert_eq!(rx.len(), 3);
        // the first try_recv moves all three to the receiver's own buffer
        assert_eq!(rx.try_recv(), Some(0));
        tx.send(3).unwrap();
        assert_eq!(rx.len(), 3);
        let got: Vec<u8> = std::iter::from_fn(|| rx.try_recv()).collect();
        assert_eq!(got, [1, 2, 3]);
        assert!(rx.is_empty());
    }

    #[tokio::test]
    async fn send_all_wakes_a_waiting_receiver() {
        let (tx, mut rx) = channel::<u32>();
        let r = tokio::spawn(async move { (rx.recv().await, rx.try_recv(), rx.try_recv()) });
        tokio::task::yield_now().await;
        assert!(tx.send_all(&mut VecDeque::from([8, 9])));
        assert_eq!(r.await.unwrap(), (Some(8), Some(9), None));
    }

    #[test]
    fn the_receiver_sees_every_sender_gone() {
        let (tx, mut rx) = channel::<u8>();
        let tx2 = tx.clone();
        drop(tx);
        assert!(!rx.is_closed());
        tx2.send(9).unwrap();
        drop(tx2);
        assert!(rx.is_closed());
        assert_eq!(rx.try_recv(), Some(9));
        assert_eq!(rx.try_recv(), None);
    }

    /// A waker that counts its wake-ups.
    struct Count(AtomicUsize);

    impl Count {
        /// A waker, and what counts its wake-ups.
        fn waker() -> (Arc<Count>, Waker) {
            let count = Arc::new(Count(AtomicUsize::new(0)));
            (count.clone(), Waker::from(count))
        }
    }

    impl std::task::Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn a_receiver_that_looks_again_without_news_stays_registered_and_is_woken() {
        let (tx, mut rx) = channel::<u8>();
        let (count, waker) = Count::waker();
        let mut cx = Context::from_waker(&waker);
        let woken = || count.0.load(Ordering::SeqCst);
        assert!(rx.poll_recv(&mut cx).is_pending());
        // looked again with nothing new: the waker stays in place
        assert!(rx.poll_recv(&mut cx).is_pending());
        assert!(rx.poll_recv(&mut cx).is_pending());
        tx.send(1).unwrap();
        assert_eq!(woken(), 1);
        // the message is taken by try_recv: the next look must still find this task's
        // waker in the queue (or put it back), or the next message would wake nobody
        assert_eq!(rx.try_recv(), Some(1));
        assert_eq!(rx.try_recv(), None);
        assert!(rx.poll_recv(&mut cx).is_pending());
        tx.send(2).unwrap();
        assert_eq!(woken(), 2);
        // another task's waker: registered in place of the first
        let (other, other_waker) = Count::waker();
        assert_eq!(rx.poll_recv(&mut cx), Poll::Ready(Some(2)));
        assert!(rx.poll_recv(&mut Context::from_waker(&other_waker)).is_pending());
        tx.send(3).unwrap();
        assert_eq!((woken(), other.0.load(Ordering::SeqCst)), (2, 1));
        // the last sender gone: the receiver sees the end without a new message
        assert_eq!(rx.poll_recv(&mut cx), Poll::Ready(Some(3)));
        assert!(rx.poll_recv(&mut cx).is_pending());
        drop(tx);
        assert_eq!(woken(), 3);
        assert_eq!(rx.poll_recv(&mut cx), Poll::Ready(None));
    }

    #[test]
    fn a_batch_wakes_the_receiver_once_and_the_next_batch_again() {
        let (tx, mut rx) = channel::<u8>();
        let (count, waker) = Count::waker();
        let mut cx = Context::from_waker(&waker);
        assert!(rx.poll_recv(&mut cx).is_pending());
        for i in 0..3 {
            tx.send(i).unwrap();
        }
        assert!(tx.send_all(&mut VecDeque::from([3, 4])));
        assert_eq!(count.0.load(Ordering::SeqCst), 1);
        for i in 0..5 {
            assert_eq!(rx.poll_recv(&mut cx), Poll::Ready(Some(i)));
        }
        assert!(rx.poll_recv(&mut cx).is_pending());
        assert!(tx.send_all(&mut VecDeque::from([5, 6, 7])));
        tx.send(8).unwrap();
        assert_eq!(count.0.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn a_burst_does_not_stay_allocated() {
        let (tx, mut rx) = channel::<u64>();
        for i in 0..100_000 {
            tx.send(i).unwrap();
        }
        let mut n = 0;
        while rx.try_recv().is_some() {
            n += 1;
        }
        assert_eq!(n, 100_000);
        // the next messages: the burst's buffer goes back to the queue empty and is let go
        tx.send(1).unwrap();
        assert_eq!(rx.try_recv(), Some(1));
        tx.send(2).unwrap();
        assert_eq!(rx.try_recv(), Some(2));
        let queued = rx.shared.state.lock().items.capacity();
        assert!(queued <= KEEP && rx.local.capacity() <= KEEP, "{queued} {}", rx.local.capacity());
    }
}
