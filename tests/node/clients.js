// Real Node.js client libraries through heatshield, at their defaults (tests/node_clients.rs
// runs this with the port of a heatshield in front of a real cluster): ioredis and
// node-redis transactions, pipelines, WATCH and blocking pops, and a bullmq worker that
// must pick up a job added after it drained its queue and blocked.
//
//   node tests/node/clients.js PORT
// Prints one line per check ("ok <name>") and exits non-zero on the first failure.

const assert = require('node:assert/strict');
const Redis = require('ioredis');
const { createClient } = require('redis');
const { Queue, Worker } = require('bullmq');

const port = Number(process.argv[2]);
const run = Math.random().toString(36).slice(2, 8);
const ok = (name) => console.log(`ok ${name}`);
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function ioredis() {
  const r = new Redis({ port, host: '127.0.0.1' });
  const t = `{io:${run}}`;
  // multi(): MULTI ... EXEC, keys in one slot
  const res = await r.multi().set(`${t}a`, '1').incr(`${t}a`).get(`${t}a`).exec();
  assert.deepEqual(res, [[null, 'OK'], [null, 2], [null, '2']]);
  ok('ioredis multi');
  // pipeline across slots (not a transaction)
  const p = await r.pipeline().set(`io:${run}:x`, 'x').set(`io:${run}:y`, 'y').mget(`io:${run}:x`, `io:${run}:y`).exec();
  assert.deepEqual(p[2], [null, ['x', 'y']]);
  ok('ioredis pipeline');
  // WATCH: a write by another client makes EXEC answer null
  const other = new Redis({ port, host: '127.0.0.1' });
  await r.set(`${t}stock`, '5');
  await r.watch(`${t}stock`);
  await other.set(`${t}stock`, '100');
  const aborted = await r.multi().decr(`${t}stock`).exec();
  assert.equal(aborted, null);
  await r.watch(`${t}stock`);
  const done = await r.multi().decr(`${t}stock`).exec();
  assert.deepEqual(done, [[null, 99]]);
  ok('ioredis watch');
  // BLPOP on its own connection, served by a later push
  const blocked = r.blpop(`${t}q`, 0);
  await sleep(200);
  await other.rpush(`${t}q`, 'job');
  assert.deepEqual(await blocked, [`${t}q`, 'job']);
  ok('ioredis blpop');
  r.disconnect();
  other.disconnect();
}

async function nodeRedis() {
  const c = createClient({ socket: { port, host: '127.0.0.1' } });
  c.on('error', () => {});
  await c.connect();
  const t = `{nr:${run}}`;
  const res = await c.multi().set(`${t}a`, '1').incr(`${t}a`).get(`${t}a`).exec();
  assert.deepEqual(res, ['OK', 2, '2']);
  ok('node-redis multi');
  // a blocking pop on a duplicate connection, as node-redis documents it
  const b = c.duplicate();
  b.on('error', () => {});
  await b.connect();
  const popped = b.blPop(`${t}q`, 0);
  await sleep(200);
  await c.rPush(`${t}q`, 'job');
  assert.deepEqual(await popped, { key: `${t}q`, element: 'job' });
  ok('node-redis blPop');
  // WATCH on an isolated connection
  const w = c.duplicate();
  w.on('error', () => {});
  await w.connect();
  await w.set(`${t}stock`, '5');
  await w.watch(`${t}stock`);
  await c.set(`${t}stock`, '100');
  let failed = false;
  try {
    await w.multi().decr(`${t}stock`).exec();
  } catch (e) {
    failed = e && (e.constructor.name === 'WatchError' || /watched keys/.test(e.message));
  }
  assert.ok(failed, 'EXEC after a conflicting write must fail with a WatchError');
  ok('node-redis watch');
  await Promise.all([c.quit(), b.quit(), w.quit()]);
}

// pub/sub as each library documents it: a subscriber connection, messages by event or
// listener, a publisher on another connection
async function ioredisPubsub() {
  const sub = new Redis({ port, host: '127.0.0.1' });
  const pub = new Redis({ port, host: '127.0.0.1' });
  const ch = `io-news:${run}`;
  const got = [];
  sub.on('message', (c, m) => got.push(['message', c, m]));
  sub.on('pmessage', (p, c, m) => got.push(['pmessage', p, c, m]));
  assert.equal(await sub.subscribe(ch), 1);
  assert.equal(await sub.psubscribe(`io-*:${run}`), 2);
  assert.equal(await pub.publish(ch, 'hello'), 2);
  for (let i = 0; i < 100 && got.length < 2; i++) await sleep(20);
  got.sort((a, b) => a[0].localeCompare(b[0]));
  assert.deepEqual(got, [['message', ch, 'hello'], ['pmessage', `io-*:${run}`, ch, 'hello']]);
  assert.equal(await sub.unsubscribe(ch), 1);
  assert.equal(await sub.punsubscribe(`io-*:${run}`), 0);
  // out of subscriber mode: an ordinary command again
  assert.equal(await sub.ping(), 'PONG');
  ok('ioredis pub/sub');
  sub.disconnect();
  pub.disconnect();
}

async function nodeRedisPubsub() {
  const c = createClient({ socket: { port, host: '127.0.0.1' } });
  c.on('error', () => {});
  await c.connect();
  const sub = c.duplicate();
  sub.on('error', () => {});
  await sub.connect();
  const got = [];
  const shards = [0, 1, 2].map((i) => `nr-shard${i}:${run}`);
  await sub.subscribe(`nr-news:${run}`, (m, ch) => got.push(`${ch}=${m}`));
  // sharded channels (most likely on different masters) on one connection
  for (const s of shards) await sub.sSubscribe(s, (m, ch) => got.push(`${ch}=${m}`));
  assert.equal(await c.publish(`nr-news:${run}`, 'a'), 1);
  for (const s of shards) assert.equal(await c.sPublish(s, 'b'), 1);
  for (let i = 0; i < 100 && got.length < 4; i++) await sleep(20);
  assert.deepEqual(got.sort(), [`nr-news:${run}=a`, ...shards.map((s) => `${s}=b`)].sort());
  await sub.unsubscribe();
  await sub.sUnsubscribe();
  ok('node-redis pub/sub');
  await Promise.all([c.quit(), sub.quit()]);
}

async function bullmq() {
  const connection = { host: '127.0.0.1', port, maxRetriesPerRequest: null };
  // a hash-tag prefix keeps a queue's keys in one slot, as bullmq documents for clusters
  const prefix = `{bull${run}}`;
  const queue = new Queue('jobs', { connection, prefix });
  const seen = [];
  const worker = new Worker('jobs', async (job) => { seen.push(job.data.n); return job.data.n * 2; }, { connection, prefix });
  await queue.add('early', { n: 1 });
  for (let i = 0; i < 100 && seen.length < 1; i++) await sleep(50);
  assert.deepEqual(seen, [1]);
  // the worker drained the queue and now waits in a blocking command: a job added later
  // must be picked up (through a proxy that refuses or mishandles blocking commands the
  // worker sleeps for ever here)
  await sleep(1500);
  await queue.add('late', { n: 2 });
  for (let i = 0; i < 100 && seen.length < 2; i++) await sleep(50);
  assert.deepEqual(seen, [1, 2]);
  ok('bullmq worker picks up a job added after it drained');
  await worker.close();
  await queue.obliterate({ force: true });
  await queue.close();
}

(async () => {
  try {
    await ioredis();
    await nodeRedis();
    await ioredisPubsub();
    await nodeRedisPubsub();
    await bullmq();
    process.exit(0);
  } catch (e) {
    console.log(`FAILED: ${e && e.stack ? e.stack : e}`);
    process.exit(1);
  }
})();
