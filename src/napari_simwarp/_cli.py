"""The ``napari-simwarp`` command.

napari-simwarp demo                open napari with the sample data and the widgets
                                   docked (needs the napari extra and a display)
napari-simwarp demo --headless --out DIR
                                   no viewer: run the same pipeline on the sample data
                                   and write the maps, registrations, a summary and a
                                   picture into DIR
napari-simwarp build-kernels       build the compiled kernels now (else: on first use)
napari-simwarp info                which backend runs each op, and why
napari-simwarp register FIXED MOVING -o OUT
                                   register two image files (TIFF, PNG, NPY), write the
                                   warped image and the transform
napari-simwarp register-stack STACK -o OUT
                                   drift-correct a stack (TIFF, NPY, Zarr, OME-Zarr) into
                                   a TIFF, a .npy file or an OME-Zarr store (.zarr), with
                                   the per-frame transforms beside it; Zarr and OME-Zarr
                                   (and stacks larger than memory) need the large extra
"""

from __future__ import annotations

import argparse
import sys


def _add_demo(subparsers) -> None:
    p = subparsers.add_parser(
        "demo",
        help="open napari with the sample data and the widgets (or run headless)",
        description="Open napari with the bundled sample data and the Similarity map, "
        "Template matching and Register widgets docked. With --headless (or with no "
        "display), run the same pipeline without a viewer: local std, ZNCC template "
        "matching, local NCC and SSIM on the camera picture and a deformed copy, "
        "deformable registration of the pair and drift correction of a time-lapse; "
        "write the results (.npy), summary.json and demo.png into --out.",
    )
    p.add_argument("--out", default=None, help="output folder of --headless (default: out/demo)")
    p.add_argument(
        "--headless",
        action="store_true",
        help="no viewer: compute and write the results into --out",
    )
    p.add_argument("--device", default="auto", help="torch device: auto, cpu, cuda, mps")
    p.set_defaults(func=_run_demo)


def _has_display() -> bool:
    import os

    if sys.platform in ("darwin", "win32"):
        return True
    return bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))


def _napari_missing() -> bool:
    import importlib.util

    return importlib.util.find_spec("napari") is None


def _run_demo(args) -> int:
    from ._demo import run_headless_demo

    if not args.headless:
        if not _has_display():
            print("napari-simwarp demo: no display; running --headless instead", file=sys.stderr)
        elif _napari_missing():  # without importing napari: only _qt/ imports it
            print(
                "napari-simwarp demo: napari is not installed (pip install "
                "'napari-simwarp[all]'); running --headless instead",
                file=sys.stderr,
            )
        else:
            if args.out is not None:  # said only where the viewer does open
                print(
                    "napari-simwarp demo: --out is used with --headless; opening the viewer",
                    file=sys.stderr,
                )
            from ._qt._demo import run_gui_demo

            run_gui_demo(device=args.device)
            return 0
    from ._devices import resolve_device

    resolve_device(args.device)  # a bad --device before the folder is made
    out = _demo_folder(args.out or "out/demo")
    summary = run_headless_demo(out, device=args.device)
    for key, value in summary.items():
        print(f"{key}: {value}")
    return 0


def _demo_folder(out: str):
    """``--out`` checked and made: a folder (not a file) that can be created, where no file
    the demo writes (:data:`napari_simwarp._demo.OUTPUTS`) would replace one of the user's
    (files from an earlier demo run, marked by its summary.json, are replaced)."""
    import json
    import pathlib

    from ._demo import OUTPUTS

    path = pathlib.Path(out)
    if path.exists() and not path.is_dir():
        raise ValueError(f"--out: {out!r} is a file; expected a folder (made if missing)")
    if path.is_dir():
        taken = [name for name in OUTPUTS if (path / name).exists()]
        try:
            earlier = "template_cut_at" in json.loads((path / "summary.json").read_text())
        except (OSError, ValueError, TypeError):
            earlier = False
        if taken and not earlier:
            raise ValueError(
                f"--out: {out!r} holds {', '.join(taken)}, not from an earlier demo run, "
                "which the demo would replace; choose a new or empty folder"
            )
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(
            f"--out: cannot make the folder {out!r} ({exc.strerror or exc}); choose another"
        ) from None
    return path


def _add_build_kernels(subparsers) -> None:
    p = subparsers.add_parser(
        "build-kernels",
        help="build (or find cached) compiled kernels",
        description="Build the C++/CUDA kernels into the cache now, so "
        "that the first call of an op does not wait for the compiler.",
    )
    p.add_argument("--verbose", action="store_true", help="show the compiler's output")
    p.set_defaults(func=_run_build_kernels)


def _run_build_kernels(args) -> int:
    from .backend import build_kernels

    built = build_kernels(verbose=args.verbose)
    print(f"CPU kernels built in {built['cpu']}")
    print(f"CUDA kernels: {built['cuda']}")
    return 0


def _add_info(subparsers) -> None:
    p = subparsers.add_parser(
        "info",
        help="which backend runs each op, and why",
        description="Say which GPU and torch build this environment has, whether the "
        "compiled kernels are built (and for which devices), and which backend (compiled "
        "kernels or pure torch) runs each op on each device, and why. Builds the CPU "
        "kernels first if they are not in the cache yet (SIMWARP_BACKEND=torch skips that).",
    )
    p.set_defaults(func=_run_info)


def machine_lines(info: dict) -> list[str]:
    """``info``'s first lines: torch (version, CUDA), the GPUs, and which kernels run
    (``info``: :func:`napari_simwarp.backend_info`'s answer)."""
    import torch

    cuda = torch.version.cuda
    lines = [f"torch: {torch.__version__} ({f'CUDA {cuda}' if cuda else 'no CUDA: a CPU build'})"]
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            major, minor = torch.cuda.get_device_capability(i)
            lines.append(
                f"GPU cuda:{i}: {torch.cuda.get_device_name(i)} (compute capability "
                f"{major}.{minor})"
            )
    else:
        why = "torch is a CPU build" if cuda is None else "torch finds no CUDA device"
        lines.append(f"GPU: none ({why})")
    build = info["build"]
    if info["requested"] == "torch":
        lines.append("kernels: none (SIMWARP_BACKEND=torch: the pure torch operators run)")
    elif not build["loaded"]:
        lines.append(f"kernels: none (the pure torch operators run): {build['error']}")
    else:
        lines.append("kernels: compiled CPU kernels")
        if build["cuda_kernels"]:
            compiled = [op for op, per in info["ops"].items() if per["cpu"][0] == "compiled"]
            on_gpu = [op for op in compiled if info["ops"][op]["cuda"][0] == "compiled"]
            lines.append(
                f"kernels: compiled CUDA kernels, {len(on_gpu)} of {len(compiled)} ops on "
                "the GPU (each after its self-check there; the table below says why)"
            )
        else:
            lines.append(f"kernels: no CUDA kernels ({build['cuda_error'] or 'not built'})")
    return lines


def _run_info(args) -> int:
    from .backend import backend_info

    info = backend_info()
    for line in machine_lines(info):
        print(line)
    print(f"requested backend: {info['requested']}")
    for key, value in info["build"].items():
        print(f"build {key}: {value}")
    for op, per_device in info["ops"].items():
        cells = "; ".join(f"{dev}: {b} ({why})" for dev, (b, why) in per_device.items())
        print(f"{op:24s} {cells}")
    return 0


class _Parser(argparse.ArgumentParser):
    """argparse, with a bad argument reported on one line (exit status 2)."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="napari-simwarp",
        description="Compare and align images: similarity maps, template matching, warps.",
    )
    subparsers = parser.add_subparsers(dest="command", required=True)
    _add_demo(subparsers)
    _add_build_kernels(subparsers)
    _add_info(subparsers)
    from .registration import cli as register_cli  # argparse only: imports no torch

    register_cli.add_parser(subparsers)
    register_cli.add_stack_parser(subparsers)
    return parser


def main(argv=None) -> int:
    """Run the command; returns its exit status (2 for a problem the user can fix)."""
    from ._extras import MissingExtraError

    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, TypeError, OSError, MemoryError, MissingExtraError) as exc:
        # Input problems are the user's to fix: one clear line, no traceback.
        message = _as_option(_one_line(exc), _options(parser, args.command))
        print(f"napari-simwarp {args.command}: error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:
        # a command that leaves something behind says what (register-stack: a partial
        # store that a rerun resumes); the others write whole outputs or none
        note = str(exc) or "interrupted; no output was written"
        print(f"napari-simwarp {args.command}: {note}", file=sys.stderr)
        return 130


def _options(parser: argparse.ArgumentParser, command: str) -> dict[str, str]:
    """``{dest: "--option"}`` of the subcommand ``command``'s options (``grid_spacing``:
    ``--grid-spacing``)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and command in action.choices:
            return {
                a.dest: max(a.option_strings, key=len)
                for a in action.choices[command]._actions
                if a.option_strings and a.dest != "help"
            }
    return {}


def _as_option(message: str, options: dict[str, str]) -> str:
    """``message`` with a leading keyword name of the library (``grid_spacing must be
    positive``, ``levels=50 shrinks``) written as the option the user typed
    (``--grid-spacing must be positive``): the checks are the library's, shared with
    scripts, but a command-line user knows the options."""
    for dest, option in options.items():
        for sep in (" ", "="):
            if message.startswith(dest + sep):
                return option + message[len(dest) :]
    return message


def _one_line(exc: BaseException) -> str:
    """The exception's message on one line (OSError: its strerror and file name)."""
    if isinstance(exc, OSError) and exc.strerror and exc.filename:
        return f"{exc.strerror}: {exc.filename!r}"
    text = " ".join(str(exc).split())
    return text or type(exc).__name__


if __name__ == "__main__":
    raise SystemExit(main())
