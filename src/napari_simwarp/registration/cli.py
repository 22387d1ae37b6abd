"""``napari-simwarp register FIXED MOVING -o OUT``: register two image files.

Reads TIFF, PNG (any format scikit-image reads) or NPY; writes the warped moving image
(``OUT``, format from its suffix; ``.tif`` when it has none) and the transform
(``OUT`` with ``.transform.npz``). A progress line is drawn on a terminal.

The package's command (``napari_simwarp._cli``) wires this in as a subcommand::

    from napari_simwarp.registration import cli
    cli.add_parser(subparsers)          # adds "register", sets func=cli.run
"""

from __future__ import annotations

import argparse
import pathlib
import sys

import numpy as np

_SUFFIXES = (".npy", ".tif", ".tiff", ".png")


def read_image(path) -> np.ndarray:
    """Read an image file (NPY, TIFF, PNG, ...) as a NumPy array."""
    path = pathlib.Path(path)
    if not path.exists():
        raise FileNotFoundError(f"input file {str(path)!r} does not exist")
    suffix = path.suffix.lower()
    if suffix == ".npy":
        return np.load(path, allow_pickle=False)
    if suffix in (".tif", ".tiff"):
        import tifffile

        return tifffile.imread(path)
    from skimage import io

    image = io.imread(path)
    if image.ndim == 3 and image.shape[-1] in (3, 4):  # color PNG: register on luminance
        from skimage.color import rgb2gray

        image = rgb2gray(image[..., :3])
    return image


def write_image(path, image: np.ndarray, like_dtype) -> pathlib.Path:
    """Write ``image`` to ``path``; integer outputs are rounded and clipped to ``like_dtype``."""
    path = pathlib.Path(path)
    if path.suffix.lower() not in _SUFFIXES:
        path = path.with_name(path.name + ".tif")
    path.parent.mkdir(parents=True, exist_ok=True)
    out = image
    if np.issubdtype(like_dtype, np.integer):
        info = np.iinfo(like_dtype)
        out = np.clip(np.rint(image), info.min, info.max).astype(like_dtype)
    suffix = path.suffix.lower()
    if suffix == ".npy":
        np.save(path, out)
    elif suffix in (".tif", ".tiff"):
        import tifffile

        tifffile.imwrite(path, out)
    else:
        from skimage import io

        if not np.issubdtype(out.dtype, np.integer):
            lo, hi = float(out.min()), float(out.max())
            out = ((out - lo) / (hi - lo if hi > lo else 1) * 255).round().astype(np.uint8)
        io.imsave(path, out, check_contrast=False)
    return path


class _ProgressLine:
    """A one-line progress display on a terminal (nothing when output is redirected)."""

    def __init__(self, stream=sys.stderr):
        self.stream = stream
        self.active = stream.isatty()

    def __call__(self, progress) -> bool:
        if self.active:
            levels = progress.levels
            bar = "#" * (progress.level + 1) + "." * (levels - progress.level - 1)
            self.stream.write(f"\r  level [{bar}] {progress.level + 1}/{levels}  iteration "
                              f"{progress.iteration:4d}  loss {progress.loss:.5f}   ")
            self.stream.flush()
        return False

    def close(self):
        if self.active:
            self.stream.write("\n")
            self.stream.flush()


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Add the ``register`` subcommand to an argparse ``subparsers`` object."""
    from ._names import METRICS, MODELS

    p = subparsers.add_parser(
        "register",
        help="align MOVING to FIXED (files: TIFF, PNG, NPY)",
        description="Find the transform that makes MOVING look like FIXED; write the warped "
        "image to OUT and the transform beside it (OUT.transform.npz).",
    )
    p.add_argument("fixed", help="fixed (reference) image file")
    p.add_argument("moving", help="moving image file")
    p.add_argument("-o", "--out", required=True,
                   help="output image file (.tif, .npy or .png; .tif added when missing)")
    p.add_argument("--model", default="affine", choices=MODELS)
    p.add_argument("--metric", default="lncc", choices=METRICS)
    p.add_argument("--levels", default="auto", help="pyramid levels (default: auto)")
    p.add_argument("--iterations", type=int, default=None, help="most iterations per level")
    p.add_argument("--lr", type=float, default=None, help="initial step, pixels per level")
    p.add_argument("--window", type=int, default=None, help="lncc/ssim window (odd)")
    p.add_argument("--grid-spacing", type=float, default=8.0,
                   help="deformable: control-grid spacing in pixels (default 8)")
    p.add_argument("--regularization", type=float, default=None,
                   help="deformable: smoothness weight (default 0.05)")
    p.add_argument("--mask", default=None, help="mask file for the fixed image (non-zero = use)")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, mps")
    p.add_argument("--quiet", action="store_true", help="no progress display")
    p.set_defaults(func=run)
    return p


def run(args) -> int:
    """Run the ``register`` subcommand from parsed ``args``; returns the exit status."""
    from .register import register

    fixed = read_image(args.fixed)
    moving = read_image(args.moving)
    mask = read_image(args.mask) if args.mask else None
    levels = args.levels if args.levels == "auto" else int(args.levels)
    progress = _ProgressLine() if not args.quiet else None
    try:
        result = register(fixed, moving, model=args.model, metric=args.metric, mask=mask,
                          levels=levels, iterations=args.iterations, lr=args.lr,
                          window=args.window, grid_spacing=args.grid_spacing,
                          regularization=args.regularization, device=args.device,
                          callback=progress)
    finally:
        if progress is not None:
            progress.close()
    out = write_image(args.out, result.warped, moving.dtype)
    tpath = result.transform.save(out.with_name(out.stem + ".transform.npz"))
    if not args.quiet:
        print(f"{args.model}/{args.metric}: final loss {result.loss_history[-1]:.5f} after "
              f"{len(result.loss_history)} evaluations in {result.seconds:.2f} s on "
              f"{result.device}")
        print(f"wrote {out}")
        print(f"wrote {tpath}")
    return 0
