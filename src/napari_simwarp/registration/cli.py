"""``napari-simwarp register FIXED MOVING -o OUT``: register two image files.

Reads TIFF, PNG, JPEG or NPY (2-D or 3-D grey; color is converted to luminance with a
note); writes the warped moving image to ``OUT`` (TIFF, PNG or NPY, by its suffix, in the
moving image's dtype unless ``--dtype`` says otherwise) and the transform to
``OUT.transform.npz`` (``registered.tif`` → ``registered.tif.transform.npz``). Nothing is
ever written over an input; an existing output is replaced only with ``--overwrite``, and
every check is made before the registration starts. Progress is drawn on a terminal, and
printed every few seconds when the output is redirected.

The package's command (``napari_simwarp._cli``) wires this in as a subcommand::

    from napari_simwarp.registration import cli
    cli.add_parser(subparsers)          # adds "register", sets func=cli.run
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time

import numpy as np

#: ``--dtype`` choices besides "same" (the moving file's dtype)
OUTPUT_DTYPES = ("float32", "float64", "uint8", "uint16", "int16", "int32")


def transform_path(out) -> pathlib.Path:
    """Where the transform of output image ``out`` is written: ``OUT.transform.npz``."""
    out = pathlib.Path(out)
    return out.with_name(out.name + ".transform.npz")


def levels_option(text: str):
    """``--levels``: "auto" or a positive int (argparse reports anything else)."""
    if text == "auto":
        return text
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected 'auto' or a positive int, got {text!r}"
        ) from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected 'auto' or a positive int, got {text!r}")
    return value


def per_axis_option(text: str) -> tuple[float, ...]:
    """``--fixed-spacing`` and the like: one number, or one per axis separated by commas
    (array order, z first: ``3,0.5,0.5``). Their count is checked against the image."""
    try:
        values = tuple(float(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a number or comma-separated numbers (array order, e.g. 3,0.5,0.5), "
            f"got {text!r}"
        ) from None
    return values


class ProgressReport:
    """Progress of a run on ``stream``: one redrawn line on a terminal, else one printed
    line every ``every`` seconds (so a long run in a log or a pipe still shows it moves)."""

    def __init__(self, stream=sys.stderr, every: float = 5.0):
        self.stream = stream
        self.terminal = stream.isatty()
        self.every = every
        self._last = time.monotonic()

    def __call__(self, progress) -> bool:
        levels = progress.levels
        text = (
            f"level {progress.level + 1}/{levels}  iteration {progress.iteration:4d}  "
            f"loss {progress.loss:.5f}"
        )
        if self.terminal:
            bar = "#" * (progress.level + 1) + "." * (levels - progress.level - 1)
            self.stream.write(f"\r  [{bar}] {text}   ")
            self.stream.flush()
        elif time.monotonic() - self._last >= self.every:
            self._last = time.monotonic()
            self.stream.write(f"  {text}\n")
            self.stream.flush()
        return False

    def close(self):
        if self.terminal:
            self.stream.write("\n")
            self.stream.flush()


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Add the ``register`` subcommand to an argparse ``subparsers`` object."""
    from ._names import METRICS, MODELS

    p = subparsers.add_parser(
        "register",
        help="align MOVING to FIXED (files: TIFF, PNG, JPEG, NPY)",
        description="Find the transform that makes MOVING look like FIXED; write the warped "
        "moving image to OUT and the transform beside it, to OUT.transform.npz "
        "(registered.tif -> registered.tif.transform.npz). Input files are never written "
        "over; existing outputs are replaced only with --overwrite.",
    )
    p.add_argument("fixed", help="fixed (reference) image file: .tif, .png, .jpg or .npy")
    p.add_argument("moving", help="moving image file: .tif, .png, .jpg or .npy")
    p.add_argument(
        "-o", "--out", required=True, help="output image file: .tif, .tiff, .png or .npy"
    )
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace OUT and OUT.transform.npz if they exist (never an input)",
    )
    p.add_argument(
        "--dtype",
        default="same",
        choices=("same", *OUTPUT_DTYPES),
        help="dtype of OUT (default: the moving file's; integers are rounded "
        "and clipped, never rescaled)",
    )
    p.add_argument("--model", default="affine", choices=MODELS)
    p.add_argument("--metric", default="lncc", choices=METRICS)
    p.add_argument(
        "--levels",
        default="auto",
        type=levels_option,
        help="pyramid levels: auto or a positive int (default: auto)",
    )
    for role in ("fixed", "moving"):
        p.add_argument(
            f"--{role}-spacing",
            type=per_axis_option,
            default=None,
            metavar="S[,S...]",
            help=f"{role} pixel size, one value or one per axis in array order (z,y,x); "
            "default 1. Registration then works in these physical units",
        )
        p.add_argument(
            f"--{role}-origin",
            type=per_axis_option,
            default=None,
            metavar="O[,O...]",
            help=f"physical position of the {role} image's first pixel (default 0)",
        )
    p.add_argument("--iterations", type=int, default=None, help="most iterations per level")
    p.add_argument("--lr", type=float, default=None, help="initial step, pixels per level")
    p.add_argument(
        "--window",
        type=float,
        default=None,
        help="lncc/ssim window in physical units (default 9 / 11 pixels)",
    )
    p.add_argument(
        "--grid-spacing",
        type=float,
        default=None,
        help="deformable: control-grid spacing in physical units (default 8 pixels)",
    )
    p.add_argument(
        "--regularization",
        type=float,
        default=None,
        help="deformable: smoothness weight (default 0.05)",
    )
    p.add_argument("--mask", default=None, help="mask file for the fixed image (non-zero = use)")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, mps")
    p.add_argument("--quiet", action="store_true", help="no progress display")
    p.set_defaults(func=run)
    return p


def _one_per_axis(values):
    """A single value applies to every axis."""
    return values[0] if values is not None and len(values) == 1 else values


def run(args) -> int:
    """Run the ``register`` subcommand from parsed ``args``; returns the exit status.

    Every file check (inputs readable, outputs writable and not inputs) happens before
    the registration starts, so a mistake costs no computation and writes nothing.
    """
    from ..io import check_output_path, check_target, read_image, write_image
    from .pair import register

    notes: list[str] = []
    fixed = read_image(args.fixed, what="fixed", notes=notes)
    moving = read_image(args.moving, what="moving", notes=notes)
    mask = read_image(args.mask, what="--mask", notes=notes) if args.mask else None
    dtype = moving.dtype if args.dtype == "same" else np.dtype(args.dtype)
    inputs = {"fixed": args.fixed, "moving": args.moving, "--mask": args.mask}
    out = check_output_path(
        args.out, what="-o", inputs=inputs, overwrite=args.overwrite, dtype=dtype
    )
    transform_out = check_target(
        transform_path(out), what="the transform file", inputs=inputs, overwrite=args.overwrite
    )
    for note in notes:
        print(f"napari-simwarp register: note: {note}", file=sys.stderr)
    progress = ProgressReport() if not args.quiet else None
    try:
        result = register(
            fixed,
            moving,
            model=args.model,
            metric=args.metric,
            mask=mask,
            fixed_spacing=_one_per_axis(args.fixed_spacing),
            fixed_origin=_one_per_axis(args.fixed_origin),
            moving_spacing=_one_per_axis(args.moving_spacing),
            moving_origin=_one_per_axis(args.moving_origin),
            levels=args.levels,
            iterations=args.iterations,
            lr=args.lr,
            window=args.window,
            grid_spacing=args.grid_spacing,
            regularization=args.regularization,
            device=args.device,
            callback=progress,
        )
    finally:
        if progress is not None:
            progress.close()
    write_image(out, result.warped, dtype=dtype)
    result.transform.save(transform_out)
    if not args.quiet:
        print(
            f"{args.model}/{args.metric}: final loss {result.loss_history[-1]:.5f} after "
            f"{len(result.loss_history)} evaluations in {result.seconds:.2f} s on "
            f"{result.device}"
        )
        print(f"wrote {out}")
        print(f"wrote {transform_out}")
    return 0
