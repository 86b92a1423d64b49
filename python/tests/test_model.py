"""Random schedules of the model engine (oracle.Engine) through
omnicache.Cache, checked against the oracle: every materialized row, where
each request's rows start (no gap, no repeat), and that a plan begun and
then abandoned, by abort or by a save that fails, changes nothing."""

import random

import numpy as np
import pytest

import omnicache as oc
from oracle import Delivery, Engine, Mirror, row_bytes, slots

BS, RB = 4, 16
KEYS = [oc.Key("hidden", RB)]
REJECTED = 777  # the content version of a rejected draft's row

# How a begun plan is abandoned: the forward fails (abort), or its save
# fails with the error it must raise.
ABANDON = ["abort", "tokens", "rows", "accepted", "omitted"]


def plan_of(eng, st):
    ids = [s[0] for s in st["sched"]]
    p = oc.Plan(ids=ids, rows=[eng.reqs[i].row for i in ids], start=[s[1] for s in st["sched"]],
                count=[s[2] for s in st["sched"]], table=eng.table.copy(),
                arrivals=st["arrivals"], hit_tokens=st["hit_tokens"], hit_blocks=st["hit_blocks"],
                finished=st["finished"], preempted=st["preempted"], resumed=st["resumed"])
    if st["replaced"]:
        p.set_replaced(list(st["replaced"]), list(st["replaced"].values()))
    return p


def outputs(eng, st):
    """The step's rows (rejected drafts with their own version) and its
    accepted counts (None: every token)."""
    out = [np.zeros((0, RB), np.uint8)]
    for rid, start, n in st["sched"]:
        acc = st["accepted"].get(rid, n)
        ver = eng.reqs[rid].ver
        out += [row_bytes(ver if p < start + acc else REJECTED, rid, p, RB)[None] for p in range(start, start + n)]
    rows = np.concatenate(out) if len(out) > 1 else np.zeros((1, RB), np.uint8)  # a row, not none: the key is there
    acc = [st["accepted"].get(rid, n) for rid, _, n in st["sched"]] if st["accepted"] else None
    return rows, acc


def abandon(c, eng, rng, how):
    """Begins a plan a copy of eng could run now and abandons it as how
    says; the cache's state must not move."""
    alt = eng.copy(rng.randrange(1 << 30))
    st = alt.step()
    before = c.stats()
    c.begin(plan_of(alt, st))
    n = sum(s[2] for s in st["sched"])
    rows, acc = outputs(alt, st)
    if how == "abort":
        c.abort()
    elif how == "tokens":
        with pytest.raises(oc.TokenCountError):
            c.save([rows], tokens=n + 1, accepted=acc)
    elif how == "rows":
        with pytest.raises(oc.OutputsError, match="tensor too small"):
            c.save([rows[:max(n - 1, 0)]], tokens=n if n else 1, accepted=acc)
    elif how == "accepted":
        with pytest.raises(oc.OutputsError, match="accepted count|accepted counts for"):
            c.save([rows], tokens=n, accepted=[s[2] + 1 for s in st["sched"]] or [1])
    else:
        with pytest.raises(oc.OutputsError, match="required"):
            c.save({"hidden": None}, tokens=n)
    after = c.stats()
    for f in ("Steps", "HitRequests", "HitTokens", "LiveRequests"):
        assert after[f] == before[f], (how, f, before[f], after[f])


def run(seed, steps=250, abandon_p=0.25):
    rng = random.Random(seed)
    eng = Engine(random.Random(seed * 7919 + 1))
    c = oc.Cache(KEYS, num_blocks=len(eng.ref), block_size=BS)
    m, d = Mirror(KEYS), Delivery(RB)
    abandoned = {h: 0 for h in ABANDON}
    try:
        for i in range(steps):
            if rng.random() < abandon_p:
                how = ABANDON[i % len(ABANDON)]
                abandon(c, eng, rng, how)
                abandoned[how] += 1
            st = eng.step()
            for rid, at in st["replaced"].items():
                d.restart(rid, at)
            c.begin(plan_of(eng, st))
            rows, acc = outputs(eng, st)
            n = sum(s[2] for s in st["sched"])
            sid = c.save([rows], tokens=n, accepted=acc)
            off = 0
            for rid, start, cnt in st["sched"]:
                a = st["accepted"].get(rid, cnt)
                m.write("hidden", slots(eng.table, eng.reqs[rid].row, start, a, BS), rows[off:off + a])
                off += cnt
            if n == 0:
                c.discard(sid)
                continue
            res = c.materialize(sid)
            check(eng, st, m, res)
            d.take(res, "hidden")
    finally:
        c.close()
    return eng.counts, abandoned


def check(eng, st, m, res):
    """Every delivered row: the hit prefix as the oracle's mirror holds it,
    then the request's own accepted rows of this step."""
    hits, used = {}, 0
    for rid, ht in zip(st["arrivals"], st["hit_tokens"]):
        nb = ht // BS
        hits[rid] = st["hit_blocks"][used:used + nb]
        used += nb
    for i, rid in enumerate(res.ids):
        rid = int(rid)
        _, start, cnt = next(s for s in st["sched"] if s[0] == rid)
        acc = st["accepted"].get(rid, cnt)
        hb = hits.get(rid, [])
        lo = start - len(hb) * BS
        hit_slots = [b * BS + j for b in hb for j in range(BS)]
        full = np.concatenate([m.read("hidden", hit_slots, RB),
                               np.stack([row_bytes(eng.reqs[rid].ver, rid, p, RB) for p in range(start, start + acc)])
                               if acc else np.zeros((0, RB), np.uint8)])
        f, n = int(res.from_[i]), int(res.tokens[i])
        assert lo <= f and f - lo + n <= len(full), (rid, lo, f, n, len(full))
        np.testing.assert_array_equal(res.rows(i, "hidden"), full[f - lo:f - lo + n],
                                      err_msg="request %d: rows from %d" % (rid, f))


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_schedules_with_abandoned_plans(seed):
    """250 steps of random schedules; before about a quarter of them a plan
    the engine could run instead (finishing, preempting, resuming,
    replacing and hitting far more often) is begun and abandoned, by abort
    or by a save that fails in one of four ways."""
    counts, abandoned = run(seed)
    print("seed %d: %s; abandoned: %s" % (seed, counts, abandoned))
    for k in ("hits", "preempts", "resumes", "resume_hits", "replaces", "drafts"):
        assert counts[k] > 0, k
    assert all(abandoned.values()), abandoned


def test_resumes_without_a_hit_after_an_unaligned_length():
    """Across the seeds, requests preempted at a length that is not block
    aligned resume without a hit and recompute a partial block."""
    assert sum(run(seed, steps=250, abandon_p=0)[0]["resumes_unaligned"] for seed in (1, 2, 3)) > 0
