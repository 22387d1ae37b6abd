"""Drift correction of rigid (rotating) drift: ``register_stack``'s metric, by measurement.

``register_stack`` aligns linear models other than translation with the generic optimizer;
its metric decides the optimizer (global "ncc" and "mse": Gauss–Newton; "lncc": Adam, see
``resolve_optimizer``). This runs each metric, and pystackreg's ``register_stack`` as the
peer, on time-lapses built from a known drift (a rotation of up to ±3° and a shift of up to
±6 px per frame, cubic-interpolated from a larger scene, then cropped), under the
conditions microscopy drift comes with: camera noise, photobleaching (the signal decaying
to a quarter over the stack, the camera offset not), low signal to noise, a bright object
crossing the field of view independently of the drift, and each reference ("first",
"previous", "mean"). Accuracy: the mean displacement error at the frame's corners
(against the true reference → frame transform), median and worst over the frames. Each
row is one call, timed (a warm-up precedes the suite).

    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/bench_stack.py [--out FILE]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
from scipy import ndimage as ndi

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _harness import Report, print_markdown
from bench_quality import once, rotation
from bench_register import centered_affine, corner_error, drift_stack, noisy, scene

SECTION = "Drift correction of rigid drift: register_stack's metric (issue 16)"
FRAMES, SHAPE, PAD = 12, (128, 128), 16
METRICS = ("ncc", "lncc", "mse")
#: pystackreg's names of our references
STACKREG = {"first": "first", "previous": "previous", "mean": "mean"}


# ----------------------------------------------------------------------------- data


def rigid_drift(rng, frames=FRAMES, degrees=3.0, shift=6.0):
    """``(T, 3, 3)`` matrices ``A_t`` (array order, crop pixels): frame ``t`` at ``x`` is
    the scene at ``A_t x``; a random walk that stays within ±``degrees`` and ±``shift``."""
    angles = np.clip(np.cumsum(rng.normal(0, degrees / 3, frames)), -degrees, degrees)
    shifts = np.clip(np.cumsum(rng.normal(0, shift / 3, (frames, 2)), axis=0), -shift, shift)
    return np.stack([centered_affine(rotation(2, a), s, SHAPE) for a, s in zip(angles, shifts)])


def truth_of(drift):
    """The reference (frame 0) → frame ``t`` transforms: ``frame_t(T_t x) = frame_0(x)``."""
    return np.stack([np.linalg.inv(a) @ drift[0] for a in drift])


def make_stack(rng, drift, *, noise=10.0, bleach=1.0, blob=0.0):
    """A uint16 time-lapse ``(T, *SHAPE)`` of one scene under ``drift``.

    bleach : the signal's fraction left at the last frame (exponential decay; the camera
        offset of 100 does not decay)
    blob : peak intensity of a bright object (Gaussian, σ 6 px) crossing the field of
        view diagonally, independently of the drift (0: none)
    """
    big = scene(rng, tuple(n + 2 * PAD for n in SHAPE))
    pad = np.eye(3)
    pad[:2, 2] = PAD
    rate = -np.log(bleach) / max(len(drift) - 1, 1)
    yy, xx = np.mgrid[: SHAPE[0], : SHAPE[1]].astype(np.float64)
    out = []
    for t, a in enumerate(drift):
        f = ndi.affine_transform(big, pad @ a, output_shape=SHAPE, order=3, mode="nearest")
        f = 100 + (f - 900) * np.exp(-rate * t)
        if blob:
            c = 20 + (SHAPE[0] - 40) * t / (len(drift) - 1)
            f = f + blob * np.exp(-((yy - c) ** 2 + (xx - c) ** 2) / (2 * 6.0**2))
        out.append(f)
    return noisy(rng, np.stack(out), noise)


# ----------------------------------------------------------------------------- accuracy


def stack_accuracy(truth, shape=SHAPE):
    """``acc(result)``: median and worst corner error over frames 1…T−1; the estimates are
    taken relative to frame 0's (pystackreg's "mean" reference is the stack's mean)."""

    def acc(result):
        mats = (
            np.stack([t.matrix for t in result.transforms])
            if hasattr(result, "transforms")
            else np.asarray(result)
        )
        mats = mats @ np.linalg.inv(mats[0])
        e = np.array([corner_error(m, t, shape) for m, t in zip(mats[1:], truth[1:])])
        return f"corner error median {np.median(e):.3f} px, max {e.max():.3f} px"

    return acc


# ----------------------------------------------------------------------------- runs


def ours(stack, reference, metric, model="rigid"):
    from napari_simwarp.registration import register_stack

    return lambda: register_stack(stack, model=model, reference=reference, metric=metric)


def stackreg(stack, reference):
    def run():
        from pystackreg import StackReg

        tm = StackReg(StackReg.RIGID_BODY).register_stack(stack, reference=reference)
        swap = np.array([[0, 1, 0], [1, 0, 0], [0, 0, 1]], float)
        return swap @ tm @ swap  # (x, y) → array order, reference → frame

    return run


def stack_case(report, group, stack, truth, references=("first",)):
    acc = stack_accuracy(truth)
    for reference in references:
        name = group if len(references) == 1 else f"{group}, reference={reference}"
        for metric in METRICS:
            optimizer = "Adam" if metric == "lncc" else "Gauss–Newton"
            once(
                report,
                name,
                f"simwarp register_stack rigid/{metric} ({optimizer})",
                ours(stack, reference, metric),
                acc,
                ours=metric == "ncc",
            )
        once(report, name, "pystackreg RIGID_BODY", stackreg(stack, STACKREG[reference]), acc)


def large_case(report) -> None:
    """bench_register's drift stack (50 × 512², shifts only, same seed) aligned as rigid."""
    stack, shifts = drift_stack(np.random.default_rng(2026))
    truth = np.stack([np.eye(3)] * len(shifts))
    truth[:, :2, 2] = shifts
    acc = stack_accuracy(truth, stack.shape[1:])
    group = "drift 50 × 512², ±8 px (shifts only), aligned as rigid"
    once(
        report,
        group,
        "simwarp register_stack (translation)",
        ours(stack, "first", None, "translation"),
        acc,
    )
    for metric in METRICS:
        optimizer = "Adam" if metric == "lncc" else "Gauss–Newton"
        name = f"simwarp register_stack rigid/{metric} ({optimizer})"
        once(report, group, name, ours(stack, "first", metric), acc, ours=metric == "ncc")
    once(report, group, "pystackreg RIGID_BODY", stackreg(stack, "first"), acc)


def warm_up() -> None:
    """Threads, kernels and Adam's first import (torch._dynamo): out of the first rows."""
    from napari_simwarp.registration import register_stack

    warm = noisy(
        np.random.default_rng(0), np.stack([scene(np.random.default_rng(0), (48, 48))] * 3)
    )
    for metric in METRICS:
        register_stack(warm, model="rigid", metric=metric)


def run(report, large=False) -> None:
    warm_up()
    report.note(
        SECTION,
        f"{FRAMES} frames of {SHAPE[0]}×{SHAPE[1]}, rigid drift (random walk within ±3° and "
        "±6 px), camera noise σ 10 unless stated. One call per row. Error: mean "
        "displacement error at the frame's corners against the true reference → frame "
        "transform, median and worst over frames 1 to T−1.",
    )
    start = time.perf_counter()
    cases = [
        ("rigid drift", dict(), ("first", "previous", "mean")),
        ("photobleaching to 25 %", dict(bleach=0.25), ("first", "previous", "mean")),
        ("low SNR (noise σ 100)", dict(noise=100.0), ("first",)),
        ("photobleaching to 25 % and noise σ 60", dict(bleach=0.25, noise=60.0), ("first",)),
        ("bright object (peak 700) crossing the field", dict(blob=700.0), ("first",)),
        ("bright object (peak 1500) crossing the field", dict(blob=1500.0), ("first",)),
    ]
    for i, (label, kw, references) in enumerate(cases):
        rng = np.random.default_rng(2026 + i)
        drift = rigid_drift(rng)
        stack = make_stack(rng, drift, **kw)
        stack_case(report, label, stack, truth_of(drift), references)
    if large:
        large_case(report)
    print(f"  (stack suite: {time.perf_counter() - start:.0f} s)", flush=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="write the markdown table to this file")
    parser.add_argument(
        "--large", action="store_true", help="also bench_register's 50 × 512² drift stack"
    )
    parser.add_argument("--only-large", action="store_true", help="that case alone")
    args = parser.parse_args(argv)
    report = Report()
    if args.only_large:
        warm_up()
        large_case(report)
    else:
        run(report, args.large)
    return print_markdown(report, SECTION, args.out)


if __name__ == "__main__":
    raise SystemExit(main())
