"""Files: reading and writing images for the command line, safely.

No Qt, no torch. :mod:`.images` reads 2-D and 3-D grey images from TIFF, PNG, JPEG and
NPY (color and alpha converted explicitly, with a note) and writes TIFF, PNG and NPY
atomically, never over an input and never over an existing file unless asked.
"""

from .images import (
    READ_SUFFIXES,
    WRITE_SUFFIXES,
    ImageFileError,
    check_output_path,
    check_target,
    read_image,
    write_image,
)

__all__ = [
    "READ_SUFFIXES",
    "WRITE_SUFFIXES",
    "ImageFileError",
    "check_output_path",
    "check_target",
    "read_image",
    "write_image",
]
