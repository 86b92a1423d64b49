"""An engine loop that drives omnicache.vllm_omni as vLLM-Omni's model
runner drives its prefix cache, with plain objects shaped like vLLM's
SchedulerOutput and InputBatch (no vLLM needed):

    PYTHONPATH=python /usr/bin/python3 python/examples/vllm_engine_loop.py

A small scheduler admits requests whose prompts share prefixes (vLLM's KV
prefix cache then skips their shared full blocks), prefills them in
chunks, decodes, preempts a request when blocks run out and resumes it
later (hitting its own blocks that are still cached), and finishes them.
Each step:

    step = adapter.translate_step(scheduler_output)
    manager.new_step_starts(step)
    input_batch.update(scheduler_output)           # vLLM's _update_states
    layout = adapter.build_write_layout(group_view, num_scheduled_tokens=...)
    manager.prepare_read_plans(layout)             # hit reads run during the forward
    hidden, codes = forward(...)
    sid = manager.save_outputs(hidden, {"codes": codes}, ..., write_layout=layout)

and a consumer thread materializes each step while the engine runs the
next one, as vLLM-Omni's async output builder does. A request's hidden
row at a position depends only on its tokens up to there, so a hit's
prefix must equal what recomputing it would give: the example checks
that every request received each of its rows exactly once, in order."""

import queue
import sys
import threading
from types import SimpleNamespace as NS

import numpy as np

from omnicache import vllm_omni as vo

BS, NUM_BLOCKS, WIDTH, BUDGET, CHUNK = 4, 12, 8, 24, 12


def hidden_row(tokens, p):
    """The toy model's hidden state at position p: a function of tokens[:p+1]."""
    h = 0
    for t in tokens[: p + 1]:
        h = (h * 1000003 + t) % (1 << 24)
    return np.array([h, p, tokens[p]] + [h % (k + 7) for k in range(WIDTH - 3)], np.float32)


class Request:
    def __init__(self, rid, prompt, max_new):
        self.rid, self.tokens, self.prompt, self.max_new = rid, list(prompt), len(prompt), max_new
        self.blocks, self.computed = [], 0

    @property
    def done(self):
        return len(self.tokens) >= self.prompt + self.max_new and self.computed >= len(self.tokens)


class Scheduler:
    """vLLM's scheduler, reduced: a block pool with reference counts and a
    prefix cache of full blocks (the tokens up to a block's end -> the
    block; a freed block keeps its entry until it is allocated again), a
    token budget, chunked prefill, and preemption of the newest running
    request when blocks run out."""

    def __init__(self):
        self.free, self.ref = list(range(NUM_BLOCKS)), [0] * NUM_BLOCKS
        self.cached, self.key_of = {}, {}
        self.waiting, self.running, self.preempted, self.finished = [], [], [], []
        self.preemptions = self.resume_hits = 0

    def take(self, b):
        if self.ref[b] == 0:
            self.free.remove(b)
            key = self.key_of.pop(b, None)
            if key is not None and self.cached.get(key) == b:
                del self.cached[key]  # a block allocated afresh leaves the prefix cache
        self.ref[b] += 1

    def release(self, r):
        for b in r.blocks:
            self.ref[b] -= 1
            if self.ref[b] == 0:
                self.free.append(b)
        r.blocks = []

    def prefix_hit(self, r):
        """The cached full blocks r's tokens start with (at most len-1 tokens)."""
        out = []
        while (len(out) + 1) * BS < len(r.tokens):
            b = self.cached.get(tuple(r.tokens[: (len(out) + 1) * BS]))
            if b is None:
                break
            out.append(b)
        return out

    def grow(self, r, upto):
        """Allocates r's blocks up to position upto; False when the pool is
        empty (the blocks allocated so far stay r's)."""
        while len(r.blocks) * BS < upto:
            if not self.free:
                return False
            b = self.free[0]
            self.take(b)
            r.blocks.append(b)
        return True

    def schedule(self):
        """One SchedulerOutput: running requests first, then preempted ones
        resumed, then waiting ones admitted, within the token budget."""
        new, resumed, cached, new_blocks, num = [], [], [], [], {}
        finished = {r.rid for r in self.finished}
        self.finished = []
        budget, just = BUDGET, []
        for r in list(self.running):
            if r not in self.running:
                continue  # preempted above
            n, had = min(CHUNK, len(r.tokens) - r.computed, budget), len(r.blocks)
            while n and not self.grow(r, r.computed + n):
                victim = self.running.pop()
                self.release(victim)
                victim.computed = 0
                self.preempted.append(victim)
                self.preemptions += 1
                just.append(victim)
                n = 0 if victim is r else n
            if n:
                num[r.rid] = n
                budget -= n
                cached.append(r)
                new_blocks.append((r.blocks[had:],) if len(r.blocks) > had else None)
        for waiting, is_new in ((self.preempted, False), (self.waiting, True)):
            while waiting and budget > 0 and waiting[0] not in just:  # not resumed in the step it was preempted
                r = waiting[0]
                for b in self.prefix_hit(r):
                    self.take(b)
                    r.blocks.append(b)
                r.computed = len(r.blocks) * BS
                n = min(CHUNK, len(r.tokens) - r.computed, budget)
                if not self.grow(r, r.computed + n):
                    self.release(r)
                    break
                waiting.pop(0)
                self.running.append(r)
                num[r.rid] = n
                budget -= n
                (new if is_new else resumed).append(r)
                self.resume_hits += not is_new and r.computed > 0
        c = cached + resumed
        return NS(scheduled_new_reqs=[NS(req_id=r.rid, prompt_token_ids=list(r.tokens), block_ids=(list(r.blocks),),
                                         num_computed_tokens=r.computed) for r in new],
                  scheduled_cached_reqs=NS(
                      req_ids=[r.rid for r in c], resumed_req_ids={r.rid for r in resumed},
                      new_block_ids=new_blocks + [(list(r.blocks),) for r in resumed],
                      num_computed_tokens=[r.computed for r in c], new_token_ids=[],
                      num_output_tokens=[len(r.tokens) - r.prompt for r in c]),
                  num_scheduled_tokens=num, total_num_scheduled_tokens=sum(num.values()), finished_req_ids=finished)

    def update(self, so, sampled):
        """After the forward: computed tokens advance, full blocks enter the
        prefix cache, sampled tokens are appended, done requests finish."""
        for r in list(self.running):
            if r.rid not in so.num_scheduled_tokens:
                continue
            r.computed += so.num_scheduled_tokens[r.rid]
            for i in range(r.computed // BS):
                key = tuple(r.tokens[: (i + 1) * BS])
                if key not in self.cached and r.blocks[i] not in self.key_of:
                    self.cached[key], self.key_of[r.blocks[i]] = r.blocks[i], key
            if r.rid in sampled:
                r.tokens.append(sampled[r.rid])
            if r.done:
                self.running.remove(r)
                self.release(r)
                self.finished.append(r)


class InputBatch:
    """vLLM's InputBatch, reduced: the batch's request order, each request's
    block ids (its block table row) and computed tokens, updated from the
    scheduler output as vLLM's _update_states does."""

    def __init__(self):
        self.req_ids, self.blocks, self.computed = [], {}, {}

    def update(self, so):
        c = so.scheduled_cached_reqs
        # finished and preempted requests leave the batch; a resumed one comes back at its end
        self.req_ids = [r for r in self.req_ids if r in so.num_scheduled_tokens and r not in c.resumed_req_ids]
        for d in so.scheduled_new_reqs:
            self.req_ids.append(d.req_id)
            self.blocks[d.req_id], self.computed[d.req_id] = list(d.block_ids[0]), d.num_computed_tokens
        for rid, blocks, comp in zip(c.req_ids, c.new_block_ids, c.num_computed_tokens):
            if rid in c.resumed_req_ids:
                self.req_ids.append(rid)
                self.blocks[rid] = list(blocks[0])  # a resumed request's blocks replace its row
            elif blocks is not None:
                self.blocks[rid] += list(blocks[0])
            self.computed[rid] = comp


class GroupView:
    """The group view vLLM-Omni's adapter asks for: the batch order and each
    scheduled token's KV slot (block_id * block_size + pos % block_size)."""

    def __init__(self, batch):
        self.batch = batch

    def batch_req_ids(self):
        return list(self.batch.req_ids)

    def step_slots_cpu(self, req_ids, num_scheduled):
        out = [np.zeros(0, np.int64)]
        for rid in req_ids:
            start, blocks = self.batch.computed[rid], np.asarray(self.batch.blocks[rid], np.int64)
            pos = np.arange(start, start + num_scheduled.get(rid, 0))
            out.append(blocks[pos // BS] * BS + pos % BS)
        return np.concatenate(out)


def run(sched, batch, adapter, manager, steps):
    """The engine loop; each saved step goes to the consumer. Returns the
    number of steps saved."""
    reqs = {r.rid: r for r in sched.waiting}
    nsteps = 0
    while sched.waiting or sched.running or sched.preempted:
        so = sched.schedule()
        manager.new_step_starts(adapter.translate_step(so))
        batch.update(so)
        if not so.num_scheduled_tokens:
            if not so.finished_req_ids:
                raise RuntimeError("nothing fits: the pool is too small for a request")
            continue
        layout = adapter.build_write_layout(GroupView(batch), num_scheduled_tokens=so.num_scheduled_tokens)
        manager.prepare_read_plans(layout)
        rows, codes, sampled = [], [], {}
        for w in layout.writes:  # the forward
            r, start, n = reqs[w.req_id], batch.computed[w.req_id], w.row_end - w.row_start
            for p in range(start, start + n):
                rows.append(hidden_row(r.tokens, p))
                codes.append((r.tokens[p], p))
            if start + n == len(r.tokens) and len(r.tokens) < r.prompt + r.max_new:
                sampled[w.req_id] = int(hidden_row(r.tokens, len(r.tokens) - 1)[0]) % 997 + 1
        n = layout.total_rows
        sid = manager.save_outputs(np.stack(rows), {"codes": np.array(codes, np.int64)}, num_tokens_unpadded=n,
                                   num_tokens_padded=n, write_layout=layout)
        steps.put((sid, [w.req_id for w in layout.writes if w.row_end > w.row_start]))
        sched.update(so, sampled)
        nsteps += 1
    return nsteps


def main():
    rng = np.random.default_rng(7)
    shared = list(rng.integers(1, 1000, 12))
    prompts = [shared + list(rng.integers(1, 1000, k)) for k in (5, 3, 9, 2)] + [list(rng.integers(1, 1000, 14))]
    sched, batch = Scheduler(), InputBatch()
    sched.waiting = [Request("req-%d" % i, p, 3 + i % 3) for i, p in enumerate(prompts)]
    reqs = {r.rid: r for r in sched.waiting}
    adapter = vo.PrefixCacheSchedulerAdapter()
    manager = vo.OmniPrefixCacheManager(vo.PrefixCacheConfig(num_blocks=NUM_BLOCKS, block_size=BS))
    got, codes, steps = {}, {}, queue.Queue()

    def consumer():  # vLLM-Omni's async output builder: materializes while the engine runs the next step
        while True:
            item = steps.get()
            if item is None:
                return
            sid, req_ids = item
            out = manager.materialize(sid, req_ids)
            for rid in req_ids:
                got.setdefault(rid, []).extend(out.hidden_states[rid])
                codes.setdefault(rid, []).extend(out.mm_outputs["codes"][rid].tolist())

    t = threading.Thread(target=consumer)
    t.start()
    try:
        nsteps = run(sched, batch, adapter, manager, steps)
    finally:
        steps.put(None)
        t.join()
    bad = [rid for rid, r in reqs.items()
           if not np.array_equal(np.stack(got[rid]), np.stack([hidden_row(r.tokens, p) for p in range(len(r.tokens))]))
           or codes[rid] != [[int(t), p] for p, t in enumerate(r.tokens)]]
    st = manager.stats()
    manager.shutdown()
    print("%d steps, %d requests, %d preempted (%d resumed with a hit): %d hits (%d tokens), %d prefix rows served, "
          "%d rows written; rows %s" % (nsteps, len(reqs), sched.preemptions, sched.resume_hits, st["HitRequests"],
                                       st["HitTokens"], st["HitRowsRead"], st["RowsWritten"],
                                       "exact" if not bad else "WRONG for %s" % bad))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
