"""numpy and torch inputs; non-contiguous or wrongly typed ones refused
with a clear error."""

import numpy as np
import pytest

import omnicache as oc
from conftest import torch_or_fail

TABLE = np.arange(16, dtype=np.int32).reshape(2, 8)


def cache():
    return oc.Cache([oc.Key("hidden", 8), oc.Key("mm", 4, optional=True)], num_blocks=16, block_size=4)


def test_torch_plan_and_bf16_outputs():
    torch = torch_or_fail()
    c = cache()
    plan = oc.Plan(ids=torch.tensor([5, 6]), rows=torch.tensor([0, 1], dtype=torch.int32),
                   start=torch.zeros(2, dtype=torch.int32), count=torch.tensor([3, 2], dtype=torch.int32),
                   table=torch.from_numpy(TABLE), arrivals=torch.tensor([5, 6]))
    c.begin(plan)
    hidden = torch.randn(5, 4).to(torch.bfloat16)  # 4 bf16 = 8 bytes a row
    mm = torch.arange(5, dtype=torch.float32).reshape(5, 1)  # 4 bytes a row
    sid = c.save({"hidden": hidden, "mm": mm})
    r = c.materialize(sid, torch.tensor([6]))
    got = torch.from_numpy(r.rows(0, "hidden").copy()).view(torch.bfloat16)
    assert torch.equal(got, hidden[3:])
    assert r.rows(0, "mm", dtype=np.float32).ravel().tolist() == [3.0, 4.0]
    c.close()


def test_torch_padded_outputs():
    torch = torch_or_fail()
    c = cache()
    c.begin(ids=[1], rows=[0], start=[0], count=[2], table=TABLE, arrivals=[1])
    padded = torch.arange(8 * 2, dtype=torch.float32).reshape(8, 2)  # 8 padded rows, 2 real
    sid = c.save([padded, None], tokens=2, padded=8)
    r = c.materialize(sid)
    assert r.rows(0, 0, dtype=np.float32).ravel().tolist() == [0, 1, 2, 3]
    c.close()


def test_torch_refusals():
    torch = torch_or_fail()
    c = cache()
    with pytest.raises(TypeError, match="ids: dtype torch.int32, want torch.int64"):
        oc.Plan(ids=torch.tensor([1], dtype=torch.int32), rows=[0], start=[0], count=[1])
    with pytest.raises(TypeError, match="start: dtype torch.float32"):
        oc.Plan(ids=[1], rows=[0], start=torch.zeros(1), count=[1])
    t = torch.arange(16, dtype=torch.int32).reshape(2, 8).t()
    with pytest.raises(ValueError, match="table: not contiguous"):
        oc.Plan(table=t)
    c.begin(ids=[1], rows=[0], start=[0], count=[2], table=TABLE, arrivals=[1])
    with pytest.raises(ValueError, match="key 'hidden': not contiguous"):
        c.save([torch.zeros(8, 2).t(), None], tokens=2)
    with pytest.raises(ValueError, match="rows of 16 bytes"):
        c.save([torch.zeros(2, 4, dtype=torch.float32), None], tokens=2)  # float32 where bf16 rows are expected
    c.close()


def test_numpy_refusals():
    c = cache()
    with pytest.raises(TypeError, match="ids: dtype int32, want int64"):
        oc.Plan(ids=np.array([1], np.int32), rows=[0], start=[0], count=[1])
    with pytest.raises(TypeError, match="count: dtype float64"):
        oc.Plan(ids=[1], rows=[0], start=[0], count=np.array([1.0]))
    with pytest.raises(ValueError, match="rows: not C-contiguous"):
        oc.Plan(ids=[1, 2], rows=np.arange(4, dtype=np.int32)[::2], start=[0, 0], count=[1, 1])
    with pytest.raises(ValueError, match="batch arrays disagree"):
        oc.Plan(ids=[1, 2], rows=[0], start=[0, 0], count=[1, 1])
    with pytest.raises(TypeError, match="want a numpy array, a torch tensor or a list"):
        oc.Plan(ids="12", rows=[0], start=[0], count=[1])
    with pytest.raises(ValueError, match="a 1-D table needs its stride"):
        oc.Plan(table=np.arange(4, dtype=np.int32))
    c.begin(ids=[1], rows=[0], start=[0], count=[2], table=TABLE, arrivals=[1])
    with pytest.raises(ValueError, match="not C-contiguous"):
        c.save([np.zeros((8, 2), np.float32).T, None], tokens=2)
    with pytest.raises(ValueError, match="rows of 4 bytes"):
        c.save([np.zeros((2, 4), np.uint8), None], tokens=2)
    with pytest.raises(TypeError, match="want a numpy array or a torch tensor"):
        c.save([b"12345678" * 2, None], tokens=2)
    with pytest.raises(KeyError, match="no key 'nope'"):
        c.save({"nope": np.zeros((2, 8), np.uint8)}, tokens=2)
    with pytest.raises(oc.SequenceError):  # a refused save undoes its begin, as one the library refuses
        c.save([np.zeros((2, 8), np.uint8), None], tokens=2)
    c.begin(ids=[1], rows=[0], start=[0], count=[2], table=TABLE, arrivals=[1])
    sid = c.save([np.zeros((2, 8), np.uint8), None], tokens=2)
    c.discard(sid)
    c.close()
