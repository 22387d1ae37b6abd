"""The warp optimizer against known ground truth and its peers (issue 5's figures).

Cases: drift correction (50 × 512², sub-pixel shifts of ±8 px, noise) against pystackreg
and scikit-image's phase_cross_correlation; a 512² affine pair against itk-elastix; a 512²
smooth deformation of about 4 px against scikit-image's optical_flow_ilk / tvl1; and a
96³ volume (affine and deformable). Accuracy is measured once per implementation from its
own output and written into the note column; the harness times the calls.
"""

from __future__ import annotations

import time

import numpy as np
from scipy import ndimage as ndi

from _elastix import import_itk, linear_matrix, registration

SECTION = "Registration"


# ----------------------------------------------------------------------------- data


def scene(rng, shape) -> np.ndarray:
    """Microscopy-like 2-D/3-D scene: an offset, structure at several scales, bright blobs."""
    if len(shape) == 2:
        from skimage import data

        cam = data.camera().astype(np.float64) / 255.0
        reps = [-(-n // m) for n, m in zip(shape, cam.shape)]
        base = np.tile(cam, reps)[tuple(slice(0, n) for n in shape)]
    else:
        base = ndi.gaussian_filter(rng.standard_normal(shape), 4.0)
        base = (base - base.min()) / np.ptp(base)
    texture = ndi.gaussian_filter(rng.standard_normal(shape), 1.5)
    blobs = np.zeros(shape)
    blobs[tuple(rng.integers(0, n, 40) for n in shape)] = 1
    blobs = ndi.gaussian_filter(blobs, 2.5)
    return 1000 + 400 * base + 60 * texture / texture.std() + 600 * blobs / blobs.max()


def centered_affine(linear, shift, shape):
    d = len(shape)
    c = (np.asarray(shape, float) - 1) / 2
    m = np.eye(d + 1)
    m[:d, :d] = linear
    m[:d, d] = c + np.asarray(shift, float) - np.asarray(linear) @ c
    return m


def corner_error(m_est, m_true, shape) -> float:
    d = len(shape)
    corners = np.array(np.meshgrid(*[[0, n - 1] for n in shape], indexing="ij")).reshape(d, -1)
    h = np.vstack([corners, np.ones(corners.shape[1])])
    return float(np.linalg.norm((m_est @ h - m_true @ h)[:d], axis=0).mean())


def smooth_deformation(rng, shape, amplitude, sigma=None):
    """``(d, grid, inverse)``: a smooth field of max magnitude ``amplitude`` (Gaussian-
    filtered noise of ``sigma`` px, default an eighth of the shortest side), the pixel
    grid, and the field's inverse."""
    sigma = min(shape) / 8 if sigma is None else sigma
    d = np.stack([ndi.gaussian_filter(rng.standard_normal(shape), sigma) for _ in shape])
    d *= amplitude / np.linalg.norm(d, axis=0).max()
    grid = np.stack(np.meshgrid(*[np.arange(n, dtype=float) for n in shape], indexing="ij"))
    u = -d.copy()
    for _ in range(30):
        u = -np.stack([ndi.map_coordinates(c, grid + u, order=1, mode="nearest") for c in d])
    return d, grid, u


def noisy(rng, x, sigma=10.0):
    return np.clip(x + rng.normal(0, sigma, x.shape), 0, 65535).astype(np.uint16)


# ----------------------------------------------------------------------------- cases


def drift_stack(rng, frames=50, shape=(512, 512), pad=12):
    """``(stack, truth)``: uint16 frames of one scene shifted by up to ±8 px (cubic), noise;
    ``truth[t]`` the shift with ``frame_0(x) = frame_t(x + truth[t])``."""
    big = scene(rng, tuple(n + 2 * pad for n in shape))
    true = rng.uniform(-8, 8, (frames, 2))
    crop = tuple(slice(pad, pad + n) for n in shape)
    stack = noisy(rng, np.stack([ndi.shift(big, -s, order=3, mode="nearest")[crop] for s in true]))
    return stack, true[0] - true


def drift_case(report, rng):
    from napari_simwarp.registration import register_stack

    group = "drift 50 × 512², ±8 px"
    stack, truth = drift_stack(rng)

    def err(shifts):
        e = np.linalg.norm(np.asarray(shifts) - truth, axis=1)[1:]
        return f"median shift error {np.median(e):.4f} px, max {e.max():.3f} px"

    ours = register_stack(stack)
    report.measure(
        group,
        "simwarp register_stack (translation)",
        "register",
        lambda: register_stack(stack),
        ours=True,
        repeat=3,
        note=err(ours.shifts),
    )

    try:
        from pystackreg import StackReg

        sr = StackReg(StackReg.TRANSLATION)
        tm = sr.register_stack(stack, reference="first")
        report.measure(
            group,
            "pystackreg TRANSLATION",
            "register",
            lambda: sr.register_stack(stack, reference="first"),
            repeat=1,
            memory=False,
            note=err(tm[:, [1, 0], 2]),
        )
    except ImportError:
        report.note(SECTION, "pystackreg is not installed: its row is missing.")

    from skimage.registration import phase_cross_correlation

    def pcc():
        return np.array(
            [-phase_cross_correlation(stack[0], f, upsample_factor=20)[0] for f in stack]
        )

    report.measure(
        group,
        "skimage phase_cross_correlation (upsample 20)",
        "register",
        pcc,
        repeat=1,
        memory=False,
        note=err(pcc()),
    )


def affine_case(report, rng):
    from napari_simwarp.registration import register

    group = "affine pair 512²"
    shape = (512, 512)
    th = np.deg2rad(rng.uniform(-10, 10))
    rot = np.array([[np.cos(th), -np.sin(th)], [np.sin(th), np.cos(th)]])
    lin = (
        rot @ np.diag(rng.uniform(0.9, 1.1, 2)) @ np.array([[1, rng.uniform(-0.05, 0.05)], [0, 1]])
    )
    shift = rng.uniform(-10, 10, 2)
    m = centered_affine(lin, shift, shape)
    fixed_f = scene(rng, shape)
    moving = noisy(rng, ndi.affine_transform(fixed_f, np.linalg.inv(m), order=3, mode="nearest"))
    fixed = noisy(rng, fixed_f)
    desc = (
        f"rotation {np.rad2deg(th):.1f}°, linear part {np.round(lin, 3).tolist()}, "
        f"shift of the center {np.round(shift, 2).tolist()} px"
    )
    report.note(SECTION, f"Affine pair: {desc}; error = mean corner displacement error.")
    for metric in ("lncc", "ncc"):
        r = register(fixed, moving, model="affine", metric=metric)
        report.measure(
            group,
            f"simwarp register affine/{metric}",
            "register",
            lambda metric=metric: register(fixed, moving, model="affine", metric=metric),
            ours=metric == "lncc",
            repeat=3,
            note=f"corner error {corner_error(r.transform.matrix, m, shape):.4f} px",
        )
    r = register(fixed, moving, model="affine", metric="lncc", full_resolution=True)
    report.measure(
        group,
        "simwarp register affine/lncc, full_resolution=True",
        "register",
        lambda: register(fixed, moving, model="affine", full_resolution=True),
        repeat=1,
        memory=False,
        note=f"corner error {corner_error(r.transform.matrix, m, shape):.4f} px",
    )
    _elastix_affine(report, group, fixed, moving, m, shape)


def _elastix_affine(report, group, fixed, moving, m, shape):
    itk = import_itk(report, SECTION)
    if itk is None:
        return
    run = registration(itk, fixed, moving, "affine")
    _, tparams = run()
    e = corner_error(linear_matrix(tparams), m, shape)
    report.measure(
        group,
        "itk-elastix affine (default map)",
        "register",
        run,
        repeat=1,
        memory=False,
        note=f"corner error {e:.4f} px",
    )


def deformable_case(report, rng):
    import torch

    from napari_simwarp.ops import jacobian_determinant
    from napari_simwarp.registration import register
    from napari_simwarp.registration._names import default_metric

    group = "deformable pair 512², ~4 px"
    shape = (512, 512)
    d, grid, u = smooth_deformation(rng, shape, 4.0)
    fixed_f = scene(rng, shape)
    moving = noisy(rng, ndi.map_coordinates(fixed_f, grid + u, order=3, mode="nearest"))
    fixed = noisy(rng, fixed_f)
    b = 16
    report.note(
        SECTION,
        f"Deformable pair: smooth random field, max |d| 4 px (σ = 64 px); "
        f"end-point error averaged over the image minus a {b}-px border.",
    )

    def epe(est):
        return float(np.linalg.norm(est - d, axis=0)[b:-b, b:-b].mean())

    for model in ("deformable", "diffeomorphic"):
        r = register(fixed, moving, model=model)
        est = r.transform.to_displacement(shape)
        note = f"EPE {epe(est):.3f} px"
        if model == "diffeomorphic":
            jac = float(jacobian_determinant(torch.from_numpy(est)[None]).min())
            note += f", min Jacobian determinant {jac:.3f}"
        report.measure(
            group,
            f"simwarp register {model}/{default_metric(model)}",
            "register",
            lambda model=model: register(fixed, moving, model=model),
            ours=model == "deformable",
            repeat=3,
            note=note,
        )
    from skimage.registration import optical_flow_ilk, optical_flow_tvl1

    report.measure(
        group,
        "skimage optical_flow_ilk",
        "register",
        lambda: optical_flow_ilk(fixed, moving),
        repeat=3,
        note=f"EPE {epe(optical_flow_ilk(fixed, moving)):.3f} px",
    )
    flow = optical_flow_tvl1(fixed, moving)
    report.measure(
        group,
        "skimage optical_flow_tvl1",
        "register",
        lambda: optical_flow_tvl1(fixed, moving),
        repeat=1,
        memory=False,
        note=f"EPE {epe(flow):.3f} px",
    )


def volume_case(report, rng):
    from napari_simwarp.registration import register
    from napari_simwarp.registration._names import default_metric

    shape = (96, 96, 96)
    vol = scene(rng, shape)
    th = np.deg2rad(6)
    lin = np.array([[1, 0, 0], [0, np.cos(th), -np.sin(th)], [0, np.sin(th), np.cos(th)]])
    m = centered_affine(lin @ np.diag([1.04, 0.97, 1.0]), [2.5, -3.0, 1.5], shape)
    moving = noisy(rng, ndi.affine_transform(vol, np.linalg.inv(m), order=3, mode="nearest"))
    fixed = noisy(rng, vol)
    r = register(fixed, moving, model="affine")
    report.measure(
        "3-D 96³",
        "simwarp register affine/lncc",
        "register",
        lambda: register(fixed, moving, model="affine"),
        ours=True,
        repeat=1,
        note=f"corner error {corner_error(r.transform.matrix, m, shape):.4f} px",
    )
    d, grid, u = smooth_deformation(rng, shape, 3.0)
    moving = noisy(rng, ndi.map_coordinates(vol, grid + u, order=1, mode="nearest"))
    r = register(fixed, moving, model="deformable")
    est = r.transform.to_displacement(shape)
    e = float(np.linalg.norm(est - d, axis=0)[8:-8, 8:-8, 8:-8].mean())
    report.measure(
        "3-D 96³ deformable (~3 px)",
        f"simwarp register deformable/{default_metric('deformable')}",
        "register",
        lambda: register(fixed, moving, model="deformable"),
        ours=True,
        repeat=1,
        note=f"EPE {e:.3f} px (8-px border excluded)",
    )


def run(report) -> None:
    start = time.perf_counter()
    for case in (drift_case, affine_case, deformable_case, volume_case):
        case(report, np.random.default_rng(2026))
        print(f"  ({case.__name__} done at {time.perf_counter() - start:.0f} s)", flush=True)
