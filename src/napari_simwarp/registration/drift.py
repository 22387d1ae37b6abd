"""Batched translation estimation for drift correction: phase correlation, then
Gauss–Newton sub-pixel refinement, on all frames of a batch at once.

Why not the generic Adam loop: a translation has a closed-form first guess (the peak of
the phase correlation, found for every frame by one batched FFT) and, from within a pixel,
Gauss–Newton converges in 3–5 iterations where gradient descent needs dozens. The
inverse-compositional form uses the reference's gradient, so each iteration is one batched
resampling and a few reductions.

Every comparison of a frame with its reference is made over their overlap (the pixels
``x`` with ``x + d`` inside the frame), never over a fixed inner box, so shifts up to half
the frame are found: the refinement weighs the overlap, and a guess whose overlap matches
poorly is searched for again by a normalized cross-correlation over every shift that keeps
enough overlap (:func:`masked_ncc_shift`).

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
from .gauss_newton import axis_gradients
from .models import wide_dtype
from .pyramid import gaussian_blur

#: device types on which :func:`shifted` samples by integer slices and lerps (it reads
#: the shifts back to the host: free on the CPU, a sync elsewhere); other devices use one
#: batched ``grid_sample``. Tests empty it to run the GPU's path on the CPU.
SLICE_DEVICE_TYPES = frozenset({"cpu"})
#: the smallest overlap (fraction of the frame) a shift may leave
MIN_OVERLAP = 0.2
#: below this ZNCC over the overlap, a phase-correlation guess is searched for again
RESEARCH_BELOW = 0.5


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

        def value(offset, axis=axis, size=size):
            p = peak.clone()
            p[:, axis] = (p[:, axis] + offset) % size
            return corr[(idx, *p.unbind(1))]

        left, center, right = value(-1), value(0), value(1)
        denom = left - 2 * center + right
        frac = torch.where(
            denom.abs() > 1e-12, 0.5 * (left - right) / denom, torch.zeros_like(denom)
        )
        shifts[:, axis] = shifts[:, axis] + frac.clamp(-0.5, 0.5)
    sizes = torch.tensor(shape, dtype=frames.dtype, device=frames.device)
    # Wrapped into [-n/2, n/2) before the sign flip, so the result is in (-n/2, n/2] as
    # scikit-image's.
    return -torch.where(shifts >= sizes / 2, shifts - sizes, shifts)


def shifted(
    frames: torch.Tensor, shifts: torch.Tensor, *, use_grid_sample: bool | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``frames(x + d)`` over the whole frame, bilinear, and where it is defined.

    Parameters
    ----------
    frames : Tensor, shape ``(N or 1, 1, *S)``
    shifts : Tensor, shape ``(N, D)``, pixels, array-axis order.

    Returns
    -------
    warped : Tensor, shape ``(N, 1, *S)``: 0 where ``x + d`` falls outside the frame.
    valid : Tensor, shape ``(N, 1, *S)``, ``frames``' dtype: 1 where it falls inside.

    On CPU a translation's bilinear sample is an integer slice and one lerp per axis over
    the overlap, several times cheaper than ``grid_sample``; on accelerators one batched
    ``grid_sample`` beats a loop over frames.
    """
    n, d = shifts.shape
    shape = tuple(frames.shape[2:])
    src = frames if frames.shape[0] == n else frames.expand(n, *frames.shape[1:])
    if use_grid_sample is None:
        use_grid_sample = frames.device.type not in SLICE_DEVICE_TYPES
    if use_grid_sample:
        axes = [torch.arange(k, dtype=frames.dtype, device=frames.device) for k in shape]
        mesh = torch.stack(torch.meshgrid(*axes, indexing="ij"), dim=-1)  # (*S, D)
        pos = mesh.unsqueeze(0) + shifts.to(frames.dtype).view(n, *([1] * d), d)
        sizes = torch.tensor(shape, dtype=frames.dtype, device=frames.device)
        valid = ((pos >= 0) & (pos <= sizes - 1)).all(dim=-1).unsqueeze(1).to(frames.dtype)
        grid = ((pos + 0.5) * (2.0 / sizes) - 1).flip(-1)
        warped = F.grid_sample(
            src, grid, mode="bilinear", padding_mode="border", align_corners=False
        )
        return warped * valid, valid
    warped = frames.new_zeros((n, 1, *shape))
    valid = frames.new_zeros((n, 1, *shape))
    floors = torch.floor(shifts).long().tolist()
    fracs = (shifts - torch.floor(shifts)).tolist()
    for i in range(n):
        x, box = src[i], []
        for axis, size in enumerate(shape):
            k, f = floors[i][axis], fracs[i][axis]
            # x + k and x + k + 1 (the lerp's two taps) must both be inside the axis.
            start, stop = max(0, -k), min(size, size - k - (1 if f > 0 else 0))
            if stop <= start:
                break
            length = stop - start
            dim = 1 + axis
            x = x.narrow(dim, start + k, length + (1 if f > 0 else 0))
            if f > 0:
                x = torch.lerp(x.narrow(dim, 0, length), x.narrow(dim, 1, length), f)
            box.append(slice(start, stop))
        else:
            warped[(i, slice(None), *box)] = x
            valid[(i, slice(None), *box)] = 1.0
    return warped, valid


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


def overlap_fraction(shape, shifts: torch.Tensor) -> torch.Tensor:
    """Per frame, the fraction of the frame that ``shifts`` ``(N, D)`` keep in the overlap."""
    sizes = torch.tensor(shape, dtype=shifts.dtype, device=shifts.device)
    return (1 - shifts.abs() / sizes).clamp_min(0).prod(dim=1)


def _standardize(x: torch.Tensor, valid: torch.Tensor, dims) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` standardized over ``valid`` (zero mean, unit variance there, 0 elsewhere), and
    the standard deviation it was divided by ``(N, 1, ...)``."""
    count = valid.sum(dim=dims, keepdim=True).clamp_min(1)
    mean = (x * valid).sum(dim=dims, keepdim=True) / count
    centered = (x - mean) * valid
    std = ((centered * centered).sum(dim=dims, keepdim=True) / count).sqrt().clamp_min(1e-12)
    return centered / std, std


def _overlap_loss(fs: torch.Tensor, rs: torch.Tensor, shifts: torch.Tensor) -> torch.Tensor:
    """Per frame, the refinement's loss at ``shifts`` over the overlap (batched).

    ``Σ (F̃(x + d) − R̃(x))²`` averaged over the pixels ``x`` with ``x + d`` inside the
    frame, ``F̃, R̃`` standardized over that overlap (``2 − 2·ZNCC`` over the overlap).
    """
    dims = tuple(range(2, fs.dim()))
    warped, valid = shifted(fs, shifts)
    err = _standardize(warped, valid, dims)[0] - _standardize(rs, valid, dims)[0]
    count = valid.sum(dim=dims).clamp_min(1)
    return ((err * err).sum(dim=dims) / count)[:, 0]


def _select(fs, rs, candidates) -> torch.Tensor:
    """Per frame, the candidate shift ``(N, D)`` with the lowest :func:`_overlap_loss`.

    Candidates that keep less than :data:`MIN_OVERLAP` of the frame are ruled out (a tiny
    overlap can match well by chance). The check only has to tell a right guess from a
    wrong one, so large frames are compared at a reduced resolution (sides of at least 64
    pixels), which keeps it cheap.
    """
    if len(candidates) == 1:
        return candidates[0]
    shape = tuple(fs.shape[2:])
    fs, rs, factor = _coarse(fs, rs, 64)
    losses = []
    for c in candidates:
        loss = _overlap_loss(fs, rs, c / factor)
        enough = overlap_fraction(shape, c) >= MIN_OVERLAP
        losses.append(torch.where(enough, loss, torch.full_like(loss, float("inf"))))
    best = torch.stack(losses).argmin(dim=0)  # (N,); ties go to the first candidate
    stacked = torch.stack(candidates)  # (K, N, D)
    return stacked[best, torch.arange(stacked.shape[1], device=stacked.device)]


def _coarse(fs, rs, min_side: int):
    """``fs``, ``rs`` box-averaged by the largest power of two that keeps every side at
    least ``min_side`` pixels, and that factor (shifts there are ``1/factor`` as long)."""
    factor = 1
    while min(fs.shape[2:]) // (2 * factor) >= min_side:
        factor *= 2
    if factor > 1:
        pool = F.avg_pool2d if fs.dim() == 4 else F.avg_pool3d
        fs, rs = pool(fs, factor), pool(rs, factor)
    return fs, rs, factor


def select_shifts(frames, references, candidates, *, sigma: float = 1.0) -> torch.Tensor:
    """Per frame, whichever of ``candidates`` (each ``(N, D)``) fits best over the overlap.

    The check :func:`refine_translation` applies to its ``alternatives``, for callers that
    start another optimizer from a phase-correlation guess: a spurious peak (from outliers,
    or a periodic pattern) is dropped where a zero shift matches better, and a guess whose
    overlap matches poorly is searched for again over every shift
    (:func:`masked_ncc_shift`).
    """
    fs, rs = gaussian_blur(frames, sigma), gaussian_blur(references, sigma)
    return _rescue(fs, rs, _select(fs, rs, list(candidates)))


def masked_ncc_shift(
    references: torch.Tensor,
    frames: torch.Tensor,
    *,
    min_overlap: float = MIN_OVERLAP,
    max_side: int = 128,
) -> torch.Tensor:
    """The integer shift ``d`` ``(N, D)`` that maximizes the ZNCC over the overlap.

    Every shift that keeps at least ``min_overlap`` of the frame is scored at once by FFTs
    of the images, their squares and their supports (Padfield's masked normalized
    cross-correlation), on frames box-averaged to at most ``max_side`` pixels a side;
    the result is in full-resolution pixels (to within the averaging factor) with
    ``reference(x) ≈ frame(x + d)``. Slower than a phase correlation (twelve FFTs of
    twice the size) but it cannot lock onto a peak that the overlap does not support.
    """
    n = frames.shape[0]
    d = frames.dim() - 2
    shape = tuple(frames.shape[2:])
    factor = 1
    while max(shape) // factor > max_side:
        factor *= 2
    rs, fs = references.double(), frames.double()
    if factor > 1:
        pool = F.avg_pool2d if d == 2 else F.avg_pool3d
        rs, fs = pool(rs, factor), pool(fs, factor)
    small = tuple(fs.shape[2:])
    size = [2 * k for k in small]
    dims = tuple(range(-d, 0))

    def spectrum(x):
        return torch.fft.rfftn(x, s=size, dim=dims)

    def correlate(a, b):  # Σ_x a(x) b(x + d), for every d, wrapped at 2k
        return torch.fft.irfftn(a.conj() * b, s=size, dim=dims)

    ones_r, ones_f = torch.ones_like(rs[:1]), torch.ones_like(fs[:1])
    r, r2, one_r = spectrum(rs), spectrum(rs * rs), spectrum(ones_r)
    f, f2, one_f = spectrum(fs), spectrum(fs * fs), spectrum(ones_f)
    count = correlate(one_r, one_f).round()
    sum_r, sum_f = correlate(r, one_f), correlate(one_r, f)
    cross = correlate(r, f) - sum_r * sum_f / count.clamp_min(1)
    var_r = (correlate(r2, one_f) - sum_r * sum_r / count.clamp_min(1)).clamp_min(0)
    var_f = (correlate(one_r, f2) - sum_f * sum_f / count.clamp_min(1)).clamp_min(0)
    score = cross / (var_r * var_f).sqrt().clamp_min(1e-300)
    enough = count >= min_overlap * math.prod(small)
    score = torch.where(enough & (var_r > 0) & (var_f > 0), score, torch.full_like(score, -2.0))
    flat = score.reshape(n, -1).argmax(dim=1)
    best = []
    for k in reversed(size):
        best.append(flat % k)
        flat = flat // k
    best = torch.stack(best[::-1], dim=1)  # (N, D) indices in [0, 2k)
    sizes = torch.tensor(size, device=best.device)
    signed = torch.where(best >= sizes // 2, best - sizes, best)
    return (signed * factor).to(frames.dtype)


def _rescue(fs, rs, shifts) -> torch.Tensor:
    """``shifts`` ``(N, D)``, with the frames whose overlap matches poorly (ZNCC below
    :data:`RESEARCH_BELOW`) searched for again by :func:`masked_ncc_shift` and given its
    answer where that matches better."""
    coarse_f, coarse_r, factor = _coarse(fs, rs, 64)
    zncc = 1 - _overlap_loss(coarse_f, coarse_r, shifts / factor) / 2
    poor = zncc < RESEARCH_BELOW
    if not bool(poor.any()):
        return shifts
    rows = poor.nonzero()[:, 0]
    refs = rs if rs.shape[0] == 1 else rs[rows]
    found = masked_ncc_shift(refs, fs[rows])
    better = _select(fs[rows], refs, [shifts[rows], found])
    out = shifts.clone()
    out[rows] = better
    return out


class TranslationStep(NamedTuple):
    """One Gauss–Newton iteration of :func:`refine_translation_iter`."""

    iteration: int
    loss: torch.Tensor  # (N,), read back: on the CPU
    shifts: torch.Tensor  # (N, D), after the step


def refine_translation(
    frames,
    references,
    shifts,
    *,
    iterations: int = 10,
    tol: float = 1e-3,
    sigma: float = 1.0,
    callback=None,
    alternatives=None,
    reference_mask=None,
):
    """:func:`refine_translation_iter` run to the end; ``callback(step)`` true stops it.

    Returns ``(shifts, loss per frame, stopped)``.
    """
    return drive(
        refine_translation_iter(
            frames,
            references,
            shifts,
            iterations=iterations,
            tol=tol,
            sigma=sigma,
            alternatives=alternatives,
            reference_mask=reference_mask,
        ),
        callback,
    )


def refine_translation_iter(
    frames,
    references,
    shifts,
    *,
    iterations: int = 10,
    tol: float = 1e-3,
    sigma: float = 1.0,
    alternatives=None,
    reference_mask=None,
):
    """Gauss–Newton (inverse compositional) refinement of per-frame shifts.

    Minimizes ``Σ_x (F̃(x + d) − R̃(x))²`` over the overlap (the pixels ``x`` with ``x + d``
    inside the frame), with ``F̃, R̃`` the frame and reference blurred by ``sigma`` (this
    takes noise off the gradient, and bilinear interpolation is far more accurate on a
    smooth image) and standardized over the overlap (so slow intensity changes, e.g.
    bleaching, do not bias the shift). A generator: it yields a :class:`TranslationStep`
    per iteration, stops when sent a true value, and returns ``(shifts, loss per frame,
    stopped)``.

    ``alternatives``: other starting shifts ``(N, D)`` (e.g. zeros); each frame starts from
    whichever of ``shifts`` and these matches best over its overlap, so a spurious
    phase-correlation peak is not followed, and a start that still matches poorly is
    searched for again over every shift. Shifts are held where they keep at least
    :data:`MIN_OVERLAP` of the frame. ``reference_mask`` ``(1 or N, 1, *S)``: where the
    reference is a real image (e.g. where every frame covers a mean); only there does it
    count.
    """
    d = frames.dim() - 2
    dims = tuple(range(2, 2 + d))
    shape = tuple(frames.shape[2:])
    fs = gaussian_blur(frames, sigma)
    rs = gaussian_blur(references, sigma)
    if alternatives:
        shifts = _rescue(fs, rs, _select(fs, rs, [shifts, *alternatives]))
    gradient = torch.stack(axis_gradients(rs, dims), dim=1)[:, :, 0]  # (N_r, D, *S)
    sizes = torch.tensor(shape, dtype=shifts.dtype, device=shifts.device)
    # Per axis, the largest shift that keeps MIN_OVERLAP of the frame along that axis alone.
    reach = sizes * (1 - MIN_OVERLAP ** (1.0 / d))
    loss = None
    stopped = False
    # the 2 × 2 (3 × 3) systems: float64 on the CPU, float32 on GPUs (models.wide_dtype)
    wide = wide_dtype(shifts.device)
    eye = torch.eye(d, dtype=wide, device=shifts.device)
    for iteration in range(iterations):
        warped, valid = shifted(fs, shifts)
        if reference_mask is not None:
            valid = valid * reference_mask
        f_std, _ = _standardize(warped, valid, dims)
        r_std, scale = _standardize(rs, valid, dims)
        err = (f_std - r_std).flatten(2)[:, 0]  # (N, P), 0 outside the overlap
        g = (gradient * (valid / scale)).flatten(2)  # (N, D, P): ∇R̃ on the overlap
        count = valid.flatten(2)[:, 0].sum(dim=1).clamp_min(1)
        loss = (err * err).sum(dim=1) / count
        b = torch.einsum("np,nip->ni", err, g).to(wide)
        hessian = torch.einsum("nip,njp->nij", g, g).to(wide)
        # A whisper of ridge keeps a frame without texture on the overlap solvable (step 0).
        ridge = 1e-9 * hessian.diagonal(dim1=1, dim2=2).sum(-1).clamp_min(1e-30)
        hessian = hessian + ridge[:, None, None] * eye
        # solve_ex: linalg.solve checks its result on the host (a sync on a GPU); the ridge
        # keeps the system solvable
        step = torch.linalg.solve_ex(hessian, b.unsqueeze(-1))[0][..., 0]
        shifts = torch.maximum(torch.minimum(shifts - step.to(shifts.dtype), reach), -reach)
        # The one host read of the iteration: the losses (for the progress) and the
        # largest step (for the stop) together.
        read = torch.cat([loss, step.abs().amax().view(1).to(loss.dtype)]).cpu()
        if (yield TranslationStep(iteration, read[:-1], shifts)):
            stopped = True
            break
        if float(read[-1]) < tol:
            break
    return shifts, loss, stopped
