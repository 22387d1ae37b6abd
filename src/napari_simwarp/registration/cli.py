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

from .._extras import install_line, require

#: the extra that brings register-stack's optional packages (zarr, dask, ngff-zarr, distributed)
STACK_EXTRA = "large"

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


def batch_size_option(text: str):
    """``--batch-size``: "auto" or a positive int (argparse reports anything else)."""
    if text == "auto":
        return text
    try:
        value = int(text)
    except ValueError:
        value = 0
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

    def __init__(self, stream=None, every: float = 5.0):
        # sys.stderr when called (a default bound at import would keep a replaced stream)
        stream = sys.stderr if stream is None else stream
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
        "-o",
        "--out",
        required=True,
        help="output image file: .tif, .tiff, .png or .npy (a missing folder is created)",
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
    p.add_argument(
        "--metric",
        default=None,
        choices=METRICS,
        help="similarity (default: ncc for linear models, lncc for dense ones)",
    )
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
        help="dense models: smoothness weight (default 4 deformable, 0.5 with --metric ncc; "
        "0.2 diffeomorphic)",
    )
    p.add_argument("--mask", default=None, help="mask file for the fixed image (non-zero = use)")
    p.add_argument(
        "--landmarks",
        default=None,
        metavar="CSV",
        help="BigWarp landmark CSV (File > Export landmarks): its 'moving' columns are "
        "MOVING's points, its 'target' columns FIXED's, x,y[,z] in the physical units of "
        "the spacings (pixels by default); inactive rows are skipped. The run starts from "
        "their least-squares fit of --model (dense models: affine)",
    )
    p.add_argument(
        "--landmark-weight",
        type=float,
        default=0.0,
        help="keep the landmarks as a soft constraint of this weight (default 0: they only "
        "start the run)",
    )
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, mps")
    p.add_argument("--quiet", action="store_true", help="no progress display")
    p.set_defaults(func=run)
    return p


def _one_per_axis(values):
    """A single value applies to every axis."""
    return values[0] if values is not None and len(values) == 1 else values


def _read_landmarks(path):
    """``(fixed_points, moving_points)`` from a BigWarp CSV (array order), or None."""
    if path is None:
        return None
    from ..io.transform_files.bigwarp import read_bigwarp_landmarks

    if not pathlib.Path(path).is_file():  # the reader's own words are a transform file's
        what = "is a directory" if pathlib.Path(path).is_dir() else "does not exist"
        raise ValueError(f"--landmarks: {str(path)!r} {what}; expected a BigWarp landmark CSV")
    try:
        return read_bigwarp_landmarks(path)
    except ValueError as exc:  # not a BigWarp table: say which option it came from
        raise ValueError(f"--landmarks: {exc}") from None


def run(args) -> int:
    """Run the ``register`` subcommand from parsed ``args``; returns the exit status.

    Every file check (inputs readable, outputs writable and not inputs) happens before
    the registration starts, so a mistake costs no computation and writes nothing.
    """
    from ..io import check_output_path, check_target, read_image
    from ..io.atomic import write_together
    from ..io.images import cast_note, image_writer
    from .pair import register
    from .plan import RunOptions

    # the optimizer's options checked before any file is read (the grids, landmarks and
    # device are checked with the images)
    options = RunOptions.make(
        args.model,
        args.metric,
        levels=args.levels,
        iterations=args.iterations,
        lr=args.lr,
        window=args.window,
        grid_spacing=args.grid_spacing,
        regularization=args.regularization,
    )
    notes: list[str] = []
    fixed = read_image(args.fixed, what="fixed", notes=notes)
    moving = read_image(args.moving, what="moving", notes=notes)
    mask = read_image(args.mask, what="--mask", notes=notes) if args.mask else None
    landmarks = _read_landmarks(args.landmarks)
    dtype = moving.dtype if args.dtype == "same" else np.dtype(args.dtype)
    inputs = {
        "fixed": args.fixed,
        "moving": args.moving,
        "--mask": args.mask,
        "--landmarks": args.landmarks,
    }
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
            **options.kwargs(),
            mask=mask,
            fixed_spacing=_one_per_axis(args.fixed_spacing),
            fixed_origin=_one_per_axis(args.fixed_origin),
            moving_spacing=_one_per_axis(args.moving_spacing),
            moving_origin=_one_per_axis(args.moving_origin),
            landmarks=landmarks,
            landmark_weight=args.landmark_weight,
            device=args.device,
            callback=progress,
        )
    finally:
        if progress is not None:
            progress.close()
    # an integer --dtype rounds and clips (the moving file's own dtype loses nothing the
    # file had: interpolation stays within its values)
    lost = cast_note(result.warped, dtype) if args.dtype != "same" else None
    if lost:
        print(f"napari-simwarp register: note: --dtype {dtype}: {lost}", file=sys.stderr)
    # Both outputs or neither: written beside their targets, then renamed together (a
    # full disk or a Ctrl-C while writing the transform removes the image again).
    out.parent.mkdir(parents=True, exist_ok=True)
    write_together(
        [
            (out, image_writer(out, result.warped, dtype=dtype)),
            (transform_out, result.transform.npz_writer()),
        ]
    )
    if not args.quiet:
        if result.loss_history:
            loss = f"final loss {result.loss_history[-1]:.5f} after "
            loss += f"{len(result.loss_history)} evaluations"
        else:  # --iterations 0: the starting transform (identity, or the landmarks' fit)
            loss = "no iteration run (--iterations 0): the starting transform"
        print(
            f"{options.model}/{result.metric}: {loss} in {result.seconds:.2f} s on {result.device}"
        )
        print(f"wrote {out}")
        print(f"wrote {transform_out}")
    return 0


# -- napari-simwarp register-stack ----------------------------------------------------------


def _transforms_record(complete: pathlib.Path) -> dict:
    """What the ``complete`` mark of a transforms folder records (``key``, ``input``):
    {} when there is none, or one from an older version (a count of transforms)."""
    import json

    try:
        record = json.loads(complete.read_text())
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def _write_transforms(folder: pathlib.Path, transforms, record: dict) -> None:
    """The per-frame transforms in ``folder``, whole or not at all: written in a temporary
    folder beside it with the ``complete`` mark (``record``: the write's key and the
    input's identity), then renamed into place (an existing folder is replaced)."""
    import json
    import shutil

    from ..io.atomic import partial_path

    partial = partial_path(folder)
    if partial.exists():
        shutil.rmtree(partial)
    partial.mkdir(parents=True)
    try:
        for t, transform in enumerate(transforms):
            transform.save(partial / f"frame_{t:05d}.transform.npz")
        (partial / "complete").write_text(json.dumps({**record, "count": len(transforms)}))
        if folder.exists():
            shutil.rmtree(folder)
        partial.rename(folder)
    finally:
        if partial.exists():
            shutil.rmtree(partial, ignore_errors=True)


def _what_is_left(
    out: pathlib.Path, folder: pathlib.Path, to_file: bool = False, overwrite: bool = False
) -> str:
    """After an interrupt: what a ``register-stack`` run leaves, and how a rerun goes on.

    ``to_file``: the output is a TIFF or ``.npy`` file (written whole under a temporary
    name: an existing one is the earlier, intact result); ``overwrite``: the run was
    given ``--overwrite`` (a rerun with it starts over; without it, it resumes)."""
    rerun = "rerun without --overwrite" if overwrite else "rerun the same command"
    if out.exists() and not to_file:
        return (
            f"interrupted; {str(out)!r} holds a partial store (marked complete: false; its "
            f"missing blocks read as zeros) and {str(folder)!r} the transforms: {rerun} to "
            "resume the write (or pass --overwrite to start over)"
        )
    if folder.exists():
        kept = f" ({str(out)!r} is the earlier result, untouched)" if out.exists() else ""
        return (
            f"interrupted; {str(folder)!r} holds the transforms{kept}: {rerun} to write the "
            "aligned stack from them"
        )
    return "interrupted; no output was written"


def stack_transforms_path(out) -> pathlib.Path:
    """Where the per-frame transforms of output store ``out`` go: ``OUT.transforms/``."""
    out = pathlib.Path(out)
    return out.with_name(out.name + ".transforms")


#: ``register-stack --help``: which inputs and outputs need which optional packages
STACK_EXTRAS_HELP = (
    "Optional packages: a .tif/.tiff or .npy stack in and a .tif/.tiff or .npy file out "
    "need none (the input is memory-mapped, or read whole when compressed; the aligned "
    "stack is held in memory). A Zarr or OME-Zarr input, an OME-Zarr output (.zarr) and "
    "--scheduler need zarr, dask and ngff-zarr (and distributed): "
    f"{install_line(STACK_EXTRA)}. With them installed, TIFF and .npy inputs are read "
    "frame by frame too and the aligned stack is computed lazily, so a stack may be "
    "larger than memory."
)


def add_stack_parser(subparsers) -> argparse.ArgumentParser:
    """Add the ``register-stack`` subcommand to an argparse ``subparsers`` object."""
    from ._names import METRICS, MODELS

    p = subparsers.add_parser(
        "register-stack",
        help="drift-correct a stack (TIFF, NPY, Zarr, OME-Zarr) into an OME-Zarr store, "
        "a TIFF or a .npy file",
        description="Align every frame of a (T, Y, X) or (T, Z, Y, X) stack to a reference "
        "and write the aligned stack to OUT and the per-frame transforms beside it, in "
        "OUT.transforms/. OUT is an OME-Zarr store (a folder, .zarr: multiscale, chunked, "
        "compressed, with the input's pixel sizes; an interrupted run rerun with the same "
        "arguments resumes the write), or a .tif/.tiff or .npy file (written frame by frame). "
        "Inputs are never written over; existing outputs are replaced only with --overwrite.",
        epilog=STACK_EXTRAS_HELP,
    )
    p.add_argument(
        "input",
        help="stack: .tif/.tiff, .npy, a Zarr array or an OME-Zarr image (.zarr, needs the "
        "large extra)",
    )
    p.add_argument(
        "-o",
        "--out",
        required=True,
        help="output: an OME-Zarr store (.zarr, a folder; needs the large extra), or a "
        ".tif, .tiff or .npy file (a missing parent folder is created)",
    )
    p.add_argument("--overwrite", action="store_true", help="replace OUT and its transforms")
    p.add_argument(
        "--reference",
        default="first",
        help="first, previous, mean or a frame index (negative counts from the end: -1 is "
        "the last frame)",
    )
    p.add_argument("--model", default="translation", choices=MODELS)
    p.add_argument(
        "--metric",
        default=None,
        choices=METRICS,
        help="similarity of models other than translation (default: ncc for linear "
        "models, lncc for dense ones)",
    )
    p.add_argument(
        "--spacing",
        type=per_axis_option,
        default=None,
        metavar="S[,S...]",
        help="pixel size of the frames, one value or one per spatial axis in array order "
        "(z,y,x); default: the OME-Zarr input's pixel size, else 1. Rigid and similarity "
        "then stay rigid in these physical units, however anisotropic the voxels",
    )
    p.add_argument(
        "--origin",
        type=per_axis_option,
        default=None,
        metavar="O[,O...]",
        help="physical position of the frames' first pixel (default 0, or the OME-Zarr input's)",
    )
    p.add_argument(
        "--batch-size",
        default="auto",
        type=batch_size_option,
        help="frames per batch: auto or a positive int (default: auto)",
    )
    p.add_argument("--memory-budget", default=None, help="e.g. 2GiB (default: half the free RAM)")
    p.add_argument(
        "--dtype",
        default="same",
        choices=("same", *OUTPUT_DTYPES),
        help="dtype of OUT (default: the input's; integers are rounded and clipped)",
    )
    p.add_argument(
        "--scheduler",
        default=None,
        help="dask.distributed scheduler address (needs the large extra)",
    )
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, mps")
    p.add_argument("--quiet", action="store_true", help="no progress display")
    p.set_defaults(func=run_stack)
    return p


def _reference_option(text: str):
    if text in ("first", "previous", "mean"):
        return text
    try:
        return int(text)
    except ValueError:
        raise ValueError(
            f"--reference must be first, previous, mean or a frame index, got {text!r}"
        ) from None


def _open_tiff(path):
    """A TIFF file's full-resolution image as tifffile's Zarr view (nothing read yet)."""
    import tifffile
    import zarr

    data = zarr.open(tifffile.imread(path, aszarr=True), mode="r")
    return data if hasattr(data, "shape") else data["0"]  # multiscale: full resolution


def _open_npy(path):
    """A ``.npy`` file memory-mapped."""
    from ..io.images import load_npy

    return load_npy(path, mmap_mode="r")


def _frames_by_path(path, opener):
    """The file as a dask array of one chunk per frame, read by path
    (:class:`~napari_simwarp.io.lazy.ReopenedArray`): frames are read as needed, here or
    on the workers of a ``--scheduler``."""
    import dask.array as da

    from ..io.lazy import ReopenedArray

    array = ReopenedArray(path, opener)
    return da.from_array(array, chunks=(1, *array.shape[1:]))


#: optional modules behind a stack read frame by frame, and behind OME-Zarr stores
LAZY_MODULES = ["zarr", "dask.array"]
OME_ZARR_MODULES = ["zarr", "dask.array", "ngff_zarr"]


def _is_zarr_path(path: pathlib.Path) -> bool:
    """Whether ``path`` names a Zarr array or group (by its suffix or its metadata files)."""
    return path.suffix.lower() == ".zarr" or (
        path.is_dir() and any((path / n).exists() for n in (".zgroup", "zarr.json", ".zarray"))
    )


def check_stack_output_type(out) -> None:
    """``-o``: an OME-Zarr store (``.zarr`` or a folder name with no suffix), or a
    ``.tif``, ``.tiff`` or ``.npy`` file; anything else is refused before any work."""
    from ..io import ImageFileError
    from ..io.stack_files import FILE_SUFFIXES

    suffix = pathlib.Path(out).suffix.lower()
    if suffix not in (*FILE_SUFFIXES, ".zarr", ""):
        raise ImageFileError(
            f"-o: {str(out)!r} has an unsupported output type {suffix!r}; use .zarr (an "
            f"OME-Zarr store) or one of {', '.join(FILE_SUFFIXES)}"
        )


def stack_needs(args) -> dict[str, list[str]]:
    """The optional modules ``register-stack`` will import for ``args``, by what they are
    for (``{purpose: modules}``, for :func:`napari_simwarp._extras.require`); empty for a
    TIFF or ``.npy`` stack in and a TIFF or ``.npy`` file out."""
    from ..io.stack_files import is_stack_file

    needs = {}
    if _is_zarr_path(pathlib.Path(args.input)):
        needs[f"reading a Zarr or OME-Zarr input ({args.input})"] = OME_ZARR_MODULES
    if not is_stack_file(args.out):
        needs[f"writing an OME-Zarr store (-o {args.out})"] = OME_ZARR_MODULES
    if args.scheduler:
        needs["running on a dask.distributed cluster (--scheduler)"] = [
            "distributed",
            *LAZY_MODULES,
        ]
    return needs


def open_stack(path, *, lazy=None, memory_budget=None):
    """``(data, axes, pixel_size, origin)``: a stack file opened (nothing read yet but
    for a compressed TIFF in memory); the spatial pixel size and origin are None unless
    the file is an OME-Zarr image.

    TIFF, NumPy ``.npy``, a Zarr array, or an OME-Zarr image (level 0). With ``lazy``
    (default: when zarr and dask import), TIFF and ``.npy`` files are read frame by
    frame as a dask array (TIFF through tifffile's Zarr view); without, as NumPy (a
    memory map, or a compressed TIFF read whole after a check against
    ``memory_budget``): the base install's way, which needs neither.
    Raises an ImageFileError naming the input for anything else.
    """
    from .._extras import missing
    from ..io import ImageFileError
    from ..io.images import load_npy
    from ..io.omezarr import read_ome_zarr
    from ..io.stack_files import check_stack_shape, check_tiff_stack, open_tiff_in_memory

    path = pathlib.Path(path)
    where = f"input: {str(path)!r}"
    if not path.exists():
        raise ImageFileError(f"{where} does not exist")
    if lazy is None:
        lazy = not missing(LAZY_MODULES)
    labelled = False  # whether the file says which axis is which (TIFF: tifffile's axes)
    try:
        if path.suffix.lower() in (".tif", ".tiff"):
            # truncated, or color: refused up front; a last axis tifffile calls X is x
            labelled = check_tiff_stack(path, where=where).endswith("X")
            if lazy:
                data, pixel_size = _frames_by_path(path, _open_tiff), None
            else:
                data = open_tiff_in_memory(path, where=where, memory_budget=memory_budget)
                pixel_size = None
        elif _is_zarr_path(path) and path.is_dir():
            import zarr

            node = zarr.open(str(path), mode="r")
            if hasattr(node, "shape"):
                data, pixel_size = node, None
            else:
                return tuple(read_ome_zarr(path))
        elif path.suffix.lower() == ".npy":
            array = load_npy(path, mmap_mode="r")  # checked here (a clear error)
            data = _frames_by_path(path, _open_npy) if lazy else array  # lazy: read by path
            pixel_size = None
        else:
            raise ImageFileError(
                f"{where} is not a TIFF file, a NumPy .npy file, a Zarr array or an OME-Zarr image"
            )
    except (ImageFileError, MemoryError):
        raise
    except Exception as exc:
        reason = " ".join(str(exc).split())[:160]
        raise ImageFileError(
            f"{where} could not be opened ({type(exc).__name__}: {reason})"
        ) from exc
    check_stack_shape(data.shape, where=where, labelled=labelled)
    return data, "tyx" if len(data.shape) == 3 else "tzyx", pixel_size, None


def _stack_progress(stream=None, every: float = 5.0):
    """``(on_frames(StackProgress), on_blocks(done, total))``: a progress bar of the
    registration (frames reached) and of the write (blocks stored) on ``stream`` (default:
    ``sys.stderr`` when called, not when this module was imported)."""
    stream = sys.stderr if stream is None else stream
    terminal = stream.isatty()
    last = [0.0]

    def show(text, force=False):
        if terminal:
            stream.write(f"\r  {text}   ")
            stream.flush()
        elif force or time.monotonic() - last[0] >= every:
            last[0] = time.monotonic()
            stream.write(f"  {text}\n")
            stream.flush()

    def bar(done, total, width=30):
        filled = int(width * done / max(total, 1))
        return "[" + "#" * filled + "." * (width - filled) + f"] {done}/{total}"

    def on_frames(progress, total=[0]):  # noqa: B006 (the highest frame reached so far)
        total[0] = max(total[0], progress.frames.stop)
        show(f"aligning frames {progress.frames.start}:{progress.frames.stop}")
        return False

    def on_blocks(done, total):
        show(f"writing {bar(done, total)}", force=done == total)

    return on_frames, on_blocks


def run_stack(args) -> int:
    """Run ``register-stack`` from parsed ``args``; returns the exit status.

    Every check (optional packages installed, input readable, output writable and not
    an input, options) is made before the registration starts.
    """
    import json

    from ..io import budget as _budget
    from ..io import check_target, lazy
    from ..io.identity import describe, input_identity
    from ..io.omezarr import check_store, write_key, write_ome_zarr
    from ..io.stack_files import check_stack_output, is_stack_file, write_stack
    from .grid import Grid
    from .plan import RunOptions
    from .stack import register_stack, warped_stack
    from .transforms import load_transform

    check_stack_output_type(args.out)
    require(stack_needs(args))  # every optional package, before anything is read
    run_options = RunOptions.make(args.model, args.metric)
    to_file = is_stack_file(args.out)
    data, axes, pixel_size, stored_origin = open_stack(args.input, memory_budget=args.memory_budget)
    # The pixel size and origin: --spacing and --origin, else the OME-Zarr input's own
    # (None for TIFF and Zarr). The aligned frames lie on the reference's grid, so the
    # output store carries the same.
    from_metadata = args.spacing is None and pixel_size is not None
    spacing = _one_per_axis(args.spacing) if args.spacing is not None else pixel_size
    origin = _one_per_axis(args.origin) if args.origin is not None else stored_origin
    grid = Grid.make(len(data.shape) - 1, spacing, origin)  # checked before any work
    if args.spacing is not None:  # the output store carries the pixel size given
        pixel_size = list(grid.spacing)
    reference = _reference_option(args.reference)
    batch = args.batch_size
    if args.memory_budget is not None:
        _budget.parse_bytes(args.memory_budget, "--memory-budget")
    dtype = np.dtype(data.dtype) if args.dtype == "same" else np.dtype(args.dtype)
    out = pathlib.Path(args.out)
    inputs = {"input": args.input}
    shape = tuple(data.shape)
    block = (1, *shape[1:])
    # The input's identity (size, time, a sample of its frames), not only its path: a
    # rerun after the input was replaced must not resume from the old one's transforms
    # and blocks.
    identity = input_identity(args.input, data)
    options = dict(
        reference=reference,
        model=run_options.model,
        metric=run_options.metric,
        input=str(pathlib.Path(args.input).resolve()),
        spacing=spacing,
        origin=origin,
        identity=identity,
    )
    key = write_key(
        shape,
        dtype,
        axes,
        block,
        "auto",
        pixel_size or [1.0] * (len(shape) - 1),
        None,
        "image",
        False,
        json.dumps(options),
        list(grid.origin),
    )
    named = {"name": f"input {str(args.input)!r}", "identity": identity}
    if to_file:
        check_stack_output(out, what="-o", inputs=inputs, overwrite=args.overwrite)
        state = "new"
    else:
        state = check_store(out, key=key, inputs=inputs, overwrite=args.overwrite, identity=named)
    folder = stack_transforms_path(out)
    complete = folder / "complete"
    held = _transforms_record(complete)
    # the transforms of an interrupted run, from this input with these options: reused
    resume = not args.overwrite and state in ("new", "resume") and held.get("key") == key
    if not resume:
        from ..io import ImageFileError

        if not folder.exists():
            check_target(folder, what="the transforms folder", inputs=inputs, overwrite=True)
        elif not folder.is_dir():
            raise ImageFileError(
                f"the transforms folder: {str(folder)!r} is a file; move it or choose another -o"
            )
        elif not (args.overwrite or state == "resume"):
            if isinstance(held.get("input"), dict) and held["input"] != identity:
                raise ImageFileError(
                    f"the transforms folder: {str(folder)!r} holds the transforms of an "
                    f"interrupted run, but {describe(held['input'], identity, named['name'])}; "
                    "pass --overwrite to start again from the new input"
                )
            raise ImageFileError(
                f"the transforms folder: {str(folder)!r} exists; pass --overwrite to replace it"
            )
    client = None
    if args.scheduler:
        from distributed import Client

        try:
            client = Client(args.scheduler)
        except OSError as exc:  # TimeoutError, refused: the address is the user's to fix
            raise ValueError(
                f"--scheduler: could not connect to {args.scheduler!r} ({exc}); start the "
                "dask scheduler there, or leave --scheduler out to run here"
            ) from None
    on_frames, on_blocks = _stack_progress()
    if from_metadata and not args.quiet:
        print(
            f"pixel size {tuple(pixel_size)} and origin {tuple(grid.origin)} (array order) "
            f"read from the OME-Zarr metadata of {args.input}; --spacing and --origin "
            "override them"
        )
    try:
        if resume:
            files = sorted(folder.glob("frame_*.transform.npz"))
            transforms = [load_transform(f) for f in files]
            from .._devices import resolve_device

            warped = warped_stack(data, transforms, resolve_device(args.device))
            if not args.quiet:
                print(f"resuming the write of {out} ({len(transforms)} transforms read)")
        else:
            result = register_stack(
                data,
                reference=reference,
                **run_options.kwargs(stack=True),
                spacing=spacing,
                origin=origin,
                batch_size=batch,
                device=args.device,
                memory_budget=args.memory_budget,
                callback=None if args.quiet else on_frames,
            )
            transforms, warped = result.transforms, result.warped
            _write_transforms(folder, transforms, {"key": key, "input": identity})
        if to_file:
            write_stack(out, warped, dtype=dtype, progress=None if args.quiet else on_blocks)
        else:
            write_ome_zarr(
                out,
                warped,
                axes=axes,
                pixel_size=pixel_size,
                origin=grid.origin,
                chunks=block,
                dtype=dtype,
                overwrite=args.overwrite and not resume,
                inputs=inputs,
                key_extra=json.dumps(options),
                progress=None if args.quiet else on_blocks,
                memory_budget=args.memory_budget,
                identity=named,
            )
    except MemoryError as exc:
        if lazy.is_lazy(data):
            raise
        # in memory for want of zarr and dask: say that the large extra lifts that
        raise MemoryError(
            f"{exc}; {install_line(STACK_EXTRA)} lets the command read TIFF and .npy "
            "stacks frame by frame and hold no aligned stack in memory"
        ) from None
    except KeyboardInterrupt:
        raise KeyboardInterrupt(_what_is_left(out, folder, to_file, args.overwrite)) from None
    finally:
        if client is not None:
            client.close()
    if not args.quiet:
        sys.stderr.write("\n")
        print(f"wrote {out}")
        print(f"wrote {folder}/ ({len(transforms)} transforms)")
    return 0
