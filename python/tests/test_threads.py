"""The GIL is released while a call waits; calls from other threads; Close
with calls in flight; fork and spawn."""

import multiprocessing
import os
import select
import signal
import threading
import time

import numpy as np
import pytest

import omnicache as oc

TABLE = np.arange(64, dtype=np.int32).reshape(8, 8)


def cache(**kw):
    return oc.Cache([oc.Key("hidden", 16)], num_blocks=64, block_size=4, decode_buffer=False, **kw)


def step(c, rid, row):
    c.begin(ids=[rid], rows=[row], start=[0], count=[4], table=TABLE, arrivals=[rid])
    return c.save({"hidden": np.full((4, 16), rid, np.uint8)})


class Counter(threading.Thread):
    def __init__(self):
        super().__init__(daemon=True)
        self.n, self.stop = 0, False

    def run(self):
        while not self.stop:
            self.n += 1


def test_save_waiting_for_a_page_releases_the_gil():
    c = cache(staging_depth=1, staging_claim_timeout_s=10)
    first = step(c, 1, 0)
    cnt = Counter()
    cnt.start()
    threading.Timer(0.3, c.discard, args=(first,)).start()
    t0 = time.monotonic()
    n0 = cnt.n
    second = step(c, 2, 1)  # waits in Go for the page the discard frees
    waited = time.monotonic() - t0
    ran = cnt.n - n0
    cnt.stop = True
    assert waited >= 0.25
    assert ran > 10000, "the counter thread ran %d times while save waited" % ran
    assert c.materialize(second).rows(0, "hidden").min() == 2
    c.close()


def test_save_times_out_waiting():
    c = cache(staging_depth=1, staging_claim_timeout_s=0.2)
    first = step(c, 1, 0)
    t0 = time.monotonic()
    with pytest.raises(oc.StagingTimeoutError) as ei:
        step(c, 2, 1)
    assert 0.15 <= time.monotonic() - t0 < 5
    assert ei.value.unconsumed == [first]
    c.close()


def test_materialize_from_another_thread():
    c = cache()
    ids = [step(c, r, r) for r in range(1, 4)]
    out = {}

    def consume():
        for sid in ids:
            out[sid] = c.materialize(sid)

    t = threading.Thread(target=consume)
    t.start()
    t.join(10)
    assert not t.is_alive()
    for r, sid in enumerate(ids, 1):
        assert out[sid].rows(0, "hidden").min() == r and out[sid].rows(0, "hidden").max() == r
    c.close()


def test_concurrent_materialize_while_the_engine_steps():
    c = cache(staging_depth=8)
    q, errs, done = [], [], threading.Event()
    lock = threading.Lock()

    def consumer():
        while not done.is_set() or q:
            with lock:
                sid = q.pop(0) if q else None
            if sid is None:
                time.sleep(0.0005)
                continue
            try:
                r, rid = c.materialize(sid[0]), sid[1]
                if r.rows(0, "hidden").min() != rid % 256:
                    errs.append(("rows", rid))
            except Exception as e:  # pragma: no cover
                errs.append(e)

    t = threading.Thread(target=consumer)
    t.start()
    for rid in range(1, 200):
        c.begin(ids=[rid], rows=[rid % 8], start=[0], count=[4], table=TABLE, arrivals=[rid],
                finished=[rid - 1] if rid > 1 else None)
        sid = c.save({"hidden": np.full((4, 16), rid % 256, np.uint8)})
        with lock:
            q.append((sid, rid))
        while len(q) > 4:
            time.sleep(0.0002)
    done.set()
    t.join(10)
    assert not errs
    c.close()


def test_close_with_calls_in_flight():
    c = cache(staging_depth=1, staging_claim_timeout_s=30)
    step(c, 1, 0)  # holds the only page
    got = []

    def blocked_save():
        try:
            step(c, 2, 1)
            got.append("saved")
        except oc.OmnicacheError as e:
            got.append(e)

    t = threading.Thread(target=blocked_save)
    t.start()
    time.sleep(0.2)
    assert t.is_alive()  # waiting in Go for a page, GIL released
    t0 = time.monotonic()
    c.close()
    t.join(5)
    assert not t.is_alive() and time.monotonic() - t0 < 5
    assert isinstance(got[0], oc.ClosedError), got
    with pytest.raises(oc.ClosedError):
        c.sync()


def test_close_races_materialize():
    for _ in range(20):
        c = cache(staging_depth=8)
        ids = [step(c, r, r % 8) for r in range(1, 6)]
        errs = []

        def consume():
            for sid in ids:
                try:
                    c.materialize(sid)
                except oc.ClosedError:
                    pass
                except Exception as e:  # pragma: no cover
                    errs.append(e)

        t = threading.Thread(target=consume)
        t.start()
        c.close()
        t.join(5)
        assert not t.is_alive() and not errs


def test_forked_child_fails_fast():
    c = cache()  # the library is loaded in this process
    step(c, 1, 0)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never return into pytest
        try:
            os.close(r)
            t0 = time.monotonic()
            msg = "no error"
            try:
                c.sync()
            except oc.ForkedError as e:
                msg = "forked %.3f %s" % (time.monotonic() - t0, e)
            except BaseException as e:
                msg = "other %r" % (e,)
            try:
                oc.Cache([oc.Key("h", 4)], num_blocks=4, block_size=4)
            except oc.ForkedError:
                msg += " | new refused"
            os.write(w, msg.encode())
        finally:
            os._exit(0)
    os.close(w)
    ready, _, _ = select.select([r], [], [], 5)
    if not ready:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        pytest.fail("the forked child hung on its first call")
    msg = os.read(r, 4096).decode()
    os.close(r)
    os.waitpid(pid, 0)
    assert msg.startswith("forked "), msg
    assert float(msg.split()[1]) < 1.0
    assert "forked after the library was loaded" in msg and msg.endswith("| new refused")
    c.sync()  # the parent is unaffected
    c.close()


def spawned_child(q):
    import numpy as np
    import omnicache as oc

    c = oc.Cache([oc.Key("hidden", 16)], num_blocks=64, block_size=4)
    c.begin(ids=[1], rows=[0], start=[0], count=[4], table=np.arange(8, dtype=np.int32).reshape(1, 8),
            arrivals=[1])
    sid = c.save({"hidden": np.full((4, 16), 7, np.uint8)})
    q.put(int(c.materialize(sid).rows(0, "hidden").sum()))
    c.close()


def test_spawned_child_works():
    c = cache()  # loaded in the parent too
    ctx = multiprocessing.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=spawned_child, args=(q,))
    p.start()
    try:
        got = q.get(timeout=60)
    finally:
        p.join(30)
    assert got == 4 * 16 * 7 and p.exitcode == 0
    c.close()
