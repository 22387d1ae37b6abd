"""ZNCC of a template at every valid position, block by block (overlap-save).

``match_template``'s score ``Σ_j y[i + j] t[j] / (E_i ‖t‖)`` with ``Σ t = 0`` and ``E_i``
the window's energy ``sqrt(Σ (y - ȳ_i)²)``. The output is cut into blocks (tiles of
:class:`~._tiles.TileGrid`, each reading its ``T + t - 1`` inputs) because:

- an FFT's round-off is global, about ``eps · log2(L) · ‖y‖ · ‖t‖`` for the array it
  transforms, and a score's error is that over ``E_i ‖t‖``. Per block, ``‖y‖`` is the
  block's norm about its own mean, and centering each block on its mean is exact: with a
  zero-mean template ``Σ (y - c) t = Σ y t`` for any constant ``c``. A dark window then
  shares its round-off only with its own block (docs/maths.md §2.1);
- so the transforms can run in float32 (3 to 5 times faster than float64 on a CPU, 32 to
  64 times on consumer GPUs). Blocks holding a window that float32 cannot resolve (energy
  within the float32 round-off, but not within float64's) are redone in float64 where the
  device has it; the other windows under the round-off are flat by design (score 0);
- the template's spectrum is one transform of the block's length, not the image's.

Shapes: ``y (N, C, *P)``, template ``(Nt, Ct, *t)``, output ``(N, C, *(P - t + 1))``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F

from . import _kernels, _numerics
from ._tiles import TileGrid
from .fft_cc import next_fast_len

#: A block's transform is about ``BLOCK_TEMPLATES`` templates long per axis (at least
#: ``MIN_BLOCK``): the overlap ``t - 1`` then costs about ``(1 + 1/7)^d`` more samples
#: and the blocks stay small enough for their round-off to be local. At 2048² with a 64²
#: template (2 cores), float32 blocks of 256 to 512 cost about one whole-image transform.
BLOCK_TEMPLATES = 8
MIN_BLOCK = 64

#: the largest error a score may carry from the FFT's round-off; windows whose energy is
#: too small for that (in the dtype that ran the transforms) are flat by design
SCORE_TOLERANCE = 1e-4


def block_grid(
    out_shape: Sequence[int], tshape: Sequence[int], *, even_last: bool = False
) -> TileGrid:
    """The blocks of the output ``out_shape`` for a template of ``tshape``.

    Per axis the block's input ``T + t - 1`` is a fast FFT length; an axis shorter than one
    block gets a single block covering it. ``even_last``: an even number of blocks along
    the last axis where there are several (one more, smaller, if needed), so that
    :func:`_packed_numerator` pairs every block with another.
    """
    tiles = []
    last = len(out_shape) - 1
    for axis, (n, t) in enumerate(zip(out_shape, tshape)):
        whole = next_fast_len(n + t - 1)
        length = next_fast_len(max(BLOCK_TEMPLATES * t, MIN_BLOCK))
        if length >= whole:
            tiles.append(whole - t + 1)
            continue
        # As many blocks as that length needs, shrunk to share the outputs evenly (the
        # last block would otherwise run mostly past the image), at a fast length again.
        count = -(-n // (length - t + 1))
        if even_last and axis == last and count % 2:
            wanted = count + 1
            tile = next_fast_len(-(-n // wanted) + t - 1) - t + 1
            if -(-n // tile) == wanted:
                tiles.append(tile)
                continue
        tile = next_fast_len(-(-n // count) + t - 1) - t + 1
        tiles.append(tile if -(-n // tile) == count else length - t + 1)
    return TileGrid(tuple(out_shape), tuple(tshape), tuple(tiles))


def fft_noise_factor(dtype: torch.dtype, grid: TileGrid) -> float:
    """``eps · log2(L) / SCORE_TOLERANCE``: the window energy, per unit of its block's norm,
    below which a score carries more than :data:`SCORE_TOLERANCE` of FFT round-off."""
    length = max(t + k - 1 for t, k in zip(grid.tile, grid.window))
    return torch.finfo(dtype).eps * math.log2(max(length, 2)) / SCORE_TOLERANCE


def _extend(y: torch.Tensor, grid: TileGrid) -> torch.Tensor:
    """``y (N, C, *P)`` extended to the grid's ``n T + t - 1`` by repeating its edge.

    Only outputs past the image read the extension, but every sample of a block shares in
    its FFT's round-off: an extension that continues the data keeps the block's norm about
    its mean as small as the data's (zeros, once centered, would weigh ``-c`` each).
    """
    extension = []
    for p, e in zip(reversed(grid.padded), reversed(grid.extended)):
        extension += [0, e - p]
    if not any(extension):
        return y
    return F.pad(y, extension, mode="replicate")


def _center_blocks(blocks: torch.Tensor, d: int):
    """Blocks ``(..., *L)`` minus their mean, and the norm ``(..., *(1,) * d)`` of the
    result (detached): the scale of the block's FFT round-off."""
    sample_dims = tuple(range(-d, 0))
    with torch.no_grad():
        # Any constant is exact for the score (Σ t = 0): the mean's rounding is harmless.
        mean = blocks.mean(sample_dims, keepdim=True)
    # A fresh contiguous buffer: the blocks are overlapping views, and an output laid out
    # like them would make every transform gather.
    if torch.is_grad_enabled() and blocks.requires_grad:
        centered = blocks.clone(memory_format=torch.contiguous_format).sub_(mean)
    else:
        centered = torch.sub(blocks, mean, out=blocks.new_empty(blocks.shape))
    with torch.no_grad():
        norm = torch.linalg.vector_norm(centered, dim=sample_dims, keepdim=True)
    return centered, norm


def _numerator(centered: torch.Tensor, spectrum: torch.Tensor, grid: TileGrid) -> torch.Tensor:
    """``Σ_j y[i + j] t[j]`` per block: ``(..., *L) -> (..., *T)``."""
    d = grid.dims
    sample_dims = tuple(range(-d, 0))
    lengths = [t + k - 1 for t, k in zip(grid.tile, grid.window)]
    product = torch.fft.rfftn(centered, dim=sample_dims)
    if torch.is_grad_enabled() and (product.requires_grad or spectrum.requires_grad):
        product = product * spectrum
    else:
        product.mul_(spectrum)  # no allocation of a second spectrum
    full = torch.fft.irfftn(product, s=lengths, dim=sample_dims)
    return full[(..., *[slice(0, t) for t in grid.tile])]


def _template_spectrum(t_centered: torch.Tensor, grid: TileGrid) -> torch.Tensor:
    """The conjugate spectrum of the template zero-padded to the block's length,
    ``(Nt, Ct, *(1,) * d, *L')``: it broadcasts against the blocks ``(N, C, *n, *L)``."""
    d = grid.dims
    pad = []
    for t in reversed(grid.tile):
        pad += [0, t - 1]
    spectrum = torch.fft.rfftn(F.pad(t_centered, pad), dim=tuple(range(-d, 0))).conj()
    return spectrum.reshape(*t_centered.shape[:2], *(1,) * d, *spectrum.shape[-d:])


def _score(numerator: torch.Tensor, energy: torch.Tensor, noise: torch.Tensor):
    """``numerator / energy`` where the window resolves (energy above ``noise``), else 0,
    and that mask. Differentiable (a safe denominator keeps the gradient finite)."""
    valid = energy > noise
    if torch.is_grad_enabled() and (numerator.requires_grad or energy.requires_grad):
        safe = torch.where(valid, energy, torch.ones_like(energy))
        return torch.where(valid, numerator / safe, torch.zeros_like(numerator)), valid
    # Without autograd: outside ``valid`` the denominator is +inf, so the ratio is 0
    # there (the numerator is finite) and no mask pass follows the division.
    denominator = torch.where(valid, energy, torch.inf)
    ratio = torch.div(numerator, denominator, out=numerator if numerator.is_contiguous() else None)
    return ratio, valid


def packs(device: torch.device) -> bool:
    """Whether :func:`blocked_zncc` transforms two blocks at once on ``device``: on the CPU
    (torch's CPU inverse real FFT costs twice its forward one), unless the tests force
    the GPUs' dtype policy there (``_numerics.FLOAT32_MOMENT_DEVICE_TYPES``), which then
    runs the GPUs' route, one real transform per block, as on a GPU."""
    return device.type == "cpu" and device.type not in _numerics.FLOAT32_MOMENT_DEVICE_TYPES


def _packed_numerator(y: torch.Tensor, unit: torch.Tensor, grid: TileGrid):
    """:func:`_numerator` of every block at once, two real blocks per complex transform.

    Without autograd on the CPU. Blocks ``2j`` and ``2j + 1`` along the last block axis are
    centered on their own means straight into the real and imaginary parts of one complex
    array ``z``: the template is real, so ``IFFT(FFT(z) · conj(FFT(t)))`` holds block
    ``2j``'s correlations in its real part and block ``2j + 1``'s in its imaginary part.
    One complex transform each way costs about what one real one does per block (torch's
    CPU ``irfftn`` took twice its ``rfftn``: 2048² with a 64² template, forward 24 ms,
    inverse 50 ms, against 24 and 27 ms packed), and the crops go straight into the
    untiled map. The two blocks then share their round-off (complex products mix real
    and imaginary parts), so each block's norm is the pair's (its noise threshold).

    Returns
    -------
    numerator : Tensor, shape ``(N, C, *out)``: ``Σ_j y[i + j] t[j]`` (a view).
    norm : Tensor, shape ``(N, C, *n, *(1,) * d)``: each block's pair's norm about the
        blocks' means.
    """
    d = grid.dims
    sample_dims = tuple(range(-d, 0))
    lengths = [t + k - 1 for t, k in zip(grid.tile, grid.window)]
    blocks = grid.tiles(_extend(y, grid))  # (N, C, *n, *L), overlapping views
    lead, counts = tuple(blocks.shape[:2]), grid.counts
    last = 2 + d - 1  # the block axis along which blocks are paired
    pairs = -(-counts[-1] // 2)
    complex_dtype = torch.complex128 if y.dtype == torch.float64 else torch.complex64
    z = torch.empty(*lead, *counts[:-1], pairs, *lengths, dtype=complex_dtype, device=y.device)
    parts = torch.view_as_real(z)  # (..., *L, 2)
    mean = blocks.mean(sample_dims, keepdim=True)

    def along(x, start, stop=None):
        index = [slice(None)] * x.dim()
        index[last] = slice(start, stop, 2)
        return x[tuple(index)]

    odd = counts[-1] // 2

    def second(x, pick=slice(0, odd)):
        """The imaginary parts ``(..., pairs, *L, 2) -> (..., pick, *L)``."""
        return x[(..., pick, *(slice(None),) * d, 1)]

    torch.sub(along(blocks, 0), along(mean, 0), out=parts[..., 0])
    torch.sub(along(blocks, 1), along(mean, 1), out=second(parts))
    if odd < pairs:  # an odd count: the last pair's second block is empty
        second(parts, slice(odd, None)).zero_()
    norm = torch.linalg.vector_norm(parts, dim=(*range(-d - 1, 0),), keepdim=True)[..., 0]
    norm = norm.repeat_interleave(2, dim=last).narrow(last, 0, counts[-1])

    pad = []
    for t in reversed(grid.tile):
        pad += [0, t - 1]
    spectrum = torch.fft.fftn(F.pad(unit.to(y.dtype), pad), dim=sample_dims).conj_physical()
    spectrum = spectrum.reshape(*unit.shape[:2], *(1,) * d, *spectrum.shape[-d:])
    product = torch.fft.fftn(z, dim=sample_dims)
    del z, parts
    product.mul_(spectrum)
    full = torch.view_as_real(torch.fft.ifftn(product, dim=sample_dims))
    crop = full[(..., *[slice(0, t) for t in grid.tile], slice(None))]

    # The untiled map, written once: its tiled view takes the pairs' two parts.
    whole = y.new_empty(*lead, *[c * t for c, t in zip(counts, grid.tile)])
    split = []
    for c, t in zip(counts, grid.tile):
        split += [c, t]
    tiles = whole.view(*lead, *split).permute(
        0, 1, *[2 + 2 * a for a in range(d)], *[3 + 2 * a for a in range(d)]
    )
    along(tiles, 0).copy_(crop[..., 0])
    along(tiles, 1).copy_(second(crop))
    for axis, n in enumerate(grid.spatial):
        whole = whole.narrow(2 + axis, 0, n)
    return whole, norm


def blocked_zncc(
    y: torch.Tensor,
    energy: torch.Tensor,
    t_centered: torch.Tensor,
    t_energy: torch.Tensor,
    t_flat: torch.Tensor,
    grid: TileGrid,
    wide: torch.dtype,
) -> torch.Tensor:
    """ZNCC of ``t_centered`` at every valid position of ``y``, block by block.

    Parameters
    ----------
    y : Tensor, shape ``(N, C, *P)``, ``P = out + t - 1``, in the dtype the transforms run
        in (float32 or float64): the data as they are (only scaled by a power of two, so
        exactly), not centered: a centered copy would round each value relative to the
        whole image's mean, which a dark window beside bright ones cannot afford; here each
        block is centered on its own mean.
    energy : Tensor, shape ``(N, C, *out)``: each window's energy ``sqrt(Σ (y - ȳ)²)`` (0
        where flat), differentiable.
    t_centered : Tensor, shape ``(Nt, Ct, *t)``, zero mean, in ``wide``; broadcast over
        ``(N, C)``. ``t_energy``, ``t_flat``: ``(Nt, Ct, 1, ...)``, its sum of squares (1
        where flat) and its flat flag (``ncc.centered_energy``).
    grid : :func:`block_grid` of ``(out, t)``.
    wide : the dtype to redo, in, the blocks holding windows that ``y``'s dtype cannot
        resolve (no redo when it is ``y``'s dtype).

    Returns
    -------
    Tensor, shape ``(N, C, *out)``, in ``y``'s dtype: the scores, 0 where the window or the
    template is flat; differentiable with respect to ``y``, ``t_centered`` and
    ``t_energy``.
    """
    d, work = grid.dims, y.dtype
    # The template of unit norm: the numerator is then the score times the window energy.
    unit = t_centered / t_energy.sqrt()
    differentiable = torch.is_grad_enabled() and any(
        t.requires_grad for t in (y, energy, t_centered, t_energy)
    )
    if packs(y.device) and not differentiable:
        numerator, norm = _packed_numerator(y, unit, grid)
    else:
        centered, norm = _center_blocks(grid.tiles(_extend(y, grid)), d)
        spectrum = _template_spectrum(unit.to(work), grid)
        numerator = grid.untile(_numerator(centered, spectrum, grid))
        del centered, spectrum
    factor = fft_noise_factor(work, grid)
    with torch.no_grad():
        # The energy each window needs to resolve: its block's norm times the factor (the
        # block's FFT round-off); infinite for a flat template (every score 0).
        lift = (*t_flat.shape[:2], *(1,) * (2 * d))
        thresholds = torch.where(t_flat.reshape(lift), torch.inf, norm * factor)
        noise = grid.untile(thresholds.expand(*y.shape[:2], *grid.counts, *grid.tile))
    scores, valid = _score(numerator, energy, noise)
    if wide == work:
        return scores
    with torch.no_grad():
        # count_nonzero: a bool sum would first widen the masks to int64
        resolved = int(valid.count_nonzero())
        if resolved == valid.numel():  # every window resolved (the usual case): no redo
            return scores
        # Windows float32 cannot resolve but float64 can: redo their blocks.
        resolvable = energy > noise * (fft_noise_factor(wide, grid) / factor)
        if int(resolvable.count_nonzero()) == resolved:
            return scores
        missing = grid.split(resolvable.logical_and_(~valid).to(work)).flatten(-d).amax(-1)
        redo = missing.flatten().nonzero().squeeze(1)
    tiled = _redo(grid.split(scores), redo, y.to(wide), unit, t_flat, grid)
    return grid.untile(tiled)


def _redo(scores, redo, y, unit, t_flat, grid: TileGrid):
    """``scores (N, C, *n, *T)`` with the blocks ``redo`` (flat indices into ``(N, C, *n)``)
    recomputed from ``y`` (``(N, C, *P)`` in the wider dtype)."""
    d = grid.dims
    n_channels = scores.shape[1]
    per_image = math.prod(grid.counts)
    blocks = grid.tiles(_extend(y, grid))
    rows = (-1, *(1,) * d)
    picked = blocks.reshape(-1, *blocks.shape[-d:]).index_select(0, redo)
    centered, norm = _center_blocks(picked, d)
    # The template (and its energy) each redone block is compared with.
    image, channel = redo // (n_channels * per_image), (redo // per_image) % n_channels
    nt, ct = unit.shape[:2]
    which = (image if nt > 1 else image * 0) * ct + (channel if ct > 1 else channel * 0)
    spectrum = _template_spectrum(unit.to(y.dtype), grid)
    spectrum = spectrum.reshape(nt * ct, *spectrum.shape[-d:]).index_select(0, which)
    numerator = _numerator(centered, spectrum, grid)
    impl = _kernels.implementation("local_std", centered)
    lengths = [t + k - 1 for t, k in zip(grid.tile, grid.window)]
    energy = impl.local_std_valid(centered.reshape(-1, 1, *lengths), grid.window, 0.0, False)
    energy = energy.reshape(numerator.shape)
    t_flat_rows = t_flat.reshape(-1).index_select(0, which).reshape(rows)
    noise = torch.where(t_flat_rows, torch.inf, norm * fft_noise_factor(y.dtype, grid))
    redone, _ = _score(numerator, energy, noise)
    flat = scores.reshape(-1, *scores.shape[-d:]).index_copy(0, redo, redone.to(scores.dtype))
    return flat.reshape(scores.shape)
