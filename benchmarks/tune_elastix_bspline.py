"""Tune elastix's B-spline map on one draw of bench_quality's dense cases (issue 16).

Runs elastix's default "bspline" map with each set of entries in ``SETTINGS`` replaced, on
one pair of a dense case, and prints the end-point error, lowest Jacobian determinant and
time of each: what chose ``bench_quality.ELASTIX_TUNED`` (docs/benchmarks.md).

    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/tune_elastix_bspline.py --case 1 --seed 1
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_quality import DENSE_CASES, _elastix_positions, dense_accuracy, dense_pair

NCC = ["AdvancedNormalizedCorrelation", "TransformBendingEnergyPenalty"]
#: name → entries replacing the default map's (one draw each; stage 2 combines the best)
SETTINGS = {
    "default": {},
    "grid 5": {"FinalGridSpacingInPhysicalUnits": 5},
    "grid 8": {"FinalGridSpacingInPhysicalUnits": 8},
    "grid 16": {"FinalGridSpacingInPhysicalUnits": 16},
    "iterations 1000": {"MaximumNumberOfIterations": 1000},
    "samples 8192": {"NumberOfSpatialSamples": 8192},
    "ncc": {"Metric": NCC},
    "resolutions 3": {"NumberOfResolutions": 3, "GridSpacingSchedule": [2, 1.4142, 1]},
    "bending 0.1": {"Metric1Weight": 0.1},
    "bending 10": {"Metric1Weight": 10},
    "bending 0.01": {"Metric1Weight": 0.01},
    "bending 0.03": {"Metric1Weight": 0.03},
    "bending 0.3": {"Metric1Weight": 0.3},
}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--case", type=int, default=1, help="index into DENSE_CASES")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--only", nargs="*", help="names of SETTINGS to run")
    parser.add_argument("--combine", nargs="*", default=[], help="settings merged in order")
    args = parser.parse_args(argv)
    name, shape, amplitude, sigma, border, *_ = DENSE_CASES[args.case]
    truth, fixed, moving = dense_pair(args.seed, shape, amplitude, sigma)
    acc = dense_accuracy(truth, border)
    settings = {k: v for k, v in SETTINGS.items() if not args.only or k in args.only}
    if args.combine:
        merged = {}
        for key in args.combine:
            merged.update(SETTINGS[key])
        settings = {" + ".join(args.combine): merged}
    _elastix_positions(fixed[:32, :32], moving[:32, :32], "translation")  # ITK's start-up
    print(f"{name}, seed {args.seed}", flush=True)
    for label, overrides in settings.items():
        t0 = time.perf_counter()
        field = _elastix_positions(fixed, moving, "bspline", overrides=overrides)
        seconds = time.perf_counter() - t0
        print(f"  {label:40s} {seconds * 1e3:8.0f} ms  {acc(field)}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
