"""Reading and writing image files for the command line.

Reading returns a 2-D or 3-D grey image as NumPy, in the file's own dtype. Color images
(RGB, RGBA) are converted to luminance ``0.2125 R + 0.7154 G + 0.0721 B`` in the file's
value scale, grey+alpha images keep their grey channel; each conversion appends a note for
the user. Files the package cannot read, empty arrays, non-numeric data and images with
several channels are refused with an :class:`ImageFileError` that names the argument and
the path.

Writing is atomic (a temporary file in the same folder, then a rename), refuses to write
over any input file (whatever the spelling of the path) and replaces an existing file only
when asked. Output dtypes are never changed silently: a PNG holds 8- or 16-bit integers,
so float data must be written as TIFF or NPY, or converted by an explicit dtype.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pathlib
import tempfile
import warnings

import numpy as np

from . import atomic

READ_SUFFIXES = (".tif", ".tiff", ".png", ".jpg", ".jpeg", ".npy")
WRITE_SUFFIXES = (".tif", ".tiff", ".png", ".npy")
#: luminance weights of R, G, B (ITU-R BT.709, scikit-image's rgb2gray)
LUMINANCE = (0.2125, 0.7154, 0.0721)


class ImageFileError(ValueError):
    """A file that cannot be read or written as asked; the message names it."""


def _describe(what: str, path: pathlib.Path) -> str:
    return f"{what}: {str(path)!r}"


def read_image(path, *, what: str = "image", notes: list | None = None) -> np.ndarray:
    """Read a 2-D or 3-D grey image from a TIFF, PNG, JPEG or NPY file.

    Parameters
    ----------
    path : str or path-like
    what : str
        The argument's name, for messages ("fixed", "moving", "--mask").
    notes : list, optional
        Conversions made (color to luminance, alpha dropped) are appended as sentences.

    Returns
    -------
    ndarray, 2-D or 3-D, in the file's dtype (luminance of an integer color image is
    rounded back to that integer type).
    """
    path = pathlib.Path(path)
    where = _describe(what, path)
    if not path.exists():
        raise ImageFileError(f"{where} does not exist")
    if path.is_dir():
        raise ImageFileError(
            f"{where} is a directory, expected an image file ({', '.join(READ_SUFFIXES)})"
        )
    suffix = path.suffix.lower()
    if suffix not in READ_SUFFIXES:
        raise ImageFileError(
            f"{where} has an unsupported type {suffix or '(no suffix)'!r}; "
            f"expected one of {', '.join(READ_SUFFIXES)}"
        )
    try:
        if suffix == ".npy":
            image, samples = _read_npy(path, where), False
            # as _check_grey reads it: axes of one dropped from a 4-D or 5-D array
            shape = tuple(n for n in image.shape if n != 1) if image.ndim > 3 else image.shape
            if len(shape) == 3:  # a (Y, X, 3) color array, or a thin volume
                refuse_color_last_axis(shape, where, spatial=3)
        elif suffix in (".tif", ".tiff"):
            image, samples = _read_tiff(path, where)
        else:
            from skimage import io

            image = np.asarray(io.imread(path))
            samples = image.ndim == 3 and image.shape[-1] in (2, 3, 4)
    except ImageFileError:
        raise
    except Exception as exc:  # a corrupt or foreign file: say which, not a traceback
        reason = " ".join(str(exc).split()).split(". ")[0][:160]
        raise ImageFileError(
            f"{where} could not be read as {suffix[1:].upper()} ({type(exc).__name__}: {reason})"
        ) from exc
    if samples:
        image = _to_grey(image, where, notes)
    return _check_grey(image, where)


def refuse_too_big(shape, dtype, where: str) -> None:
    """Refuse, before it is read, an image that would not fit the memory budget as floats
    (what registering it holds, several times over): a 24 GiB ``.npy`` was read whole,
    and could take the machine's memory, before anything said it was too big. The budget
    is :func:`~.budget.memory_budget`'s (``SIMWARP_MEMORY_BUDGET``, else half the free
    RAM), as for the dask and zarr arrays that ``register`` reads itself."""
    from . import budget as _budget

    need = int(np.prod(shape, dtype=np.float64)) * (8 if np.dtype(dtype) == np.float64 else 4)
    try:
        _budget.refuse(
            need,
            _budget.memory_budget(),
            what=f"reading {where} (shape {tuple(int(n) for n in shape)}) as floats",
            advice="crop or downsample it (a pair is registered in memory)",
        )
    except MemoryError as exc:  # an ImageFileError: read_image wraps any other error
        raise ImageFileError(str(exc)) from None


def _read_npy(path: pathlib.Path, where: str) -> np.ndarray:
    """A ``.npy`` file read into memory after its size is checked against the memory
    budget (its header, memory-mapped, says the shape without reading the data)."""
    try:
        mapped = load_npy(path, mmap_mode="r")
    except ValueError as exc:
        if "memory-mapped" not in str(exc):  # object arrays: np.load says why below
            raise
        return load_npy(path)
    refuse_too_big(mapped.shape, mapped.dtype, where)
    return np.array(mapped)  # a copy in memory: the file may change once read


def load_npy(path: pathlib.Path, mmap_mode=None) -> np.ndarray:
    """A NumPy ``.npy`` array (memory-mapped with ``mmap_mode="r"``), never unpickled.

    A file without NumPy's magic string is a ValueError saying so: ``np.load`` would
    take it for a pickle and blame "pickled (object) data"; so is a file shorter than its
    header says (an interrupted copy: np.load blamed "mmap length" or a reshape).
    """
    with open(path, "rb") as f:
        head = f.read(6)
        if head != b"\x93NUMPY":
            raise ValueError("not a NumPy .npy file (it does not start with NumPy's magic string)")
        f.seek(0)
        fmt = np.lib.format
        try:
            read_header = {
                (1, 0): fmt.read_array_header_1_0,
                (2, 0): fmt.read_array_header_2_0,
            }.get(fmt.read_magic(f))
            shape, _, dtype = read_header(f) if read_header else (None, None, None)
        except ValueError:
            shape = None  # a header np.load will describe itself
        if shape is not None and not dtype.hasobject:
            need = f.tell() + int(np.prod(shape, dtype=np.float64)) * dtype.itemsize
            size = os.fstat(f.fileno()).st_size
            if size < need:
                raise ValueError(
                    f"truncated: its header says shape {tuple(shape)} of {dtype}, {need} "
                    f"bytes with the header, but the file has {size} (an interrupted copy "
                    "or write?)"
                )
    return np.load(path, mmap_mode=mmap_mode, allow_pickle=False)


@contextlib.contextmanager
def _quiet_tifffile():
    """tifffile's own log lines silenced (it logs "invalid page offset" for a truncated
    file on stderr): the error raised here says what is wrong, once, naming the argument."""
    log = logging.getLogger("tifffile")
    level = log.level
    log.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        log.setLevel(level)


def check_tiff_complete(tif, path, where: str) -> None:
    """Refuse a TIFF whose first image series is missing or whose pixels run past the end
    of the file (an interrupted copy or write), before anything is read or registered.

    ``tif``: an open ``tifffile.TiffFile``. tifffile itself would fail later, mid-run,
    with a message naming neither the file nor the cause ("corrupted strip cannot be
    reshaped"), or read the missing frames of a stack as garbage.
    """
    if not tif.series:
        raise ImageFileError(f"{where} holds no image")
    series = tif.series[0]
    ends = []
    if series.dataoffset is not None:
        # contiguous pixels (tifffile's and ImageJ's default): the series' extent is known
        # without loading every page (a long stack's first page may be all there is)
        ends.append(int(series.dataoffset) + int(series.nbytes))
    else:
        for page in series.pages:
            if page is None or getattr(page, "parent", tif) is not tif:  # in another file
                continue
            for offset, count in zip(
                getattr(page, "dataoffsets", ()), getattr(page, "databytecounts", ())
            ):
                if count:
                    ends.append(int(offset) + int(count))
    size = os.path.getsize(path)
    end = max(ends, default=0)
    if end > size:
        raise ImageFileError(
            f"{where} is truncated: its image data runs to byte {end}, but the file has "
            f"{size} bytes (an interrupted copy or write?); copy or export it again"
        )


#: how to give :func:`read_image` a color image it can convert
COLOR_ADVICE = (
    "save the image as grey (e.g. skimage.color.rgb2gray) or as an RGB .tif or .png, "
    "which is converted to luminance"
)


def refuse_color_last_axis(
    shape: tuple, where: str, *, spatial: int, advice: str = COLOR_ADVICE
) -> None:
    """Refuse an array without axis labels (``.npy``) whose last axis looks like the
    samples of a color pixel: 2 to 4 entries under ``spatial`` axes of 8 or more.

    ``shape``: the array's shape; ``spatial``: how many of its trailing axes are read as
    (z,) y, x (2 or 3); ``advice``: what the user can do instead. Read as an image, such
    an axis is only 2 to 4 pixels wide: a ``(Y, X, 3)`` RGB array would be registered as
    a thin 3-D volume, silently wrong.
    """
    if len(shape) < 2 or spatial < 2 or not 2 <= shape[-1] <= 4:
        return
    if min(shape[len(shape) - spatial : -1]) < 8:
        return
    kind = "a stack" if len(shape) > spatial else "an image"
    raise ImageFileError(
        f"{where} has shape {tuple(shape)}: read as {kind} "
        f"it is only {shape[-1]} pixels along x, its last axis; if that axis holds the "
        f"color samples of each pixel (RGB, RGBA), {advice}"
    )


def _read_tiff(path: pathlib.Path, where: str):
    """``(array, has_samples)``: the first series of a TIFF, and whether its last axis holds
    the samples of a color (or grey+alpha) pixel."""
    import tifffile

    with _quiet_tifffile(), tifffile.TiffFile(path) as tif:
        check_tiff_complete(tif, path, where)
        series = tif.series[0]
        axes = series.axes
        refuse_too_big(series.shape, series.dtype, where)
        image = series.asarray()
    if "C" in axes and image.shape[axes.index("C")] > 1:
        raise ImageFileError(
            f"{where} has {image.shape[axes.index('C')]} channels (axes "
            f"{axes!r}); register one channel at a time (save it as its "
            "own file)"
        )
    return image, axes.endswith("S") and image.shape[-1] in (2, 3, 4)


def _to_grey(image: np.ndarray, where: str, notes: list | None) -> np.ndarray:
    """Luminance of ``(..., 3|4)`` color or the grey channel of ``(..., 2)`` grey+alpha."""
    channels = image.shape[-1]
    if channels == 2:
        grey = image[..., 0]
        message = f"{where} is grey+alpha: the alpha channel was dropped"
    else:
        values = image[..., :3].astype(np.float64) @ np.asarray(LUMINANCE)
        if np.issubdtype(image.dtype, np.integer):
            info = np.iinfo(image.dtype)
            grey = np.clip(np.rint(values), info.min, info.max).astype(image.dtype)
        else:
            grey = values.astype(image.dtype)
        kind = "RGBA (alpha dropped)" if channels == 4 else "RGB"
        message = (
            f"{where} is {kind}: converted to luminance "
            f"{LUMINANCE[0]} R + {LUMINANCE[1]} G + {LUMINANCE[2]} B"
        )
    if notes is not None:
        notes.append(message)
    return grey


def _check_grey(image: np.ndarray, where: str) -> np.ndarray:
    if image.dtype == object or not (
        np.issubdtype(image.dtype, np.number) or image.dtype == np.bool_
    ):
        raise ImageFileError(f"{where} holds {image.dtype} data, expected numbers")
    if np.iscomplexobj(image):
        raise ImageFileError(f"{where} holds complex numbers, expected real ones")
    if image.size == 0:
        raise ImageFileError(f"{where} is empty (shape {image.shape})")
    squeezed = image.squeeze() if image.ndim > 3 else image
    if squeezed.ndim not in (2, 3):
        raise ImageFileError(f"{where} has shape {image.shape}; expected a 2-D or 3-D grey image")
    return squeezed


def _same_file(a: pathlib.Path, b: pathlib.Path) -> bool:
    try:
        return a.exists() and b.exists() and os.path.samefile(a, b)
    except OSError:
        return False


def check_target(path, *, what: str, inputs: dict, overwrite: bool = False) -> pathlib.Path:
    """Check, before any work, that a file may be written at ``path``; return it.

    Parameters
    ----------
    what : the argument's name ("-o"), for messages.
    inputs : ``{name: path}`` of the input files: the target may be none of them, through
        whatever spelling of the path (links, relative paths), even with ``overwrite``.
    overwrite : whether an existing file (never an input) may be replaced.

    Also refuses a name longer than the file system takes (255 bytes on most).
    """
    path = pathlib.Path(path)
    where = _describe(what, path)
    size, limit = len(os.fsencode(path.name)), atomic.name_max(path.parent)
    if size > limit:
        raise ImageFileError(
            f"{where}: the file name is {size} bytes, longer than the {limit} bytes its file "
            "system takes; choose a shorter name"
        )
    for name, source in inputs.items():
        if source is not None and (
            _same_file(path, pathlib.Path(source))
            or path.resolve() == pathlib.Path(source).resolve()
        ):
            # "the input file" for register-stack's one input, not "the input input file"
            role = "the input file" if name == "input" else f"the {name} input file"
            raise ImageFileError(
                f"{where} is {role}; input files are never written over: choose another output"
            )
    if path.is_dir():
        raise ImageFileError(f"{where} is a directory; give a file name")
    if path.exists() and not overwrite:
        raise ImageFileError(f"{where} exists; pass --overwrite to replace it")
    existing = path.parent
    while not existing.exists():
        existing = existing.parent
    try:  # the only sure test of a folder (permissions, read-only mounts, /proc): write in it
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as exc:
        raise ImageFileError(
            f"{where} cannot be written: {str(existing)!r} is not a writable "
            f"folder ({exc.strerror or exc})"
        ) from exc
    return path


def check_output_path(
    path, *, what: str, inputs: dict, overwrite: bool = False, dtype=None
) -> pathlib.Path:
    """:func:`check_target` for an image file, and its type against ``dtype``.

    The suffix must be one of :data:`WRITE_SUFFIXES`; a PNG holds 8- or 16-bit integers
    only, so ``dtype`` (the dtype that will be written) must be one of those for a PNG.
    """
    path = pathlib.Path(path)
    where = _describe(what, path)
    suffix = path.suffix.lower()
    if suffix not in WRITE_SUFFIXES:
        raise ImageFileError(
            f"{where} has an unsupported output type "
            f"{suffix or '(no suffix)'!r}; use one of "
            f"{', '.join(WRITE_SUFFIXES)}"
        )
    if dtype is not None and suffix == ".png" and np.dtype(dtype) not in (np.uint8, np.uint16):
        raise ImageFileError(
            f"{where}: PNG holds 8- or 16-bit integers, not {np.dtype(dtype)}; "
            "write .tif or .npy to keep the data as it is, or choose "
            "--dtype uint8 or uint16 (values are rounded and clipped)"
        )
    return check_target(path, what=what, inputs=inputs, overwrite=overwrite)


#: values rounded at a time by :func:`cast_note` (4 MiB of float64)
CAST_CHUNK = 1 << 19


def cast_note(image: np.ndarray, dtype) -> str | None:
    """What writing ``image`` as integer ``dtype`` loses, for the user, or None.

    The cast rounds and clips, never rescales (:func:`image_writer`): values outside the
    type's range are clipped, and float data spanning a few units (an image in [0, 1])
    rounds to a few grey levels. Either is said, with the figures, so that a nearly
    black or saturated output is not a surprise.
    """
    target = np.dtype(dtype)
    if not np.issubdtype(target, np.integer) or np.asarray(image).size == 0:
        return None
    values = np.asarray(image)
    info = np.iinfo(target)
    # rint is monotonic: the extremes' rounding says whether any value clips and how many
    # grey levels there are; the values are counted (a chunk at a time: no float64 copy
    # of the whole image, which had 4x its size at a peak) only when some clip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # an all-NaN image: said below
        low, high = (float(np.rint(np.float64(f(values)))) for f in (np.nanmin, np.nanmax))
    if np.isnan(low):
        return None  # all NaN: nothing rounds
    if low < info.min or high > info.max:
        flat, clipped = values.reshape(-1), 0
        buffer = np.empty(min(CAST_CHUNK, flat.size), np.float64)  # one, reused
        for begin in range(0, flat.size, CAST_CHUNK):
            chunk = flat[begin : begin + CAST_CHUNK]
            rounded = buffer[: chunk.size]
            np.rint(chunk, out=rounded, casting="unsafe")  # in float64 (an int64's rint too)
            clipped += int(np.count_nonzero(rounded < info.min))
            clipped += int(np.count_nonzero(rounded > info.max))
        return (
            f"{clipped} values ({100 * clipped / values.size:.1f}%) lie outside {target}'s "
            f"range [{info.min}, {info.max}] and are clipped to it"
        )
    levels = int(high - low) + 1
    if np.issubdtype(values.dtype, np.floating) and levels <= 16:
        return (
            f"the values span [{float(values.min()):.4g}, {float(values.max()):.4g}]: rounded "
            f"to {target} they take at most {levels} grey levels (nothing is rescaled); "
            "write a float image (.tif or .npy with --dtype float32) to keep them"
        )
    return None


def image_writer(path, image: np.ndarray, *, dtype=None):
    """A function that writes ``image`` as ``dtype`` (default: its own) to the path it is
    given, in the format of ``path``'s suffix (for
    :func:`napari_simwarp.io.atomic.write_together`, which writes it beside ``path``).

    Integer dtypes are reached by rounding and clipping to the type's range; nothing is
    rescaled.
    """
    out = np.asarray(image)
    if dtype is not None and np.dtype(dtype) != out.dtype:
        target = np.dtype(dtype)
        if np.issubdtype(target, np.integer):
            info = np.iinfo(target)
            out = np.clip(np.rint(out), info.min, info.max)
        out = out.astype(target)
    suffix = pathlib.Path(path).suffix.lower()

    def write(partial: pathlib.Path) -> None:
        if suffix == ".npy":
            with open(partial, "wb") as f:  # np.save(name) would add ".npy" to a name
                np.save(f, out)
        elif suffix in (".tif", ".tiff"):
            import tifffile

            tifffile.imwrite(partial, out)
        else:
            from skimage import io

            io.imsave(partial, out, check_contrast=False)

    return write


def write_image(path, image: np.ndarray, *, dtype=None) -> pathlib.Path:
    """Write ``image`` to ``path`` atomically (whole or not at all), as ``dtype`` (default:
    its own); see :func:`image_writer`. Call :func:`check_output_path` first: this
    function does not re-check.
    """
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return atomic.write_atomic(path, image_writer(path, image, dtype=dtype))
