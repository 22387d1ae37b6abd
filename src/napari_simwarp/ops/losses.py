"""Similarity losses as ``torch.nn.Module`` s, one table for every user of them.

Each loss compares a fixed image with a moving (typically warped) image, is lower for
better matches and about 0 at a perfect match (docs/maths.md §6.2):

============ ================== ============================================
name         module             loss per image
============ ================== ============================================
``"ncc"``    :class:`NCCLoss`    ``1 −`` global ZNCC
``"lncc"``   :class:`LocalNCCLoss` ``1 −`` mean local NCC
``"ssim"``   :class:`SSIMLoss`   ``1 −`` mean SSIM
``"mse"``    :class:`MSELoss`    mean squared difference
``"mi"``     :class:`MILoss`     ``2 −`` normalized mutual information (not 0
                                 at a perfect match: the Parzen window)
============ ================== ============================================

An optional ``weight`` ``(N or 1, 1, *S)`` (0..1, no gradient) restricts every mean to
where it is non-zero (the registration uses it for masks and for the pixels whose sample
fell inside the moving image). :data:`LOSSES` is the table the registration optimizer and
:func:`~napari_simwarp.ops.similarity_gradient` both use.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ._numerics import flat_threshold_factor
from ._validation import check_choice, check_pair
from .local_ncc import local_ncc
from .mutual_information import mutual_information
from .ncc import ncc
from .ssim import ssim

#: reductions of the losses over the batch.
REDUCTIONS = ("mean", "sum", "none")
_TINY = 1e-8


def _weighted_mean(x: torch.Tensor, weight: torch.Tensor | None) -> torch.Tensor:
    """Mean over everything but the batch axis, ``x`` ``(N, C, *S)`` → ``(N,)``."""
    dims = tuple(range(1, x.dim()))
    if weight is None:
        return x.mean(dim=dims)
    w = weight.expand_as(x)
    return (x * w).sum(dim=dims) / w.sum(dim=dims).clamp_min(_TINY)


class SimilarityLoss(torch.nn.Module):
    """Base class: ``forward(fixed, moving, weight=None)`` reduces :meth:`per_image`.

    Parameters
    ----------
    reduction : {"mean", "sum", "none"}
        Over the batch: the mean or the sum of the per-image losses, or the ``(N,)``
        losses themselves.
    """

    def __init__(self, reduction: str = "mean"):
        super().__init__()
        self.reduction = check_choice(reduction, "reduction", REDUCTIONS)

    def per_image(self, fixed, moving, weight):  # pragma: no cover - abstract
        raise NotImplementedError

    def forward(
        self, fixed: torch.Tensor, moving: torch.Tensor, weight: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The loss of ``moving`` ``(N, C, *S)`` against ``fixed`` ``(N or 1, C, *S)``.

        Returns a scalar ("mean", "sum") or ``(N,)`` ("none"), in the compute dtype.
        """
        if (
            isinstance(fixed, torch.Tensor)
            and isinstance(moving, torch.Tensor)
            and fixed.shape != moving.shape
            and fixed.dim() == moving.dim()
            and fixed.shape[0] == 1
            and fixed.shape[1:] == moving.shape[1:]
        ):
            fixed = fixed.expand_as(moving)  # one reference for many moving images
        # Anything else that differs is check_pair's error, which names fixed and moving.
        check_pair(fixed, moving, "fixed", "moving")
        losses = self.per_image(fixed, moving, weight)
        if self.reduction == "mean":
            return losses.mean()
        if self.reduction == "sum":
            return losses.sum()
        return losses


class MSELoss(SimilarityLoss):
    """Mean squared difference per image (of images normalized to about [0, 1])."""

    def per_image(self, fixed, moving, weight):
        return _weighted_mean((moving - fixed) ** 2, weight)


class NCCLoss(SimilarityLoss):
    """``1 −`` global ZNCC per image (mean over channels), weighted where a weight is given."""

    def per_image(self, fixed, moving, weight):
        if weight is None:
            return 1.0 - ncc(fixed, moving).mean(dim=1)
        dims = tuple(range(2, fixed.dim()))
        w = weight.expand_as(fixed)
        total = w.sum(dim=dims).clamp_min(_TINY)

        def centered(x):
            # ops.ncc's corrected two-pass energy and flat rule, weighted: a relative test,
            # so that the loss does not depend on the images' scale (an absolute epsilon
            # under the square root biased it for intensities of order 1e-3 and below).
            xc = x - (w * x).sum(dim=dims, keepdim=True) / total[(...,) + (None,) * len(dims)]
            sum_sq = (w * xc * xc).sum(dim=dims)
            first = (w * xc).sum(dim=dims)
            energy = sum_sq - first * first / total
            flat = (energy <= sum_sq.detach() * flat_threshold_factor(x.dtype)).detach()
            return xc, first, torch.where(flat, torch.ones_like(energy), energy), flat

        fa, fa_sum, fa_energy, fa_flat = centered(fixed)
        mb, mb_sum, mb_energy, mb_flat = centered(moving)
        cov = (w * fa * mb).sum(dim=dims) - fa_sum * mb_sum / total
        flat = fa_flat | mb_flat
        score = torch.where(flat, torch.zeros_like(cov), cov / torch.sqrt(fa_energy * mb_energy))
        return 1.0 - score.mean(dim=1)


class LocalNCCLoss(SimilarityLoss):
    """``1 −`` mean local NCC per image (:func:`~napari_simwarp.ops.local_ncc`)."""

    def __init__(
        self,
        window: int | Sequence[int] = 9,
        kernel: str = "box",
        sigma: float | Sequence[float] | None = None,
        reduction: str = "mean",
    ):
        super().__init__(reduction)
        self.window, self.kernel, self.sigma = window, kernel, sigma

    def per_image(self, fixed, moving, weight):
        cc = local_ncc(fixed, moving, window=self.window, kernel=self.kernel, sigma=self.sigma)
        return 1.0 - _weighted_mean(cc, weight)


class SSIMLoss(SimilarityLoss):
    """``1 −`` mean SSIM per image (:func:`~napari_simwarp.ops.ssim`)."""

    def __init__(
        self,
        window: int | Sequence[int] = 11,
        sigma: float | Sequence[float] = 1.5,
        data_range: float = 1.0,
        k1: float = 0.01,
        k2: float = 0.03,
        reduction: str = "mean",
    ):
        super().__init__(reduction)
        self.window, self.sigma, self.data_range, self.k1, self.k2 = (
            window,
            sigma,
            data_range,
            k1,
            k2,
        )

    def per_image(self, fixed, moving, weight):
        s = ssim(
            fixed,
            moving,
            window=self.window,
            sigma=self.sigma,
            data_range=self.data_range,
            k1=self.k1,
            k2=self.k2,
        )
        return 1.0 - _weighted_mean(s, weight)


class MILoss(SimilarityLoss):
    """Mutual information per image (:func:`~napari_simwarp.ops.mutual_information`),
    for images whose intensities are related by any function (multimodal).

    ``normalize=True`` (default): ``2 −`` the normalized mutual information of Studholme
    et al., in ``[0, 1]``: 1 for independent images, lower the more each image determines
    the other. ``normalize=False``: ``−`` the mutual information in nats (the value of
    elastix's ``AdvancedMattesMutualInformation``), negative. Unlike the other losses
    neither is 0 for identical images: the Parzen window spreads every intensity over
    neighboring bins (``2 − NMI`` of an image with itself is about 0.5 with 32 bins).
    The weight restricts the histogram to the pixels where it is positive and weighs
    them; channels are averaged.
    """

    def __init__(
        self,
        bins: int = 32,
        kernel: str = "bspline",
        sigma: float = 1.0,
        normalize: bool = True,
        reduction: str = "mean",
    ):
        super().__init__(reduction)
        self.bins, self.kernel, self.sigma, self.normalize = bins, kernel, sigma, normalize

    def per_image(self, fixed, moving, weight):
        score = mutual_information(
            fixed,
            moving,
            weight=weight,
            bins=self.bins,
            kernel=self.kernel,
            sigma=self.sigma,
            normalize=self.normalize,
        ).mean(dim=1)
        return 2.0 - score if self.normalize else -score


#: metric name → loss class (the registration's ``metric`` and similarity_gradient's).
LOSSES = {
    "ncc": NCCLoss,
    "lncc": LocalNCCLoss,
    "ssim": SSIMLoss,
    "mse": MSELoss,
    "mi": MILoss,
}

#: metric name → the options its loss takes (besides ``reduction``).
LOSS_OPTIONS = {
    "ncc": (),
    "lncc": ("window", "kernel", "sigma"),
    "ssim": ("window", "sigma", "data_range", "k1", "k2"),
    "mse": (),
    "mi": ("bins", "kernel", "sigma", "normalize"),
}


def loss_for(
    metric: str, *, reduction: str = "mean", caller: str = "loss_for", **options
) -> SimilarityLoss:
    """The loss module of a metric name, with its options checked by name.

    An option the metric does not take is a TypeError that names it and lists what the
    metric accepts (``caller`` names the function the user called, for the message).
    """
    check_choice(metric, "metric", tuple(LOSSES))
    unknown = sorted(set(options) - set(LOSS_OPTIONS[metric]))
    if unknown:
        accepted = ", ".join(LOSS_OPTIONS[metric]) or "none"
        raise TypeError(
            f"{caller}(metric={metric!r}) got unexpected keyword argument(s) "
            f"{', '.join(unknown)}; {metric!r} accepts: {accepted}"
        )
    return LOSSES[metric](reduction=reduction, **options)
