"""How good a registration looks: final similarity, overlap, and warnings when implausible.

Every result reports a global similarity between the fixed image and the warped moving
image over the pixels they share (``similarity``), the same before registration
(``initial_similarity``) and the fraction of the fixed image the warped moving image
covers (``overlap``). The similarity is the ZNCC, except for ``metric="mi"`` (images of two
modalities, whose ZNCC can be anything at the right alignment): there it is the
normalized mutual information (``similarity_measure`` says which; :data:`MEASURES`).
A run whose result looks wrong gets a :class:`RegistrationWarning` (also kept in
``result.warnings``): images that hardly overlap, a low final similarity, a result worse
than no transform at all, a dense model fitted to images that looked unrelated, or a dense
field that folds (a region mapped inside out). These are plausibility checks, not proofs.
"""

from __future__ import annotations

import math
import warnings
from typing import NamedTuple

import torch

from ..ops import mutual_information

#: below this fraction of the fixed image covered, the result is implausible
MIN_OVERLAP = 0.25
#: below this final ZNCC, the images hardly look alike after registration (two noisy
#: images of one scene at a signal-to-noise ratio of 1 score about 0.5)
MIN_SIMILARITY = 0.5
#: below this initial ZNCC a dense model starts from images that look unrelated, and can
#: fit one's noise to the other's
MIN_DENSE_START = 0.25
#: a final ZNCC this much below the initial one means registration made things worse
MAX_LOSS_OF_SIMILARITY = 0.05
#: below this final normalized mutual information (1: independent, 2: one image determines
#: the other) the images hardly share information: the camera image against itself
#: shifted by 30 pixels scores 1.019, against a noisy copy at a signal-to-noise ratio of 1
#: 1.06, against 1 - image² aligned 1.41
MIN_NMI = 1.02
#: a final normalized MI this much below the initial one means registration made it worse
MAX_LOSS_OF_NMI = 0.005


class Measure(NamedTuple):
    """A similarity measure's name in messages and its plausibility thresholds."""

    label: str
    minimum: float
    max_loss: float
    dense_start: float | None  # below this initial value a dense fit is suspect (or None)


#: the similarity measures results report, by ``similarity_measure``
MEASURES = {
    "zncc": Measure("ZNCC", MIN_SIMILARITY, MAX_LOSS_OF_SIMILARITY, MIN_DENSE_START),
    "nmi": Measure("normalized MI", MIN_NMI, MAX_LOSS_OF_NMI, None),
}


def measure_for(metric: str | None) -> str:
    """The similarity measure a run with ``metric`` reports: "nmi" for "mi", else "zncc"."""
    return "nmi" if metric == "mi" else "zncc"


class RegistrationWarning(UserWarning):
    """A registration result that looks unconverged or implausible."""


#: pixels per image of one chunk of :func:`masked_zncc` (its temporaries, a few MiB, are
#: reused by the allocator where whole-frame ones would be mapped and faulted in afresh)
ZNCC_CHUNK = 1 << 18


def masked_zncc(fixed: torch.Tensor, warped: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Global ZNCC per image over ``valid`` pixels: ``(N, 1, *S)`` each → ``(N,)``.

    ``fixed`` and ``valid`` may have a batch of 1 (shared by every image). 0 where either
    image is flat over the shared pixels (or no pixel is shared). Computed in float64 when
    either image is, else in float32, chunk by chunk: each chunk's sums are torch's
    cascaded float32 sums, added up in float64, and the products are of centred values,
    so a float32 score is within ~1e-6 of the float64 one (tested at 2048² with an offset
    of 100 times the contrast) in a fifth of the time a float64 copy of the frames costs.
    """
    n = warped.shape[0]
    dtype = torch.float64 if torch.float64 in (fixed.dtype, warped.dtype) else torch.float32
    # (batch, pixels) views; a batch of 1 broadcasts, with no copy of the shared image
    pixels = math.prod(warped.shape[1:])
    x, y, v = (t.reshape(t.shape[0], pixels) for t in (fixed, warped, valid))
    step = max(1, ZNCC_CHUNK // max(n, 1))

    def chunks():
        for start in range(0, pixels, step):
            part = slice(start, start + step)
            yield x[:, part].to(dtype), y[:, part].to(dtype), v[:, part].to(dtype)

    # The chunks' sums added up in float64, where the device has it (Apple's MPS has not).
    wide = torch.float32 if y.device.type == "mps" else torch.float64

    def total(t):
        return t.sum(1, dtype=wide) if dtype == torch.float64 else t.sum(1).to(wide)

    count, sum_x, sum_y = (torch.zeros(n, dtype=wide, device=y.device) for _ in "abc")
    for xc, yc, vc in chunks():
        count += total(vc.expand(n, -1))
        sum_x += total(xc * vc)
        sum_y += total(yc * vc)
    count = torch.where(count > 0, count, torch.ones_like(count))  # (weights may sum < 1)
    mean_x, mean_y = (s / count for s in (sum_x, sum_y))
    mx, my = mean_x.to(dtype)[:, None], mean_y.to(dtype)[:, None]
    xx, yy, xy = (torch.zeros(n, dtype=wide, device=y.device) for _ in "abc")
    for xc, yc, vc in chunks():
        a, b = (xc - mx) * vc, (yc - my) * vc  # not in place: differentiable
        xx += total(a * a)
        yy += total(b * b)
        xy += total(a * b)
    # A flat image centres to its mean's rounding error (~1e-7 of the mean per pixel in
    # float32, ~1e-16 in float64), not to 0: it is flat below that error's energy.
    tiny = (1e-11 if dtype == torch.float32 else 1e-26) * count
    flat = (xx * yy <= 1e-24) | (xx <= tiny * mean_x**2) | (yy <= tiny * mean_y**2)
    score = xy / (xx * yy).clamp_min(1e-300).sqrt()
    return torch.where(flat, torch.zeros_like(score), score).to(dtype)


def masked_nmi(fixed: torch.Tensor, warped: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Normalized mutual information per image over ``valid`` pixels (their weights):
    ``(N, 1, *S)`` each → ``(N,)``, in ``[1, 2]`` (:func:`~..ops.mutual_information`),
    in float64 on the CPU, in float32 on GPUs (``_numerics.moment_dtype``: the entropies
    are sums without cancellation there, within 1e-5 of float64)."""
    from ..ops._numerics import moment_dtype

    wide = moment_dtype(torch.float32, warped.device)
    fixed = fixed.expand_as(warped).to(wide)
    weight = valid.expand_as(warped).to(wide)
    return mutual_information(fixed, warped.to(wide), weight=weight, normalize=True)[:, 0]


def problems(
    similarity: float,
    initial: float,
    overlap: float,
    dense: bool = False,
    measure: str = "zncc",
    lowest_jacobian: float | None = None,
) -> dict[str, str]:
    """What looks implausible about a result, by kind ("overlap", "similarity", "worse",
    "unrelated", "folds"); ``dense`` for deformable and diffeomorphic models; ``measure``
    the similarity's kind (a key of :data:`MEASURES`); ``lowest_jacobian`` a dense
    result's lowest Jacobian determinant (:func:`lowest_jacobian`), None if not known."""
    label, minimum, max_loss, dense_start = MEASURES[measure]
    found = {}
    if overlap < MIN_OVERLAP:
        found["overlap"] = (
            f"the registered moving image covers only {overlap:.0%} of the "
            "fixed image: the images hardly overlap, the result is likely "
            "wrong"
        )
    if similarity < minimum:
        found["similarity"] = (
            f"the final similarity is low ({label} {similarity:.3f}): the "
            "result may be wrong (try a larger capture range, a mask, "
            "another metric or a starting transform)"
        )
    if similarity < initial - max_loss:
        found["worse"] = (
            f"registration made the match worse ({label} {initial:.3f} before, "
            f"{similarity:.3f} after)"
        )
    if dense and dense_start is not None and initial < dense_start and "similarity" not in found:
        found["unrelated"] = (
            f"the images looked unrelated before registration ({label} {initial:.3f}): a "
            "dense model can make unrelated images look alike, so its similarity "
            f"({similarity:.3f}) proves little; align them with a linear model first "
            "(or pass init=)"
        )
    if lowest_jacobian is not None and lowest_jacobian <= 0:
        # A fold can leave a high similarity (the field tucks away what does not match),
        # so it is checked apart: global NCC under uneven illumination folded fields by
        # tens of pixels with no other warning (issue 16).
        found["folds"] = (
            f"the displacement field folds (lowest Jacobian determinant "
            f"{lowest_jacobian:.2f}: a region is mapped inside out), so the result is wrong "
            "there; try metric='lncc' (intensities that differ across the images), a larger "
            "regularization or a larger grid_spacing"
        )
    return found


#: planes of the first axis per slab of :func:`lowest_jacobian` (bounds its temporaries)
JACOBIAN_SLAB = 32


def lowest_jacobian(displacement) -> float:
    """The lowest Jacobian determinant of ``x ↦ x + d(x)``, ``displacement`` ``(D, *S)`` in
    pixels (array order): ≤ 0 where the map folds.

    Computed in slabs of :data:`JACOBIAN_SLAB` planes along the first axis, each read with
    one plane either side, so the central differences are those of the whole field and
    the temporaries stay a slab's.
    """
    from ..ops import jacobian_determinant

    d = torch.as_tensor(displacement)
    if not d.is_floating_point():
        d = d.float()
    n, lowest = d.shape[1], float("inf")
    for start in range(0, n, JACOBIAN_SLAB):
        lo, hi = max(start - 1, 0), min(start + JACOBIAN_SLAB + 1, n)
        det = jacobian_determinant(d[None, :, lo:hi])[0, 0]
        inner = det[start - lo : start - lo + min(JACOBIAN_SLAB, n - start)]
        lowest = min(lowest, float(inner.min()))
    return lowest


def emit(messages: list[str]) -> list[str]:
    """Emit each message as a :class:`RegistrationWarning`; return them."""
    for message in messages:
        warnings.warn(message, RegistrationWarning, stacklevel=4)
    return messages


def assess(
    similarity: float,
    initial: float,
    overlap: float,
    dense: bool = False,
    measure="zncc",
    lowest_jacobian: float | None = None,
) -> list[str]:
    """The warnings a pair's result earns (empty when it looks plausible), also emitted."""
    found = problems(similarity, initial, overlap, dense, measure, lowest_jacobian)
    return emit(list(found.values()))
