#!/usr/bin/env python3
"""Generate src/command/generated.rs from a live redis-server's COMMAND INFO.

Usage:
    python3 scripts/gen_command_table.py [--redis-server PATH] [--output PATH]
                                         [--check]

The script starts a throwaway redis-server (bound to 127.0.0.1 on a free,
non-6379 port, in a temporary directory, with persistence disabled), asks it
for ``COMMAND`` (which in Redis 7 nests every subcommand's full COMMAND INFO
reply), stops it, and writes a sorted, rustfmt-friendly Rust table of
``RawSpec`` entries. It speaks RESP2 itself over a socket: no third-party
Python packages are needed. The output is deterministic for a given
redis-server version, so re-running it is safe. With ``--check`` it writes
nothing and exits 1 if the file on disk differs from what it would write.

Flag constants emitted (defined in src/command/spec.rs as
``pub mod flags { pub const WRITE: u32 = 1 << 0; ... }`` in exactly this
order):

    WRITE         = 1 << 0   (redis flag "write")
    READONLY      = 1 << 1   ("readonly")
    DENYOOM       = 1 << 2   ("denyoom")
    ADMIN         = 1 << 3   ("admin")
    PUBSUB        = 1 << 4   ("pubsub")
    NOSCRIPT      = 1 << 5   ("noscript")
    BLOCKING      = 1 << 6   ("blocking")
    LOADING       = 1 << 7   ("loading")
    STALE         = 1 << 8   ("stale")
    FAST          = 1 << 9   ("fast")
    NO_AUTH       = 1 << 10  ("no_auth")
    MAY_REPLICATE = 1 << 11  ("may_replicate")
    NO_MULTI      = 1 << 12  ("no_multi")
    ALLOW_BUSY    = 1 << 13  ("allow_busy")

The static carries ``#[rustfmt::skip]`` so ``cargo fmt --check`` accepts the
one-entry-per-line layout.

A command with none of these flags gets ``flags: 0``. All other Redis flags
are ignored, except "movablekeys", which becomes ``movable: true``.
Key specs become ``RawKey(flags, begin, find)`` entries (``key::*`` flags: what
ACL checks each key for).
``first``/``last``/``step`` are the legacy first-key/last-key/step fields of
COMMAND INFO (``last`` may be negative, e.g. -1 = last argument).
"""

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

# Redis 7.0's ACL categories, in the order ACL CAT lists them: bit i of a command's
# `acl` is CATEGORIES[i] (src/command/spec.rs, `cat`).
CATEGORIES = [
    "keyspace", "read", "write", "set", "sortedset", "list", "hash", "string",
    "bitmap", "hyperloglog", "geo", "stream", "pubsub", "admin", "fast", "slow",
    "blocking", "dangerous", "connection", "transaction", "scripting",
]

# (redis flag name, Rust constant), in bit order.
FLAG_MAP = [
    ("write", "WRITE"),
    ("readonly", "READONLY"),
    ("denyoom", "DENYOOM"),
    ("admin", "ADMIN"),
    ("pubsub", "PUBSUB"),
    ("noscript", "NOSCRIPT"),
    ("blocking", "BLOCKING"),
    ("loading", "LOADING"),
    ("stale", "STALE"),
    ("fast", "FAST"),
    ("no_auth", "NO_AUTH"),
    ("may_replicate", "MAY_REPLICATE"),
    ("no_multi", "NO_MULTI"),
    ("allow_busy", "ALLOW_BUSY"),
]

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_OUTPUT = os.path.join(REPO_ROOT, "src", "command", "generated.rs")


class RespError(Exception):
    pass


class RespConn:
    """Minimal blocking RESP2 client."""

    def __init__(self, host, port, timeout=10.0):
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.buf = b""

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass

    def _fill(self):
        chunk = self.sock.recv(1 << 16)
        if not chunk:
            raise RespError("connection closed by server")
        self.buf += chunk

    def _line(self):
        while True:
            i = self.buf.find(b"\r\n")
            if i >= 0:
                line, self.buf = self.buf[:i], self.buf[i + 2 :]
                return line
            self._fill()

    def _exact(self, n):
        while len(self.buf) < n + 2:
            self._fill()
        data, self.buf = self.buf[:n], self.buf[n + 2 :]
        return data

    def read(self):
        line = self._line()
        kind, rest = line[:1], line[1:]
        if kind == b"+":
            return rest.decode()
        if kind == b"-":
            raise RespError(rest.decode())
        if kind == b":":
            return int(rest)
        if kind == b"$":
            n = int(rest)
            return None if n < 0 else self._exact(n).decode()
        if kind == b"*":
            n = int(rest)
            return None if n < 0 else [self.read() for _ in range(n)]
        raise RespError("unexpected RESP type byte %r" % kind)

    def call(self, *args):
        out = [b"*%d\r\n" % len(args)]
        for a in args:
            a = a.encode() if isinstance(a, str) else a
            out.append(b"$%d\r\n%s\r\n" % (len(a), a))
        self.sock.sendall(b"".join(out))
        return self.read()


def free_port():
    for _ in range(100):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        finally:
            s.close()
        if port != 6379 and port + 10000 <= 65535:
            return port
    raise RuntimeError("could not find a free loopback port")


class ThrowawayRedis:
    def __init__(self, server_bin):
        self.server_bin = server_bin
        self.proc = None
        self.tmpdir = None
        self.port = None

    def __enter__(self):
        self.tmpdir = tempfile.mkdtemp(prefix="heatshield-cmdtable-")
        last_err = None
        for _ in range(5):
            self.port = free_port()
            args = [
                self.server_bin,
                "--port", str(self.port),
                "--bind", "127.0.0.1",
                "--dir", self.tmpdir,
                "--save", "",
                "--appendonly", "no",
                "--daemonize", "no",
                "--protected-mode", "yes",
                "--logfile", os.path.join(self.tmpdir, "redis.log"),
            ]
            self.proc = subprocess.Popen(
                args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL, cwd=self.tmpdir,
            )
            deadline = time.time() + 10
            while time.time() < deadline:
                if self.proc.poll() is not None:
                    last_err = "redis-server exited with %s" % self.proc.returncode
                    break
                try:
                    c = RespConn("127.0.0.1", self.port, timeout=2)
                    try:
                        if c.call("PING") == "PONG":
                            return self
                    finally:
                        c.close()
                except (OSError, RespError) as e:
                    last_err = str(e)
                time.sleep(0.05)
            self._stop_proc()
        self._cleanup_dir()
        raise RuntimeError("could not start redis-server: %s" % last_err)

    def _stop_proc(self):
        if self.proc is None:
            return
        if self.proc.poll() is None:
            try:
                c = RespConn("127.0.0.1", self.port, timeout=2)
                try:
                    c.call("SHUTDOWN", "NOSAVE")
                except (OSError, RespError):
                    pass  # connection drops on shutdown
                finally:
                    c.close()
            except OSError:
                pass
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.terminate()
                try:
                    self.proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
        self.proc = None

    def _cleanup_dir(self):
        if self.tmpdir:
            shutil.rmtree(self.tmpdir, ignore_errors=True)
            self.tmpdir = None

    def __exit__(self, *exc):
        self._stop_proc()
        self._cleanup_dir()
        return False


def parse_info(entry, parent=None):
    """Turn one COMMAND INFO array into a dict (recursing into subcommands)."""
    name, arity, flags, first, last, step = entry[:6]
    name = name.upper()
    if parent is not None:
        prefix = parent + "|"
        if not name.startswith(prefix):
            raise RuntimeError("subcommand %r not under %r" % (name, parent))
        name = name[len(prefix):]
    if not name.isascii():
        raise RuntimeError("non-ASCII command name %r" % name)
    flags = set(f.lower() for f in flags)
    acl = [c.lower().lstrip("@") for c in (entry[6] if len(entry) > 6 and entry[6] else [])]
    unknown = [c for c in acl if c not in CATEGORIES]
    if unknown:
        raise RuntimeError("%s: ACL categories unknown to heatshield: %s" % (name, unknown))
    specs = [parse_keyspec(name, k) for k in (entry[8] if len(entry) > 8 and entry[8] else [])]
    subs_raw = entry[9] if len(entry) > 9 and entry[9] else []
    full = name if parent is None else parent + "|" + name
    subs = [parse_info(s, full) for s in subs_raw]
    subs.sort(key=lambda s: s["name"])
    return {
        "name": name,
        "arity": int(arity),
        "flags": flags,
        "first": int(first),
        "last": int(last),
        "step": int(step),
        "movable": "movablekeys" in flags,
        "acl": acl,
        "specs": specs,
        "subs": subs,
    }


def pairs(flat):
    """A RESP2 flat map ([k1, v1, k2, v2, ...]) as a dict."""
    return dict(zip(flat[::2], flat[1::2]))


# (key spec flag, Rust constant in spec.rs's `key`): ACL's access and change flags,
# whether the key may change at all, and what tells heatshield the spec is not enough.
KEY_FLAGS = [
    (("access",), "ACCESS"),
    (("insert", "update", "delete"), "CHANGE"),
    (("rw", "ow", "rm", "insert", "update", "delete"), "WRITES"),
    (("not_key",), "NOT_KEY"),
    (("incomplete",), "INCOMPLETE"),
    (("variable_flags",), "VARIABLE"),
]


def parse_keyspec(name, raw):
    """One key spec of COMMAND INFO as the Rust RawKey expression."""
    k = pairs(raw)
    fl = set(f.lower() for f in k.get("flags", []))
    bits = [rust for (names, rust) in KEY_FLAGS if fl & set(names)]
    b, f = pairs(k["begin_search"]), pairs(k["find_keys"])
    bs, fs = pairs(b.get("spec") or []), pairs(f.get("spec") or [])
    if b["type"] == "index":
        begin = "Index(%d)" % int(bs["index"])
    elif b["type"] == "keyword":
        begin = 'Keyword("%s", %d)' % (bs["keyword"], int(bs["startfrom"]))
    elif b["type"] == "unknown":
        begin = "BeginUnknown"
    else:
        raise RuntimeError("%s: begin_search type %r" % (name, b["type"]))
    if f["type"] == "range":
        find = "Range(%d, %d, %d)" % (int(fs["lastkey"]), int(fs["keystep"]), int(fs["limit"]))
    elif f["type"] == "keynum":
        find = "KeyNum(%d, %d, %d)" % (int(fs["keynumidx"]), int(fs["firstkey"]), int(fs["keystep"]))
    elif f["type"] == "unknown":
        find = "FindUnknown"
    else:
        raise RuntimeError("%s: find_keys type %r" % (name, f["type"]))
    return "RawKey(%s, %s, %s)" % (" | ".join(bits) if bits else "0", begin, find)


def fetch_commands(conn):
    top = conn.call("COMMAND")
    cmds = [parse_info(e) for e in top if e is not None]
    # Cross-check against COMMAND LIST and explicit COMMAND INFO of each
    # "parent|sub" name, so nothing nested is silently missed.
    names = set(n.lower() for n in conn.call("COMMAND", "LIST"))
    seen = set()
    for c in cmds:
        seen.add(c["name"].lower())
        for s in c["subs"]:
            seen.add((c["name"] + "|" + s["name"]).lower())
    if names - seen:
        raise RuntimeError("COMMAND LIST has names missing from COMMAND: %s"
                           % sorted(names - seen))
    sub_names = sorted(n for n in seen if "|" in n)
    infos = conn.call("COMMAND", "INFO", *sub_names) if sub_names else []
    for n, info in zip(sub_names, infos):
        if info is None:
            raise RuntimeError("COMMAND INFO %s returned nil" % n)
    cmds.sort(key=lambda c: c["name"])
    return cmds


def rust_flags(flags):
    parts = [rust for (redis, rust) in FLAG_MAP if redis in flags]
    return " | ".join(parts) if parts else "0"


def rust_categories(acl):
    parts = ["cat::" + c.upper() for c in CATEGORIES if c in acl]
    return " | ".join(parts) if parts else "0"


def render_spec(c, indent):
    pad = " " * indent
    head = (
        '%sRawSpec { name: "%s", arity: %d, flags: %s, first: %d, last: %d, '
        "step: %d, movable: %s, acl: %s, specs: &[%s], subs: &["
        % (pad, c["name"], c["arity"], rust_flags(c["flags"]), c["first"],
           c["last"], c["step"], "true" if c["movable"] else "false",
           rust_categories(c["acl"]), ", ".join(c["specs"]))
    )
    if not c["subs"]:
        return [head + "] },"]
    lines = [head]
    for s in c["subs"]:
        lines.extend(render_spec(s, indent + 4))
    lines.append(pad + "] },")
    return lines


def render(version, cmds):
    out = [
        "//! Generated by scripts/gen_command_table.py from redis-server %s's "
        "COMMAND INFO. Do not edit." % version,
        "use super::spec::{RawBegin::*, RawFind::*, RawKey, RawSpec, cat, flags::*, key::*};",
        "",
        "#[rustfmt::skip]",
        "pub(crate) static REDIS_COMMANDS: &[RawSpec] = &[",
    ]
    for c in cmds:
        out.extend(render_spec(c, 4))
    out.append("];")
    return "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--redis-server", default=shutil.which("redis-server"),
                    help="redis-server binary (default: from PATH)")
    ap.add_argument("--output", default=DEFAULT_OUTPUT)
    ap.add_argument("--check", action="store_true",
                    help="exit 1 if OUTPUT is not up to date; write nothing")
    args = ap.parse_args()
    if not args.redis_server:
        sys.exit("redis-server not found on PATH (try scripts/ensure-deps.sh)")

    with ThrowawayRedis(args.redis_server) as srv:
        conn = RespConn("127.0.0.1", srv.port)
        try:
            info = conn.call("INFO", "server")
            version = None
            for line in info.splitlines():
                if line.startswith("redis_version:"):
                    version = line.split(":", 1)[1].strip()
            if not version:
                raise RuntimeError("no redis_version in INFO server")
            cmds = fetch_commands(conn)
        finally:
            conn.close()

    text = render(version, cmds)
    nsubs = sum(len(c["subs"]) for c in cmds)
    if args.check:
        try:
            with open(args.output, encoding="utf-8") as f:
                current = f.read()
        except FileNotFoundError:
            current = None
        if current != text:
            print("%s is out of date" % args.output, file=sys.stderr)
            sys.exit(1)
        print("%s is up to date" % args.output)
        return
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    tmp = args.output + ".tmp"
    with open(tmp, "w", encoding="utf-8", newline="\n") as f:
        f.write(text)
    os.replace(tmp, args.output)
    print("wrote %s: %d commands, %d subcommands (redis-server %s)"
          % (os.path.relpath(args.output), len(cmds), nsubs, version))


if __name__ == "__main__":
    main()
