"""Mutual information of two images from a Parzen-window joint histogram (Mattes et al.).

docs/maths.md §10. Each image's intensities are mapped to continuous bin coordinates and
spread over the bins by a smooth kernel (a cubic B-spline, as Mattes et al. 2003 and
elastix's ``AdvancedMattesMutualInformation`` for the moving image, or a Gaussian), so the
joint histogram, and the mutual information computed from it, are differentiable with
respect to both images. For images whose intensities are related by any function, not
only a linear one (two stains, fluorescence against brightfield).
"""

from __future__ import annotations

import math

import torch

from . import _kernels
from ._autograd import first_order_backward
from ._kernels.preconditions import PARZEN_MAX_BINS
from ._numerics import moment_dtype
from ._validation import check_bool, check_choice, check_pair, check_positive

KERNELS = ("bspline", "gaussian")
#: pixels × taps (or tap pairs) built at once: bounds the memory of a pass
_CHUNK_ELEMENTS = 1 << 22
#: probabilities below this count as empty bins in p·log p (its gradient stays finite);
#: float32's smallest normal number where the entropies run in float32
_TINY = 1e-300


#: the cubic B-spline's weights ``β³(ξ − k)`` of the four bins ``k = cell − 1 … cell + 2``
#: (rows), then their first and second derivatives with respect to ``ξ``, as polynomials
#: in ``f = ξ − cell ∈ [0, 1]``: coefficients of ``(1, f, f², f³)`` (columns)
_BSPLINE3_BASIS = (
    (1 / 6, -1 / 2, 1 / 2, -1 / 6),  # (1 − f)³ / 6
    (2 / 3, 0.0, -1.0, 1 / 2),  # 2/3 − f² + f³/2
    (1 / 6, 1 / 2, 1 / 2, -1 / 2),
    (0.0, 0.0, 0.0, 1 / 6),  # f³ / 6
    (-1 / 2, 1.0, -1 / 2, 0.0),  # slopes
    (0.0, -2.0, 3 / 2, 0.0),
    (1 / 2, 1.0, -3 / 2, 0.0),
    (0.0, 0.0, 1 / 2, 0.0),
    (1.0, -1.0, 0.0, 0.0),  # curvatures
    (-2.0, 3.0, 0.0, 0.0),
    (1.0, -3.0, 0.0, 0.0),
    (0.0, 1.0, 0.0, 0.0),
)
#: (dtype, device) → (the basis ``(12, 4)``, the exponents ``(4, 1)``), made once per device
_BASIS_CACHE: dict = {}


def _basis(dtype, device):
    key = (dtype, str(device))
    hit = _BASIS_CACHE.get(key)
    if hit is None:
        hit = _BASIS_CACHE[key] = (
            torch.tensor(_BSPLINE3_BASIS, dtype=dtype, device=device),
            torch.arange(4, dtype=dtype, device=device).view(4, 1),
        )
    return hit


def _bspline3_cells(xi: torch.Tensor, bins: int, derivative: int = 0):
    """The cubic B-spline's four non-zero taps at bin coordinates ``xi`` ``(M, P)`` in
    ``[1, bins − 2]``: ``(cell, weights, slopes, curvatures)``, each pixel's cell ``cell =
    ⌊ξ⌋`` ``(M, P)`` (int64; kept ≤ bins − 3, so ``f = ξ − cell ∈ [0, 1]``) and the
    weights ``β³(ξ − k)`` ``(4, M, P)`` of bins ``k = cell − 1 … cell + 2``, their first
    (``derivative`` ≥ 1) and second (2) derivatives with respect to ``ξ``, else None.
    Detached from ``xi``.

    The tap is the leading axis, the pixels the contiguous one: torch's elementwise
    products over a trailing axis of 4 ran 5 to 7 times slower (docs/benchmarks.md). All
    of them are one product of the polynomials' coefficients (:data:`_BSPLINE3_BASIS`)
    with the powers ``(1, f, f², f³)`` (``(4, M·P)``, one launch): six launches in all,
    where the twelve polynomials in Horner form took about twenty-five (issue 24). In
    float32 the power form's terms are at most 2/3 for ``f ∈ [0, 1]``: each tap is within
    a few 1e-7 of Horner's."""
    cell, taps = _bspline3_taps(xi, bins, 4 * (1 + min(max(derivative, 0), 2)))
    weights = taps[:4]
    slopes = taps[4:8] if derivative >= 1 else None
    curves = taps[8:12] if derivative >= 2 else None
    return cell, weights, slopes, curves


def _bspline3_taps(xi: torch.Tensor, bins: int, rows: int):
    """``(cell (M, P) int64, taps (rows, M, P))``: the first ``rows`` (4, 8 or 12) rows
    of :data:`_BSPLINE3_BASIS` at bin coordinates ``xi`` (see :func:`_bspline3_cells`)."""
    # ξ ≥ 1 > 0: truncation is the floor (one launch less than floor, then a cast)
    cell = xi.detach().to(torch.int64).clamp_(1, bins - 3)
    f = xi.detach() - cell
    basis, exponents = _basis(f.dtype, f.device)
    powers = f.reshape(1, -1).pow(exponents)  # (4, M·P)
    return cell, (basis[:rows] @ powers).view(rows, *xi.shape)


def _cell_rows(cell_a: torch.Tensor, cell_b: torch.Tensor, bins: int) -> torch.Tensor:
    """Flat index ``(M·P,)`` of each pixel's pair of cells in ``(M, bins, bins)``: one
    index per pixel, its 4 × 4 tap pairs counted in 16 rows of the counts at that column
    (:func:`_spread_cells`; 16 separate flat indices per pixel took twice the time)."""
    m = cell_a.shape[0]
    rows = cell_a * bins + cell_b
    if m > 1:
        rows = rows + torch.arange(m, device=rows.device).view(m, 1) * (bins * bins)
    return rows.reshape(-1)


def _spread_cells(counts: torch.Tensor, bins: int) -> torch.Tensor:
    """Counts ``(4, 4, Q, M, bins, bins)`` per pair of taps and pair of cells → the joint
    histograms ``(M, bins, bins, Q)``: tap pair ``(i, j)`` of cells ``(k, l)`` is bin
    ``(k + i − 1, l + j − 1)`` (overlapping 4 × 4 blocks summed: ``fold``)."""
    q, m = counts.shape[2:4]
    blocks = counts.reshape(16, q, m, bins * bins).permute(2, 1, 0, 3).reshape(m, q * 16, -1)
    out = torch.nn.functional.fold(blocks, (bins + 3, bins + 3), (4, 4))  # (M, Q, b+3, b+3)
    return out[..., 1 : bins + 1, 1 : bins + 1].permute(0, 2, 3, 1)


def _cell_patches(grad_joint: torch.Tensor, bins: int) -> torch.Tensor:
    """``G`` ``(M, bins, bins)`` → ``(16, M·bins·bins)``: column ``(m, k, l)`` holds the
    4 × 4 bins ``G[m, k − 1 … k + 2, l − 1 … l + 2]`` that the taps of cells ``(k, l)``
    see (0 outside), row ``4i + j`` tap pair ``(i, j)``: the transpose of
    :func:`_spread_cells`."""
    m = grad_joint.shape[0]
    padded = torch.nn.functional.pad(grad_joint, (1, 2, 1, 2))  # (M, bins + 3, bins + 3)
    patches = padded.unfold(1, 4, 1).unfold(2, 4, 1)  # (M, bins, bins, 4, 4)
    return patches.permute(3, 4, 0, 1, 2).reshape(16, m * bins * bins)


def _seen(patches: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """The 4 × 4 bins of ``G`` each pixel's tap pairs see ``(4, 4, M, P)``, from
    :func:`_cell_patches` and the pixels' :func:`_cell_rows` ``(M, P)``."""
    g = patches.gather(1, rows.reshape(1, -1).expand(16, -1))
    return g.reshape(4, 4, *rows.shape)


def _gaussian_curvatures(xi: torch.Tensor, bins: int, sigma: float) -> torch.Tensor:
    """The second derivatives ``(M, P, bins)`` with respect to ``ξ`` of the normalized
    weights of :func:`_gaussian_taps`: ``(g/T)'' = g''/T − 2g'T'/T² − gT''/T² + 2gT'²/T³``."""
    centers = torch.arange(bins, device=xi.device, dtype=xi.dtype)
    t = xi.unsqueeze(-1) - centers
    g = torch.exp(-0.5 * (t / sigma) ** 2)
    dg = -t / sigma**2 * g
    ddg = (t * t / sigma**4 - 1 / sigma**2) * g
    total, dtotal, ddtotal = (x.sum(-1, keepdim=True) for x in (g, dg, ddg))
    return (
        ddg / total
        - 2 * dg * dtotal / total**2
        - g * ddtotal / total**2
        + 2 * g * dtotal**2 / total**3
    )


def _gaussian_taps(xi: torch.Tensor, bins: int, sigma: float, derivative: bool):
    """Gaussian weights of ``sigma`` bins over every bin, normalized to sum 1 per pixel,
    and their derivatives with respect to ``xi``."""
    centers = torch.arange(bins, device=xi.device, dtype=xi.dtype)
    t = xi.unsqueeze(-1) - centers
    g = torch.exp(-0.5 * (t / sigma) ** 2)
    total = g.sum(-1, keepdim=True)
    weights = g / total
    index = torch.arange(bins, device=xi.device).expand_as(t)
    if not derivative:
        return index, weights, None
    dg = -t / sigma**2 * g
    return index, weights, dg / total - weights * dg.sum(-1, keepdim=True) / total


class _Parzen:
    """The Parzen window over ``bins`` bins: each pixel's taps (bins, weights and their
    derivatives with respect to its bin coordinate ``ξ``), and their dense form.

    B-spline: 4 taps, summing to 1 for ``ξ ∈ [1, bins − 2]`` (where the intensities are
    mapped; :func:`_bspline3_cells`). Gaussian (``sigma`` in bins): every bin a tap,
    normalized to sum 1 (:meth:`taps`).
    """

    def __init__(self, kernel: str, bins: int, sigma: float):
        self.kernel, self.bins, self.sigma = kernel, bins, sigma
        #: B-spline: 4 × 4 tap pairs per pixel, counted directly; Gaussian: every bin a
        #: tap, dense weights and matrix products
        self.sparse = kernel == "bspline"
        #: elements per pixel a chunk holds (sizes the chunks)
        self.cost = 16 if self.sparse else bins

    def taps(self, xi: torch.Tensor, derivative: bool = False):
        """The Gaussian's ``(index, weights, slopes)``, each ``(M, P, bins)`` (``slopes``
        None unless asked); the B-spline's taps come from :func:`_bspline3_cells`, laid
        out tap-first."""
        return _gaussian_taps(xi, self.bins, self.sigma, derivative)

    def curvatures(self, xi: torch.Tensor) -> torch.Tensor:
        """The Gaussian taps' second derivatives ``(M, P, bins)`` with respect to ``ξ``."""
        return _gaussian_curvatures(xi, self.bins, self.sigma)

    def dense(self, index: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """``W[m, p, k]`` ``(M, P, bins)``: the taps' weights scattered onto the bins."""
        out = weights.new_zeros(*weights.shape[:-1], self.bins)
        return out.scatter_add_(-1, index, weights)


class _JointHistogram(torch.autograd.Function):
    """``J[m] = Σ_p w_p · W_a[m, p]ᵀ ⊗ W_b[m, p]`` ``(M, bins, bins)`` from bin coordinates
    ``xi_a``, ``xi_b`` ``(M, P)`` and pixel weights ``(M, P)`` (or None).

    Pixels are processed in chunks: the B-spline's 16 tap pairs per pixel counted into
    their bins, or the Gaussian's dense weights and one batched matrix product; the
    backward recomputes the taps chunk by chunk, so the memory is a few ``(M, P)`` maps
    whatever the number of bins (docs/maths.md §10.2).
    """

    @staticmethod
    def forward(ctx, xi_a, xi_b, weight, parzen: _Parzen):
        ctx.save_for_backward(xi_a, xi_b, weight)
        ctx.parzen = parzen
        m, p = xi_a.shape
        bins = parzen.bins
        if parzen.sparse:  # 4 × 4 tap pairs per pixel, counted directly
            return _bspline_histogram(xi_a, xi_b, weight, bins)
        joint = xi_a.new_zeros(m * bins * bins)
        for chunk in _chunks(p, m * parzen.cost):
            index_a, wa, _ = parzen.taps(xi_a[:, chunk])
            index_b, wb, _ = parzen.taps(xi_b[:, chunk])
            if weight is not None:
                wa = wa * weight[:, chunk].unsqueeze(-1)
            # every bin a tap: dense weights and one batched matrix product
            dense = torch.bmm(parzen.dense(index_a, wa).transpose(1, 2), parzen.dense(index_b, wb))
            joint += dense.reshape(-1)
        return joint.reshape(m, bins, bins)

    @staticmethod
    @first_order_backward("mutual_information")
    def backward(ctx, grad_joint):
        xi_a, xi_b, weight = ctx.saved_tensors
        parzen = ctx.parzen
        need_a, need_b = ctx.needs_input_grad[:2]
        grad_a = torch.zeros_like(xi_a) if need_a else None
        grad_b = torch.zeros_like(xi_b) if need_b else None
        m, p = xi_a.shape
        grad_joint = grad_joint.contiguous()
        patches = _cell_patches(grad_joint, parzen.bins) if parzen.sparse else None
        for chunk in _chunks(p, m * parzen.cost):
            w = None if weight is None else weight[:, chunk]
            # ∂L/∂ξ_a(p) = w_p Σ_k W'_a[p, k] Σ_l G[k, l] W_b[p, l], and the same for b:
            # what each tap of one image sees of G through the other image's weights
            if parzen.sparse:  # taps leading: (4, M, p); seen (4, 4, M, p)
                cell_a, wa, slope_a, _ = _bspline3_cells(xi_a[:, chunk], parzen.bins, need_a)
                cell_b, wb, slope_b, _ = _bspline3_cells(xi_b[:, chunk], parzen.bins, need_b)
                g = _seen(patches, _cell_rows(cell_a, cell_b, parzen.bins).view(cell_a.shape))
                if need_a:
                    total = (slope_a * (g * wb[None]).sum(1)).sum(0)
                    grad_a[:, chunk] = total if w is None else total * w
                if need_b:
                    total = (slope_b * (g * wa[:, None]).sum(0)).sum(0)
                    grad_b[:, chunk] = total if w is None else total * w
                continue
            index_a, wa, slope_a = parzen.taps(xi_a[:, chunk], derivative=need_a)
            index_b, wb, slope_b = parzen.taps(xi_b[:, chunk], derivative=need_b)
            if need_a:
                seen = torch.bmm(parzen.dense(index_b, wb), grad_joint.transpose(1, 2))
                g = (slope_a * seen.gather(-1, index_a)).sum(-1)
                grad_a[:, chunk] = g if w is None else g * w
            if need_b:
                seen = torch.bmm(parzen.dense(index_a, wa), grad_joint).gather(-1, index_b)
                g = (slope_b * seen).sum(-1)
                grad_b[:, chunk] = g if w is None else g * w
        return grad_a, grad_b, None, None


def cell_taps(xi: torch.Tensor, bins: int):
    """The cubic B-spline's taps at bin coordinates ``xi`` ``(M, P)``: ``(rows, weights)``,
    ``rows`` ``(M, P)`` each pixel's cell times ``bins`` plus its row's offset ``m ·
    bins²`` (int64), ``weights`` ``(4, M, P)`` (bins ``cell − 1 … cell + 2``). The fixed
    image's taps, kept across the steps of a level (its frame rarely changes)."""
    m = xi.shape[0]
    cell, weights, _, _ = _bspline3_cells(xi, bins)
    rows = cell * bins
    if m > 1:
        rows = rows + torch.arange(m, device=rows.device).view(m, 1) * (bins * bins)
    return rows, weights


def _taps_in(taps_a, chunk, bins: int):
    """The fixed taps ``(rows (M, p), weights (4, M, p))`` of the pixels ``chunk``: from
    :func:`cell_taps` kept whole, or computed here from bin coordinates ``(M, P)`` (so
    that a one-off histogram holds no whole-image taps)."""
    if isinstance(taps_a, torch.Tensor):
        return cell_taps(taps_a[:, chunk], bins)
    rows, weights = taps_a
    return rows[:, chunk], weights[:, :, chunk]


def moving_taps(xi: torch.Tensor, bins: int):
    """``(cell (M, P) int64, taps (12, M, P))``: the B-spline taps of bin coordinates
    ``xi`` ``(M, P)`` with both derivatives (rows 0…3 the weights, 4…7 the slopes, 8…11
    the curvatures; :func:`_bspline3_cells`), kept whole for :func:`bspline_histograms`
    and :func:`bspline_pixel_derivatives` to share."""
    return _bspline3_taps(xi, bins, 12)


def _moving_in(taps_b, chunk, bins: int, rows: int):
    """``(cell (M, p), taps (rows, M, p))`` of the pixels ``chunk``, from bin
    coordinates ``(M, P)`` or from :func:`moving_taps` kept whole."""
    if isinstance(taps_b, torch.Tensor):
        return _bspline3_taps(taps_b[:, chunk], bins, rows)
    cell, taps = taps_b
    return cell[:, chunk], taps[:rows, :, chunk]


def taps_device(taps_b) -> torch.device:
    return taps_b.device if isinstance(taps_b, torch.Tensor) else taps_b[0].device


def _shape_of(taps_b):
    return taps_b.shape if isinstance(taps_b, torch.Tensor) else taps_b[0].shape


def bspline_histograms(taps_a, xi_b, weights, bins: int) -> list:
    """The B-spline joint histograms ``(M, bins, bins)`` of the fixed taps ``taps_a``
    (:func:`cell_taps`, or the fixed bin coordinates ``(M, P)``) and bin coordinates
    ``xi_b`` ``(M, P)`` (or their :func:`moving_taps`), one per pixel weight in
    ``weights`` (each ``(M, P)`` or None), in one pass: each pixel's 16 tap pairs are
    formed once and counted at the column of its pair of cells, 16 rows per weight
    (:func:`_cell_rows`), then spread onto the bins (:func:`_spread_cells`)."""
    m, p = _shape_of(xi_b)
    k = len(weights)
    dtype = xi_b.dtype if isinstance(xi_b, torch.Tensor) else xi_b[1].dtype
    counts = torch.zeros(k * 16, m * bins * bins, dtype=dtype, device=taps_device(xi_b))
    for chunk in _chunks(p, m * 16 * k):
        rows_a, wa = _taps_in(taps_a, chunk, bins)
        cell_b, wb = _moving_in(xi_b, chunk, bins, 4)
        if k == 1:  # (K, 4, M, p): the fixed taps under each weight
            wa = (wa if weights[0] is None else wa * weights[0][:, chunk]).unsqueeze(0)
        elif all(w is not None for w in weights):  # one product for every weight
            wa = wa * torch.stack([w[:, chunk] for w in weights])[:, None]
        else:
            wa = torch.stack([wa if w is None else wa * w[:, chunk] for w in weights])
        values = wa.unsqueeze(2) * wb[None, None]  # (K, 4, 4, M, p): every pair, every weight
        counts.index_add_(1, (rows_a + cell_b).reshape(-1), values.reshape(k * 16, -1))
    counts = counts.reshape(k, 4, 4, m, bins, bins).permute(1, 2, 0, 3, 4, 5)
    return list(_spread_cells(counts, bins).unbind(-1))


def bspline_pixel_derivatives(taps_a, xi_b, slope, weight, grad_joint, bins: int):
    """:func:`pixel_derivatives` for the B-spline window from the fixed taps ``taps_a``
    (:func:`cell_taps`, or the fixed bin coordinates) and the moving bin coordinates
    ``xi_b`` (or their :func:`moving_taps`): first and second derivatives ``(M, P)``
    each; ``slope`` ``(M, 1)``, or ``(2, M, 1)`` holding ``∂ξ/∂b`` and its square."""
    m, p = _shape_of(xi_b)
    dtype = xi_b.dtype if isinstance(xi_b, torch.Tensor) else xi_b[1].dtype
    patches = _cell_patches(grad_joint.to(dtype), bins)
    parts = []
    for chunk in _chunks(p, m * 16):
        rows_a, wa = _taps_in(taps_a, chunk, bins)
        cell_b, taps_b = _moving_in(xi_b, chunk, bins, 12)
        g = _seen(patches, rows_a + cell_b)  # (4, 4, M, p)
        seen = (g * wa[:, None]).sum(0)  # (4, M, p): G seen by b's taps, over a's taps
        # slopes and curvatures are rows 4…11 of one tensor: both sums in one launch
        both = taps_b[4:12].unflatten(0, (2, 4))
        parts.append((both * seen).sum(1))  # (2, M, p)
    out = parts[0] if len(parts) == 1 else torch.cat(parts, dim=2)
    if slope.dim() == 3:  # (∂ξ/∂b, (∂ξ/∂b)²) given: one product each
        out = out.mul_(slope) if weight is None else out.mul_(weight).mul_(slope)
        return out[0], out[1]
    scale = slope if weight is None else weight * slope
    out = out.mul_(scale)
    out[1].mul_(slope)
    return out[0], out[1]


def _bspline_histogram(xi_a, xi_b, weight, bins: int) -> torch.Tensor:
    """The B-spline's joint histogram ``(M, bins, bins)`` (:func:`bspline_histograms`)."""
    return bspline_histograms(xi_a, xi_b, [weight], bins)[0]


def _pair_index(index_a: torch.Tensor, index_b: torch.Tensor, bins: int) -> torch.Tensor:
    """Flat index ``(M, P, Ta, Tb)`` of every pair of taps into ``(M, bins, bins)``."""
    m = index_a.shape[0]
    if m * bins * bins < 2**31:  # int32 halves the memory the largest temporary touches
        index_a, index_b = index_a.to(torch.int32), index_b.to(torch.int32)
    rows = index_a * bins  # the row offsets on the small (M, P, Ta) side: one full-size add
    if m > 1:
        offset = torch.arange(m, device=index_a.device).view(m, 1, 1) * (bins * bins)
        rows = rows + offset
    return rows.unsqueeze(-1) + index_b.unsqueeze(-2)


def _chunks(pixels: int, per_pixel: int):
    step = max(1, _CHUNK_ELEMENTS // max(per_pixel, 1))
    for start in range(0, pixels, step):
        yield slice(start, min(pixels, start + step))


def frame_of(x: torch.Tensor, valid: torch.Tensor):
    """The default histogram frame ``(lo, hi)`` ``(M, 1)`` each of intensities ``x``
    ``(M, P)``: each row's min and max over its pixels in ``valid`` (detached: the frame
    does not move with the image; ``(0, 1)`` for a row with no valid pixel)."""
    big = torch.finfo(x.dtype).max
    lo = torch.where(valid, x, x.new_tensor(big)).amin(1, keepdim=True).detach()
    hi = torch.where(valid, x, x.new_tensor(-big)).amax(1, keepdim=True).detach()
    empty = hi < lo  # no valid pixel: any frame will do, the weights are all 0
    return torch.where(empty, 0.0, lo), torch.where(empty, 1.0, hi)


def bin_coordinates(x, lo, hi, bins: int, pad: float):
    """Intensities ``(M, P)`` → continuous bin coordinates in ``[pad, bins − 1 − pad]``
    for the frame ``[lo, hi]`` (values outside clamped to it), and ``∂ξ/∂x`` ``(M, 1)``
    inside it."""
    span = hi - lo
    flat = span <= 0
    span = torch.where(flat, torch.ones_like(span), span)
    unit = ((torch.minimum(torch.maximum(x, lo), hi) - lo) / span).clamp(0.0, 1.0)
    return pad + unit * (bins - 1 - 2 * pad), (bins - 1 - 2 * pad) / span.expand(x.shape[0], 1)


def _bin_coordinates(x, valid, value_range, bins: int, pad: float):
    """Intensities ``(M, P)`` → :func:`bin_coordinates` in the frame ``value_range`` or,
    per row, :func:`frame_of` the pixels in ``valid``."""
    if value_range is None:
        lo, hi = frame_of(x, valid)
    else:
        lo, hi = (x.new_tensor(float(v)) for v in value_range)
    return bin_coordinates(x, lo, hi, bins, pad)


def _pair_bin_coordinates(xa, xb, valid, value_range, bins: int, pad: float):
    """Intensities ``(M, P)`` of both images → their bin coordinates in ``[pad, bins − 1 −
    pad]``, as :func:`_bin_coordinates` of each (the frame ``value_range`` or each row's
    range over the pixels in ``valid``, held fixed; values outside clamped to it), both
    images in one pass: about ten launches where two calls took twenty-four (issue 24).
    A row with no valid pixel has an inverted frame: its values all clamp to ``pad``
    (they carry no weight)."""
    both = torch.stack([xa.detach(), xb.detach()])  # (2, M, P)
    if value_range is None:
        big = torch.finfo(xa.dtype).max
        lo = torch.where(valid, both, big).amin(-1, keepdim=True)
        hi = torch.where(valid, both, -big).amax(-1, keepdim=True)
    else:
        lo, hi = (xa.new_tensor(float(v)) for v in value_range)
    span = hi - lo
    span = torch.where(span > 0, span, 1.0)
    # (x − lo) / span clamped to [0, 1], gradients through x only: the frame's ends map to
    # 0 and 1 exactly in any dtype (a product with (bins − 3) / span rounds above the top
    # in float32 and the clamp then takes the brightest pixel's gradient)
    unit = torch.stack([xa, xb]).sub(lo).div_(span).clamp_(0.0, 1.0)
    xi = unit.mul_(bins - 1 - 2 * pad).add_(pad)
    return xi[0], xi[1]


def _tiny(dtype: torch.dtype) -> float:
    return max(_TINY, torch.finfo(dtype).tiny)


def _entropy(p: torch.Tensor, dims) -> torch.Tensor:
    return -(p * torch.log(p.clamp_min(_tiny(p.dtype)))).sum(dims)


def score_of_joint(joint: torch.Tensor, normalize: bool) -> torch.Tensor:
    """The mutual information (or, ``normalize``, the normalized mutual information) ``(M,)``
    of joint histograms ``(M, bins, bins)`` (counts, any total), differentiable.

    In float64 on the CPU; in float32 on GPUs and MPS (``_numerics.moment_dtype``: float64
    runs at 1/32 to 1/64 of the float32 rate on most GPUs). Every ``-p log p`` is ≥ 0, so
    each entropy is a sum without cancellation, good to a few float32 ulps; the mutual
    information, a difference of entropies, keeps an absolute error of a few ulps of the
    joint entropy (about 1e-6 nats for 32 bins), within 1e-5 of float64 (tests).
    """
    joint = joint.to(moment_dtype(joint.dtype, joint.device))
    total = joint.sum((1, 2), keepdim=True)
    p = joint / total.clamp_min(_tiny(joint.dtype))
    h_ab = _entropy(p, (1, 2))
    h_a = _entropy(p.sum(2), 1)
    h_b = _entropy(p.sum(1), 1)
    if normalize:
        flat = h_ab <= 0
        return torch.where(flat, 2.0, (h_a + h_b) / torch.where(flat, 1.0, h_ab))
    return h_a + h_b - h_ab


#: (bins, dtype, device) → the segments ``(bins² + 2 bins, 3)`` that sum ``p log p`` over
#: the joint, then each marginal, in one product (:func:`score_and_gradient`)
_SEGMENTS: dict = {}


def _segments(bins: int, dtype, device) -> torch.Tensor:
    key = (bins, dtype, str(device))
    hit = _SEGMENTS.get(key)
    if hit is None:
        hit = torch.zeros(bins * bins + 2 * bins, 3, dtype=dtype)
        hit[: bins * bins, 0] = 1.0
        hit[bins * bins : bins * bins + bins, 1] = 1.0
        hit[bins * bins + bins :, 2] = 1.0
        hit = _SEGMENTS[key] = hit.to(device)
    return hit


def score_and_gradient(
    joint: torch.Tensor,
    normalize: bool,
    gradient: bool = True,
    negate: bool = False,
    empty: bool = True,
):
    """The score ``S`` ``(M,)`` of :func:`score_of_joint` of joint histograms ``(M, bins,
    bins)`` and (``gradient``) its gradient ``∂S/∂J`` ``(M, bins, bins)``, else None, in
    closed form (``negate``: ``−∂S/∂J``, the gradient of a loss ``c − S``, at no cost;
    ``empty=False``: a histogram with nothing counted gives NaN where the normalized form
    is otherwise 2, and MI 0, each with a zero gradient; two or three launches less) and
    in the histograms' dtype (float32 on a GPU: no float64 and no
    autograd pass; 10 to 20 launches).

    With ``T = ΣJ``, ``p = J / T`` (normalized once) and its marginals ``p_a``, ``p_b``:

        MI:  ∂S/∂J = (log p_ab − log p_a − log p_b − MI) / T
        NMI: ∂S/∂J = (S · log p_ab − log p_a − log p_b) / (H_ab · T)

    (``∂H/∂J = −(log p + H) / T`` for each entropy). Every ``p log p`` is ≤ 0, so each
    entropy is a sum without cancellation, as in :func:`score_of_joint`; ``log p`` is
    clamped at the dtype's smallest normal number, so an empty bin gives a finite
    gradient, which no pixel sees with a non-zero weight (tests: on filled bins, within
    1e-5 of float64 autograd in float32)."""
    m, b = joint.shape[0], joint.shape[1]
    tiny = _tiny(joint.dtype)
    parts = torch.cat([joint.reshape(m, b * b), joint.sum(2), joint.sum(1)], dim=1)
    total = parts[:, : b * b].sum(1, keepdim=True)
    p = parts / total.clamp_min(tiny)
    log_p = p.clamp_min(tiny).log_()
    # −H of the joint, of a and of b: three segment sums of p log p, one product
    sums = (p * log_p) @ _segments(b, p.dtype, p.device)
    neg_h_ab, neg_h_a, neg_h_b = sums.unbind(1)
    if normalize:
        score = (neg_h_a + neg_h_b) / neg_h_ab
        flat = None
        if empty:
            flat = neg_h_ab >= 0  # H_ab = 0: one bin (or none) holds everything
            score = score.masked_fill_(flat, 2.0)
    else:
        score = neg_h_ab - neg_h_a - neg_h_b
    if not gradient:
        return score, None
    log_ab = log_p[:, : b * b].view(m, b, b)
    log_a = log_p[:, b * b : b * b + b].view(m, b, 1)
    log_b = log_p[:, b * b + b :].view(m, 1, b)
    if not normalize:
        if negate:
            grad = (log_a + log_b + score.view(m, 1, 1) - log_ab) / total.view(m, 1, 1)
        else:
            grad = (log_ab - log_a - log_b - score.view(m, 1, 1)) / total.view(m, 1, 1)
        if empty:  # no weight (total 0): a score of 0 that no pixel moves
            grad = grad.masked_fill_((total == 0).view(m, 1, 1), 0.0)
        return score, grad
    # ∂S/∂J = (S log p_ab − log p_a − log p_b) / (H_ab T), and H_ab = −(Σ p log p)
    scale = neg_h_ab * total[:, 0]
    if not negate:
        scale = scale.neg_()
    grad = (log_ab * score.view(m, 1, 1) - log_a - log_b) / scale.view(m, 1, 1)
    return score, grad if flat is None else grad.masked_fill_(flat.view(m, 1, 1), 0.0)


class _Score(torch.autograd.Function):
    """:func:`score_of_joint` ``(M,)`` of joint histograms ``(M, bins, bins)``, its
    gradient from :func:`score_and_gradient`'s closed form, made in the forward (no
    autograd graph through the entropies: about twenty launches fewer per call, issue 24).
    In :func:`~._numerics.moment_dtype`; the score in the histograms' dtype."""

    @staticmethod
    def forward(ctx, joint, normalize: bool):
        wide = moment_dtype(joint.dtype, joint.device)
        need = ctx.needs_input_grad[0]
        score, grad = score_and_gradient(joint.to(wide), normalize, gradient=need)
        ctx.save_for_backward(grad)
        return score.to(joint.dtype)

    @staticmethod
    @first_order_backward("mutual_information")
    def backward(ctx, grad_score):
        (grad,) = ctx.saved_tensors
        if grad is None:
            return None, None
        out = grad * grad_score.to(grad.dtype).view(-1, 1, 1)
        return out.to(grad_score.dtype), None


def score_curvature(joint: torch.Tensor, moves: torch.Tensor, normalize: bool) -> torch.Tensor:
    """``(∂J/∂θ)ᵀ (∂²S/∂J²) (∂J/∂θ)`` ``(M, Q, Q)``: the second derivatives of the score
    ``S`` of :func:`score_of_joint` (the mutual information or its normalized form) along
    the histogram's derivatives ``moves`` ``(M, bins, bins, Q)``, in closed form
    (docs/maths.md §10.3). With ``T = ΣJ`` and ``Σ_x = Σ J_x log J_x`` over the joint
    (or a marginal), each entropy is ``H = log T − Σ_x / T``; its second derivative
    along ``U, V`` is

        −U_T V_T / T² − Σ U V / J / T + (dΣ[U] V_T + dΣ[V] U_T) / T² − 2 Σ_x U_T V_T / T³

    with ``dΣ[V] = Σ V (log J + 1)`` (``U_T = ΣU``; marginals for ``H(a)``, ``H(b)``).
    Empty bins count for nothing: the B-spline's taps and their derivatives vanish
    together at the ends of their support, so no move reaches an empty bin, and the
    Gaussian's taps are never 0. In float64 on the CPU, in float32 on GPUs and MPS
    (``_numerics.moment_dtype``), where it is within 1e-4 of float64 (tests): a curvature
    for a Gauss–Newton step, not a result."""
    wide = moment_dtype(torch.promote_types(joint.dtype, moves.dtype), joint.device)
    joint, moves = joint.to(wide), moves.to(wide)
    total = joint.sum((1, 2))  # (M,)
    t = total.clamp_min(_tiny(wide))[:, None, None]
    v_total = moves.sum((1, 2))  # (M, Q)
    outer = v_total[:, :, None] * v_total[:, None, :]

    def entropy_terms(j, v):
        # j (M, K), v (M, K, Q) → value H (M,), first dH (M, Q), second d²H (M, Q, Q)
        filled = j > 0
        log_j = torch.log(torch.where(filled, j, torch.ones_like(j)))
        inverse = torch.where(filled, 1.0 / torch.where(filled, j, torch.ones_like(j)), 0.0)
        sigma = (j * log_j).sum(1)
        d_sigma = torch.einsum("mkq,mk->mq", v, log_j + 1.0)
        dd_sigma = torch.einsum("mkq,mk,mkr->mqr", v, inverse, v)
        t1 = t[:, 0, 0]
        value = torch.log(t1) - sigma / t1
        first = (
            v_total / t1[:, None]
            - d_sigma / t1[:, None]
            + sigma[:, None] * v_total / (t1[:, None] ** 2)
        )
        second = (
            -outer / t**2
            - dd_sigma / t
            + (
                d_sigma[:, None, :] * v_total[:, :, None]
                + d_sigma[:, :, None] * v_total[:, None, :]
            )
            / t**2
            - 2.0 * sigma[:, None, None] * outer / t**3
        )
        return value, first, second

    m = joint.shape[0]
    q = moves.shape[-1]
    h_ab = entropy_terms(joint.reshape(m, -1), moves.reshape(m, -1, q))
    h_a = entropy_terms(joint.sum(2), moves.sum(2))
    h_b = entropy_terms(joint.sum(1), moves.sum(1))
    if not normalize:
        return h_a[2] + h_b[2] - h_ab[2]
    num = [x + y for x, y in zip(h_a, h_b)]
    den = h_ab
    d = den[0][:, None, None]
    cross = num[1][:, :, None] * den[1][:, None, :]
    return (
        num[2] / d
        - (cross + cross.transpose(1, 2)) / d**2
        - num[0][:, None, None] * den[2] / d**2
        + 2.0 * num[0][:, None, None] * den[1][:, :, None] * den[1][:, None, :] / d**3
    )


def parzen_frames(a, b, weight, bins: int, kernel: str, sigma: float):
    """``(xi_a, xi_b, ∂ξ_b/∂b (M, 1), parzen)``: the default frames of
    :func:`mutual_information` (each row's range over its pixels of positive weight) for
    intensities ``a``, ``b`` ``(M, P)``, and its Parzen window."""
    valid = torch.ones_like(a, dtype=torch.bool) if weight is None else weight > 0
    pad = 1.0 if kernel == "bspline" else 0.0
    xi_a = _bin_coordinates(a, valid, None, bins, pad)[0]
    xi_b, slope = _bin_coordinates(b, valid, None, bins, pad)
    return xi_a, xi_b, slope, _Parzen(kernel, bins, sigma)


def joint_histogram(xi_a, xi_b, weight, parzen) -> torch.Tensor:
    """The joint histogram ``(M, bins, bins)`` (counts) of bin coordinates from
    :func:`parzen_frames`, as :func:`mutual_information` builds it (not differentiated)."""
    with torch.no_grad():
        return _JointHistogram.apply(xi_a, xi_b, weight, parzen)


def joint_jacobian(xi_a, xi_b, slope, weight, parzen, moves):
    """``∂J/∂θ`` ``(M, bins, bins, Q)`` for ``∂b/∂θ`` ``(M, Q, P)``."""
    m, p = xi_a.shape
    q = moves.shape[1]
    bins = parzen.bins
    if parzen.sparse:  # taps leading, as in bspline_histograms
        counts = xi_a.new_zeros(16 * q, m * bins * bins)
        for chunk in _chunks(p, m * 16 * q):
            cell_a, wa, _, _ = _bspline3_cells(xi_a[:, chunk], bins)
            cell_b, _, sb, _ = _bspline3_cells(xi_b[:, chunk], bins, 1)
            if weight is not None:
                wa = wa * weight[:, chunk]
            mv = (moves[:, :, chunk] * slope[:, :, None]).transpose(0, 1)  # (Q, M, p)
            values = (wa[:, None] * sb[None])[:, :, None] * mv  # (4, 4, Q, M, p)
            counts.index_add_(1, _cell_rows(cell_a, cell_b, bins), values.reshape(16 * q, -1))
        return _spread_cells(counts.reshape(4, 4, q, m, bins, bins), bins)
    out = xi_a.new_zeros(m * bins * bins, q)
    for chunk in _chunks(p, m * parzen.cost * q):
        index_a, wa, _ = parzen.taps(xi_a[:, chunk])
        index_b, _, sb = parzen.taps(xi_b[:, chunk], derivative=True)
        if weight is not None:
            wa = wa * weight[:, chunk].unsqueeze(-1)
        mv = (moves[:, :, chunk] * slope[:, :, None]).transpose(1, 2)
        flat = _pair_index(index_a, index_b, bins).reshape(-1)
        values = (wa.unsqueeze(-1) * sb.unsqueeze(-2)).unsqueeze(-1) * mv[:, :, None, None, :]
        out.index_add_(0, flat, values.reshape(-1, q))
    return out.reshape(m, bins, bins, q)


def pixel_derivatives(xi_a, xi_b, slope, weight, parzen, grad_joint):
    """First and second derivatives ``(M, P)`` each of ``Σ_ικ G[ι, κ] J[ι, κ]`` with
    respect to each pixel's intensity ``b(x)``, for a fixed ``G`` ``(M, bins, bins)`` on the
    bins of the joint histogram ``J`` (:func:`joint_histogram`), the frames held fixed:

        w_x Σ_ικ G[ι, κ] W_a(ι − ξ_a(x)) W_b'(κ − ξ_b(x)) ∂ξ_b/∂b,
        w_x Σ_ικ G[ι, κ] W_a(ι − ξ_a(x)) W_b''(κ − ξ_b(x)) (∂ξ_b/∂b)²

    (``J`` is a sum over the pixels: its second derivatives in two pixels are 0). With
    ``G = ∂L/∂J`` the first is ``∂L/∂b``; the second is ``∂²L/∂b²`` with ``G`` held fixed
    (docs/maths.md §6.4, §10.3).
    """
    m, p = xi_a.shape
    bins = parzen.bins
    if parzen.sparse:
        return bspline_pixel_derivatives(xi_a, xi_b, slope, weight, grad_joint, bins)
    first, second = torch.zeros_like(xi_b), torch.zeros_like(xi_b)
    grad_joint = grad_joint.to(xi_b.dtype).contiguous()
    for chunk in _chunks(p, m * parzen.cost):
        index_a, wa, _ = parzen.taps(xi_a[:, chunk])
        index_b, _, slopes = parzen.taps(xi_b[:, chunk], derivative=True)
        curves = parzen.curvatures(xi_b[:, chunk])
        seen = torch.bmm(parzen.dense(index_a, wa), grad_joint).gather(-1, index_b)
        first[:, chunk] = (slopes * seen).sum(-1)
        second[:, chunk] = (curves * seen).sum(-1)
    if weight is not None:
        first, second = first * weight, second * weight
    return first * slope, second * slope * slope


def _check_weight(weight, a: torch.Tensor) -> torch.Tensor | None:
    if weight is None:
        return None
    if not isinstance(weight, torch.Tensor) or not weight.is_floating_point():
        raise TypeError(f"weight must be a floating-point torch.Tensor, got {weight!r:.80}")
    expected = (a.shape[0], 1, *a.shape[2:])
    if (
        weight.dim() != a.dim()
        or weight.shape[0] not in (1, a.shape[0])
        or weight.shape[1] != 1
        or weight.shape[2:] != a.shape[2:]
    ):
        raise ValueError(
            f"weight must have shape (N or 1, 1, *S) = {expected} for images of shape "
            f"{tuple(a.shape)}, got {tuple(weight.shape)}"
        )
    if weight.device != a.device:
        raise ValueError(f"weight is on {weight.device}, the images on {a.device}")
    return weight.detach()


def _check_range(value_range):
    if value_range is None:
        return None
    try:
        lo, hi = (float(v) for v in value_range)
    except (TypeError, ValueError):
        raise TypeError(
            f"value_range must be None or a pair (low, high) of numbers, got {value_range!r}"
        ) from None
    if not (math.isfinite(lo) and math.isfinite(hi) and hi > lo):
        raise ValueError(f"value_range must be finite with high > low, got {value_range!r}")
    return lo, hi


def mutual_information(
    a: torch.Tensor,
    b: torch.Tensor,
    *,
    weight: torch.Tensor | None = None,
    bins: int = 32,
    kernel: str = "bspline",
    sigma: float = 1.0,
    value_range=None,
    normalize: bool = False,
) -> torch.Tensor:
    """Mutual information of ``a`` and ``b`` per image and channel, from a Parzen-window
    joint histogram.

    Parameters
    ----------
    a, b : Tensor, shape ``(N, C, H, W)`` or ``(N, C, D, H, W)``, same shape and device
        float16/bfloat16 (computed in float32), float32 or float64. Never modified.
    weight : Tensor, shape ``(N or 1, 1, *S)``, optional
        Each pixel's share of the histogram (≥ 0; a 0/1 mask selects pixels). No gradient
        flows to it. Default: every pixel counts once.
    bins : int
        Histogram bins per image (≥ 4 for the B-spline kernel, ≥ 2 for the Gaussian).
    kernel : {"bspline", "gaussian"}
        The Parzen window: the cubic B-spline of Mattes et al. (support 4 bins, the
        intensity range mapped onto bins ``[1, bins − 2]`` so that every pixel's weights
        sum to 1), or a Gaussian of ``sigma`` bins (weights normalized to sum 1 per pixel,
        the range mapped onto ``[0, bins − 1]``).
    sigma : float
        The Gaussian's standard deviation, in bins (ignored by the B-spline).
    value_range : (low, high), optional
        The intensity range the bins cover, for both images; values outside are clamped
        to it. Default: each image's own min and max (over the pixels of positive weight,
        per image and channel; not differentiated).
    normalize : bool
        False: the mutual information ``H(a) + H(b) − H(a, b)`` in nats. True: the
        normalized mutual information ``(H(a) + H(b)) / H(a, b)`` of Studholme et al. (in
        ``[1, 2]``; scikit-image's ``normalized_mutual_information``).

    Returns
    -------
    Tensor, shape ``(N, C)``, in the promoted dtype of ``a`` and ``b``. The mutual
    information is ≥ 0: 0 for independent images (and wherever one image is constant
    over the counted pixels), larger the more each image tells about the other; the
    normalized form runs from 1 (independent) to 2 (each determines the other; 2 also
    where the joint entropy is 0). NaN for an image and channel holding a NaN or
    infinite pixel. Differentiable with respect to
    ``a`` and ``b`` (first derivatives; the histogram's frame is held fixed).
    """
    out_dtype, dtype = check_pair(a, b)
    weight = _check_weight(weight, a)
    if isinstance(bins, bool) or not isinstance(bins, int):
        raise TypeError(f"bins must be an int, got {bins!r}")
    check_choice(kernel, "kernel", KERNELS)
    low = 4 if kernel == "bspline" else 2
    if bins < low:
        raise ValueError(f"bins must be at least {low} for kernel={kernel!r}, got {bins}")
    sigma = check_positive(sigma, "sigma")
    value_range = _check_range(value_range)
    check_bool(normalize, "normalize")

    n, c = a.shape[:2]
    xa = a.to(dtype).reshape(n * c, -1)
    xb = b.to(dtype).reshape(n * c, -1)
    w = None
    if weight is not None:
        w = weight.to(dtype).expand(n, c, *weight.shape[2:]).reshape(n * c, -1)
    impl = None
    if kernel == "bspline" and bins <= PARZEN_MAX_BINS:
        impl = _kernels.implementation("mutual_information", xa, xb)
    if impl is not None and hasattr(impl, "parzen_mutual_information"):
        # one compiled call each way (issue 24); the torch path below is its twin
        score = impl.parzen_mutual_information(xa, xb, w, bins, normalize, value_range)
    else:
        score = parzen_score(xa, xb, w, _Parzen(kernel, bins, sigma), normalize, value_range)
    return score.reshape(n, c).to(out_dtype)


def parzen_score(xa, xb, w, parzen: _Parzen, normalize: bool, value_range) -> torch.Tensor:
    """The (normalized) mutual information ``(M,)`` of intensities ``xa``, ``xb`` ``(M,
    P)`` (pixel weights ``w`` ``(M, P)`` or None; ``value_range`` None or checked), NaN
    for a row holding a non-finite value: the pure torch path of :func:`mutual_information`
    (the twin of ``simwarp::parzen_fwd`` for the B-spline window)."""
    # The NaN rule on the device, with no host read (issue 24: two syncs per call in a
    # registration's loop): a row with a non-finite pixel scores NaN; its non-finite
    # pixels count as 0 meanwhile (its own frame and histogram only).
    # (x − x is 0 exactly where x is finite: two launches where isfinite takes four)
    finite = (xa.detach() - xa.detach()).add_(xb.detach() - xb.detach()).eq(0).all(-1)
    xa, xb = (torch.nan_to_num(x, nan=0.0, posinf=0.0, neginf=0.0) for x in (xa, xb))
    valid = torch.ones_like(xa, dtype=torch.bool) if w is None else w > 0
    pad = 1.0 if parzen.kernel == "bspline" else 0.0
    xi_a, xi_b = _pair_bin_coordinates(xa, xb, valid, value_range, parzen.bins, pad)
    joint = _JointHistogram.apply(xi_a, xi_b, w, parzen)
    score = _Score.apply(joint, normalize)
    return torch.where(finite, score, math.nan)
