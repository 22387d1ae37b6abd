"""The unfused local std kernels' flat rule in 3-D (cuda/local_std.cu through the host shim;
2-D CUDA calls take the fused kernel, test_host_shim.py): a window over which the padded
volume is exactly constant must come out flat (σ = 0, no gradient), as the CPU kernel's
float64 sums give.

Beside a "constant" border the CUDA running sums of a truly flat window held the rounding
of the padding's values (0 − mean, about −1000 here) that had left the window a few steps
before: the compensated float32 sums carry about 2⁻⁴⁸ of what they have seen, ~1e-8 of S2
here, while the flat rule for those sums (``calls.COMPENSATED_FLOAT32_FLAT_FACTOR``,
2.3e-13) is relative to the window's own S2 (the patch sits 0.5 from the mean): 179 of 294
flat windows came out 6e-5 to 1e-4 instead of 0. The forward passes now sum afresh the
first window past the padding (cuda/window_pass.h, AxisPass::restart)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from napari_simwarp.ops._kernels import calls
from napari_simwarp.ops._reference.local_std import center_and_pad
from tests.compiled import require_compiled
from tests.csrc.conftest import require_host_shim


def _volume_with_flat_patch():
    """Offset noisy volume (1000 + 5·U) with an exactly constant patch at one border."""
    rng = np.random.default_rng(3)
    x = rng.random((1, 1, 12, 14, 16)) * 5.0 + 1000.0
    x[..., 1:9, 1:10, 2:11] = 1003.0
    return torch.as_tensor(x.astype(np.float32))


def _padded_and_constant(x, k, padding):
    """The centred, padded volume local_std hands the kernels, and the windows over which
    it is exactly constant (max - min over the window is 0)."""
    xp = center_and_pad(x, [(k // 2, k // 2)] * 3, padding)
    pool = torch.nn.functional.max_pool3d
    return xp, (pool(xp, k, stride=1) + pool(-xp, k, stride=1)) == 0


def _cuda_kernel_flat(xp, k):
    library = require_host_shim()
    out, _, flat = library.local_std_fwd(
        xp, [k] * 3, 0.0, True, calls.COMPENSATED_FLOAT32_FLAT_FACTOR
    )
    return out, flat


@pytest.mark.parametrize("k", [3, 5])
@pytest.mark.parametrize("padding", ["reflect", "nearest", "mirror"])
def test_unfused_cuda_kernel_marks_flat_windows(k, padding):
    xp, constant = _padded_and_constant(_volume_with_flat_patch(), k, padding)
    out, flat = _cuda_kernel_flat(xp, k)
    assert constant.sum() > 50  # the case holds flat windows
    assert torch.equal(flat & constant, constant)
    assert (out[constant] == 0).all()


@pytest.mark.parametrize("k", [3, 5])
def test_cpu_kernel_marks_flat_windows_beside_a_constant_border(k):
    require_compiled()
    from napari_simwarp.ops import _kernels

    _kernels.ensure_loaded()
    xp, constant = _padded_and_constant(_volume_with_flat_patch(), k, "constant")
    out, _, flat = torch.ops.simwarp.local_std_fwd(
        xp.double(), [k] * 3, 0.0, True, calls.KERNEL_FLAT_FACTOR
    )
    assert torch.equal(flat & constant, constant)
    assert (out[constant] == 0).all()


@pytest.mark.parametrize("k", [3, 5])
def test_unfused_cuda_kernel_marks_flat_windows_beside_a_constant_border(k):
    xp, constant = _padded_and_constant(_volume_with_flat_patch(), k, "constant")
    out, flat = _cuda_kernel_flat(xp, k)
    assert constant.sum() > 50
    assert torch.equal(flat & constant, constant)
    assert (out[constant] == 0).all()
