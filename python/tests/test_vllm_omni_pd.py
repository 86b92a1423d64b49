"""Prefill/decode disaggregation through the tier: a prefill cache publishes
a prompt's full blocks and waits for them (wait_published); a decode
cache, whose KV for those blocks came from outside, imports their rows
(the arrival's tier blocks). Through the core and through the adapter, over
an embedded store the two caches share ("embedded://NAME"); a block the
tier lost fails its request with a typed error, the others are served."""

import itertools

import numpy as np
import pytest

import omnicache as oc
from omnicache import vllm_omni as vo
from vo_world import BS, K, layout, rows, slots_of

_names = itertools.count()


def store():
    """A fresh shared store's spec (the process keeps it while a cache
    holds it)."""
    return "embedded://pd-%d" % next(_names)


HASHES = np.array([101, 102, 103], np.uint64)  # a 14-token prompt's full blocks (block size 4)


def pair(spec=None):
    spec = spec or store()
    keys = [oc.Key("hidden", 8)]
    pre = oc.Cache(keys, num_blocks=32, block_size=BS, tier=spec, tier_model="m", publish_barrier=True)
    return pre, oc.Cache(keys, num_blocks=32, block_size=BS, tier=spec, tier_model="m", tier_import_timeout_s=0.5)


def prefill(pre, h):
    """Request 1 computes its 14-token prompt on blocks 2, 5, 7, 9 and
    publishes its 3 full blocks."""
    pre.begin(ids=[1], rows=[0], start=[0], count=[14], table=[[2, 5, 7, 9]], arrivals=[1], hit_tokens=[0],
              full_blocks=[2, 5, 7], full_hashes=HASHES)
    pre.materialize(pre.save([h]))


def test_core_prompt_rows_through_the_tier():
    pre, dec = pair()
    with pre, dec:
        h = rows(1, 0, 14)
        prefill(pre, h)
        pre.wait_published(HASHES, 5.0)
        pre.wait_published(HASHES, 0)  # stored: no wait needed
        # the decode side: the KV of the prompt's full blocks was loaded into
        # its blocks 10, 3, 0: a hit of 12 tokens, all tier blocks; it computes
        # the last 2 prompt tokens and the first output token
        dec.begin(ids=[7], rows=[0], start=[12], count=[3], table=[[10, 3, 0, 1]], arrivals=[7], hit_tokens=[12],
                  hit_blocks=[10, 3, 0], tier_blocks=[3], tier_hashes=HASHES)
        h2 = rows(1, 12, 3)
        r = dec.materialize(dec.save([h2]))
        assert list(r.prefix) == [12] and list(r.tokens) == [15]
        np.testing.assert_array_equal(r.rows(0, "hidden"), np.concatenate([h[:12], h2]))
        st = dec.stats()
        assert st["TierImported"] == 3 and st["TierImportFailed"] == 0


def test_core_wait_published_errors():
    pre, dec = pair()
    with pre, dec:
        with pytest.raises(oc.NotPublishedError, match="never noted"):
            pre.wait_published([12345], 1.0)
        with pytest.raises(oc.ConfigError, match="PublishBarrier"):
            dec.wait_published(HASHES, 1.0)
        with pytest.raises(oc.ArgumentError):
            pre.wait_published(HASHES, -1)
    with pytest.raises(oc.ConfigError, match="without a tier"):
        oc.Cache([oc.Key("hidden", 8)], num_blocks=8, block_size=BS, publish_barrier=True)
    with pytest.raises(oc.ConfigError, match="names no store"):
        oc.Cache([oc.Key("hidden", 8)], num_blocks=8, block_size=BS, tier="embedded://")
    assert issubclass(oc.WaitTimeoutError, TimeoutError) and oc.ERRORS[108] is oc.WaitTimeoutError


def test_core_lost_rows_fail_typed():
    """The tier is flushed between the sides (a third cache of the store
    purges the namespace: Cache.reset(purge_tier=True)): the decode request
    fails with TierMissError, its rows zeros, never another's; a request
    beside it is served exact."""
    spec = store()
    pre, dec = pair(spec)
    with pre, dec:
        prefill(pre, rows(1, 0, 14))
        pre.wait_published(HASHES, 5.0)
        with oc.Cache([oc.Key("hidden", 8)], num_blocks=8, block_size=BS, tier=spec, tier_model="m") as flusher:
            flusher.reset(purge_tier=True)
        dec.begin(ids=[7, 8], rows=[0, 1], start=[12, 0], count=[3, 4], table=[[10, 3, 0, 1], [4, 6, 8, 11]],
                  arrivals=[7, 8], hit_tokens=[12, 0], hit_blocks=[10, 3, 0], tier_blocks=[3, 0], tier_hashes=HASHES)
        h2 = np.concatenate([rows(1, 12, 3), rows(2, 0, 4)])
        with pytest.raises(oc.TierMissError) as e:
            dec.materialize(dec.save([h2]))
        assert e.value.failed == [7]
        r = e.value.result
        assert not r.rows(0, "hidden").any() and isinstance(r.error(0), oc.TierMissError) and r.error(1) is None
        np.testing.assert_array_equal(r.rows(1, "hidden"), rows(2, 0, 4))
        assert dec.stats()["TierImportFailed"] == 3


def managers(spec=None):
    spec = spec or store()
    cfg = dict(num_blocks=32, block_size=BS, tier=spec, tier_model="m")
    return (vo.OmniPrefixCacheManager(vo.PrefixCacheConfig(publish_barrier=True, **cfg)),
            vo.OmniPrefixCacheManager(vo.PrefixCacheConfig(tier_import_timeout_s=0.5, **cfg)))


def save(m, lay, h):
    n = lay.total_rows
    return m.save_outputs(h, {}, num_tokens_unpadded=n, num_tokens_padded=n, write_layout=lay)


def test_adapter_prefill_to_decode():
    """The prefill side's event carries the prompt's block hashes; after
    the request finished, wait_published(req_id) waits for the blocks it
    computed. The decode side declares the transferred prompt: a STARTED
    event whose hit blocks are all tier blocks (tier_hashes); materialize
    gives the prompt's rows, then the step's."""
    P, D = managers()
    hashes = tuple(int(x) for x in HASHES)
    h = rows(1, 0, 14)
    P.new_step_starts([vo.PrefixCacheRequestEvent("a", K.STARTED, block_ids=((2, 5, 7, 9),), block_hashes=hashes)],
                      num_scheduled_tokens={"a": 14})
    P.materialize(save(P, layout(("a", slots_of([2, 5, 7, 9], 0, 14))), h), ["a"])
    P.new_step_starts([vo.PrefixCacheRequestEvent("a", K.FINISHED)], num_scheduled_tokens={})
    P.wait_published("a", 5.0)
    assert P.stats()["TierPublished"] == 3
    D.new_step_starts([vo.PrefixCacheRequestEvent("a", K.STARTED, hit_end=12, block_ids=((10, 3, 0, 1),),
                                                  tier_hashes=hashes)], num_scheduled_tokens={"a": 3})
    h2 = rows(1, 12, 3)
    out = D.materialize(save(D, layout(("a", slots_of([10, 3, 0, 1], 12, 3))), h2), ["a"])
    np.testing.assert_array_equal(out.hidden_states["a"], np.concatenate([h[:12], h2]))
    assert D.stats()["TierImported"] == 3
    P.shutdown()
    D.shutdown()


def test_adapter_lost_block_fails_typed():
    """A transferred prompt whose blocks the tier does not hold: its
    request fails with OmniPrefixCacheTierMissError naming it (the engine
    recomputes it), the request beside it served exact in .outputs."""
    P, D = managers()
    D.new_step_starts([vo.PrefixCacheRequestEvent("b", K.STARTED, hit_end=8, block_ids=((4, 6, 8),), tier_hashes=(201, 202)),
                       vo.PrefixCacheRequestEvent("c", K.STARTED, block_ids=((11, 12),))],
                      num_scheduled_tokens={"b": 1, "c": 5})
    lay = layout(("b", slots_of([4, 6, 8], 8, 1)), ("c", slots_of([11, 12], 0, 5)))
    h = np.concatenate([rows(3, 8, 1), rows(4, 0, 5)])
    with pytest.raises(vo.OmniPrefixCacheTierMissError) as e:
        D.materialize(save(D, lay, h), ["b", "c"])
    assert isinstance(e.value, vo.OmniPrefixCacheUnmatchError) and isinstance(e.value.__cause__, oc.TierMissError)
    assert e.value.failed == ("b",) and list(e.value.outputs.hidden_states) == ["c"]
    np.testing.assert_array_equal(e.value.outputs.hidden_states["c"], rows(4, 0, 5))
    P.shutdown()
    D.shutdown()


def test_adapter_pd_refusals():
    P, D = managers()
    with pytest.raises(vo.OmniPrefixCacheUnmatchError, match="before the cache exists"):
        P.wait_published([1], 1.0)
    P.new_step_starts([vo.PrefixCacheRequestEvent("a", K.STARTED, block_ids=((2, 5),), block_hashes=(301, 302))],
                      num_scheduled_tokens={"a": 8})
    P.materialize(save(P, layout(("a", slots_of([2, 5], 0, 8))), rows(1, 0, 8)), ["a"])
    with pytest.raises(vo.OmniPrefixCacheUnmatchError, match="req zz noted no block"):
        P.wait_published("zz", 1.0)
    with pytest.raises(oc.NotPublishedError):
        P.wait_published([999], 1.0)
    P.wait_published("a", 5.0)  # live: the blocks it computed so far
    P.new_step_starts([vo.PrefixCacheRequestEvent("a", K.FINISHED)], num_scheduled_tokens={})
    for events, err in [
        # tier blocks beyond the hit's, on a resume, on a request without a hit
        ([vo.PrefixCacheRequestEvent("x", K.STARTED, hit_end=4, block_ids=((1,),), tier_hashes=(1, 2))],
         vo.OmniPrefixCacheUnmatchError),
        ([vo.PrefixCacheRequestEvent("y", K.STARTED, tier_hashes=(1,))], vo.OmniPrefixCacheUnmatchError),
        ([vo.PrefixCacheRequestEvent("z", K.STARTED, block_hashes=(-1,))], ValueError),
    ]:
        with pytest.raises(err):
            D.new_step_starts(events, num_scheduled_tokens={})
    assert D.stats() == {}  # nothing registered reached a core
    P.shutdown()
    D.shutdown()
