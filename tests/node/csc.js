// node-redis's client-side cache (`clientSideCache`, RESP3, CLIENT TRACKING ON) through
// heatshield, run by tests/tracking.rs. Argument: the proxy's port, then key=masterPort
// pairs (one key per master). For each key, in rounds:
// - the cached client writes, then reads twice (the second read from its cache): it must
//   read back what it wrote, never an older value (the invariant);
// - another client writes through heatshield, then a client connected to the key's
//   master directly: the cached client must come to read the new value (its cache was
//   invalidated), and the delay until it does is measured.
// Prints one line: `ok rounds=N own_stale=0 hits=H worst_proxy_ms=.. worst_direct_ms=..`.
const { createClient } = require('redis');

const port = Number(process.argv[2]);
const pairs = process.argv.slice(3).map((p) => { const [k, m] = p.split('='); return [k, Number(m)]; });
const ROUNDS = 40;

(async () => {
  const csc = createClient({ socket: { port, host: '127.0.0.1' }, RESP: 3, clientSideCache: { ttl: 0, maxEntries: 0 } });
  csc.on('error', () => {});
  await csc.connect();
  const w = createClient({ socket: { port, host: '127.0.0.1' } });
  w.on('error', () => {});
  await w.connect();
  const direct = {};
  for (const [, m] of pairs) {
    if (!direct[m]) {
      direct[m] = createClient({ socket: { port: m, host: '127.0.0.1' } });
      direct[m].on('error', () => {});
      await direct[m].connect();
    }
  }
  let ownStale = 0;
  let worstProxy = 0;
  let worstDirect = 0;
  // reads until the cached client sees `want`; returns the milliseconds it took
  const until = async (k, want) => {
    const t0 = process.hrtime.bigint();
    for (let i = 0; i < 20000; i++) {
      if ((await csc.get(k)) === want) return Number(process.hrtime.bigint() - t0) / 1e6;
      await new Promise((r) => setImmediate(r));
    }
    throw new Error(`never read ${want} for ${k}`);
  };
  for (let round = 0; round < ROUNDS; round++) {
    for (const [k, m] of pairs) {
      await csc.set(k, `own${round}`);
      if ((await csc.get(k)) !== `own${round}`) ownStale++;
      if ((await csc.get(k)) !== `own${round}`) ownStale++;
      await w.set(k, `proxy${round}`);
      worstProxy = Math.max(worstProxy, await until(k, `proxy${round}`));
      await csc.get(k); // cached again
      await direct[m].set(k, `direct${round}`);
      worstDirect = Math.max(worstDirect, await until(k, `direct${round}`));
    }
  }
  const hits = csc.clientSideCache.stats().hitCount;
  console.log(`ok rounds=${ROUNDS} own_stale=${ownStale} hits=${hits} worst_proxy_ms=${worstProxy.toFixed(2)} worst_direct_ms=${worstDirect.toFixed(2)}`);
  await Promise.all([csc.quit(), w.quit(), ...Object.values(direct).map((d) => d.quit())]);
  process.exit(0);
})().catch((e) => {
  console.log(`FAILED: ${e && e.stack ? e.stack : e}`);
  process.exit(1);
});
