"""A snapshot of a running registration, as every loop and entry point hands it out."""

from __future__ import annotations

import torch


class Progress:
    """One snapshot of a run: where it is and the best transform(s) so far.

    ``transforms`` (one per image pair) and ``transform`` (the first) are computed on
    first access by ``make_transforms``, from parameters copied when the snapshot was
    taken. ``loss`` (the mean over the pairs) may be handed over as the ``(N,)`` losses
    still on the device: their mean is read (a host sync) on first access only, so a
    snapshot nobody looks at costs no wait.
    """

    def __init__(self, level, levels, iteration, loss, make_transforms):
        self.level, self.levels, self.iteration = level, levels, iteration
        self._loss = loss
        self._make, self._transforms = make_transforms, None

    @property
    def loss(self) -> float:
        if isinstance(self._loss, torch.Tensor):
            self._loss = float(self._loss.mean())
        return self._loss

    @property
    def pending_loss(self):
        """The loss as handed over, unread: a float, or the ``(N,)`` losses still on the
        device (for a snapshot passed on, e.g. as a :class:`~.stack.StackProgress`,
        without a host sync)."""
        return self._loss

    @property
    def transforms(self) -> list:
        if self._transforms is None:
            self._transforms = self._make()
        return self._transforms

    @property
    def transform(self):
        return self.transforms[0]

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(level={self.level + 1}/{self.levels}, "
            f"iteration={self.iteration}, loss={self.loss:.6g})"
        )
