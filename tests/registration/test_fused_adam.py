"""solvers.adam.FusedAdam against torch.optim.Adam: the same steps, launches counted."""

from __future__ import annotations

import pytest
import torch

from napari_simwarp.registration.solvers.adam import FusedAdam, make_adam
from tests._dispatch_count import DispatchCounter


def _quadratic_run(make, steps=12, dtype=torch.float32):
    gen = torch.Generator().manual_seed(3)
    target = torch.randn(2, 5, 4, generator=gen, dtype=dtype)
    start = torch.randn(2, 5, 4, generator=gen, dtype=dtype)
    # one strided parameter, as DenseModel stores its 2-D fields
    p = start.permute(0, 2, 1).contiguous().permute(0, 2, 1).requires_grad_(True)
    q = torch.zeros(3, dtype=dtype, requires_grad=True)
    opt = make([p, q])
    for k in range(steps):
        if k == 6:
            opt.param_groups[0]["lr"] = 0.05  # the plateau schedule halves it between steps
        opt.zero_grad(set_to_none=True)
        loss = ((p - target) ** 2 * torch.linspace(0.5, 2, 4, dtype=dtype)).sum()
        loss = loss + (q - 1).pow(4).sum()
        loss.backward()
        opt.step()
    return p.detach(), q.detach()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_fused_adam_takes_torch_adams_steps(dtype):
    ours = _quadratic_run(lambda ps: FusedAdam(ps, 0.1, 12), dtype=dtype)
    fused = _quadratic_run(lambda ps: torch.optim.Adam(ps, lr=0.1, fused=True), dtype=dtype)
    plain = _quadratic_run(lambda ps: torch.optim.Adam(ps, lr=0.1), dtype=dtype)
    for a, b, c in zip(ours, fused, plain):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
        torch.testing.assert_close(a, c)
    start = _quadratic_run(lambda ps: FusedAdam(ps, 0.1, 12), steps=0, dtype=dtype)
    assert not torch.allclose(ours[0], start[0], atol=0.1)  # it moved


def test_fused_adam_step_is_one_launch():
    p = torch.zeros(4, 3, requires_grad=True)
    opt = make_adam([p], 0.1, 5)
    assert isinstance(opt, FusedAdam)
    p.grad = torch.ones(4, 3)
    counter = DispatchCounter()
    with counter:
        opt.step()
    assert counter.launches == 1, dict(counter.ops)
    assert counter.syncs == 0


def test_fused_adam_refuses_more_steps_than_made_for():
    p = torch.zeros(2, requires_grad=True)
    opt = FusedAdam([p], 0.1, 1)
    p.grad = torch.ones(2)
    opt.step()
    with pytest.raises(RuntimeError, match="1 steps"):
        opt.step()


def test_make_adam_without_iterations_is_torchs():
    p = torch.zeros(2, requires_grad=True)
    assert isinstance(make_adam([p], 0.1), torch.optim.Adam)
