"""The op and sync counter the loop budgets are held with (tests/_dispatch_count.py)."""

from __future__ import annotations

import torch

from tests._dispatch_count import DispatchCounter


def test_counts_ops_by_name_and_views_apart():
    x = torch.randn(8, 8)
    with DispatchCounter() as c:
        y = (x * 2 + 1).t().sum(0)
    assert c.ops["mul"] == 1 and c.ops["add"] == 1 and c.ops["sum"] == 1
    assert c.ops["t"] == 1 or c.ops["transpose"] == 1  # a view: an op, no launch
    assert c.launches == 3
    assert y.shape == (8,)


def test_counts_every_kind_of_host_read_as_a_sync():
    x = torch.randn(10)
    with DispatchCounter() as c:
        float(x.sum())  # _local_scalar_dense
        if (x > 0).any():  # bool of a tensor
            pass
        x.tolist()
        x.numpy()
        x.cpu()  # on a GPU: a copy to the host
        x.to("cpu")
        torch.nonzero(x > 0)  # a shape only the data gives
    assert c.syncs == 7, dict(c.sync_ops)


def test_arithmetic_on_values_already_read_is_no_launch_and_no_sync():
    x = torch.randn(10)
    with DispatchCounter() as c:
        host = x.cpu()  # one sync
        total = float((host * 3).sum())  # on the host: free
    assert c.syncs == 1
    assert c.launches == 0 and c.host_ops["mul"] == 1
    assert abs(total - 3 * float(x.sum())) < 1e-4
    assert not getattr(x, "_counted_on_host", False)  # the device tensor stays a device one


def test_counts_float64_results_but_not_host_data():
    x = torch.randn(4)
    with DispatchCounter() as c:
        x.double()  # a float64 result on the "device"
        torch.as_tensor([1.0, 2.0], dtype=torch.float64)  # host data (lift_fresh)
        torch.zeros(3, dtype=torch.float64)  # a factory: made on the device
    assert c.float64 == 2, dict(c.float64_ops)
    assert set(c.float64_ops) == {"_to_copy", "zeros"}


def test_a_fused_adam_step_reads_nothing_back():
    p = torch.zeros(3, requires_grad=True)
    p.grad = torch.ones(3)
    plain, fused = torch.optim.Adam([p], lr=0.1), torch.optim.Adam([p], lr=0.1, fused=True)
    for opt, syncs in ((plain, 1), (fused, 0)):
        opt.step()  # the state is made at the first step
        with DispatchCounter() as c:
            opt.step()
        assert c.syncs == syncs, dict(c.sync_ops)
