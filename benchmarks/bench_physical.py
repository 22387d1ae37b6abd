"""Anisotropic 3-D rigid registration in physical space against itk-elastix (issue 11).

The pair of :func:`napari_simwarp.data.anisotropic_volume_pair`: one sample imaged twice
with a z step 3× the xy pixel size (``(32, 96, 96)``, spacing ``(3, 1, 1)``), the second
time rotated by (6°, −4°, 5°) and shifted in physical space; the true fixed → moving
physical matrix is exact (both are slices of one isotropic volume). Rows: our
``register(model="rigid", fixed_spacing=spacing, moving_spacing=spacing)`` with NCC and
local NCC, the same run in voxel space (no spacing: the contrast row, a rigid model of
voxels cannot follow a physical rotation of anisotropic voxels), and itk-elastix's
default rigid map (EulerTransform, AdvancedMattesMutualInformation) and the same map with
AdvancedNormalizedCorrelation, both given the images with their ITK spacing. Elastix's
result is read back through :func:`~napari_simwarp.io.transform_files.elastix.read_elastix`
(its TransformParameters file → fixed → moving physical matrix, array order).

Error: mean distance between where the found and the true physical matrices send the
fixed volume's 8 corners, in voxels of the finest spacing (xy pixels); the max over the
corners is in the note too. Peak memory: the harness's resident-set peak above the level
before the call.
"""

from __future__ import annotations

import os

import numpy as np

from _elastix import import_itk, linear_matrix, registration

SECTION = "Anisotropic 3-D rigid registration in physical space"


def corner_errors(physical_est, physical_true, shape, spacing) -> tuple[float, float]:
    """(mean, max) corner distance in units of ``min(spacing)``."""
    d = len(shape)
    corners = np.array(np.meshgrid(*[[0, n - 1] for n in shape], indexing="ij")).reshape(d, -1)
    points = np.vstack([corners * np.asarray(spacing, float)[:, None], np.ones(corners.shape[1])])
    dist = np.linalg.norm(((physical_est - physical_true) @ points)[:d], axis=0) / min(spacing)
    return float(dist.mean()), float(dist.max())


def _physical(transform, spacing) -> np.ndarray:
    """The fixed → moving physical matrix of a result's pixel matrix on ``spacing`` grids
    (also for a voxel-space run, whose own grids are unit grids)."""
    g = np.diag([*spacing, 1.0])
    return g @ transform.matrix @ np.linalg.inv(g)


def _note(errors) -> str:
    return f"corner error {errors[0]:.3f} vox (max {errors[1]:.3f})"


def ours(report, group, fixed, moving, spacing, truth):
    from napari_simwarp.registration import register

    variants = [
        ("ncc", True),
        ("lncc", True),
        ("ncc", False),
    ]
    for metric, physical in variants:
        options = dict(model="rigid", metric=metric)
        if physical:
            options.update(fixed_spacing=spacing, moving_spacing=spacing)
        result = register(fixed, moving, **options)
        errors = corner_errors(_physical(result.transform, spacing), truth, fixed.shape, spacing)
        where = "physical space" if physical else "voxel space (no spacing)"
        report.measure(
            group,
            f"simwarp register rigid/{metric}, {where}",
            "register",
            lambda options=options: register(fixed, moving, **options),
            ours=(metric, physical) == ("ncc", True),
            repeat=1,  # seconds per call: one timed call after the warm-up
            note=_note(errors),
        )


def elastix(report, group, fixed, moving, spacing, truth):
    itk = import_itk(report, SECTION)
    if itk is None:
        return
    for metric in ("AdvancedMattesMutualInformation", "AdvancedNormalizedCorrelation"):
        run = registration(itk, fixed, moving, "rigid", metric=metric, spacing=spacing)
        _, tparams = run()
        physical = linear_matrix(tparams)
        errors = corner_errors(physical, truth, fixed.shape, spacing)
        default = " (its default rigid map)" if metric.endswith("Information") else ""
        report.measure(
            group,
            f"itk-elastix rigid (EulerTransform), {metric}{default}",
            "register",
            run,
            repeat=1,
            note=_note(errors),
        )


def run(report):
    import torch

    from napari_simwarp.data import anisotropic_volume_pair

    fixed, moving, spacing, truth = anisotropic_volume_pair()
    report.note(
        SECTION,
        f"torch threads {torch.get_num_threads()}; ITK threads "
        f"{os.environ.get('ITK_GLOBAL_DEFAULT_NUMBER_OF_THREADS', 'default')}.",
    )
    report.note(
        SECTION,
        "The pair of `napari_simwarp.data.anisotropic_volume_pair()`: (32, 96, 96) voxels of "
        "spacing (3, 1, 1), the moving one rotated by (6°, −4°, 5°) and shifted by (2, −3, 4) "
        "in physical space. Error = distance between where the found and the true physical "
        "matrices send the 8 corners, in xy voxels (mean, max). Elastix's transform is read "
        "back from its TransformParameters file by napari-simwarp's elastix reader.",
    )
    group = f"rigid, anisotropic {'×'.join(map(str, fixed.shape))}, spacing {spacing}"
    ours(report, group, fixed, moving, spacing, truth)
    elastix(report, group, fixed, moving, spacing, truth)
