"""What a widget warms up in the background as it opens, so that a user's first run does
not pay it (issue 27). Pure Python and torch: called in a daemon thread by the Qt widgets."""

from __future__ import annotations


def warm_optimizers() -> None:
    """Make one of each torch optimizer the engine's solvers use (Adam, L-BFGS) on a
    one-element tensor.

    The first ``torch.optim`` optimizer of a process imports ``torch._dynamo`` (1-2 s of
    Python holding the GIL; cProfile of a first deformable ``register``: 2.06 of its
    2.26 s were that import, in ``Optimizer.__init__``). From the Register widget a first
    deformable run paid it in its worker, and the GUI thread, waiting on the GIL, froze for
    240 ms meanwhile. Done as the widget opens, it is over before a user's first click.
    """
    import torch

    param = torch.zeros(1, requires_grad=True)
    torch.optim.Adam([param])
    torch.optim.LBFGS([param])
