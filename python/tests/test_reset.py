"""Reset: every cached row dropped; a step saved before raises ResetError."""

import numpy as np
import pytest

import omnicache as oc


def test_reset_drops_rows_and_fails_older_steps():
    c = oc.Cache([oc.Key("hidden", 8)], num_blocks=8, block_size=4)
    try:
        rows = np.arange(32, dtype=np.uint8).reshape(4, 8)
        c.begin(ids=[1], rows=[0], start=[0], count=[4], table=[[0, 1]], arrivals=[1])
        step = c.save([rows])
        c.begin(ids=[], rows=[], start=[], count=[], table=[[0, 1]], finished=[1])
        c.discard(c.save([np.zeros((0, 8), dtype=np.uint8)]))
        c.reset()
        with pytest.raises(oc.ResetError):
            c.materialize(step)
        # A hit over block 0 now finds its required rows absent.
        c.begin(ids=[2], rows=[0], start=[4], count=[1], table=[[0, 1]], arrivals=[2], hit_tokens=[4], hit_blocks=[0])
        s2 = c.save([rows[:1]])
        with pytest.raises(oc.OmnicacheError):
            c.materialize(s2)
    finally:
        c.close()


def test_reset_with_a_live_request_is_a_sequence_error():
    c = oc.Cache([oc.Key("hidden", 8)], num_blocks=8, block_size=4)
    try:
        c.begin(ids=[1], rows=[0], start=[0], count=[2], table=[[0, 1]], arrivals=[1])
        c.discard(c.save([np.zeros((2, 8), dtype=np.uint8)]))
        with pytest.raises(oc.SequenceError):
            c.reset()
    finally:
        c.close()
