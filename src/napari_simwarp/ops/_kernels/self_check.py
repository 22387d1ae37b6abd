"""The self-check: each compiled op against its pure torch twin, on the device it will run on.

The CUDA kernels are tested without a GPU (the host shim, ``tests/csrc/test_host_shim.py``)
and with one (``scripts/gpu_check.sh``), but a given machine can still break them: a
driver, a GPU the build did not target, a toolkit that loads and then fails at its first
launch. So on CUDA the "auto" backend runs a compiled op only once it has passed this
check on that device (:func:`.._kernels.use_compiled`): at the first use of the kernels
on each device, every primitive runs on small random inputs, values and gradients, next
to its twin in :mod:`..._reference`, and an op whose primitives differ beyond the
tolerance, or fail to run, takes the torch path on that device.

:func:`check_device` never raises: an error (a failed launch, a dead CUDA context) is a
failed check whose reason is the error. The inputs are small (a few thousand elements):
the whole check costs milliseconds on a GPU.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .. import _reference
from .._windows import gaussian_kernel1d
from . import calls

#: largest relative difference (to the twin's largest magnitude, per output) accepted in
#: float32, where compiled and torch paths differ in summation order and precision (about
#: 1e-7 apart on these inputs); a wrong index or a lost term gives differences of order 1.
TOLERANCE = {torch.float32: 1e-4, torch.float64: 1e-10}

#: the primitives (torch.ops.simwarp) each public op with kernels calls.
PRIMITIVES = {
    "local_std": ("local_std", "local_std_fused"),
    "ssim": ("moments5", "correlate", "box_sum", "ssim_fused"),
    "local_ncc": ("moments5", "correlate", "box_sum", "local_ncc_fused"),
    "splat": ("splat",),
    "mutual_information": ("parzen",),
    "integrate_velocity": ("squaring",),
}


@dataclass(frozen=True)
class Check:
    """The outcome of one primitive's or one op's check on one device."""

    passed: bool
    #: largest relative difference from the torch twin over every output and gradient
    #: (NaN when the check did not run to the end)
    error: float
    tolerance: float
    #: why it failed ("" when it passed)
    reason: str = ""
    seconds: float = 0.0

    def as_dict(self) -> dict:
        return {
            "passed": self.passed,
            "error": self.error,
            "tolerance": self.tolerance,
            "reason": self.reason,
            "seconds": self.seconds,
        }


def relative_difference(ours: torch.Tensor, reference: torch.Tensor) -> float:
    """``max |ours - reference| / max |reference|`` in float64 (NaN anywhere gives NaN)."""
    a, b = ours.detach().double(), reference.detach().double()
    if a.shape != b.shape:
        return math.inf
    if b.numel() == 0:
        return 0.0
    scale = b.abs().max().item()
    return (a - b).abs().max().item() / (scale if scale > 0 else 1.0)


def _compare_with_gradients(
    compiled: Callable, reference: Callable, inputs: list[torch.Tensor], seed: int
) -> float:
    """Largest relative difference of the outputs, and of the gradients of every input
    that requires one under a random upstream gradient."""
    results = []
    for fn in (compiled, reference):
        leaves = [x.detach().clone().requires_grad_(x.requires_grad) for x in inputs]
        out = fn(*leaves)
        outs = list(out) if isinstance(out, (tuple, list)) else [out]
        grads = []
        wanted = [leaf for leaf in leaves if leaf.requires_grad]
        if wanted:
            gen = torch.Generator(device=outs[0].device).manual_seed(seed)
            loss = sum(
                (o * torch.randn(o.shape, generator=gen, device=o.device, dtype=o.dtype)).sum()
                for o in outs
            )
            grads = list(torch.autograd.grad(loss, wanted))
        results.append([*outs, *grads])
    return max(relative_difference(a, b) for a, b in zip(*results))


def _random(gen, shape, device, dtype, grad=False, scale=1.0, offset=0.0):
    x = torch.randn(shape, generator=gen, device=device, dtype=dtype) * scale + offset
    return x.requires_grad_(grad)


def _compare_linear(
    compiled: Callable, reference: Callable, reference_adjoint: Callable, x: torch.Tensor, seed
) -> float:
    """Largest relative difference of a linear op's output and of its gradient under a
    random upstream gradient, the latter against the twin's adjoint op (the twins of the
    linear passes are not all differentiable themselves)."""
    leaf = x.detach().clone().requires_grad_()
    out = compiled(leaf)
    gen = torch.Generator(device=x.device).manual_seed(seed)
    upstream = torch.randn(out.shape, generator=gen, device=x.device, dtype=x.dtype)
    (grad,) = torch.autograd.grad(out, leaf, upstream)
    return max(
        relative_difference(out, reference(x.detach())),
        relative_difference(grad, reference_adjoint(upstream)),
    )


def _check_linear(name: str, device, dtype, gen) -> float:
    """box_sum or correlate, valid and full / transposed (each the other's adjoint)."""
    compiled, twin = getattr(calls, name), getattr(_reference, name)
    errors = []
    for shape, sizes in (((2, 3, 19, 23), (5, 7)), ((1, 2, 9, 10, 11), (3, 1, 5))):
        x = _random(gen, shape, device, dtype)
        # A window, or random taps (the transpose is not the same correlation unless they
        # are symmetric).
        window = (
            sizes
            if name == "box_sum"
            else [torch.rand(k, generator=gen, device=device).tolist() for k in sizes]
        )
        for flag in (False, True):
            errors.append(
                _compare_linear(
                    lambda t, w=window, f=flag: compiled(t, w, f),
                    lambda t, w=window, f=flag: twin(t, w, f),
                    lambda t, w=window, f=flag: twin(t, w, not f),
                    x,
                    seed=1,
                )
            )
    return max(errors)


def _check_moments5(device, dtype, gen) -> float:
    errors = []
    for shape, sizes in (((2, 2, 3, 21, 26), (7, 7)), ((2, 1, 2, 9, 10, 11), (3, 5, 3))):
        centered = _random(gen, shape, device, dtype)
        for taps in ([(1.0,) * k for k in sizes], [gaussian_kernel1d(k, 1.5) for k in sizes]):
            ours = calls.moments5(centered, taps)
            theirs = _reference.moments5(centered, taps)
            errors += [relative_difference(a, b) for a, b in zip(ours, theirs)]
    return max(errors)


def _check_local_std(device, dtype, gen) -> float:
    errors = []
    for shape, window in (((2, 3, 21, 26), (5, 7)), ((1, 2, 9, 10, 11), (3, 3, 3))):
        xp = _random(gen, shape, device, dtype, scale=3.0, offset=10.0)
        with torch.no_grad():
            xp[..., :6, :6] = 7.25  # a flat patch: both paths must call it flat
        xp.requires_grad_()
        for normalize in (True, False):
            errors.append(
                _compare_with_gradients(
                    lambda t, w=window, n=normalize: calls.local_std_valid(t, w, 1e-3, n),
                    lambda t, w=window, n=normalize: _reference.local_std_valid(t, w, 1e-3, n),
                    [xp],
                    seed=3,
                )
            )
    return max(errors)


def _check_splat(device, dtype, gen) -> float:
    errors = []
    for spatial in ((17, 19), (7, 8, 9)):
        shape = (2, len(spatial), *spatial)
        image = _random(gen, (2, 3, *spatial), device, dtype, grad=True)
        if dtype == torch.float64:  # holes, collisions, shares leaving the image
            displacement = _random(gen, shape, device, dtype, grad=True, scale=2.0)
        else:
            # Every destination keeps at least 1/4 of its own pixel per axis: a normalized
            # splat divides by that weight, and a tiny one would amplify float32 rounding.
            uniform = torch.rand(shape, generator=gen, device=device, dtype=dtype)
            displacement = (0.25 + 0.5 * uniform).requires_grad_()
        for normalize in (True, False):
            errors.append(
                _compare_with_gradients(
                    lambda i, d, n=normalize: calls.splat_fwd(i, d, n, 1e-6),
                    lambda i, d, n=normalize: _reference.splat_fwd(i, d, n, 1e-6),
                    [image, displacement],
                    seed=4,
                )
            )
    return max(errors)


#: primitive -> its check: a function of (device, dtype, generator) giving the largest
#: relative difference from the twin.
PRIMITIVE_CHECKS = {
    "box_sum": functools.partial(_check_linear, "box_sum"),
    "correlate": functools.partial(_check_linear, "correlate"),
    "moments5": _check_moments5,
    "local_std": _check_local_std,
    "splat": _check_splat,
}


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def check_primitive(name: str, device: torch.device) -> Check:
    """One primitive in float32 and float64 on ``device``; errors become a failed check."""
    start = time.perf_counter()
    worst, tolerance = 0.0, TOLERANCE[torch.float32]
    try:
        for dtype in (torch.float32, torch.float64):
            gen = torch.Generator(device=device).manual_seed(20261123)
            error = PRIMITIVE_CHECKS[name](device, dtype, gen)
            _synchronize(device)  # a failed launch shows here, not at the launch
            if not error <= TOLERANCE[dtype]:  # NaN fails too
                return Check(
                    False,
                    error,
                    TOLERANCE[dtype],
                    f"{name} differs from the pure torch path by {error:.2g} in "
                    f"{str(dtype).removeprefix('torch.')} (tolerance {TOLERANCE[dtype]:.0e})",
                    time.perf_counter() - start,
                )
            if error / TOLERANCE[dtype] > worst / tolerance:
                worst, tolerance = error, TOLERANCE[dtype]
    except Exception as exc:  # a launch error, a dead context: the kernels cannot be trusted
        text = str(exc).strip().splitlines()
        return Check(
            False,
            math.nan,
            TOLERANCE[torch.float32],
            f"{name} failed to run: {type(exc).__name__}: {text[0] if text else ''}",
            time.perf_counter() - start,
        )
    return Check(True, worst, tolerance, "", time.perf_counter() - start)


def combine(checks: list[Check]) -> Check:
    """One op's result from its primitives': passed if all passed, the worst figures."""
    failed = [c for c in checks if not c.passed]
    worst = max(checks, key=lambda c: c.error / c.tolerance if c.passed else math.inf)
    return Check(
        not failed,
        worst.error,
        worst.tolerance,
        "; ".join(c.reason for c in failed),
        sum(c.seconds for c in checks),
    )


def check_device(device: torch.device) -> dict[str, Check]:
    """Every public op with kernels checked on ``device``: ``{op: Check}``. Never raises.

    It runs at the first use of the kernels, inside whatever the caller was doing, so it
    sets its own context: gradients on (the caller may be under ``no_grad`` or
    ``inference_mode``), no autocast (which would run the twins in half precision), and no
    deterministic-algorithms mode (which would refuse the atomics of splat's kernel,
    a policy :func:`.._kernels.use_compiled` applies per call, not a fault).
    """
    deterministic = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    try:
        torch.use_deterministic_algorithms(False)
        with (
            torch.inference_mode(False),
            torch.enable_grad(),
            torch.autocast(device.type, enabled=False),
        ):
            primitives = {name: check_primitive(name, device) for name in PRIMITIVE_CHECKS}
    finally:
        torch.use_deterministic_algorithms(deterministic, warn_only=warn_only)
    return {op: combine([primitives[p] for p in names]) for op, names in PRIMITIVES.items()}
