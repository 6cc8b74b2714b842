#!/usr/bin/env python3
"""The code a request runs through, from a callgrind profile made with --dump-instr=yes:
how many 64-byte lines of the binary's machine code execute at least once per request on
average (a request's instruction-cache footprint), and the functions holding most of them.

    scripts/code-footprint.py CALLGRIND_OUT BINARY REQUESTS [TOP]

Used by scripts/bench-instructions.sh. Why it matters: at -P1 the kernel's socket calls
evict much of the level-1 instruction cache between two requests, so each hot line is
fetched again from the level-2 cache every time, and heatshield's user time per request
follows its hot lines more than its instruction count (docs/design/performance.md, "The
code a request runs through").
"""
import bisect
import collections
import re
import subprocess
import sys


def hot_lines(path, binary, requests):
    """Instructions executed per 64-byte code line of `binary`."""
    objs, ob = {}, None
    addr = 0
    per_line = collections.Counter()
    after_call = False
    with open(path) as f:
        for raw in f:
            line = raw.rstrip("\n")
            m = re.match(r"^(c?ob)=\((\d+)\)(?: (.*))?$", line)
            if m:
                kind, i, name = m.groups()
                if name:
                    objs[i] = name
                if kind == "ob":
                    ob = objs.get(i)
                continue
            if line.startswith("calls="):
                # the next cost line is the call's inclusive cost: not this line's own
                after_call = True
                continue
            if not line or line[0] not in "0123456789+-*":
                continue
            parts = line.split()
            tok = parts[0]
            if tok.startswith("0x"):
                addr = int(tok, 16)
            elif tok[0] in "+-":
                d = tok[1:]
                d = int(d, 16) if d.startswith("0x") else int(d)
                addr = addr + d if tok[0] == "+" else addr - d
            elif tok != "*":
                continue
            if after_call:
                after_call = False
                continue
            if ob == binary and len(parts) >= 3:
                per_line[addr >> 6] += int(parts[2])
    return {ln: ir for ln, ir in per_line.items() if ir >= requests}


def symbols(binary):
    out = subprocess.run(["nm", "-C", "--defined-only", "-n", binary], capture_output=True, text=True).stdout
    syms = []
    for row in out.splitlines():
        p = row.split(" ", 2)
        if len(p) == 3 and p[1] in "tTwW":
            syms.append((int(p[0], 16), re.sub(r"::h[0-9a-f]{16}$", "", p[2])))
    return syms


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    path, binary, requests = sys.argv[1], sys.argv[2], int(sys.argv[3])
    top = int(sys.argv[4]) if len(sys.argv) > 4 else 0
    hot = hot_lines(path, binary, requests)
    print(len(hot))
    if top:
        syms = symbols(binary)
        starts = [a for a, _ in syms]
        per = collections.Counter()
        for ln in hot:
            i = bisect.bisect_right(starts, ln << 6) - 1
            per[syms[i][1] if i >= 0 else "?"] += 1
        for name, n in per.most_common(top):
            print(f"{n:5d}  {name[:140]}", file=sys.stderr)


if __name__ == "__main__":
    main()
