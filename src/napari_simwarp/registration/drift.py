"""Batched translation estimation for drift correction: phase correlation, then
Gauss–Newton sub-pixel refinement, on all frames of a batch at once.

Why not the generic Adam loop: a translation has a closed-form first guess (the peak of
the phase correlation, found for every frame by one batched FFT) and, from within a pixel,
Gauss–Newton converges in 3–5 iterations where gradient descent needs dozens. The
inverse-compositional form precomputes the reference's gradient and Hessian, so each
iteration is one batched resampling and a few reductions.

Conventions: ``frames`` and ``references`` are ``(N, 1, *S)`` (a single reference
broadcasts). The refinement's shift ``d`` ``(N, D)`` (array order, pixels) satisfies
``reference(x) ≈ frame(x + d)``, the displacement convention of the whole package;
:func:`phase_correlation` keeps ``skimage.registration.phase_cross_correlation``'s argument
order and sign (``s = -d``), so that it can be checked against it.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F

from ._driver import drive

from .pyramid import gaussian_blur


def _hann(shape, dtype, device) -> torch.Tensor:
    w = None
    for axis, n in enumerate(shape):
        h = torch.hann_window(n, periodic=False, dtype=dtype, device=device)
        view = [1] * len(shape)
        view[axis] = n
        h = h.view(view)
        w = h if w is None else w * h
    return w


def phase_correlation(reference: torch.Tensor, moving: torch.Tensor) -> torch.Tensor:
    """The shift that registers ``moving`` with ``reference``, batched, to about 0.1–0.3 px.

    scikit-image's ``phase_cross_correlation(reference, moving)`` convention: the returned
    ``s`` ``(N, D)`` (array order, pixels) satisfies ``reference(x) ≈ moving(x - s)``, i.e.
    ``scipy.ndimage.shift(moving, s) ≈ reference``; the displacement of the rest of the
    package is ``d = -s``. A Hann window stops the image borders from dominating; the peak
    is refined by a three-point parabola per axis.

    The two may differ in spatial shape (a crop against its whole): each is centered and
    windowed on its own extent, then both are zero-padded to the larger shape per axis,
    with their first pixels at the same position.

    Parameters
    ----------
    reference : Tensor, shape ``(N or 1, 1, *S_ref)``
    moving : Tensor, shape ``(N, 1, *S_mov)``

    Returns
    -------
    Tensor, shape ``(N, D)``, ``moving``'s dtype; each component in ``(-n/2, n/2]`` with
    ``n`` the larger of the two sizes of that axis.
    """
    frames, references = moving, reference
    d = frames.dim() - 2
    shape = tuple(max(a, b) for a, b in zip(frames.shape[2:], references.shape[2:]))
    dims = tuple(range(-d, 0))

    def spectrum(x):
        x = x - x.mean(dim=dims, keepdim=True)
        win = _hann(tuple(x.shape[2:]), x.dtype, x.device)
        return torch.fft.rfftn(x * win, s=shape, dim=dims)

    cross = spectrum(frames) * spectrum(references).conj()
    cross = cross / (cross.abs() + 1e-12)
    corr = torch.fft.irfftn(cross, s=shape, dim=dims)[:, 0]  # (N, *S)
    n = corr.shape[0]
    flat = corr.reshape(n, -1).argmax(dim=1)
    peak = []
    for size in reversed(shape):
        peak.append(flat % size)
        flat = flat // size
    peak = torch.stack(peak[::-1], dim=1)  # (N, D) integer indices
    shifts = peak.to(frames.dtype)
    idx = torch.arange(n, device=frames.device)
    for axis, size in enumerate(shape):
        def value(offset):
            p = peak.clone()
            p[:, axis] = (p[:, axis] + offset) % size
            return corr[(idx, *p.unbind(1))]
        left, center, right = value(-1), value(0), value(1)
        denom = left - 2 * center + right
        frac = torch.where(denom.abs() > 1e-12, 0.5 * (left - right) / denom,
                           torch.zeros_like(denom))
        shifts[:, axis] = shifts[:, axis] + frac.clamp(-0.5, 0.5)
    sizes = torch.tensor(shape, dtype=frames.dtype, device=frames.device)
    # Wrapped into [-n/2, n/2) before the sign flip, so the result is in (-n/2, n/2] as
    # scikit-image's.
    return -torch.where(shifts >= sizes / 2, shifts - sizes, shifts)


def _sample_inner(frames: torch.Tensor, shifts: torch.Tensor, starts, sizes, *,
                  use_grid_sample: bool | None = None) -> torch.Tensor:
    """``frames(x + d)`` for ``x`` in the box ``starts .. starts + sizes``, bilinear.

    The box plus every shift stays inside the frames (the caller's margin guarantees it),
    so no padding is involved. On CPU, a translation's bilinear sample is an integer slice
    and one lerp per axis, several times cheaper than ``grid_sample``; on accelerators one
    batched ``grid_sample`` beats a loop over frames.
    """
    d = frames.dim() - 2
    if use_grid_sample is None:
        use_grid_sample = frames.device.type != "cpu"
    if use_grid_sample:
        shape = tuple(frames.shape[2:])
        axes = [torch.arange(st, st + sz, dtype=frames.dtype, device=frames.device)
                for st, sz in zip(starts, sizes)]
        mesh = torch.stack(torch.meshgrid(*axes, indexing="ij"), dim=-1)  # (*box, D)
        pos = mesh.unsqueeze(0) + shifts.view(-1, *([1] * d), d)
        scale = torch.tensor([2.0 / n for n in shape], dtype=frames.dtype, device=frames.device)
        grid = ((pos + 0.5) * scale - 1).flip(-1)
        return F.grid_sample(frames, grid, mode="bilinear", padding_mode="border",
                             align_corners=False)
    floors = torch.floor(shifts)
    fracs = (shifts - floors).tolist()
    floors = floors.long().tolist()
    out = []
    for n in range(frames.shape[0]):
        x = frames[n]
        for axis in range(d):
            dim = 1 + axis
            x = x.narrow(dim, starts[axis] + floors[n][axis], sizes[axis] + 1)
            x = torch.lerp(x.narrow(dim, 0, sizes[axis]), x.narrow(dim, 1, sizes[axis]),
                           fracs[n][axis])
        out.append(x)
    return torch.stack(out)


def _zero_mean_unit(x, dims):
    xc = x - x.mean(dim=dims, keepdim=True)
    norm = torch.sqrt((xc * xc).mean(dim=dims, keepdim=True)).clamp_min(1e-12)
    return xc / norm


def clip_unit(frames: torch.Tensor) -> torch.Tensor:
    """``frames`` clipped to ``[0, 1]``: expects frames already normalized so that their
    0.5–99.5 percentile range is ``[0, 1]`` (``_inputs.normalize``).

    A few hot or saturated pixels (e.g. 65535 in a frame whose content spans 0–255) would
    otherwise stand hundreds of times above the image and dominate both the phase
    correlation (a spurious peak) and the least-squares refinement.
    """
    return frames.clamp(0.0, 1.0)


def _fits(shape, shifts: torch.Tensor) -> torch.Tensor:
    """Per frame: does ``shifts`` leave the refinement an inner box of ≥ 8 pixels a side?"""
    margin = torch.ceil(shifts.abs().amax(dim=1)) + 3
    return min(shape) - 2 * margin >= 8


def _overlap_loss(fs: torch.Tensor, rs: torch.Tensor, shifts: torch.Tensor) -> torch.Tensor:
    """Per frame, the refinement's loss at ``shifts`` over the overlap (batched).

    ``Σ (F̃(x + d) − R̃(x))²`` averaged over the pixels ``x`` with ``x + d`` inside the
    frame, ``F̃, R̃`` normalized to zero mean and unit variance over that overlap.
    """
    d = fs.dim() - 2
    shape = tuple(fs.shape[2:])
    dims = tuple(range(2, 2 + d))
    n = shifts.shape[0]
    src = fs if fs.shape[0] == n else fs.expand(n, *fs.shape[1:])
    if not bool(shifts.any()):
        warped, valid = src, torch.ones_like(src[:1])
    else:
        axes = [torch.arange(k, dtype=fs.dtype, device=fs.device) for k in shape]
        mesh = torch.stack(torch.meshgrid(*axes, indexing="ij"), dim=-1)  # (*S, D)
        pos = mesh.unsqueeze(0) + shifts.to(fs.dtype).view(-1, *([1] * d), d)
        sizes = torch.tensor(shape, dtype=fs.dtype, device=fs.device)
        valid = ((pos >= 0) & (pos <= sizes - 1)).all(dim=-1).unsqueeze(1).to(fs.dtype)
        grid = ((pos + 0.5) * (2.0 / sizes) - 1).flip(-1)
        warped = F.grid_sample(src, grid, mode="bilinear", padding_mode="border",
                               align_corners=False)
    count = valid.sum(dim=dims, keepdim=True).clamp_min(1)

    def standard(x):
        mean = (x * valid).sum(dim=dims, keepdim=True) / count
        xc = (x - mean) * valid
        var = (xc * xc).sum(dim=dims, keepdim=True) / count
        return xc / var.sqrt().clamp_min(1e-12)

    err = standard(warped) - standard(rs)
    return ((err * err).sum(dim=dims) / count.reshape(-1, 1))[:, 0].expand(n)


def _select(fs, rs, candidates) -> torch.Tensor:
    """Per frame, the candidate shift ``(N, D)`` with the lowest :func:`_overlap_loss`.

    Candidates that leave the refinement no room (see :func:`_fits`) are ruled out. The
    check only has to tell a right guess from a wrong one, so large frames are compared
    at a reduced resolution (sides of at least 64 pixels), which keeps it cheap.
    """
    if len(candidates) == 1:
        return candidates[0]
    shape = tuple(fs.shape[2:])
    factor = 1
    while min(shape) // (2 * factor) >= 64:
        factor *= 2
    if factor > 1:
        pool = F.avg_pool2d if fs.dim() == 4 else F.avg_pool3d
        fs, rs = pool(fs, factor), pool(rs, factor)
    losses = []
    for c in candidates:
        loss = _overlap_loss(fs, rs, c / factor)
        losses.append(torch.where(_fits(shape, c), loss, torch.full_like(loss, float("inf"))))
    best = torch.stack(losses).argmin(dim=0)  # (N,); ties go to the first candidate
    stacked = torch.stack(candidates)  # (K, N, D)
    return stacked[best, torch.arange(stacked.shape[1], device=stacked.device)]


def select_shifts(frames, references, candidates, *, sigma: float = 1.0) -> torch.Tensor:
    """Per frame, whichever of ``candidates`` (each ``(N, D)``) fits best over the overlap.

    The check :func:`refine_translation` applies to its ``alternatives``, for callers that
    start another optimizer from a phase-correlation guess: a spurious peak (from outliers,
    or a periodic pattern) is dropped where a zero shift matches better.
    """
    return _select(gaussian_blur(frames, sigma), gaussian_blur(references, sigma),
                   list(candidates))


def _box(rs, margin, d, dims, shape, dtype):
    starts = [margin] * d
    sizes = [n - 2 * margin for n in shape]
    box = (slice(None), slice(None), *[slice(st, st + sz) for st, sz in zip(starts, sizes)])
    r = _zero_mean_unit(rs[box], dims)  # (N_ref, 1, *box)
    # Gradient and (D, D) Hessian of the reference: constant while the box is.
    grads = torch.stack(torch.gradient(r, dim=list(dims)), dim=-1)
    hessian = torch.einsum("nc...i,nc...j->nij", grads, grads)
    hinv = torch.linalg.inv(hessian.double()).to(dtype)
    g_flat = grads.reshape(grads.shape[0], -1, d)  # (N_ref, P, D)
    return starts, sizes, r, hinv, g_flat


class TranslationStep(NamedTuple):
    """One Gauss–Newton iteration of :func:`refine_translation_iter`."""

    iteration: int
    loss: torch.Tensor  # (N,)
    shifts: torch.Tensor  # (N, D), after the step


def refine_translation(frames, references, shifts, *, iterations: int = 10,
                       tol: float = 1e-3, sigma: float = 1.0, callback=None,
                       alternatives=None):
    """:func:`refine_translation_iter` run to the end; ``callback(step)`` true stops it.

    Returns ``(shifts, loss per frame, stopped)``.
    """
    return drive(refine_translation_iter(frames, references, shifts, iterations=iterations,
                                         tol=tol, sigma=sigma, alternatives=alternatives),
                 callback)


def refine_translation_iter(frames, references, shifts, *, iterations: int = 10,
                            tol: float = 1e-3, sigma: float = 1.0, alternatives=None):
    """Gauss–Newton (inverse compositional) refinement of per-frame shifts.

    Minimizes ``Σ_x (F̃(x + d) − R̃(x))²`` over the pixels ``x`` of an inner box that every
    shift keeps inside the frame, with ``F̃, R̃`` the frame and reference blurred by
    ``sigma`` (this takes noise off the gradient, and bilinear interpolation is far more
    accurate on a smooth image) and normalized to zero mean and unit variance over the box
    (so slow intensity changes, e.g. bleaching, do not bias the shift). A generator: it
    yields a :class:`TranslationStep` per iteration, stops when sent a true value, and
    returns ``(shifts, loss per frame, stopped)``.

    ``alternatives``: other starting shifts ``(N, D)`` (e.g. zeros); each frame starts from
    whichever of ``shifts`` and these has the lowest loss over the overlap, so a spurious
    phase-correlation peak is not followed. When a step would leave the inner box, the box
    is shrunk to make room (and shifts are held inside the largest box of ≥ 8 pixels).
    """
    d = frames.dim() - 2
    dims = tuple(range(2, 2 + d))
    shape = tuple(frames.shape[2:])
    fs = gaussian_blur(frames, sigma)
    rs = gaussian_blur(references, sigma)
    if alternatives:
        shifts = _select(fs, rs, [shifts, *alternatives])
    largest = (min(shape) - 8) // 2  # the widest margin that leaves an 8-pixel box
    margin = int(torch.ceil(shifts.abs().max()).item()) + 3
    if margin > largest:
        raise ValueError(
            f"the starting shifts of up to {margin - 3} pixels leave less than 8 pixels of "
            f"overlap in frames of shape {shape}: either the frames hardly overlap, or the "
            f"phase correlation found a spurious peak (e.g. from hot or saturated pixels)")
    starts, sizes, r, hinv, g_flat = _box(rs, margin, d, dims, shape, frames.dtype)
    loss = None
    stopped = False
    for iteration in range(iterations):
        warped = _zero_mean_unit(_sample_inner(fs, shifts, starts, sizes), dims)
        err = (warped - r).reshape(warped.shape[0], -1)  # (N, P)
        loss = (err * err).mean(dim=1)
        if g_flat.shape[0] == 1:
            b = err @ g_flat[0]  # one matrix product for the whole batch
        else:
            b = torch.einsum("np,npi->ni", err, g_flat)
        step = torch.einsum("nij,nj->ni", hinv.expand(b.shape[0], -1, -1), b)
        shifts = shifts - step
        reach = float(shifts.abs().max())
        if reach > margin - 2:
            # The step left the box the sampling relies on: widen the margin (shrink the
            # box) and, at the limit, hold the shifts inside it.
            wanted = min(int(math.ceil(reach)) + 3, largest)
            if wanted > margin:
                margin = wanted
                starts, sizes, r, hinv, g_flat = _box(rs, margin, d, dims, shape,
                                                      frames.dtype)
            shifts = shifts.clamp(-(margin - 2), margin - 2)
        if (yield TranslationStep(iteration, loss, shifts)):
            stopped = True
            break
        if float(step.abs().max()) < tol:
            break
    return shifts, loss, stopped
