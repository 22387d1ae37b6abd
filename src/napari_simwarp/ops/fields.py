"""Placeholder: being implemented (see the issue). Replaced wholesale by its owner."""

def compose(d1, d2):
    raise NotImplementedError("compose is not implemented yet")


def invert(d, *, iterations=20):
    raise NotImplementedError("invert is not implemented yet")


def integrate_velocity(v, steps=7):
    raise NotImplementedError("integrate_velocity is not implemented yet")


def jacobian_determinant(d):
    raise NotImplementedError("jacobian_determinant is not implemented yet")


def affine_to_displacement(matrix, shape):
    raise NotImplementedError("affine_to_displacement is not implemented yet")


