"""Speculative decoding (Outputs.accepted), replaced prompts
(Plan.replaced / replaced_from) and where each request's rows start
(Result.from_), against the oracle: the rows a request receives, in order,
are its rows with no gap and no repeat, and a hit serves exactly what the
oracle's mirror holds."""

import numpy as np
import pytest

import omnicache as oc
from oracle import Delivery, Mirror, row_bytes, slots

BS, RB, STRIDE = 4, 8, 8
KEYS = [oc.Key("hidden", RB)]
# request r owns blocks 4(r-1)..4(r-1)+3, on table row r-1
TABLE = np.array([[r * 4 + j % 4 for j in range(STRIDE)] for r in range(8)], dtype=np.int32)
REJECTED = 99  # the content version of a rejected draft's row


def new_cache():
    return oc.Cache(KEYS, num_blocks=32, block_size=BS)


def rows(req, start, n, ver):
    return np.stack([row_bytes(ver, req, p, RB) for p in range(start, start + n)]) if n else np.zeros((0, RB), np.uint8)


def want(req, n, ver=lambda pos: 1):
    return np.concatenate([rows(req, p, 1, ver(p)) for p in range(n)])


class World:
    """One cache, its oracle mirror and what it delivered."""

    def __init__(self):
        self.c = new_cache()
        self.m = Mirror(KEYS)
        self.d = Delivery(RB)

    def step(self, req, start, n, ver=1, accepted=None, hit_blocks=None, arrive=False, **plan):
        """Begins and saves one request's step of n tokens from start
        (accepted of them, None: all); returns the step id and the rows
        the mirror holds afterwards (accepted ones only)."""
        hit = 4 * len(hit_blocks or ())
        p = oc.Plan(ids=[req], rows=[req - 1], start=[start], count=[n], table=TABLE, **plan)
        if arrive:
            p.set_arrivals([req], [hit], hit_blocks or [])
        self.c.begin(p)
        a = n if accepted is None else accepted
        h = np.concatenate([rows(req, start, a, ver), rows(req, start + a, n - a, REJECTED)])
        sid = self.c.save(oc.Outputs(self.c, [h], tokens=n, accepted=None if accepted is None else [accepted]))
        self.m.write("hidden", slots(TABLE, req - 1, start, a, BS), h[:a])
        return sid

    def mat(self, sid):
        r = self.c.materialize(sid)
        self.d.take(r, "hidden")
        return r


def test_accepted_rows():
    """Rejected drafts' rows are never delivered nor served by a hit; the
    accepted ones are, and a hit over a rejected draft's slot fails until
    the slot is written again."""
    w = World()
    r = w.mat(w.step(1, 0, 4, arrive=True))
    assert list(r.from_) == [0] and list(r.tokens) == [4]
    # positions 4..6 scheduled (one token and two drafts), two accepted
    r = w.mat(w.step(1, 4, 3, accepted=2))
    assert list(r.from_) == [4] and list(r.tokens) == [2]
    np.testing.assert_array_equal(r.rows(0, "hidden"), rows(1, 4, 2, 1))
    # request 2 hits request 1's blocks 0 and 1 (position 6 a rejected
    # draft's slot, 7 never written): not served, the rejected row nowhere
    sid = w.step(2, 8, 1, arrive=True, hit_blocks=[0, 1])
    with pytest.raises((oc.ReassignedError, oc.AbsentRequiredError)) as e:
        w.c.materialize(sid)
    assert e.value.failed == [2]
    got = e.value.result.rows(0, "hidden")
    assert not any((got == rows(1, 6, 1, REJECTED)[0]).all(axis=1))
    # request 1 goes on from 6: 6 and 7 accepted, then drafts rejecting all
    # but the first token, then all of them
    w.mat(w.step(1, 6, 2, accepted=2))
    r = w.mat(w.step(1, 8, 4, accepted=1))
    assert list(r.tokens) == [1] and list(r.from_) == [8]
    r = w.mat(w.step(1, 9, 3, accepted=0))
    assert list(r.tokens) == [0]
    np.testing.assert_array_equal(w.d.got[1], want(1, 9))
    # block 1 is now written whole with accepted rows: a hit serves them
    r = w.mat(w.step(3, 8, 1, arrive=True, hit_blocks=[0, 1]))
    assert list(r.prefix) == [8] and list(r.tokens) == [9] and list(r.from_) == [0]
    hit = slots(TABLE, 0, 0, 8, BS)
    np.testing.assert_array_equal(r.rows(0, "hidden")[:8], w.m.read("hidden", hit, RB))
    np.testing.assert_array_equal(r.rows(0, "hidden"), np.concatenate([want(1, 8), rows(3, 8, 1, 1)]))
    w.c.close()


def test_accepted_refused():
    """Accepted counts outside [0, count] or not one per request are
    OutputsError and the step can be saved again; a wrong dtype is refused
    in Python; save(dict, accepted=...) applies to that save only."""
    c = new_cache()
    for bad in ([4], [-1], [1, 1]):
        c.begin(ids=[1], rows=[0], start=[0], count=[3], table=TABLE, arrivals=[1])
        with pytest.raises(oc.OutputsError):
            c.save([rows(1, 0, 3, 1)], accepted=bad)
    assert c.stats()["Steps"] == 0 and c.stats()["LiveRequests"] == 0
    with pytest.raises(TypeError, match="accepted"):
        oc.Outputs(c, accepted=np.array([1], np.int64))
    c.begin(ids=[1], rows=[0], start=[0], count=[3], table=TABLE, arrivals=[1])
    r = c.materialize(c.save([rows(1, 0, 3, 1)], accepted=[2]))
    assert list(r.tokens) == [2]
    c.begin(ids=[1], rows=[0], start=[2], count=[2], table=TABLE)
    r = c.materialize(c.save([rows(1, 2, 2, 1)]))  # every token accepted again
    assert list(r.tokens) == [2] and list(r.from_) == [2]
    np.testing.assert_array_equal(r.rows(0, "hidden"), rows(1, 2, 2, 1))
    c.close()


def test_replaced_prompt():
    """A replace from position 6: a step saved before delivers none of the
    replaced rows, delivery restarts at 6 with the new content, a hit
    serves the new rows; a replace of a request not live, past its length
    or with lengths that disagree is refused and changes nothing."""
    w = World()
    w.mat(w.step(1, 0, 8, arrive=True))
    late = w.step(1, 8, 1)  # consumed after the replace
    before = w.c.stats()
    for ids, at, err in (([7], [0], oc.PlanError), ([1], [10], oc.PlanError), ([1], [-1], oc.PlanError)):
        with pytest.raises(err):
            w.c.begin(oc.Plan(table=TABLE, replaced=ids, replaced_from=at))
    with pytest.raises(ValueError, match="1 replaced, 2 replaced_from: want one length"):
        oc.Plan(replaced=[1], replaced_from=[1, 2])
    after = w.c.stats()
    for f in ("Steps", "WriteTasks", "BufferedSteps", "LiveRequests"):
        assert before[f] == after[f], f
    sid = w.step(1, 6, 4, ver=2, replaced=[1], replaced_from=[6])
    r = w.c.materialize(late)
    assert list(r.ids) == [1] and list(r.tokens) == [0]
    w.d.restart(1, 6)
    r = w.mat(sid)
    assert list(r.from_) == [6] and list(r.tokens) == [4]
    np.testing.assert_array_equal(w.d.got[1], want(1, 10, lambda p: 2 if p >= 6 else 1))
    r = w.mat(w.step(2, 8, 1, arrive=True, hit_blocks=[0, 1]))
    assert list(r.prefix) == [8] and list(r.from_) == [0]
    np.testing.assert_array_equal(r.rows(0, "hidden")[:8], w.m.read("hidden", slots(TABLE, 0, 0, 8, BS), RB))
    np.testing.assert_array_equal(r.rows(0, "hidden")[:8], want(1, 8, lambda p: 2 if p >= 6 else 1))
    w.c.close()


def test_plan_replaced_fields():
    p = oc.Plan(replaced=np.array([3], np.int64), replaced_from=np.array([4], np.int32))
    assert list(p.replaced) == [3] and list(p.replaced_from) == [4]
    p.clear_events()
    assert p.replaced is None and p.replaced_from is None
