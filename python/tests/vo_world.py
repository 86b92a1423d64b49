"""An engine around omnicache.vllm_omni's manager for the adapter tests:
requests with block lists and positions as vLLM's scheduler keeps them,
events and write layouts built as vLLM-Omni's adapter builds them, rows
that encode (request, position, content version) (oracle.row_bytes), the
rows every slot holds (the oracle mirror) and what each request was
delivered."""

import numpy as np

from omnicache import vllm_omni as vo
from oracle import row_bytes

K = vo.PrefixCacheEventKind
BS, RB = 4, 8


def ev(rid, kind, hit_end=0, blocks=None):
    return vo.PrefixCacheRequestEvent(rid, kind, hit_end=hit_end, block_ids=(tuple(blocks),) if blocks else ())


def slots_of(blocks, start, n, bs=BS):
    return [blocks[p // bs] * bs + p % bs for p in range(start, start + n)]


def layout(*writes):
    """A layout with per-write slots (the older upstream shape):
    writes = (req_id, slots)."""
    ws, row = [], 0
    for rid, slots in writes:
        ws.append(vo.PrefixCacheWrite(rid, row, row + len(slots), tuple(slots)))
        row += len(slots)
    return vo.PrefixCacheWriteLayout(tuple(ws), row)


def rows(seed, start, n, ver=1):
    if n == 0:
        return np.zeros((0, RB), np.uint8)
    return np.stack([row_bytes(ver, seed, p, RB) for p in range(start, start + n)])


class World:
    """One manager; requests by id with their blocks and their position
    (req.pos: tokens computed); mirror: slot -> the row last saved there;
    got: per request the rows delivered, concatenated."""

    def __init__(self, **cfg):
        cfg.setdefault("num_blocks", 64)
        cfg.setdefault("block_size", BS)
        kw = {k: cfg.pop(k) for k in ("prefetch_reads", "keys") if k in cfg}
        self.m = vo.OmniPrefixCacheManager(vo.PrefixCacheConfig(**cfg), **kw)
        self.blocks, self.pos, self.seed, self.ver = {}, {}, {}, {}
        self.mirror = {}
        self.got = {}

    def start(self, rid, blocks, hit=0, seed=None):
        """A new request (its rows' seed: seed, else a fresh one) and its
        STARTED event."""
        self.blocks[rid], self.pos[rid] = list(blocks), hit
        self.seed[rid] = seed if seed is not None else len(self.seed) + 1
        self.ver[rid] = 1
        return ev(rid, K.STARTED, hit, blocks)

    def resume(self, rid, blocks, hit=0):
        """rid was preempted (its blocks freed) and resumes on blocks,
        recomputing from hit."""
        self.blocks[rid], self.pos[rid] = list(blocks), hit
        return ev(rid, K.RESUMED, hit, blocks)

    def finish(self, rid, kind=K.FINISHED):
        return ev(rid, kind)

    def schedule(self, sched):
        """The write layout and the hidden rows of a step scheduling sched
        ({req_id: tokens}, in batch order) from each request's position."""
        lay = layout(*[(rid, slots_of(self.blocks[rid], self.pos[rid], n)) for rid, n in sched.items()])
        h = np.concatenate([rows(self.seed[rid], self.pos[rid], n, self.ver[rid]) for rid, n in sched.items()]
                           or [rows(0, 0, 0)])
        return lay, h

    def step(self, events, sched, prepare=False, hidden=None):
        """One real step: new_step_starts, (prepare_read_plans), save; the
        engine's positions advance and the oracle mirror takes the rows.
        Returns the step id."""
        self.m.new_step_starts(events, num_scheduled_tokens=dict(sched))
        lay, h = self.schedule(sched)
        if prepare:
            self.m.prepare_read_plans(lay)
        n = lay.total_rows
        sid = self.m.save_outputs(h if hidden is None else hidden, {}, num_tokens_unpadded=n, num_tokens_padded=n,
                                  write_layout=lay)
        self.commit(lay, h, sched)
        return sid

    def commit(self, lay, h, sched):
        """The engine's side of a step that ran: positions advance, the
        mirror holds the rows at the step's slots."""
        for w in lay.writes:
            for i, s in enumerate(w.slots):
                self.mirror[s] = h[w.row_start + i]
        for rid, n in sched.items():
            self.pos[rid] += n

    def lost(self, sched):
        """The engine's side of a step whose rows were never saved: its
        positions advance, its slots hold no row anyone may be served."""
        for rid, n in sched.items():
            for s in slots_of(self.blocks[rid], self.pos[rid], n):
                self.mirror[s] = None
            self.pos[rid] += n

    def mat(self, sid, rids):
        """materialize, each request's rows appended to what it got."""
        out = self.m.materialize(sid, list(rids))
        for rid in rids:
            r = out.hidden_states[rid]
            self.got[rid] = np.concatenate([self.got[rid], r]) if rid in self.got else r
        return out

    def want(self, rid, n, start=0):
        return rows(self.seed[rid], start, n, self.ver[rid])

    def held(self, blocks, n):
        """The rows the oracle mirror holds at the first n positions of
        blocks."""
        return np.stack([self.mirror[s] for s in slots_of(blocks, 0, n)])
