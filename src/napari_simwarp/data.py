"""Sample data with known ground truth, made from images that ship with scikit-image.

No download: everything is built from ``skimage.data.camera()`` (bundled) or generated.
Pure NumPy/SciPy; the napari sample-data contributions wrap these functions.

Convention for every returned displacement ``d`` (array-axis order, pixels):
``fixed(x) ≈ moving(x + d(x))``, as ``skimage.registration.optical_flow_tvl1`` returns.
"""

from __future__ import annotations

import numpy as np
from scipy import ndimage as ndi


def camera() -> np.ndarray:
    """scikit-image's 512×512 camera picture as float32 in [0, 1]."""
    from skimage import data

    return data.camera().astype(np.float32) / 255.0


def smooth_displacement(
    shape: tuple[int, ...], amplitude: float = 4.0, scale: float = 0.15, seed: int = 0
) -> np.ndarray:
    """A smooth random displacement field, ``(len(shape), *shape)`` float32, in pixels.

    White noise low-passed with a Gaussian of ``scale · min(shape)`` pixels, each
    component rescaled so its largest magnitude is ``amplitude``.
    """
    rng = np.random.default_rng(seed)
    sigma = scale * min(shape)
    field = []
    for _ in shape:
        c = ndi.gaussian_filter(rng.standard_normal(shape), sigma, mode="wrap")
        field.append(amplitude * c / np.abs(c).max())
    return np.stack(field).astype(np.float32)


def backward_warp(image: np.ndarray, displacement: np.ndarray, order: int = 3) -> np.ndarray:
    """``out(x) = image(x + d(x))`` with SciPy spline interpolation (edge values outside)."""
    grid = np.indices(image.shape, dtype=np.float64)
    coords = grid + displacement.astype(np.float64)
    return ndi.map_coordinates(image, coords, order=order, mode="nearest").astype(image.dtype)


def invert_displacement(displacement: np.ndarray, iterations: int = 20) -> np.ndarray:
    """The inverse field ``u`` of a smooth ``d``: ``y ↦ y + u(y)`` undoes ``x ↦ x + d(x)``.

    Fixed-point iteration ``u(y) = -d(y + u(y))``, which converges when ``|∇d| < 1``.
    """
    inverse = -displacement.astype(np.float64)
    grid = np.indices(displacement.shape[1:], dtype=np.float64)
    for _ in range(iterations):
        coords = grid + inverse
        inverse = -np.stack(
            [
                ndi.map_coordinates(c, coords, order=3, mode="nearest")
                for c in displacement.astype(np.float64)
            ]
        )
    return inverse.astype(np.float32)


def deformed_pair(amplitude: float = 4.0, seed: int = 0):
    """The camera picture and a smoothly deformed copy.

    Returns
    -------
    fixed : (512, 512) float32
    moving : (512, 512) float32
    displacement : (2, 512, 512) float32
        The true field: ``fixed(x) ≈ moving(x + displacement(x))``.
    """
    fixed = camera()
    displacement = smooth_displacement(fixed.shape, amplitude=amplitude, seed=seed)
    # moving = fixed ∘ φ⁻¹ with φ(x) = x + d(x), so moving(x + d(x)) = fixed(x) exactly
    # (up to interpolation).
    moving = backward_warp(fixed, invert_displacement(displacement))
    return fixed, moving, displacement


def drifting_timelapse(
    frames: int = 20, size: int = 256, max_shift: float = 8.0, noise: float = 0.02, seed: int = 0
):
    """A time-lapse of a camera crop drifting by random sub-pixel shifts, with noise.

    Returns
    -------
    stack : (frames, size, size) float32
    shifts : (frames, 2) float32
        Per frame, the displacement ``d_t`` with ``stack[0](x) ≈ stack[t](x + d_t)``
        (so ``shifts[0] == 0``).
    """
    rng = np.random.default_rng(seed)
    base = camera()
    origin = (np.array(base.shape) - size) // 2
    shifts = rng.uniform(-max_shift, max_shift, size=(frames, 2)).astype(np.float32)
    shifts[0] = 0.0
    grid = np.indices((size, size), dtype=np.float64) + origin[:, None, None]
    stack = np.empty((frames, size, size), np.float32)
    for t in range(frames):
        # frame_t(y) = base(y - d_t): then frame_0(x) = frame_t(x + d_t).
        coords = grid - shifts[t][:, None, None]
        stack[t] = ndi.map_coordinates(base, coords, order=3, mode="nearest")
    stack += rng.normal(0.0, noise, stack.shape).astype(np.float32)
    return stack, shifts


def blobs_volume(size: int = 64, seed: int = 0) -> np.ndarray:
    """A smooth 3D volume of blobs, ``(size, size, size)`` float32 in [0, 1]."""
    from skimage.data import binary_blobs

    vol = binary_blobs(
        length=size, n_dim=3, volume_fraction=0.3, blob_size_fraction=0.15, rng=seed
    ).astype(np.float32)
    vol = ndi.gaussian_filter(vol, 1.5)
    return (vol - vol.min()) / (vol.max() - vol.min())


def deformed_volume_pair(size: int = 64, amplitude: float = 3.0, seed: int = 0):
    """A 3D blob volume and a smoothly deformed copy (same convention as ``deformed_pair``).

    Returns ``fixed (S, S, S)``, ``moving (S, S, S)`` and ``displacement (3, S, S, S)``.
    """
    fixed = blobs_volume(size, seed)
    displacement = smooth_displacement(fixed.shape, amplitude=amplitude, seed=seed)
    moving = backward_warp(fixed, invert_displacement(displacement))
    return fixed, moving, displacement


def anisotropic_volume_pair(
    size: int = 96,
    z_step: int = 3,
    rotation_deg=(6.0, -4.0, 5.0),
    shift=(2.0, -3.0, 4.0),
    seed: int = 0,
):
    """One sample imaged twice with a z step ``z_step`` times the xy pixel, the second
    time rotated and shifted in physical space (a tilted, moved specimen).

    Returns ``fixed`` and ``moving`` ``(size // z_step, size, size)`` float32, their
    ``spacing`` ``(z_step, 1, 1)`` (napari's ``scale``), and ``physical`` ``(4, 4)``: the
    true map of fixed physical coordinates to moving physical coordinates (array order;
    rotation by the rotation vector ``rotation_deg`` about the volume's center, then
    ``shift``). Both are slices of one isotropic volume, so the truth is exact.
    """
    from scipy.spatial.transform import Rotation

    sample = blobs_volume(size, seed)
    center = np.full(3, (size - 1) / 2)
    rot = Rotation.from_rotvec(np.deg2rad(rotation_deg)).as_matrix()
    physical = np.eye(4)
    physical[:3, :3] = rot
    physical[:3, 3] = center + np.asarray(shift, float) - rot @ center
    # moving(y) = sample(P⁻¹ y): the specimen moved by P
    moved = ndi.affine_transform(sample, np.linalg.inv(physical), order=3, mode="nearest")
    planes = slice(None, z_step * (size // z_step), z_step)
    spacing = (float(z_step), 1.0, 1.0)
    return sample[planes].copy(), moved[planes].astype(np.float32), spacing, physical
