"""Batched translation estimation for drift correction: phase correlation, then
Gauss–Newton sub-pixel refinement, on all frames of a batch at once.

Why not the generic Adam loop: a translation has a closed-form first guess (the peak of
the phase correlation, found for every frame by one batched FFT) and, from within a pixel,
Gauss–Newton converges in 3–5 iterations where gradient descent needs dozens. The
inverse-compositional form precomputes the reference's gradient and Hessian, so each
iteration is one batched resampling and a few reductions.

Conventions: ``frames`` and ``references`` are ``(N, 1, *S)`` (a single reference
broadcasts); the returned shift ``d`` ``(N, D)`` (array order, pixels) satisfies
``reference(x) ≈ frame(x + d)``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

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


def phase_correlation(frames: torch.Tensor, references: torch.Tensor) -> torch.Tensor:
    """Shifts ``(N, D)`` with ``reference(x) ≈ frame(x + d)``, to about 0.1–0.3 px.

    A Hann window stops the image borders from dominating; the peak is refined by a
    three-point parabola per axis.
    """
    d = frames.dim() - 2
    shape = tuple(frames.shape[2:])
    dims = tuple(range(-d, 0))
    win = _hann(shape, frames.dtype, frames.device)

    def spectrum(x):
        x = x - x.mean(dim=dims, keepdim=True)
        return torch.fft.rfftn(x * win, dim=dims)

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
        left, centre, right = value(-1), value(0), value(1)
        denom = left - 2 * centre + right
        frac = torch.where(denom.abs() > 1e-12, 0.5 * (left - right) / denom,
                           torch.zeros_like(denom))
        shifts[:, axis] = shifts[:, axis] + frac.clamp(-0.5, 0.5)
    sizes = torch.tensor(shape, dtype=frames.dtype, device=frames.device)
    return torch.where(shifts > sizes / 2, shifts - sizes, shifts)


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


def refine_translation(frames, references, shifts, *, iterations: int = 10,
                       tol: float = 1e-3, sigma: float = 1.0, callback=None):
    """Gauss–Newton (inverse compositional) refinement of per-frame shifts.

    Minimises ``Σ_x (F̃(x + d) − R̃(x))²`` over the pixels ``x`` of an inner box that every
    shift keeps inside the frame, with ``F̃, R̃`` the frame and reference blurred by
    ``sigma`` (this takes noise off the gradient, and bilinear interpolation is far more
    accurate on a smooth image) and normalised to zero mean and unit variance over the box
    (so slow intensity changes, e.g. bleaching, do not bias the shift). ``callback(iteration,
    loss, shifts)`` returning True stops early. Returns ``(shifts, loss per frame, stopped)``.
    """
    d = frames.dim() - 2
    dims = tuple(range(2, 2 + d))
    shape = tuple(frames.shape[2:])
    fs = gaussian_blur(frames, sigma)
    rs = gaussian_blur(references, sigma)
    margin = int(torch.ceil(shifts.abs().max()).item()) + 3
    if any(n - 2 * margin < 8 for n in shape):
        raise ValueError(f"frames of shape {shape} are too small for shifts of up to "
                         f"{margin - 3} pixels")
    starts = [margin] * d
    sizes = [n - 2 * margin for n in shape]
    box = (slice(None), slice(None), *[slice(st, st + sz) for st, sz in zip(starts, sizes)])
    r = _zero_mean_unit(rs[box], dims)  # (N_ref, 1, *box)
    # Gradient and (D, D) Hessian of the reference: constant over the iterations.
    grads = torch.stack(torch.gradient(r, dim=list(dims)), dim=-1)
    hessian = torch.einsum("nc...i,nc...j->nij", grads, grads)
    hinv = torch.linalg.inv(hessian.double()).to(frames.dtype)
    g_flat = grads.reshape(grads.shape[0], -1, d)  # (N_ref, P, D)
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
        if callback is not None and callback(iteration, loss, shifts):
            stopped = True
            break
        if float(step.abs().max()) < tol:
            break
    return shifts, loss, stopped
