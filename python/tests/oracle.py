"""A Python model of what the cache must return (the test oracle), and a
model engine that drives a cache through random schedules."""

import copy
import random

import numpy as np


def slots(table, row, start, count, bs):
    pos = np.arange(start, start + count)
    return table[row, pos // bs].astype(np.int64) * bs + pos % bs


def row_bytes(key_seed, req, pos, rb):
    """A deterministic row for (key, request, position)."""
    x = (np.uint64(key_seed) * np.uint64(1000003) + np.uint64(req) * np.uint64(7919) + np.uint64(pos)) * np.uint64(2654435761)
    return np.frombuffer(np.full(rb // 8 + 1, x, dtype=np.uint64).tobytes()[:rb], dtype=np.uint8)


class Mirror:
    """Committed rows by (key, slot); absent optional rows read as zeros."""

    def __init__(self, keys):
        self.keys = keys
        self.rows = {k.name: {} for k in keys}

    def write(self, key, slot_list, data):
        for s, r in zip(slot_list, data):
            self.rows[key][int(s)] = bytes(r)

    def omit(self, key, slot_list):
        for s in slot_list:
            self.rows[key].pop(int(s), None)

    def read(self, key, slot_list, rb):
        out = np.zeros((len(slot_list), rb), np.uint8)
        for i, s in enumerate(slot_list):
            r = self.rows[key].get(int(s))
            if r is not None:
                out[i] = np.frombuffer(r, np.uint8)
        return out


class Delivery:
    """What materialize delivered to each request, in order, and the
    position its delivery is at (omnicache.Result.From): a request's rows
    continue where its last delivery stopped, with no gap and no repeat,
    except after a replace (restart)."""

    def __init__(self, rb):
        self.rb = rb
        self.got = {}  # request -> delivered rows, concatenated
        self.at = {}  # request -> the position delivery is at

    def take(self, res, key):
        for i, rid in enumerate(res.ids):
            rid, n = int(rid), int(res.tokens[i])
            if n == 0:
                continue
            assert int(res.from_[i]) == self.at.get(rid, 0), \
                "request %d delivered from %d, delivery is at %d" % (rid, res.from_[i], self.at.get(rid, 0))
            self.got[rid] = np.concatenate([self.got.get(rid, np.zeros((0, self.rb), np.uint8)), res.rows(i, key)])
            self.at[rid] = self.at.get(rid, 0) + n

    def restart(self, rid, pos):
        """rid's tokens from pos on were replaced: delivery restarts there."""
        self.got[rid] = self.got[rid][:pos]
        self.at[rid] = pos


class Req:
    """A request of the model engine."""

    def __init__(self, rid, prompt, total, row):
        self.id, self.prompt, self.total, self.row = rid, prompt, total, row
        self.done = 0  # positions computed
        self.blocks = []
        self.shared = 0  # tokens of its leading blocks that came from a hit
        self.ver = 0  # content version: bumped by a recompute (resume, replace)
        self.preempted_at = 0


class Engine:
    """A model inference engine over one omnicache.Cache (a scheduler with a
    KV block manager: ref-counted blocks, a least-recently-used free list
    whose full blocks stay hittable until reused). step() generates one
    step: finishes and aborts, a preemption (recompute from 0 later), a
    resume (with a hit on cached blocks, or none), a replaced prompt,
    chunked prefills, decodes with drafts, arrivals hitting cached blocks.
    copy(seed) is the same engine drawing from its own seed and taking
    every event far more often: a plan it could run instead, to begin and
    abandon."""

    def __init__(self, rng, nblocks=48, bs=4, stride=8, budget=24, chunk=6, max_running=4):
        self.rng, self.bs, self.stride, self.budget, self.chunk = rng, bs, stride, budget, chunk
        self.max_running = max_running
        self.ref = [0] * nblocks
        self.filled = [0] * nblocks  # positions the block's current tenant wrote
        self.free = list(range(nblocks))
        self.reqs = {}
        self.running, self.preempted, self.complete = [], [], []
        self.rows_free = list(range(16))
        self.table = np.zeros((16, stride), np.int32)
        self.next_id = 1
        self.eager = False
        self.counts = {"hits": 0, "hit_tokens": 0, "preempts": 0, "resumes": 0, "resume_hits": 0,
                       "resumes_unaligned": 0, "replaces": 0, "drafts": 0, "aborts": 0}

    def copy(self, seed):
        e = copy.deepcopy(self)
        e.rng = random.Random(seed)
        e.eager = True
        return e

    def hittable(self):
        return [b for b in range(len(self.filled)) if self.filled[b] == self.bs]

    def _take(self, hit, n):
        """Takes the hit blocks and n fresh ones (LRU first), or None."""
        free_after = len(self.free) - sum(1 for b in hit if self.ref[b] == 0)
        if free_after < n:
            return None
        for b in hit:
            if self.ref[b] == 0:
                self.free.remove(b)
            self.ref[b] += 1
        fresh = [b for b in self.free if b not in hit][:n]
        for b in fresh:
            self.free.remove(b)
            self.ref[b], self.filled[b] = 1, 0
        return list(hit) + fresh

    def _release(self, r):
        for b in r.blocks:
            self.ref[b] -= 1
            if self.ref[b] == 0:
                self.free.append(b)
        r.blocks = []

    def _set_row(self, r):
        self.table[r.row, :] = 0
        self.table[r.row, :len(r.blocks)] = r.blocks

    def _hit(self, most):
        hb = self.hittable()
        self.rng.shuffle(hb)
        return hb[:min(most, len(hb))]

    def step(self):
        """One step: a dict of the plan's parts, the tokens per request,
        the accepted counts, and per scheduled request (start, count)."""
        rng, bs = self.rng, self.bs
        p_abort, p_preempt, p_resume, p_replace = (0.2, 0.6, 0.9, 0.6) if self.eager else (0.03, 0.06, 0.4, 0.05)
        st = {"finished": [], "preempted": [], "resumed": [], "arrivals": [], "hit_tokens": [], "hit_blocks": [],
              "replaced": {}, "sched": [], "accepted": {}}
        for rid in self.complete:
            self._finish(st, rid)
        self.complete = []
        for rid in self.running + self.preempted:
            if rng.random() < p_abort:
                self._finish(st, rid)
                self.counts["aborts"] += 1
        if self.running and rng.random() < p_preempt:
            r = self.reqs[rng.choice(self.running)]
            self._release(r)
            r.prompt, r.preempted_at, r.done = max(r.prompt, r.done), r.done, 0
            self.running.remove(r.id)
            self.preempted.append(r.id)
            st["preempted"].append(r.id)
            self.counts["preempts"] += 1
        if self.preempted and len(self.running) < self.max_running and rng.random() < p_resume:
            r = self.reqs[self.preempted[0]]
            if r.id not in st["preempted"]:
                hit = self._hit(min(self.counts["resumes"] % 3, (r.prompt - 1) // bs))
                bl = self._take(hit, -(-r.total // bs) - len(hit))
                if bl is not None:
                    r.blocks, r.done, r.shared, r.ver = bl, len(hit) * bs, len(hit) * bs, r.ver + 1
                    self._set_row(r)
                    self.preempted.pop(0)
                    self.running.append(r.id)
                    st["resumed"].append(r.id)
                    self.counts["resumes"] += 1
                    if hit:
                        st["arrivals"].append(r.id)
                        st["hit_tokens"].append(len(hit) * bs)
                        st["hit_blocks"] += hit
                        self.counts["resume_hits"] += 1
                    elif r.preempted_at % bs:
                        self.counts["resumes_unaligned"] += 1
        if self.running and rng.random() < p_replace:
            r = self.reqs[rng.choice(self.running)]
            if r.done > r.shared and r.id not in st["resumed"]:
                at = rng.randint(r.shared, r.done)
                for pos in range(at, r.done):
                    self.filled[r.blocks[pos // bs]] -= 1
                r.done, r.ver = at, r.ver + 1
                st["replaced"][r.id] = at
                self.counts["replaces"] += 1
        budget = self.budget
        for rid in self.running:
            budget -= self._schedule(st, self.reqs[rid], budget)
        for _ in range(2):
            if len(self.running) >= self.max_running or budget <= 0 or rng.random() >= 0.5:
                continue
            prompt = 1 + rng.randrange(min(20, self.stride * bs - 1))
            total = min(prompt + 1 + rng.randrange(12), self.stride * bs)
            hit = self._hit((prompt - 1) // bs) if rng.random() < 0.6 else []
            if hit:
                hit = hit[:1 + rng.randrange(len(hit))]
            bl = self._take(hit, -(-total // bs) - len(hit)) if self.rows_free else None
            if bl is None:
                continue
            r = Req(self.next_id, prompt, total, self.rows_free.pop(0))
            self.next_id += 1
            r.blocks, r.done, r.shared = bl, len(hit) * bs, len(hit) * bs
            self._set_row(r)
            self.reqs[r.id] = r
            self.running.append(r.id)
            st["arrivals"].append(r.id)
            st["hit_tokens"].append(len(hit) * bs)
            st["hit_blocks"] += hit
            if hit:
                self.counts["hits"] += 1
                self.counts["hit_tokens"] += len(hit) * bs
            budget -= self._schedule(st, r, budget)
        for rid in self.running:
            r = self.reqs[rid]
            if r.done == r.total:
                self.complete.append(rid)
        return st

    def _finish(self, st, rid):
        r = self.reqs.pop(rid)
        self._release(r)
        for lst in (self.running, self.preempted):
            if rid in lst:
                lst.remove(rid)
        self.rows_free.append(r.row)
        st["finished"].append(rid)

    def _schedule(self, st, r, budget):
        """Schedules r's next chunk (a prefill chunk, or a decode token with
        drafts now and then); returns the tokens it took."""
        n = min(r.prompt - r.done, self.chunk) if r.done < r.prompt else 1
        acc = None
        if r.done >= r.prompt and self.rng.random() < 0.15:
            n = 1 + self.rng.randrange(1, 3)  # a token and drafts
            acc = self.rng.randrange(1, n + 1)
        n = min(n, budget, r.total - r.done)
        if n <= 0:
            return 0
        if acc is not None:
            acc = min(acc, n)
            st["accepted"][r.id] = acc
            self.counts["drafts"] += n - acc
        st["sched"].append((r.id, r.done, n))
        for pos in range(r.done, r.done + (n if acc is None else acc)):
            self.filled[r.blocks[pos // self.bs]] += 1
        r.done += n if acc is None else acc
        return n
