"""The faults, each a function run while the workloads run. Each takes an Env (the
cluster, the heatshields, the workloads, the seeded random source) and returns a record:
what was done, when (start and end on the workloads' clock), which master it hit and
the slots that master owned, and whether a failover followed (a master killed or
stopped may lose writes it acknowledged but had not replicated yet)."""

import socket
import time

import procs
from workloads import now

# faults against the Redis cluster, against heatshield, against one client
FAULTS = ["kill-master", "kill-master-stale", "failover", "migrate", "sigstop",
          "hs-kill", "takeover", "sighup", "conn-cut", "asm"]
# faults where the Redis side itself can lose acknowledged writes
LOSSY = {"kill-master", "kill-master-stale", "sigstop"}


def _slots_of(cluster, port):
    out = set()
    for n in cluster.nodes:
        if not n.alive():
            continue
        r = n.cmd("CLUSTER", "SLOTS")
        if isinstance(r, list):
            for row in r:
                if int(row[2][1]) == port:
                    out.update(range(int(row[0]), int(row[1]) + 1))
            return out
    return out


FLEET_SLOT = procs.slot_of("{heatshield:faults}")


def _fleet_note(slots):
    return " (it owned the fleet's slot, {heatshield:faults})" if FLEET_SLOT in slots else ""


def _pick_master(env):
    ms = sorted(env.cluster.masters(), key=lambda n: n.port)
    return env.rng.choice(ms)


def _wait_promoted(cluster, slots, victim, timeout=20):
    probe = min(slots)
    deadline = time.time() + timeout
    while time.time() < deadline:
        o = cluster.slot_owner(probe)
        if o is not None and o != victim.port:
            return True
        time.sleep(0.05)
    return False


def kill_master(env):
    # The first cycle kills the master of the fleet's slot whenever a fleet runs: the
    # fleet's membership and buckets die with it (a failover there once let the fleet
    # admit 1.9 x its rule: docs/reliability.md). Later cycles pick by the seed.
    fleet_master = env.cluster.slot_owner(FLEET_SLOT) if env.fleet and getattr(env, "cycle", 1) == 0 else None
    v = env.cluster.by_port(fleet_master) if fleet_master is not None else _pick_master(env)
    slots = _slots_of(env.cluster, v.port)
    t0 = now()
    v.kill9()
    promoted = _wait_promoted(env.cluster, slots, v)
    t_prom = now()
    if FLEET_SLOT in slots:
        env.note_fleet_buckets(t0)
        env.note_fleet_buckets(t_prom)
    v.start()  # rejoins as a replica of the promoted one
    return {"detail": f"kill -9 master {v.port}{_fleet_note(slots)}, replica promoted after {t_prom - t0:.1f}s, "
                      "restarted as replica",
            "victim": v.port, "victim_slots": slots, "failover": promoted, "t0": t0, "t1": now()}


def manual_failover(env):
    m = _pick_master(env)
    reps = env.cluster.replicas_of(m)
    r = env.rng.choice(reps)
    t0 = now()
    res = r.cmd("CLUSTER", "FAILOVER")
    deadline = time.time() + 15
    while time.time() < deadline and r.info("replication").get("role") != "master":
        time.sleep(0.05)
    return {"detail": f"CLUSTER FAILOVER on replica {r.port} of {m.port}: {res}, now {r.info('replication').get('role')}",
            "victim": m.port, "victim_slots": set(), "failover": False, "t0": t0, "t1": now()}


def _target_slots(env, n=6):
    keys = []
    for w in env.all_workloads():
        keys.extend(w.keys())
    slots = sorted({procs.slot_of(k) for k in keys})
    env.rng.shuffle(slots)
    return slots[:n]


def _move_slots(env, how, move):
    """Moves the seeded slots one by one to another master (seeded) with `move`."""
    slots = _target_slots(env)
    t0 = now()
    parts = []
    for s in slots:
        owner = env.cluster.slot_owner(s)
        others = sorted((m for m in env.cluster.masters() if m.port != owner), key=lambda n: n.port)
        dst = env.rng.choice(others)
        parts.append(move(env.cluster, [s], dst, env.log))
    return {"detail": how + " " + "; ".join(parts), "victim": None, "victim_slots": set(),
            "failover": False, "t0": t0, "t1": now()}


def migrate(env):
    return _move_slots(env, "MIGRATE", procs.migrate_slots)


def atomic_migrate(env):
    return _move_slots(env, "CLUSTER MIGRATESLOTS", procs.migrateslots_atomic)


def sigstop(env):
    v = _pick_master(env)
    slots = _slots_of(env.cluster, v.port)
    t0 = now()
    v.stop_cont(2.0)
    if FLEET_SLOT in slots:
        env.note_fleet_buckets(t0)
        env.note_fleet_buckets(now())
    time.sleep(1.5)
    role = v.info("replication").get("role")
    return {"detail": f"SIGSTOP master {v.port}{_fleet_note(slots)} for 2 s, then SIGCONT; afterwards it is {role}",
            "victim": v.port, "victim_slots": slots, "failover": role != "master", "t0": t0, "t1": now()}


def _hs_targets(env):
    return [h for h in [env.hs] + env.fleet[:1] if h is not None]


def hs_kill(env):
    t0 = now()
    for h in _hs_targets(env):
        # (the budgets go with the process: a fresh burst from the kill on, as the
        # restarted one may admit requests before kill9_restart returns)
        killed = now()
        h.kill9_restart()
        env.note_reset(h, killed)
    return {"detail": "SIGKILL heatshield (main and fleet member 0), restarted", "victim": None,
            "victim_slots": set(), "failover": False, "t0": t0, "t1": now()}


def takeover(env):
    t0 = now()
    out = []
    for h in _hs_targets(env):
        env.note_reset(h, now())
        out.append(h.takeover())
    return {"detail": "heatshield --takeover on the same config (main and fleet member 0): " + ", ".join(out),
            "victim": None, "victim_slots": set(), "failover": False, "t0": t0, "t1": now()}


def sighup(env):
    t0 = now()
    for _ in range(3):
        for h in _hs_targets(env):
            h.sighup()
        time.sleep(0.5)
    return {"detail": "3 SIGHUP reloads (main and fleet member 0)", "victim": None, "victim_slots": set(),
            "failover": False, "t0": t0, "t1": now()}


def _resp(*args):
    out = [f"*{len(args)}\r\n".encode()]
    for a in args:
        b = str(a).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(b), b))
    return b"".join(out)


def _cut(port, cmds):
    s = socket.create_connection(("127.0.0.1", port), timeout=2)
    s.sendall(b"".join(_resp(*c) for c in cmds))
    # close at once, unread replies and all (RST with SO_LINGER 0)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    s.close()


def conn_cut(env):
    """A client sends a pipeline of writes and closes its socket before reading the
    replies: through heatshield, and directly to the owning masters for the baseline.
    Its writes are recorded as indeterminate in the workloads' histories."""
    t0 = now()
    n = 0
    for rnd in range(5 if env.args.short else 10):
        # (the masters of the baseline's keys, read once a round: CLUSTER SLOTS per
        # command took most of the episode)
        owners = {}
        for side, wl in env.workloads.items():
            cmds = []
            for w in wl:
                if w.name == "list":
                    for i in range(5):
                        k = env.rng.choice(w.single)
                        v = f"{side}-cut-{rnd}-{i}"
                        w.hist.invoke(f"{side}-cut", "append", k, v)
                        cmds.append((k, ("RPUSH", k, v)))
                elif w.name == "counter":
                    for i in range(3):
                        k = env.rng.choice(w.ctrs)
                        a = next(w.amounts)
                        w.hist.invoke(f"{side}-cut", "incr", k, a)
                        cmds.append((k, ("INCRBY", k, a)))
                elif w.name == "queue":
                    for i in range(3):
                        v = f"{side}-cut-{rnd}-{i}"
                        w.hist.invoke(f"{side}-cut", "push", w.q, v)
                        cmds.append((w.q, ("LPUSH", w.q, v)))
            if not cmds:
                continue
            env.rng.shuffle(cmds)
            try:
                if side == "hs":
                    _cut(env.hs_port(), [c for _, c in cmds])
                else:
                    by = {}
                    for k, c in cmds:
                        slot = procs.slot_of(k)
                        if slot not in owners:
                            owners[slot] = env.cluster.slot_owner(slot)
                        by.setdefault(owners[slot], []).append(c)
                    for port, cs in by.items():
                        _cut(port, cs)
                n += 1
            except OSError as e:
                env.log(f"cut failed: {e}")
        time.sleep(0.3)
    return {"detail": f"{n} pipelines of writes sent and their sockets closed unread", "victim": None,
            "victim_slots": set(), "failover": False, "t0": t0, "t1": now()}


RUN = {"kill-master": kill_master, "kill-master-stale": kill_master, "failover": manual_failover,
       "migrate": migrate, "asm": atomic_migrate, "sigstop": sigstop, "hs-kill": hs_kill,
       "takeover": takeover, "sighup": sighup, "conn-cut": conn_cut}
