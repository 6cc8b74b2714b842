"""Processes of the fault harness: free loopback ports, Redis/Valkey cluster nodes and
the cluster they form (create, wait healthy, kill -9, restart as replica, SIGSTOP,
manual failover, slot migration with MIGRATE or Valkey's CLUSTER MIGRATESLOTS), and
heatshield instances (config file, start, SIGKILL + restart, --takeover, SIGHUP).

Everything lives in one work directory; `Registry.cleanup()` kills every process this
module started (by pid, never by name)."""

import os
import random
import shutil
import signal
import socket
import subprocess
import time

import redis

LOCAL = "127.0.0.1"
FORBIDDEN = {6379, 6380} | set(range(7000, 7011)) | set(range(30001, 30011))


def _port_free(p):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.bind((LOCAL, p))
        return True
    except OSError:
        return False
    finally:
        s.close()


_taken = set()
# the range free_port draws from: run.py's --ports narrows it, so that two harness runs
# at once (the suite's tests/faults.rs runs two) never draw the same port
PORTS = [20000, 29999]


def free_port(rng=random, bus=True):
    """A free port in PORTS (20000-29999 unless narrowed; and its bus port +10000 when
    `bus`), never one of the reserved ones, never handed out twice by this process."""
    lo, hi = PORTS
    for _ in range(5000):
        p = rng.randint(lo, hi)
        if p in _taken or p in FORBIDDEN or (bus and (p + 10000) in FORBIDDEN):
            continue
        if _port_free(p) and (not bus or _port_free(p + 10000)):
            _taken.add(p)
            return p
    raise RuntimeError(f"no free port in {lo}-{hi}")


def conn(port, timeout=2.0):
    return redis.Redis(host=LOCAL, port=port, socket_timeout=timeout, socket_connect_timeout=timeout,
                       decode_responses=True, retry=None, protocol=2)


def try_cmd(port, *args, timeout=2.0):
    c = conn(port, timeout)
    try:
        return c.execute_command(*args)
    except Exception as e:  # noqa: BLE001 - any failure is reported as such
        return e
    finally:
        c.close()


class Registry:
    """Every child process started, so that exit can kill them all by pid."""

    def __init__(self, workdir):
        self.workdir = workdir
        self.procs = []

    def spawn(self, argv, log_path, env=None):
        log = open(log_path, "ab")
        p = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             env=env, start_new_session=True)
        log.close()
        self.procs.append(p)
        return p

    def cleanup(self):
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.kill(p.pid, signal.SIGCONT)
                    os.kill(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for p in self.procs:
            try:
                p.wait(timeout=5)
            except Exception:  # noqa: BLE001
                pass


NODE_CONFIG = [
    "bind 127.0.0.1", "protected-mode no", "daemonize no", 'save ""', "appendonly no",
    "loglevel notice", "repl-diskless-sync yes", "repl-diskless-sync-delay 0",
    "cluster-enabled yes", "cluster-config-file nodes.conf", "cluster-node-timeout 2000",
    "cluster-replica-validity-factor 0", "cluster-require-full-coverage yes",
]


class Node:
    def __init__(self, reg, binary, port, workdir):
        self.reg, self.binary, self.port = reg, binary, port
        self.dir = os.path.join(workdir, f"node-{port}")
        os.makedirs(self.dir, exist_ok=True)
        with open(os.path.join(self.dir, "redis.conf"), "w") as f:
            f.write("\n".join(NODE_CONFIG + [f"port {port}", f"dir {self.dir}"]) + "\n")
        self.proc = None
        self.start()

    @property
    def addr(self):
        return f"{LOCAL}:{self.port}"

    def start(self):
        self.proc = self.reg.spawn([self.binary, os.path.join(self.dir, "redis.conf")],
                                   os.path.join(self.dir, "log.txt"))
        deadline = time.time() + 10
        while time.time() < deadline:
            if try_cmd(self.port, "PING", timeout=0.5) is True:
                return
            if self.proc.poll() is not None:
                raise RuntimeError(f"node {self.port} exited: see {self.dir}/log.txt")
            time.sleep(0.05)
        raise RuntimeError(f"node {self.port} did not answer")

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def kill9(self):
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def stop_cont(self, seconds):
        os.kill(self.proc.pid, signal.SIGSTOP)
        time.sleep(seconds)
        os.kill(self.proc.pid, signal.SIGCONT)

    def cmd(self, *args, timeout=2.0):
        return try_cmd(self.port, *args, timeout=timeout)

    def info(self, section):
        r = self.cmd("INFO", section)
        return r if isinstance(r, dict) else {}

    def cluster_info(self):
        r = self.cmd("CLUSTER", "INFO")
        if isinstance(r, dict):
            return r
        if isinstance(r, str):
            return dict(line.split(":", 1) for line in r.splitlines() if ":" in line)
        return {}

    def node_id(self):
        return self.cmd("CLUSTER", "MYID")


class Cluster:
    """3 masters + 3 replicas of `binary` on free ports."""

    def __init__(self, reg, binary, workdir, rng, name="redis"):
        self.reg, self.binary, self.rng, self.name = reg, binary, rng, name
        self.nodes = [Node(reg, binary, free_port(rng), os.path.join(workdir, name)) for _ in range(6)]
        cli = os.environ.get("REDIS_CLI", "redis-cli")
        out = subprocess.run([cli, "--cluster", "create", *[n.addr for n in self.nodes],
                              "--cluster-replicas", "1", "--cluster-yes"],
                             capture_output=True, text=True, timeout=60)
        if out.returncode != 0:
            raise RuntimeError(f"cluster create failed: {out.stdout}\n{out.stderr}")
        self.wait_healthy(60)

    def seeds(self):
        return [n.addr for n in self.nodes]

    def by_port(self, port):
        return next(n for n in self.nodes if n.port == port)

    def masters(self):
        return [n for n in self.nodes if n.alive() and n.info("replication").get("role") == "master"
                and self._owns_slots(n)]

    def _owns_slots(self, n):
        r = n.cmd("CLUSTER", "SLOTS")
        if not isinstance(r, list):
            return False
        return any(int(row[2][1]) == n.port for row in r)

    def slot_owner(self, slot):
        """The port of the master of `slot`, as the first live node says."""
        for n in self.nodes:
            if not n.alive():
                continue
            r = n.cmd("CLUSTER", "SLOTS")
            if isinstance(r, list):
                for row in r:
                    if int(row[0]) <= slot <= int(row[1]):
                        return int(row[2][1])
        return None

    def replicas_of(self, master):
        mid = master.node_id()
        out = []
        for n in self.nodes:
            if n is master or not n.alive():
                continue
            inf = n.info("replication")
            if inf.get("role") == "slave" and int(inf.get("master_port", 0)) == master.port:
                out.append(n)
        return out

    def healthy(self):
        """'' when every node is up, says cluster_state:ok, all agree on the slot map,
        each master has a replica with its link up and at the master's offset."""
        views = set()
        for n in self.nodes:
            if not n.alive():
                return f"node {n.port} down"
            ci = n.cluster_info()
            if ci.get("cluster_state") != "ok":
                return f"node {n.port} cluster_state {ci.get('cluster_state')}"
            r = n.cmd("CLUSTER", "SLOTS")
            if not isinstance(r, list):
                return f"node {n.port} CLUSTER SLOTS {r}"
            views.add(tuple(sorted((int(a[0]), int(a[1]), int(a[2][1])) for a in r)))
        if len(views) != 1:
            return "nodes disagree on the slot map"
        masters = {m for (_, _, m) in next(iter(views))}
        if len(masters) != 3:
            return f"{len(masters)} masters own slots"
        for mp in masters:
            m = self.by_port(mp)
            minf = m.info("replication")
            if minf.get("role") != "master":
                return f"{mp} owns slots but is {minf.get('role')}"
            reps = self.replicas_of(m)
            if not reps:
                return f"master {mp} has no replica"
            off = int(minf.get("master_repl_offset", 0))
            for rp in reps:
                ri = rp.info("replication")
                if ri.get("master_link_status") != "up" or int(ri.get("slave_repl_offset", -1)) < off:
                    return f"replica {rp.port} of {mp} not in sync"
        return ""

    def wait_healthy(self, timeout):
        deadline = time.time() + timeout
        why = ""
        while time.time() < deadline:
            why = self.healthy()
            if not why:
                return
            time.sleep(0.1)
        raise RuntimeError(f"{self.name} cluster not healthy after {timeout}s: {why}")

    def heal(self, timeout=40):
        """Restarts dead nodes (they rejoin as replicas) and waits until healthy; a master
        left without replica after failovers gets one by CLUSTER REPLICATE."""
        for n in self.nodes:
            if not n.alive():
                n.start()
        deadline = time.time() + timeout
        while time.time() < deadline:
            why = self.healthy()
            if not why:
                return
            if "has no replica" in why and time.time() > deadline - timeout + 8:
                self._rebalance_replicas()
            time.sleep(0.2)
        raise RuntimeError(f"{self.name} cluster did not heal: {self.healthy()}")

    def _rebalance_replicas(self):
        masters = self.masters()
        lonely = [m for m in masters if not self.replicas_of(m)]
        for m in lonely:
            for other in masters:
                reps = self.replicas_of(other)
                if len(reps) > 1:
                    reps[-1].cmd("CLUSTER", "REPLICATE", m.node_id())
                    break


def slot_of(key):
    from redis.crc import key_slot
    return key_slot(key.encode() if isinstance(key, str) else key)


def migrate_slots(cluster, slots, dst, log, pace=0.02):
    """Moves `slots` to master `dst` the classic way: SETSLOT IMPORTING / MIGRATING,
    MIGRATE of the keys in batches, SETSLOT NODE on every master. Returns a text."""
    did = dst.node_id()
    done = []
    for s in slots:
        src = cluster.by_port(cluster.slot_owner(s))
        if src is dst:
            continue
        sid = src.node_id()
        log(f"migrate slot {s} {src.port} -> {dst.port}")
        r1 = dst.cmd("CLUSTER", "SETSLOT", s, "IMPORTING", sid)
        r2 = src.cmd("CLUSTER", "SETSLOT", s, "MIGRATING", did)
        if isinstance(r1, Exception) or isinstance(r2, Exception):
            raise RuntimeError(f"SETSLOT failed: {r1} {r2}")
        moved = 0
        while True:
            keys = src.cmd("CLUSTER", "GETKEYSINSLOT", s, 20)
            if isinstance(keys, Exception):
                raise RuntimeError(f"GETKEYSINSLOT: {keys}")
            if not keys:
                break
            r = src.cmd("MIGRATE", LOCAL, dst.port, "", 0, 5000, "KEYS", *keys, timeout=10)
            if isinstance(r, Exception):
                raise RuntimeError(f"MIGRATE: {r}")
            moved += len(keys)
            time.sleep(pace)
        for n in [dst, src] + [m for m in cluster.masters() if m not in (dst, src)]:
            n.cmd("CLUSTER", "SETSLOT", s, "NODE", did)
        done.append(f"{s}({moved} keys)")
    return "slots " + ",".join(done) + f" to {dst.port}"


def migrateslots_atomic(cluster, slots, dst, log, timeout=30):
    """Valkey 9's atomic slot migration: CLUSTER MIGRATESLOTS SLOTSRANGE a b NODE id on
    the source, then wait until the slots are the destination's."""
    did = dst.node_id()
    out = []
    for s in slots:
        src = cluster.by_port(cluster.slot_owner(s))
        if src is dst:
            continue
        log(f"MIGRATESLOTS {s} {src.port} -> {dst.port}")
        r = src.cmd("CLUSTER", "MIGRATESLOTS", "SLOTSRANGE", s, s, "NODE", did)
        if isinstance(r, Exception):
            raise RuntimeError(f"MIGRATESLOTS: {r}")
        deadline = time.time() + timeout
        while cluster.slot_owner(s) != dst.port:
            if time.time() > deadline:
                raise RuntimeError(f"slot {s} did not move to {dst.port}")
            time.sleep(0.05)
        out.append(str(s))
    return "atomic slots " + ",".join(out) + f" to {dst.port}"


class Heatshield:
    """One heatshield process with its own config file, listen port, metrics port and
    handoff socket."""

    def __init__(self, reg, binary, workdir, name, seeds, extra_toml, rng, backend_extra=""):
        self.reg, self.binary, self.name = reg, binary, name
        self.dir = os.path.join(workdir, f"hs-{name}")
        os.makedirs(self.dir, exist_ok=True)
        self.port = free_port(rng, bus=False)
        self.metrics = free_port(rng, bus=False)
        self.conf = os.path.join(self.dir, "heatshield.toml")
        seeds_t = ", ".join(f'"{s}"' for s in seeds)
        self.toml = (f'[server]\nlisten = "{LOCAL}:{self.port}"\nthreads = 1\n'
                     f'handoff_socket = "{self.dir}/handoff.sock"\nshutdown_timeout_ms = 2000\n'
                     f'[backend]\nmode = "cluster"\nseeds = [{seeds_t}]\n{backend_extra}'
                     f'[metrics]\nlisten = "{LOCAL}:{self.metrics}"\n' + extra_toml)
        with open(self.conf, "w") as f:
            f.write(self.toml)
        self.proc = None
        self.generation = 0
        self.start()

    def _spawn(self, takeover=False):
        self.generation += 1
        argv = [self.binary, "--config", self.conf] + (["--takeover"] if takeover else [])
        env = dict(os.environ)
        env.setdefault("RUST_LOG", "info")
        return self.reg.spawn(argv, os.path.join(self.dir, f"log-{self.generation}.txt"), env=env)

    def _wait_ready(self, proc, timeout=20):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"heatshield {self.name} exited {proc.returncode}: see {self.dir}")
            if try_cmd(self.port, "PING", timeout=0.5) is True:
                return
            time.sleep(0.05)
        raise RuntimeError(f"heatshield {self.name} not answering after {timeout}s")

    def start(self):
        self.proc = self._spawn()
        self._wait_ready(self.proc)

    def kill9_restart(self):
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        self.start()

    def takeover(self):
        old = self.proc
        new = self._spawn(takeover=True)
        deadline = time.time() + 20
        while old.poll() is None and time.time() < deadline:
            if new.poll() is not None:
                raise RuntimeError(f"takeover process exited {new.returncode}: see {self.dir}")
            time.sleep(0.05)
        if old.poll() is None:
            raise RuntimeError("old heatshield did not drain within 20 s after --takeover")
        self.proc = new
        self._wait_ready(new)
        return f"old exited {old.returncode}"

    def sighup(self):
        os.kill(self.proc.pid, signal.SIGHUP)

    def stop(self):
        if self.proc and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def rmtree(path):
    shutil.rmtree(path, ignore_errors=True)
