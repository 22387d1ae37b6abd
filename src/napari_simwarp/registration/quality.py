"""How good a registration looks: final similarity, overlap, and warnings when implausible.

Every result reports the global ZNCC between the fixed image and the warped moving image
over the pixels they share (``similarity``), the same before registration
(``initial_similarity``) and the fraction of the fixed image the warped moving image
covers (``overlap``). A run whose result looks wrong gets a :class:`RegistrationWarning`
(also kept in ``result.warnings``): images that hardly overlap, a low final similarity,
or a result worse than no transform at all. These are plausibility checks, not proofs: a
multimodal pair can be right at a low ZNCC.
"""

from __future__ import annotations

import warnings

import torch

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


class RegistrationWarning(UserWarning):
    """A registration result that looks unconverged or implausible."""


def masked_zncc(fixed: torch.Tensor, warped: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Global ZNCC per image over ``valid`` pixels: ``(N, 1, *S)`` each → ``(N,)``.

    0 where either image is flat over the shared pixels (or no pixel is shared).
    """
    dims = tuple(range(1, warped.dim()))
    fixed = fixed.expand_as(warped).double()
    warped, valid = warped.double(), valid.expand_as(warped).double()
    count = valid.sum(dims).clamp_min(1.0)

    def centered(x):
        mean = (x * valid).sum(dims, keepdim=True) / count.view(-1, *[1] * len(dims))
        return (x - mean) * valid

    a, b = centered(fixed), centered(warped)
    energy = (a * a).sum(dims) * (b * b).sum(dims)
    flat = energy <= 1e-24
    return torch.where(
        flat, torch.zeros_like(energy), (a * b).sum(dims) / energy.clamp_min(1e-300).sqrt()
    )


def problems(
    similarity: float, initial: float, overlap: float, dense: bool = False
) -> dict[str, str]:
    """What looks implausible about a result, by kind ("overlap", "similarity", "worse",
    "unrelated"); ``dense`` for deformable and diffeomorphic models."""
    found = {}
    if overlap < MIN_OVERLAP:
        found["overlap"] = (
            f"the registered moving image covers only {overlap:.0%} of the "
            "fixed image: the images hardly overlap, the result is likely "
            "wrong"
        )
    if similarity < MIN_SIMILARITY:
        found["similarity"] = (
            f"the final similarity is low (ZNCC {similarity:.3f}): the "
            "result may be wrong (try a larger capture range, a mask, "
            "another metric or a starting transform)"
        )
    if similarity < initial - MAX_LOSS_OF_SIMILARITY:
        found["worse"] = (
            f"registration made the match worse (ZNCC {initial:.3f} before, {similarity:.3f} after)"
        )
    return found


def emit(messages: list[str]) -> list[str]:
    """Emit each message as a :class:`RegistrationWarning`; return them."""
    for message in messages:
        warnings.warn(message, RegistrationWarning, stacklevel=4)
    return messages


def assess(similarity: float, initial: float, overlap: float, dense: bool = False) -> list[str]:
    """The warnings a pair's result earns (empty when it looks plausible), also emitted."""
    return emit(list(problems(similarity, initial, overlap, dense).values()))
