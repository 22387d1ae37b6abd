"""Registration quality against known ground truth, side by side with the peers (issue 16).

Every case builds a pair from a known transform and runs our ``register`` and the peers
on the same data in the same run: itk-elastix with its default parameter maps
(translation, rigid, affine, bspline; as many threads as torch), pystackreg (2-D linear) and
scikit-image's ``optical_flow_ilk`` / ``optical_flow_tvl1`` (2-D deformable). Accuracy:
the mean displacement error at the image corners for linear models (elastix's result is
read back through transformix's deformation field, so every transform type is compared
alike), the end-point error (EPE) over the image minus a border and the lowest Jacobian
determinant for dense ones. Each row is one call, timed and measured for peak memory at
once (the suite stays at a few minutes on a shared machine); a warm-up call precedes it.

    python benchmarks/bench_quality.py [--quick] [--out FILE]     # a table alone
    python benchmarks/bench_quality.py --cases multimodal --seeds 1 2 3 [--repeat 3]
                                                   # those rows, 3 draws (median of 3 calls)
    python benchmarks/bench_quality.py --cases dense --seeds 1 2 3  # dense cases, three draws
    python benchmarks/run.py quality                               # into docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import numpy as np
from scipy import ndimage as ndi
from scipy.spatial.transform import Rotation

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _elastix import registration
from _harness import Report, Row, peak_memory_mb, print_markdown
from bench_register import (
    centered_affine,
    corner_error,
    noisy,
    scene,
    smooth_deformation,
)

SECTION = "Registration quality and capture range (issue 16)"
#: set by ``--quick`` (or SIMWARP_BENCH_QUICK=1): the cases marked quick only
QUICK = os.environ.get("SIMWARP_BENCH_QUICK") == "1"
#: elastix runs on as many threads as torch (run with OMP_NUM_THREADS=1 on a shared machine)
ELASTIX_THREADS = int(os.environ.get("OMP_NUM_THREADS", "2"))
#: calls per row (``--repeat``): the row's time is their median, its peak memory the first's
REPEAT = 1


def once(report, group, impl, fn, accuracy, *, ours=False):
    """Run ``fn`` :data:`REPEAT` times (once by default), timed, the first under the
    peak-memory probe; ``accuracy(result)`` → note."""
    out = {}

    def call():
        t0 = time.perf_counter()
        out["result"] = fn()
        out.setdefault("times", []).append(time.perf_counter() - t0)
        return None

    try:
        peak = peak_memory_mb(call)
        for _ in range(REPEAT - 1):
            call()
        out["seconds"] = float(np.median(out["times"]))
        note = accuracy(out["result"])
    except Exception as exc:  # a peer that fails on a case is a result too
        peak, note = None, f"failed: {type(exc).__name__}: {str(exc)[:60]}"
        out.setdefault("seconds", float("nan"))
    report.rows.append(Row(group, impl, "register", out["seconds"], peak, ours, note))
    print(f"  {group:38s} {impl:36s} {out['seconds'] * 1e3:9.0f} ms  {note}", flush=True)


# ----------------------------------------------------------------------------- data


def rotation(ndim, degrees, axis=0):
    th = np.deg2rad(degrees)
    if ndim == 2:
        return np.array([[np.cos(th), -np.sin(th)], [np.sin(th), np.cos(th)]])
    v = np.zeros(3)
    v[axis] = th
    return Rotation.from_rotvec(v).as_matrix()


def linear_pair(rng, shape, matrix, noise=10.0, remap=False):
    """``(fixed, moving)`` with ``fixed(x) = moving(matrix · x)`` (plus noise)."""
    fixed_f = scene(rng, shape)
    moving = ndi.affine_transform(fixed_f, np.linalg.inv(matrix), order=3, mode="nearest")
    if remap:  # non-monotonic intensity map: a multimodal pair
        lo, hi = np.percentile(moving, [0.5, 99.5])
        moving = 1000 + 800 * np.sin(3 * np.pi * np.clip((moving - lo) / (hi - lo), 0, 1))
    return noisy(rng, fixed_f, noise), noisy(rng, moving, noise)


# ----------------------------------------------------------------------------- peers


def _elastix_positions(fixed, moving, kind, metric=None, overrides=None):
    """Run elastix with its default map ``kind`` (``metric``, ``overrides``: as
    :func:`_elastix.registration` takes them); returns the fixed → moving displacement
    field ``(D, *S)`` (array order, pixels), read back through transformix."""
    import itk

    run = registration(
        itk, fixed, moving, kind, metric=metric, threads=ELASTIX_THREADS, overrides=overrides
    )
    _, tparams = run()
    mv = itk.image_view_from_array(np.ascontiguousarray(moving, dtype=np.float32))
    # transformix writes deformationField.nii: into a scratch folder, not the cwd.
    with tempfile.TemporaryDirectory() as scratch:
        field = itk.transformix_deformation_field(mv, tparams, output_directory=scratch)
        field = np.asarray(field, dtype=np.float64)
    return np.ascontiguousarray(np.moveaxis(field[..., ::-1], -1, 0))  # (D, *S), array order


def elastix(fixed, moving, kind, metric=None, overrides=None):
    return lambda: _elastix_positions(fixed, moving, kind, metric, overrides)


def pystackreg(fixed, moving, kind):
    from pystackreg import StackReg

    def run():
        t = StackReg(getattr(StackReg, kind)).register(fixed, moving)
        swap = np.array([[0, 1, 0], [1, 0, 0], [0, 0, 1]], float)
        return swap @ t @ swap  # (x, y) → array order, fixed → moving

    return run


# ----------------------------------------------------------------------------- accuracy


def corners(shape):
    d = len(shape)
    return np.array(np.meshgrid(*[[0, n - 1] for n in shape], indexing="ij")).reshape(d, -1)


def linear_accuracy(truth, shape):
    def acc(result):
        if hasattr(result, "transform"):  # ours
            return f"corner error {corner_error(result.transform.matrix, truth, shape):.3f} px"
        if result.ndim == 2:  # a matrix
            return f"corner error {corner_error(result, truth, shape):.3f} px"
        c = corners(shape)  # a displacement field: read at the corners
        est = c + result[(slice(None), *c)]
        ref = (truth @ np.vstack([c, np.ones(c.shape[1])]))[: len(shape)]
        return f"corner error {np.linalg.norm(est - ref, axis=0).mean():.3f} px"

    return acc


def dense_accuracy(truth, border):
    import torch

    from napari_simwarp.ops import jacobian_determinant

    inner = (slice(None),) + tuple(slice(border, -border) for _ in truth.shape[1:])

    def acc(result):
        if hasattr(result, "transform"):
            result = result.transform.to_displacement(truth.shape[1:])
        est = np.asarray(result, dtype=np.float64)
        epe = float(np.linalg.norm(est - truth, axis=0)[inner[1:]].mean())
        jac = float(jacobian_determinant(torch.from_numpy(est)[None]).min())
        return f"EPE {epe:.4f} px, min Jacobian det {jac:.3f}"

    return acc


# ----------------------------------------------------------------------------- cases


def ours(fixed, moving, model, metric=None, **kw):
    from napari_simwarp.registration import register

    def run():
        if metric is None:
            return register(fixed, moving, model=model, **kw)
        return register(fixed, moving, model=model, metric=metric, **kw)

    return run


def linear_case(
    report, rng, group, shape, matrix, model, *, elastix_kind, stackreg=None, adam=True, **kw
):
    fixed, moving = linear_pair(rng, shape, matrix, **kw)
    acc = linear_accuracy(matrix, shape)
    if kw.get("remap"):  # no default metric is meant for a multimodal pair: "mi" is ours
        name = f"simwarp {model}/mi (Newton, the default)"
        once(report, group, name, ours(fixed, moving, model, "mi"), acc, ours=True)
        if adam:
            adam_run = ours(fixed, moving, model, "mi", optimizer="adam")
            once(report, group, f"simwarp {model}/mi, Adam", adam_run, acc)
    else:
        name = f"simwarp {model} (defaults: ncc, Gauss–Newton)"
        once(report, group, name, ours(fixed, moving, model), acc, ours=True)
        # The defaults before Gauss–Newton: Adam, the finest level skipped above 256² / 64³.
        adam = ours(fixed, moving, model, "ncc", optimizer="adam")
        once(report, group, f"simwarp {model}/ncc, Adam", adam, acc)
        lncc = ours(fixed, moving, model, "lncc")
        once(report, group, f"simwarp {model}/lncc (Adam)", lncc, acc)
    metric = "AdvancedMattesMutualInformation" if kw.get("remap") else None
    once(
        report,
        group,
        f"itk-elastix {elastix_kind}",
        elastix(fixed, moving, elastix_kind, metric),
        acc,
    )
    if stackreg and len(shape) == 2:
        once(report, group, f"pystackreg {stackreg}", pystackreg(fixed, moving, stackreg), acc)


def affine_matrix(rng, shape, degrees, scale=(1.0, 1.0), shear=0.0, shift=(0, 0)):
    d = len(shape)
    lin = rotation(d, degrees) @ np.diag(scale)
    if d == 2:
        lin = lin @ np.array([[1, shear], [0, 1]])
    return centered_affine(lin, shift, shape)


def cases_2d(report, quick):
    rng = np.random.default_rng(16)
    s = (256, 256)
    q = s[0] / 4
    linear = [
        (
            "2-D rigid 5°, 256²",
            s,
            affine_matrix(rng, s, 5, shift=(3, -2)),
            "rigid",
            "rigid",
            "RIGID_BODY",
            {},
        ),
        (
            "2-D rigid 10°, 384×303",
            (384, 303),
            affine_matrix(rng, (384, 303), 10, shift=(4, 6)),
            "rigid",
            "rigid",
            "RIGID_BODY",
            {},
        ),
        (
            "2-D rigid 25°, 256²",
            s,
            affine_matrix(rng, s, 25, shift=(5, -4)),
            "rigid",
            "rigid",
            "RIGID_BODY",
            {},
        ),
        (
            "2-D rigid 30° + quarter shift, 256²",
            s,
            affine_matrix(rng, s, -30, shift=(q, -q / 2)),
            "rigid",
            "rigid",
            "RIGID_BODY",
            {},
        ),
        (
            "2-D translation, quarter shift, 256²",
            s,
            affine_matrix(rng, s, 0, shift=(q, q)),
            "translation",
            "translation",
            "TRANSLATION",
            {},
        ),
        (
            "2-D affine −6°, scale, shear, 256²",
            s,
            affine_matrix(rng, s, -6, (1.08, 0.93), 0.06, (5, -7)),
            "affine",
            "affine",
            "AFFINE",
            {},
        ),
        (
            "2-D affine, anisotropic scale + shear 20°, 256²",
            s,
            affine_matrix(rng, s, 20, (1.15, 0.88), 0.1, (8, 3)),
            "affine",
            "affine",
            "AFFINE",
            {},
        ),
        (
            "2-D affine, low SNR (noise σ 150), 256²",
            s,
            affine_matrix(rng, s, 8, (1.05, 0.97), 0.03, (4, 4)),
            "affine",
            "affine",
            "AFFINE",
            {"noise": 150.0},
        ),
        (
            "2-D affine, multimodal (sin remap), 256²",
            s,
            affine_matrix(rng, s, **MULTIMODAL_2D),
            "affine",
            "affine",
            None,
            {"remap": True},
        ),
    ]
    keep = {0, 2, 3, 5} if quick else set(range(len(linear)))
    for i, (group, shape, m, model, kind, sr, kw) in enumerate(linear):
        if i in keep:
            linear_case(report, rng, group, shape, m, model, elastix_kind=kind, stackreg=sr, **kw)


#: the dense cases: (name, shape, amplitude px, field σ px (None: a side / 8), pixels of
#: border left out of the EPE, whether scikit-image's flows run too (2-D only), the moving
#: image's shading (None, or ±fraction of a linear ramp across the columns))
DENSE_CASES = [
    ("2-D smooth deformation ~4 px, 256²", (256, 256), 4.0, None, 16, True, None),
    # Local: a field with structure 8 px wide (the smooth one's is 32 px).
    ("2-D local deformation ~2.5 px (σ 8 px), 256²", (256, 256), 2.5, 8.0, 16, False, None),
    # 3-D: σ 8 px (a side / 8), the amplitude of the 2-D local case's ratio to its σ.
    ("3-D smooth deformation ~3 px, 64³", (64, 64, 64), 3.0, None, 8, False, None),
    # Uneven illumination, as a microscope's field often has: the local case's moving
    # image brighter by 30 % at one side and darker by 30 % at the other.
    ("2-D local deformation, moving shaded ±30 %, 256²", (256, 256), 2.5, 8.0, 16, False, 0.3),
]

#: elastix's B-spline map tuned as a demanding user would, per dimensionality: the best
#: end-point error of the settings tried on draw 1 of the local 2-D case and of the 3-D case
#: (benchmarks/tune_elastix_bspline.py; docs/benchmarks.md lists them and their figures):
#: normalized correlation (the images share their intensities), a bending-energy weight of
#: 0.1 and 4× the spatial samples per iteration. Entries replace the default map's.
_TUNED = {
    "Metric": ["AdvancedNormalizedCorrelation", "TransformBendingEnergyPenalty"],
    "Metric1Weight": 0.1,
    "NumberOfSpatialSamples": 8192,
}
ELASTIX_TUNED = {2: _TUNED, 3: _TUNED}


def dense_pair(seed, shape, amplitude, sigma):
    """``(truth, fixed, moving)``: a pair related by a random field ``truth`` ``(D, *S)`` of
    ``amplitude`` px and smoothness ``sigma``, drawn from ``default_rng(seed)``; the fixed
    image's pixel ``x`` shows what the moving image shows at ``x + truth(x)``."""
    rng = np.random.default_rng(seed)
    d, grid, u = smooth_deformation(rng, shape, amplitude, sigma)
    fixed_f = scene(rng, shape)
    moving = noisy(rng, ndi.map_coordinates(fixed_f, grid + u, order=3, mode="nearest"))
    return d, noisy(rng, fixed_f), moving


def dense_cases(report, seeds, variants=True):
    """Every dense case, once per seed; ``variants``: also our other dense settings and
    scikit-image's flows."""
    for name, shape, amplitude, sigma, border, flows, shade in DENSE_CASES:
        for seed in seeds:
            group = name if len(seeds) == 1 else f"{name}, seed {seed}"
            truth, fixed, moving = dense_pair(seed, shape, amplitude, sigma)
            if shade:
                moving = moving * (1 + shade * np.linspace(-1.0, 1.0, shape[-1]))
            dense_case(report, group, truth, fixed, moving, border, variants, variants and flows)


def dense_case(report, group, truth, fixed, moving, border, variants=True, flows=False):
    """Ours and the peers on one dense pair (``truth``: the field, ``(D, *S)``)."""
    acc = dense_accuracy(truth, border)
    once(
        report,
        group,
        "simwarp deformable (default metric)",
        ours(fixed, moving, "deformable"),
        acc,
        ours=True,
    )
    # Our choice for pairs that share their intensities, beside elastix's tuned map
    # (whose metric is global NCC too): 0.5 bending, 150 iterations (model_defaults).
    run_ncc = ours(fixed, moving, "deformable", metric="ncc")
    once(report, group, "simwarp deformable, metric=ncc", run_ncc, acc)
    if variants:
        once(report, group, "simwarp diffeomorphic", ours(fixed, moving, "diffeomorphic"), acc)
        # A coarser control grid: 16 px, against elastix's 10 px B-spline grid.
        coarse = ours(fixed, moving, "deformable", grid_spacing=16.0)
        once(report, group, "simwarp deformable, grid_spacing=16", coarse, acc)
    once(report, group, "itk-elastix bspline", elastix(fixed, moving, "bspline"), acc)
    tuned = ELASTIX_TUNED[fixed.ndim]
    run_tuned = elastix(fixed, moving, "bspline", overrides=tuned)
    once(report, group, "itk-elastix bspline, tuned map", run_tuned, acc)
    if not flows:
        return
    from skimage.registration import optical_flow_ilk, optical_flow_tvl1

    # scikit-image's flows expect intensities of order 1 (tvl1's attachment weight is
    # absolute): both scaled by the fixed image's range, as our run normalizes its own.
    lo, hi = np.percentile(fixed, [0.5, 99.5])
    f64, m64 = ((x.astype(np.float64) - lo) / (hi - lo) for x in (fixed, moving))
    once(report, group, "skimage optical_flow_ilk", lambda: optical_flow_ilk(f64, m64), acc)
    once(report, group, "skimage optical_flow_tvl1", lambda: optical_flow_tvl1(f64, m64), acc)


#: the multimodal cases' transforms (2-D, 3-D), as the suite draws them
MULTIMODAL_2D = dict(degrees=7, scale=(1.03, 0.98), shear=0.0, shift=(3, -3))
MULTIMODAL_3D = dict(degrees=8, axis=2, scale=(1.03, 0.98, 1.0), shift=(2.0, -1.5, 2.5))


def multimodal_matrix_3d(shape):
    m = MULTIMODAL_3D
    lin = rotation(3, m["degrees"], axis=m["axis"]) @ np.diag(m["scale"])
    return centered_affine(lin, list(m["shift"]), shape)


def cases_multimodal(report, seeds):
    """The multimodal rows alone (``--cases multimodal``): the suite's 2-D and 3-D
    transforms, a new pair per seed (``np.random.default_rng(seed)``), ours and elastix
    side by side, Adam left out."""
    s2, s3 = (256, 256), (48, 48, 48)
    m2 = affine_matrix(None, s2, **MULTIMODAL_2D)
    m3 = multimodal_matrix_3d(s3)
    for seed in seeds:
        rng = np.random.default_rng(seed)
        group = f"2-D affine, multimodal (sin remap), 256², seed {seed}"
        linear_case(
            report, rng, group, s2, m2, "affine", elastix_kind="affine", adam=False, remap=True
        )
    for seed in seeds:
        rng = np.random.default_rng(seed)
        group = f"3-D affine, multimodal (sin remap), 48³, seed {seed}"
        linear_case(
            report, rng, group, s3, m3, "affine", elastix_kind="affine", adam=False, remap=True
        )


def cases_3d(report, quick):
    rng = np.random.default_rng(163)
    s = (64, 72, 80)
    lin = rotation(3, 6, axis=1) @ np.diag([1.04, 0.97, 1.0])
    m = centered_affine(lin, [2.5, -3.0, 1.5], s)
    linear_case(report, rng, "3-D affine 6°, 64×72×80", s, m, "affine", elastix_kind="affine")
    if quick:
        return
    s = (48, 48, 48)
    m = centered_affine(rotation(3, 25, axis=0), [3.0, -2.0, 4.0], s)
    linear_case(report, rng, "3-D rigid 25°, 48³", s, m, "rigid", elastix_kind="rigid")
    m = multimodal_matrix_3d(s)
    group = "3-D affine, multimodal (sin remap), 48³"
    linear_case(report, rng, group, s, m, "affine", elastix_kind="affine", remap=True)


def run(report, cases="all", seeds=(1,), variants=True) -> None:
    """The suite (``cases``: "all", or the "multimodal" or "dense" cases alone, one pair per
    seed of ``seeds``); ``variants``: also our other dense settings and scikit-image's flows."""
    # Threads and kernels start on a first call; keep that out of the first row.
    from napari_simwarp.registration import register

    warm = scene(np.random.default_rng(0), (64, 64))
    register(warm, warm, model="rigid")
    # The first torch.optim.Adam of a process imports torch._dynamo (about 2 s here):
    # Gauss-Newton runs use none, so the Adam rows get their own warm-up.
    register(warm, warm, model="rigid", optimizer="adam")
    register(warm, warm, model="affine", metric="mi")
    register(warm, warm, model="deformable")  # the warp kernels, once
    # ITK loads its modules (and each dimension's templates) on first use: seconds.
    for shape in ((48, 48), (24, 24, 24)):
        warm = scene(np.random.default_rng(0), shape)
        try:
            _elastix_positions(warm, warm, "translation")
        except ImportError:
            report.note(SECTION, "itk-elastix is not installed: its rows are missing.")
            break
    report.note(
        SECTION,
        "One call per row (time and peak memory of that call). Corner error: mean "
        "displacement error at the image corners; elastix's transform is read back through "
        "transformix's deformation field. Elastix: default parameter maps, "
        f"{ELASTIX_THREADS} threads; multimodal row: its default affine map with "
        "AdvancedMattesMutualInformation; 'tuned map': its bspline map with the entries of "
        "bench_quality.ELASTIX_TUNED. 'defaults' rows call register without "
        "metric= or optimizer=. Quick mode (--quick): " + ("yes" if QUICK else "no") + "; "
        f"dense pairs drawn from seeds {', '.join(map(str, seeds))}.",
    )
    start = time.perf_counter()
    if cases == "multimodal":
        cases_multimodal(report, seeds)
    if cases == "all":
        cases_2d(report, QUICK)
        cases_3d(report, QUICK)
    if cases == "dense" or (cases == "all" and not QUICK):
        dense_cases(report, seeds, variants)
    print(f"  (quality suite: {time.perf_counter() - start:.0f} s)", flush=True)


def main(argv=None) -> int:
    global QUICK, REPEAT
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a few cases (about a minute)")
    parser.add_argument("--out", help="write the markdown table to this file")
    parser.add_argument(
        "--cases",
        choices=("all", "multimodal", "dense"),
        default="all",
        help="multimodal / dense: those cases alone, one pair per --seeds",
    )
    parser.add_argument(
        "--seeds",
        type=int,
        nargs="+",
        default=[1],
        help="the draws of the multimodal and dense pairs",
    )
    parser.add_argument(
        "--repeat", type=int, default=1, help="calls per row, the median time reported"
    )
    parser.add_argument(
        "--no-variants",
        action="store_true",
        help="dense cases: only our defaults and elastix (no diffeomorphic, grid 16, flows)",
    )
    args = parser.parse_args(argv)
    QUICK = QUICK or args.quick
    REPEAT = max(1, args.repeat)
    report = Report()
    run(report, args.cases, args.seeds, not args.no_variants)
    return print_markdown(report, SECTION, args.out)


if __name__ == "__main__":
    raise SystemExit(main())
