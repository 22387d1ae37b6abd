"""Placeholder: being implemented (see the issue). Replaced wholesale by its owner."""

def splat(image, displacement, *, normalize=True, eps=1e-6, return_weights=False):
    raise NotImplementedError("splat is not implemented yet")


