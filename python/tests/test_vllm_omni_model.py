"""omnicache.vllm_omni against a model of a vLLM engine and the row oracle,
over random sequences: admissions with and without prefix hits, chunked
prefill, decode, preemption and resume (with a hit on the request's own
cached blocks or none, after any length), finishes and aborts, block
reuse; and in the event API a step's events split over two
new_step_starts calls (the first with no tokens), prepare_read_plans, a
forward that fails and is run again, a save that fails and is retried,
steps consumed one step late. Every request must be delivered exactly its
rows, in order, each once; every hit's prefix is the rows its blocks
hold."""

import random

import numpy as np
import pytest

from omnicache import vllm_omni as vo

K = vo.PrefixCacheEventKind
BS, RB, NB = 4, 8, 48


class Req:
    """seeds: per position, what its row is made of (the prompt's, then the
    generated tokens')."""

    def __init__(self, rid, seeds, prompt):
        self.rid, self.seeds, self.prompt, self.total = rid, seeds, prompt, len(seeds)
        self.blocks, self.done, self.hit = [], 0, 0
        self.high = 0  # the most positions it ever computed (a resume recomputes from its hit)

    def row(self, p):
        s = self.seeds[p]
        return np.array([s, s >> 8, s >> 16, s >> 24, p, p >> 8, 7, 1], np.uint64).astype(np.uint8)


class Engine:
    """Blocks: a free list (freed blocks keep their rows: a hit may reuse
    them until they are allocated again), reference counts, and per block
    its tenant and which of its positions it has written."""

    def __init__(self, rnd):
        self.rnd = rnd
        self.free = list(range(NB))
        self.ref = [0] * NB
        self.tenant = [None] * NB  # the request whose rows the block holds
        self.filled = [0] * NB
        self.reqs, self.running, self.preempted = {}, [], []
        self.n = 0
        self.counts = dict.fromkeys(("steps", "admit_hits", "preempts", "resumes", "resume_hits", "aborts",
                                     "split_events", "prepared", "forward_failed", "save_failed", "late"), 0)

    def alloc(self, k):
        if len(self.free) < k:
            return None
        out = [self.free.pop(0) for _ in range(k)]
        for b in out:
            self.ref[b], self.tenant[b], self.filled[b] = 1, None, 0
        return out

    def release(self, blocks):
        for b in blocks:
            self.ref[b] -= 1
            if self.ref[b] == 0:
                self.free.append(b)

    def cached(self, r, k):
        """How many of r's first k blocks still hold r's rows, whole."""
        n = 0
        for b in r.blocks[:k]:
            if self.tenant[b] is not r or self.filled[b] != BS:
                break
            n += 1
        return n

    def take(self, b):
        if self.ref[b] == 0:
            self.free.remove(b)
        self.ref[b] += 1

    def admit(self):
        rnd = self.rnd
        self.n += 1
        rid = "r%d" % self.n
        src = [r for r in self.reqs.values() if self.cached(r, len(r.blocks))]
        hitk = 0
        seeds = [rnd.randrange(1, 1 << 30) for _ in range(rnd.randint(1, 14))]
        if src and rnd.random() < 0.6:
            w = rnd.choice(src)
            hitk = rnd.randint(1, self.cached(w, len(w.blocks)))
            seeds = w.seeds[:hitk * BS] + seeds  # a prompt that starts as w's: its rows there are w's
        prompt = len(seeds)
        r = Req(rid, seeds + [rnd.randrange(1, 1 << 30) for _ in range(rnd.randint(1, 4))], prompt)
        hit_blocks = list(self.reqs_blocks(src, seeds, hitk)) if hitk else []
        need = -(-r.total // BS) - hitk
        if len(self.free) - sum(1 for b in hit_blocks if self.ref[b] == 0) < need:
            return None
        for b in hit_blocks:
            self.take(b)
        r.blocks = hit_blocks + self.alloc(need)
        r.done = r.hit = hitk * BS
        self.counts["admit_hits"] += hitk > 0
        self.reqs[rid] = r
        self.running.append(rid)
        return vo.PrefixCacheRequestEvent(rid, K.STARTED, hit_end=r.done, block_ids=(tuple(r.blocks),))

    def reqs_blocks(self, src, seeds, k):
        for w in src:
            if w.seeds[:k * BS] == seeds[:k * BS] and self.cached(w, k) >= k:
                return w.blocks[:k]
        raise AssertionError("no source")

    def preempt(self):
        rid = self.rnd.choice(self.running)
        r = self.reqs[rid]
        self.running.remove(rid)
        self.preempted.append(rid)
        self.release(r.blocks)  # freed; they keep r's rows until allocated again
        self.counts["preempts"] += 1

    def resume(self):
        rid = self.preempted[0]
        r = self.reqs[rid]
        k = min(self.cached(r, len(r.blocks)), (r.done - 1) // BS) if self.rnd.random() < 0.5 else 0
        hit = r.blocks[:k]
        need = -(-r.total // BS) - k
        if len(self.free) - sum(1 for b in hit if self.ref[b] == 0) < need:
            return None
        for b in hit:
            self.take(b)
        r.blocks = hit + self.alloc(need)
        r.done = k * BS  # recomputes from its hit (a length that need not be block aligned before)
        self.counts["resumes"] += 1
        self.counts["resume_hits"] += k > 0
        self.preempted.pop(0)
        self.running.append(rid)
        return vo.PrefixCacheRequestEvent(rid, K.RESUMED, hit_end=r.done, block_ids=(tuple(r.blocks),))

    def end(self, rid, kind):
        r = self.reqs.pop(rid)
        if rid in self.running:
            self.running.remove(rid)
            self.release(r.blocks)
        else:
            self.preempted.remove(rid)
        return vo.PrefixCacheRequestEvent(rid, kind)


def run(seed, steps=70):
    rnd = random.Random(seed)
    e = Engine(rnd)
    m = vo.OmniPrefixCacheManager(vo.PrefixCacheConfig(num_blocks=NB, block_size=BS, staging_depth=3),
                                  prefetch_reads=rnd.random() < 0.7)
    got, late = {}, []
    reqs_ever = {}

    def consume(sid, order):
        out = m.materialize(sid, order)
        for rid in order:
            r = reqs_ever[rid]
            have = got.get(rid, np.zeros((0, RB), np.uint8))
            got[rid] = np.concatenate([have, out.hidden_states[rid]])
            want = np.stack([r.row(p) for p in range(len(got[rid]))]) if len(got[rid]) else got[rid]
            assert np.array_equal(got[rid], want), "seed %d: %s delivered wrong or repeated rows" % (seed, rid)

    for _ in range(steps):
        events = []
        for rid in list(e.running):
            if e.reqs[rid].done >= e.reqs[rid].total:
                events.append(e.end(rid, K.FINISHED))
        if e.running and rnd.random() < 0.05:
            events.append(e.end(rnd.choice(e.running), K.ABORTED))
            e.counts["aborts"] += 1
        if len(e.running) > 1 and rnd.random() < 0.15:
            e.preempt()
        if e.preempted and rnd.random() < 0.5:
            ev = e.resume()
            if ev is not None:
                events.append(ev)
        if len(e.running) < 4 and rnd.random() < 0.6:
            ev = e.admit()
            if ev is not None:
                events.append(ev)
                reqs_ever[ev.req_id] = e.reqs[ev.req_id]
        sched = {}
        for rid in e.running:
            r = e.reqs[rid]
            if r.done < r.total:
                sched[rid] = min(r.total - r.done, rnd.randint(1, 6)) if r.done < r.prompt else 1
        if rnd.random() < 0.2 and events:  # the events over two calls, the first a step with no tokens
            cut = rnd.randint(0, len(events))
            e.counts["split_events"] += 1
            m.new_step_starts(events[:cut], num_scheduled_tokens={})
            events = events[cut:]
        m.new_step_starts(events, num_scheduled_tokens=sched)
        if not sched:
            continue
        order = list(sched)
        slots = [r_b * BS + p % BS for rid in order for p in range(e.reqs[rid].done, e.reqs[rid].done + sched[rid])
                 for r_b in [e.reqs[rid].blocks[p // BS]]]
        writes, row = [], 0
        for rid in order:
            writes.append(vo.PrefixCacheWrite(rid, row, row + sched[rid]))
            row += sched[rid]
        lay = vo.PrefixCacheWriteLayout(tuple(writes), row, np.array(slots, np.int64))
        h = np.stack([e.reqs[rid].row(p) for rid in order
                      for p in range(e.reqs[rid].done, e.reqs[rid].done + sched[rid])])
        if rnd.random() < 0.5:
            m.prepare_read_plans(lay)
            e.counts["prepared"] += 1
            if rnd.random() < 0.1:
                m.abort_prepared_step()  # the forward failed; it runs again
                e.counts["forward_failed"] += 1
        if rnd.random() < 0.1:  # a save that fails (a row missing, or the rows' dtype changed) and is retried
            bad = h.view(np.int16) if m._core is not None and rnd.random() < 0.5 else h[:-1]
            e.counts["save_failed"] += 1
            with pytest.raises(vo.OmniPrefixCacheUnmatchError):
                m.save_outputs(bad, {}, num_tokens_unpadded=row, num_tokens_padded=row, write_layout=lay)
        while len(late) >= 2:  # a staging page each: consume before the pages run out
            consume(*late.pop(0))
        sid = m.save_outputs(h, {}, num_tokens_unpadded=row, num_tokens_padded=row, write_layout=lay)
        for rid in order:
            r = e.reqs[rid]
            for p in range(r.done, r.done + sched[rid]):
                b = r.blocks[p // BS]
                if e.tenant[b] is not r:
                    e.tenant[b], e.filled[b] = r, 0
                e.filled[b] = max(e.filled[b], p % BS + 1)
            r.done += sched[rid]
            r.high = max(r.high, r.done)
        late.append((sid, order))
        e.counts["steps"] += 1
        if rnd.random() < 0.6:
            consume(*late.pop(0))
        else:
            e.counts["late"] += 1
    for sid, order in late:
        consume(sid, order)
    for rid, r in reqs_ever.items():  # everything computed was delivered (each row once: checked above)
        assert len(got.get(rid, ())) == r.high, "seed %d: %s delivered %d of %d rows" % (seed, rid, len(got.get(
            rid, ())), r.high)
    assert m.stats()["HitRequests"] == e.counts["admit_hits"] + e.counts["resume_hits"]
    m.shutdown()
    return e.counts


def test_random_engine_sequences():
    total = {}
    for seed in range(60):
        for k, v in run(seed).items():
            total[k] = total.get(k, 0) + v
    print(total)
    for k, v in total.items():  # every case ran, many times
        assert v >= 20, (k, total)
