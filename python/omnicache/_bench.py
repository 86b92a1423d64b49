"""make bench-python: the per-step cost of the engine contract seen from
Python through this package, beside the same step called from Go
(internal/capi/bench_test.go, BenchmarkCAPIStep: its output is passed with --go)
and beside a vectorized numpy slot mapping, the floor of what a pure-Python
manager spends on every step before it copies anything.

Go and Python rounds alternate (the Go side runs the compiled capi test
binary once per round), so a change in the machine's load reaches both.

A step is discard(the step before) + begin(plan), in one call into the
library (Cache.begin's discard), + save(outputs, a non-owned host array of
64-byte rows), timed around the package calls only
(the engine's own in-place plan update is outside the timer), with an
untimed spin between steps standing for the forward (50 µs for decode,
1 ms for prefill: the committer writes the step meanwhile;
internal/capi/bench_test.go does the same). "stall" is the part of a step Save
waited for a staging page. Each figure
is the median of ROUNDS rounds of STEPS steps.
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import time

import numpy as np

from . import Cache, Key, Plan

# name, requests, tokens each, untimed forward (ns): internal/capi/bench_test.go's BenchShapes
SHAPES = [("decode16", 16, 1, 50_000), ("decode64", 64, 1, 50_000), ("prefill2048", 1, 2048, 1_000_000)]
BS, ROW, STRIDE = 16, 64, 128


def bench_step(reqs, tokens, forward, steps, rounds):
    ntok = reqs * tokens
    c = Cache([Key("hidden", ROW)], num_blocks=reqs * STRIDE, block_size=BS,
              staging_capacity_tokens=max(1024, ntok))
    table = np.arange(reqs * STRIDE, dtype=np.int32).reshape(reqs, STRIDE)
    ids = np.arange(1, reqs + 1, dtype=np.int64)
    rows = np.arange(reqs, dtype=np.int32)
    start = np.zeros(reqs, np.int32)
    count = np.full(reqs, tokens, np.int32)
    plan = Plan(ids=ids, rows=rows, start=start, count=count, table=table,
                arrivals=ids.copy(), hit_tokens=np.zeros(reqs, np.int32))
    hidden = np.zeros((ntok, ROW), np.uint8)
    from .core import Outputs
    outs = Outputs(c, [hidden], tokens=ntok)
    limit = STRIDE * BS
    prefill = tokens > 1
    nxt = [reqs]
    arr, fin, zero = np.zeros(1, np.int64), np.zeros(1, np.int64), np.zeros(1, np.int32)

    def advance():
        if prefill:
            fin[0] = ids[0]
            nxt[0] += 1
            ids[0] = nxt[0]
            arr[0] = nxt[0]
            plan.set_finished(fin)
            plan.set_arrivals(arr, zero)
            return
        if plan.n_arrivals_set:
            plan.clear_events()
            plan.n_arrivals_set = False
        np.add(start, 1, out=start)
        if start[0] >= limit:
            start[:] = limit // 2

    plan.n_arrivals_set = True
    begin, save, discard = c.begin, c.save, c.discard
    prev = 0
    clock = time.perf_counter_ns
    for i in range(2 * limit + 1):
        if i:
            advance()
        begin(plan)
        sid = save(outs)
        if prev:
            discard(prev)
        prev = sid
    per_round, stall0 = [], c.stats()["StallNanos"]
    for _ in range(rounds):
        acc = 0
        for _ in range(steps):
            advance()
            t0 = clock()
            while clock() - t0 < forward:
                pass
            t0 = clock()
            begin(plan, prev)  # discards the step before in the same call
            sid = save(outs)
            acc += clock() - t0
            prev = sid
        per_round.append(acc / steps)
    stall = (c.stats()["StallNanos"] - stall0) / (steps * rounds)
    c.close()
    return statistics.median(per_round), stall


def slot_mapping(reqs, tokens, steps, rounds):
    """The vectorized numpy slot mapping of one step (the reference's fix)."""
    table = np.arange(reqs * STRIDE, dtype=np.int32).reshape(reqs, STRIDE)
    start = np.full(reqs, 0 if tokens > 1 else 100, np.int64)
    count = np.full(reqs, tokens, np.int64)
    rows = np.arange(reqs)
    clock = time.perf_counter_ns
    per_round = []
    for _ in range(rounds):
        t0 = clock()
        for _ in range(steps):
            total = int(count.sum())
            req = np.repeat(rows, count)
            first = np.cumsum(count) - count
            pos = np.repeat(start, count) + (np.arange(total) - np.repeat(first, count))
            slots = table[req, pos // BS].astype(np.int64) * BS + pos % BS
        per_round.append((clock() - t0) / steps)
    assert len(slots) == reqs * tokens
    return statistics.median(per_round)


def go_round(go_bin, name, steps):
    """One round of BenchmarkCAPIStep/shape=name from the compiled capi test
    binary: (step ns, stall ns)."""
    out = subprocess.run([go_bin, "-test.run=^$", "-test.bench=^BenchmarkCAPIStep$/^shape=%s$" % name,
                          "-test.benchtime=%dx" % steps, "-test.count=1"],
                         capture_output=True, text=True, check=True).stdout
    for line in out.splitlines():
        st, sl = re.search(r"([\d.]+) step-ns", line), re.search(r"([\d.]+) stall-ns", line)
        if line.startswith("BenchmarkCAPIStep/shape=%s" % name) and st and sl:
            return float(st.group(1)), float(sl.group(1))
    raise RuntimeError("no BenchmarkCAPIStep/shape=%s line in:\n%s" % (name, out))


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m omnicache._bench")
    ap.add_argument("--go-bin", help="the capi test binary (go test -c ./internal/capi/): Go rounds interleaved with Python's")
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args(argv)
    la = os.getloadavg()
    print("load average: %.2f %.2f %.2f (%d CPUs)" % (la[0], la[1], la[2], os.cpu_count()))
    print("step = begin + save (64-byte rows, copied) + discard; median of %d rounds, Go and Python rounds interleaved"
          % a.rounds)
    from . import _ffi
    print("python calls the library through %s" % _ffi.hot().backend)
    print("%-12s %10s %10s %10s %13s %10s %15s" % ("shape", "python µs", "go µs", "python-go", "python stall",
                                                  "go stall", "numpy slots µs"))
    for name, reqs, tokens, forward in SHAPES:
        steps = a.steps if tokens == 1 else max(1, a.steps // 10)
        py, go = [], []
        for _ in range(a.rounds):
            if a.go_bin:
                go.append(go_round(a.go_bin, name, steps))
            py.append(bench_step(reqs, tokens, forward, steps, 1))
        p, pst = statistics.median(x for x, _ in py), statistics.median(x for _, x in py)
        sm = slot_mapping(reqs, tokens, max(1, steps // 4), a.rounds) / 1e3
        if go:
            g, gst = statistics.median(x for x, _ in go), statistics.median(x for _, x in go)
            gs, ds, gsts = "%10.2f" % (g / 1e3), "%+10.2f" % ((p - g) / 1e3), "%10.2f" % (gst / 1e3)
        else:
            gs = ds = gsts = "%10s" % "-"
        print("%-12s %10.2f %s %s %13.2f %s %15.2f" % (name, p / 1e3, gs, ds, pst / 1e3, gsts, sm))
    la = os.getloadavg()
    print("load average after: %.2f %.2f %.2f" % la)
    return 0


if __name__ == "__main__":
    sys.exit(main())
