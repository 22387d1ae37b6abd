"""The measurement that chose the deformable model's default metric (issue 16; its figures
are in docs/benchmarks.md, "Deformable default metric: local NCC"): global NCC (bending
0.5) against local NCC (bending 2 and 4; 60 and 150 iterations) on bench_quality's dense
pairs, draws 1-3, and on the local pair with its moving image under a smooth random
shading and a linear ramp (±30 %), with elastix's default and tuned B-spline maps on the
shaded pairs. Prints one line per run (time, end-point error, lowest Jacobian determinant,
the warnings raised).

    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/dense_defaults.py [CONFIG ...]
"""

import sys
import time
import warnings

import numpy as np
from scipy import ndimage as ndi

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import bench_quality as bq
from napari_simwarp import register

CONFIGS = {
    "ncc 0.5 150": dict(metric="ncc", regularization=0.5, iterations=150),
    "lncc 4 150": dict(metric="lncc", regularization=4.0, iterations=150),
    "lncc 4 60": dict(metric="lncc", regularization=4.0, iterations=60),
    "lncc 2 150": dict(metric="lncc", regularization=2.0, iterations=150),
}


def shade(moving, kind, seed):
    rng = np.random.default_rng(100 + seed)
    if kind == "ramp":
        g = np.linspace(-1, 1, moving.shape[-1])[None, :] * np.ones(moving.shape)
    else:
        g = ndi.gaussian_filter(rng.standard_normal(moving.shape), 64)
        g = 2 * (g - g.min()) / (g.max() - g.min()) - 1
    return moving * (1 + 0.3 * g)


def cases():
    """``(label, truth, fixed, moving, border)``: the suite's unshaded dense pairs, then the
    local one under each shading, draws 1-3."""
    for name, shape, amp, sigma, border, _, shading in bq.DENSE_CASES:
        if shading:
            continue
        for seed in (1, 2, 3):
            truth, f, m = bq.dense_pair(seed, shape, amp, sigma)
            yield f"{name[:9]} s{seed}", truth, f, m, border
    _, shape, amp, sigma, border, *_ = bq.DENSE_CASES[1]
    for kind in ("shading", "ramp"):
        for seed in (1, 2, 3):
            truth, f, m = bq.dense_pair(seed, shape, amp, sigma)
            yield f"local+{kind} s{seed}", truth, f, shade(m, kind, seed), border


def epe(truth, d, border):
    inner = tuple(slice(border, -border) for _ in truth.shape[1:])
    import torch

    from napari_simwarp.ops import jacobian_determinant

    e = float(np.linalg.norm(d - truth, axis=0)[inner].mean())
    return e, float(jacobian_determinant(torch.from_numpy(d)[None]).min())


def main(only) -> None:
    """Run every config of :data:`CONFIGS` (or those named in ``only``) on every pair."""
    for label, truth, f, m, border in cases():
        for cname, kw in CONFIGS.items():
            if only and cname not in only:
                continue
            with warnings.catch_warnings(record=True) as w:
                warnings.simplefilter("always")
                t = time.perf_counter()
                r = register(f, m, model="deformable", device="cpu", **kw)
                dt = time.perf_counter() - t
            d = np.asarray(r.transform.to_displacement(truth.shape[1:]), dtype=np.float64)
            e, j = epe(truth, d, border)
            warned = "; ".join(
                str(x.message)[:50] for x in w if "Registration" in type(x.message).__name__
            )
            line = f"{label:22s} {cname:12s} {dt * 1000:7.0f} ms EPE {e:.4f} det {j:.3f}"
            print(f"{line} {warned}", flush=True)
        if "+" not in label or only:
            continue
        for ename, over in (("elastix default", None), ("elastix tuned", bq.ELASTIX_TUNED[2])):
            t = time.perf_counter()
            pos = bq._elastix_positions(f, m, "bspline", overrides=over)
            dt = time.perf_counter() - t
            e, j = epe(truth, np.asarray(pos, dtype=np.float64), border)
            line = f"{label:22s} {ename:12s} {dt * 1000:7.0f} ms EPE {e:.4f} det {j:.3f}"
            print(line, flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])  # config names to run (default all)
