//! The connection's two halves, plain or TLS: what the session reads requests from and
//! writes replies to. One type for both kinds, matched at each read and write, so that the
//! session's loop is compiled once: made generic, it was compiled twice, and the steps it
//! calls (dispatch, moving replies, recording them) were no longer inlined into it, which
//! cost 5% more instructions per request at -P1.

use std::io::IoSlice;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};

use crate::tls::ServerStream;

/// Where requests are read from.
pub(crate) enum ReadSide<'a> {
    Plain(tokio::net::tcp::ReadHalf<'a>),
    Tls(tokio::io::ReadHalf<ServerStream>),
}

impl AsyncRead for ReadSide<'_> {
    #[inline]
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            ReadSide::Plain(r) => Pin::new(r).poll_read(cx, buf),
            ReadSide::Tls(r) => Pin::new(r).poll_read(cx, buf),
        }
    }
}

impl ReadSide<'_> {
    /// After a read that found nothing (and left this task's waker with the socket): false
    /// while the socket has not been reported readable, closed or in error since, so
    /// that a read would find nothing again and the waker is still there. One load of the
    /// socket's readiness, against the read's 160 instructions or so. Always true for
    /// TLS, whose reads go through its own buffers.
    #[inline]
    pub(crate) fn may_have_news(&self) -> bool {
        match self {
            // (one interest at a time: tokio finds no readiness for a combined one)
            ReadSide::Plain(r) => {
                let ready = |i| r.as_ref().try_io(i, || Ok(())).is_ok();
                ready(Interest::READABLE) || ready(Interest::ERROR)
            }
            ReadSide::Tls(_) => true,
        }
    }
}

/// Where replies are written. Writes never wait: what the connection does not take now
/// stays in the session's output.
pub(crate) enum WriteSide<'a> {
    Plain(tokio::net::tcp::WriteHalf<'a>),
    Tls(tokio::io::WriteHalf<ServerStream>),
}

impl WriteSide<'_> {
    /// Writes what the connection takes now; `WouldBlock` when it takes nothing.
    #[inline(always)]
    pub(crate) fn try_write_vectored(&mut self, cx: &mut Context<'_>, bufs: &[IoSlice<'_>]) -> std::io::Result<usize> {
        match self {
            // (rustix's `send` makes the system call itself: glibc's, which std calls, is a
            // thread cancellation point, about 35 instructions more a call)
            WriteSide::Plain(w) if bufs.len() == 1 => w.as_ref().try_io(Interest::WRITABLE, || {
                rustix::net::send(w.as_ref(), &bufs[0], rustix::net::SendFlags::NOSIGNAL).map_err(Into::into)
            }),
            WriteSide::Plain(w) => w.try_write_vectored(bufs),
            WriteSide::Tls(w) => match Pin::new(w).poll_write_vectored(cx, bufs) {
                Poll::Ready(r) => r,
                Poll::Pending => Err(std::io::ErrorKind::WouldBlock.into()),
            },
        }
    }

    /// Ready once more can be written (TLS: once the records it holds have gone out).
    pub(crate) fn poll_writable(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self {
            WriteSide::Plain(w) => w.as_ref().poll_write_ready(cx),
            WriteSide::Tls(w) => Pin::new(w).poll_flush(cx),
        }
    }

    /// After writing: ready when nothing written is still held on heatshield's side (TLS
    /// records the socket did not take yet), else pending, with a wake-up for when the
    /// socket takes more.
    #[inline]
    pub(crate) fn poll_drained(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self {
            WriteSide::Plain(_) => Poll::Ready(Ok(())),
            WriteSide::Tls(w) => Pin::new(w).poll_flush(cx),
        }
    }
}
