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



# The slot mapping's shapes: name, requests, tokens each.
SLOT_SHAPES = [("decode16", 16, 1), ("decode64", 64, 1), ("prefill16384", 1, 16384)]
SLOT_ROWS, SLOT_BLOCKS = 256, 1024


def numpy_slots(table, bs, computed, index, req_ids, sched):
    """step_slots_cpu's call as a vectorized numpy mapping: each request's
    row and count looked up, then every position at once."""
    n = len(req_ids)
    idx = np.fromiter([index[r] for r in req_ids], np.int64, n)
    cnt = np.fromiter([sched[r] for r in req_ids], np.int64, n)
    start = computed[idx].astype(np.int64)
    total = int(cnt.sum())
    req = np.repeat(idx, cnt)
    first = np.cumsum(cnt) - cnt
    pos = np.repeat(start, cnt) + (np.arange(total) - np.repeat(first, cnt))
    return table[req, pos // bs].astype(np.int64) * bs + pos % bs


def bench_slots(rounds, calls):
    """Per shape: (ours, numpy) lists of µs a call, one entry a round: the
    median over blocks of calls, the two alternating block by block (a
    preemption spoils a block, not the round)."""
    from .slots import FullAttentionGroupView

    rng = np.random.default_rng(0)
    table = rng.integers(0, 1 << 20, size=(SLOT_ROWS, SLOT_BLOCKS), dtype=np.int32)
    ids = ["req-%d" % i for i in range(SLOT_ROWS)]
    index = {r: i for i, r in enumerate(ids)}
    clock = time.perf_counter_ns
    out = []
    for name, reqs, tokens in SLOT_SHAPES:
        computed = np.full(SLOT_ROWS, 0 if tokens > 1 else 100, np.int32)
        view = FullAttentionGroupView(table, BS, computed, ids, req_id_to_index=index)
        req = view.batch_req_ids()[:reqs]
        sched = {r: tokens for r in req}
        want = numpy_slots(table, BS, computed, index, req, sched)
        if not np.array_equal(view.step_slots_cpu(req, sched), want):
            raise AssertionError("step_slots_cpu differs from the numpy mapping at %s" % name)
        k = 20 if tokens == 1 else 1  # calls a block
        blocks = max(5, calls // (k * 20)) if tokens == 1 else max(5, calls // 400)
        ours, ref = [], []
        for _ in range(rounds):
            o, r = [], []
            for _ in range(blocks):
                t0 = clock()
                for _ in range(k):
                    view.step_slots_cpu(req, sched)
                t1 = clock()
                for _ in range(k):
                    numpy_slots(table, BS, computed, index, req, sched)
                t2 = clock()
                o.append((t1 - t0) / k / 1e3)
                r.append((t2 - t1) / k / 1e3)
            ours.append(statistics.median(o))
            ref.append(statistics.median(r))
        out.append((name, ours, ref))
    return out


def cuda_refusal():
    """None when a CUDA device can run the --cuda part, else why not."""
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "torch sees none"
    from .errors import NoDeviceError, UnsupportedError

    try:
        Cache([Key("hidden", 16)], num_blocks=8, block_size=BS, cuda_device=0).close()
    except (UnsupportedError, NoDeviceError) as e:
        return "the library cannot use cuda:0 (%s)" % e
    return None


def fmt(xs):
    """median [min–max] of xs."""
    return "%.2f [%.2f–%.2f]" % (statistics.median(xs), min(xs), max(xs))


def print_steps(a):
    print("\n## step = begin + save (64-byte rows, copied) + discard; median of %d rounds, Go and Python rounds "
          "interleaved" % a.rounds)
    from . import _calls
    print("python calls the library through %s" % _calls.hot().backend)
    print("%-12s %10s %10s %10s %13s %10s" % ("shape", "python µs", "go µs", "python-go", "python stall", "go stall"))
    for name, reqs, tokens, forward in SHAPES:
        steps = a.steps if tokens == 1 else max(1, a.steps // 10)
        py, go = [], []
        for _ in range(a.rounds):
            if a.go_bin:
                go.append(go_round(a.go_bin, name, steps))
            py.append(bench_step(reqs, tokens, forward, steps, 1))
        p, pst = statistics.median(x for x, _ in py), statistics.median(x for _, x in py)
        if go:
            g, gst = statistics.median(x for x, _ in go), statistics.median(x for _, x in go)
            gs, ds, gsts = "%10.2f" % (g / 1e3), "%+10.2f" % ((p - g) / 1e3), "%10.2f" % (gst / 1e3)
        else:
            gs = ds = gsts = "%10s" % "-"
        print("%-12s %10.2f %s %s %13.2f %s" % (name, p / 1e3, gs, ds, pst / 1e3, gsts))


def print_slots(a):
    print("\n## slot mapping: FullAttentionGroupView.step_slots_cpu against a vectorized numpy mapping of the same "
          "call, µs a call, median [min–max] of %d rounds" % a.rounds)
    print("%-14s %-26s %-26s %s" % ("shape", "step_slots_cpu", "numpy", "numpy/ours"))
    for name, ours, ref in bench_slots(a.rounds, a.steps * 5):
        print("%-14s %-26s %-26s %.1fx" % (name, fmt(ours), fmt(ref), statistics.median(ref) / statistics.median(ours)))


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m omnicache._bench")
    ap.add_argument("--go-bin", help="the capi test binary (go test -c ./internal/capi/): Go rounds interleaved with Python's")
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--cuda", action="store_true",
                    help="also the rows part with CUDA tensors on cuda:0 (a CUDA build of the library); no Go")
    ap.add_argument("--only", choices=["steps", "slots", "rows"], help="run one part")
    a = ap.parse_args(argv)
    if a.cuda:
        why = cuda_refusal()
        if why:
            print("omnicache._bench --cuda: no CUDA device: %s" % why, file=sys.stderr)
            return 1
        a.go_bin = None
    la = os.getloadavg()
    print("load average: %.2f %.2f %.2f (%d CPUs)" % (la[0], la[1], la[2], os.cpu_count()))
    if a.only in (None, "steps"):
        print_steps(a)
    if a.only in (None, "slots"):
        print_slots(a)
    if a.only in (None, "rows"):
        from . import _bench_rows as br

        try:
            import torch
        except ImportError:
            print("\n## rows: torch is not installed: skipped")
            torch = None
        if torch is not None:
            steps = max(20, a.steps // 5)
            print("\n## rows: 2048-wide float32 hidden rows and one 4-wide mm key, block size 16, %d rounds; "
                  "engine = begin + save, materialize = Cache.materialize into torch buffers + Result.split, "
                  "whole step = engine + materialize; µs a step, median [min–max] of the rounds' medians" % a.rounds)
            br.print_rows(br.bench_rows(torch, a.rounds, steps), "host")
            if a.cuda:
                print("torch %s, %s" % (torch.__version__, torch.cuda.get_device_name(0)))
                br.print_rows(br.bench_rows(torch, a.rounds, steps, cuda=True), "cuda")
    la = os.getloadavg()
    print("\nload average after: %.2f %.2f %.2f" % la)
    return 0


if __name__ == "__main__":
    sys.exit(main())
