"""The ``napari-simwarp`` command.

    napari-simwarp demo --out DIR      run the operators on the bundled sample data and
                                       write the maps, a summary and a picture into DIR
"""

from __future__ import annotations

import argparse
import sys


def _add_demo(subparsers) -> None:
    p = subparsers.add_parser(
        "demo",
        help="run the similarity operators on the bundled sample data",
        description="Run local std, ZNCC template matching, local NCC and SSIM on the "
        "bundled camera picture and a deformed copy; write the maps (.npy), "
        "summary.json and demo.png into --out.",
    )
    p.add_argument("--out", default="out/demo", help="output folder (default: out/demo)")
    p.add_argument("--headless", action="store_true",
                   help="no viewer: compute and write results only (the default for now)")
    p.add_argument("--device", default="auto", help="torch device: auto, cpu, cuda, mps")
    p.set_defaults(func=_run_demo)


def _run_demo(args) -> int:
    from ._demo import run_headless_demo

    summary = run_headless_demo(args.out, device=args.device)
    for key, value in summary.items():
        print(f"{key}: {value}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="napari-simwarp",
        description="Compare and align images: similarity maps, template matching, warps.",
    )
    subparsers = parser.add_subparsers(dest="command", required=True)
    _add_demo(subparsers)
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, TypeError, FileNotFoundError) as exc:
        # Input problems are the user's to fix: one clear line, no traceback.
        print(f"napari-simwarp {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
