"""Registration on the GPU against the same machine's CPU, on known ground truth (issue 24's
table; run by scripts/gpu_check.sh).

    python benchmarks/bench_gpu_register.py --markdown FILE   # on a GPU machine
    python benchmarks/bench_gpu_register.py --smoke           # tiny sizes, any device

Each case makes its pair (or stack) with a known transform, registers it with the
library's defaults on CUDA (one warm-up run, then the median of ``--repeat`` runs, timed
with a device synchronisation) and on the CPU with every core (one run; the CPU side of the
scale cases is left out: minutes, and no target asks for it), and reports both times, their
ratio and each side's error against the truth. Errors must agree between the devices: the
GPU run is the same maths.

Data are made on the host with SciPy (order-1 resampling for the volumes) so the truth does
not depend on the code under test.
"""

from __future__ import annotations

import argparse
import datetime
import os
import pathlib
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from scipy import ndimage as ndi

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

SECTION = "Registration on the GPU against the same machine's CPU"


@dataclass
class Case:
    """One registration: ``make()`` makes its data (inside the time box, only when the case
    runs) and returns ``run(device)``, which registers and gives the error against the
    truth."""

    name: str
    make: Callable[[], Callable[[str], float]]
    unit: str
    #: the CPU side runs too (the scale cases skip it)
    cpu: bool = True


def _scene(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """A textured float32 scene in [0, 1]: smooth structure at two scales and blobs."""
    coarse = ndi.gaussian_filter(rng.standard_normal(shape), min(shape) / 32)
    fine = ndi.gaussian_filter(rng.standard_normal(shape), 1.5)
    x = coarse / coarse.std() + 0.5 * fine / fine.std()
    return ((x - x.min()) / np.ptp(x)).astype(np.float32)


def _centered_affine(rng, shape, degrees=6.0, shift=6.0) -> np.ndarray:
    d = len(shape)
    q, _ = np.linalg.qr(rng.standard_normal((d, d)))
    q *= np.sign(np.linalg.det(q))
    angle = np.deg2rad(degrees)
    rot = np.eye(d)
    rot[:2, :2] = [[np.cos(angle), -np.sin(angle)], [np.sin(angle), np.cos(angle)]]
    linear = q @ rot @ q.T @ np.diag(rng.uniform(0.95, 1.05, d))
    c = (np.asarray(shape, float) - 1) / 2
    m = np.eye(d + 1)
    m[:d, :d] = linear
    m[:d, d] = c + rng.uniform(-shift, shift, d) - linear @ c
    return m


def _corner_error(m_est, m_true, shape) -> float:
    d = len(shape)
    corners = np.array(np.meshgrid(*[[0, n - 1] for n in shape], indexing="ij")).reshape(d, -1)
    h = np.vstack([corners, np.ones(corners.shape[1])])
    return float(np.linalg.norm((m_est @ h - m_true @ h)[:d], axis=0).mean())


def _affine_case(shape, seed=0) -> Callable[[str], float]:
    from napari_simwarp import register

    rng = np.random.default_rng(seed)
    m = _centered_affine(rng, shape)
    fixed = _scene(rng, shape)
    order = 3 if len(shape) == 2 else 1
    moving = ndi.affine_transform(fixed, np.linalg.inv(m), order=order, mode="nearest")

    def run(device: str) -> float:
        r = register(fixed, moving, model="affine", device=device)
        return _corner_error(r.transform.matrix, m, shape)

    return run


def _smooth_field(rng, shape, amplitude) -> np.ndarray:
    sigma = min(shape) / 8
    d = np.stack([ndi.gaussian_filter(rng.standard_normal(shape), sigma) for _ in shape])
    return (d * amplitude / np.linalg.norm(d, axis=0).max()).astype(np.float32)


def _deformable_case(shape, amplitude=4.0, seed=0) -> Callable[[str], float]:
    """``fixed(x) = moving(x + d(x))``, moving made through d's inverse (fixed point)."""
    from napari_simwarp import register

    rng = np.random.default_rng(seed)
    d = _smooth_field(rng, shape, amplitude)
    fixed = _scene(rng, shape)
    grid = np.indices(shape, dtype=np.float32)
    u = -d.copy()
    for _ in range(8):  # u(y) = -d(y + u(y)): the inverse field
        u = -np.stack([ndi.map_coordinates(c, grid + u, order=1, mode="nearest") for c in d])
    moving = ndi.map_coordinates(fixed, grid + u, order=1, mode="nearest")
    border = max(4, min(shape) // 32)
    inner = tuple(slice(border, n - border) for n in shape)

    def run(device: str) -> float:
        r = register(fixed, moving, model="deformable", device=device)
        est = r.transform.to_displacement(shape)
        return float(np.linalg.norm(est - d, axis=0)[inner].mean())

    return run


def _drift_case(frames, size, model, seed=0) -> Callable[[str], float]:
    from napari_simwarp import register_stack

    rng = np.random.default_rng(seed)
    pad = 10
    big = _scene(rng, (size + 2 * pad, size + 2 * pad))
    true = rng.uniform(-8, 8, (frames, 2))
    crop = (slice(pad, pad + size),) * 2
    stack = np.stack([ndi.shift(big, -s, order=1, mode="nearest")[crop] for s in true])
    truth = true[0] - true

    def run(device: str) -> float:
        r = register_stack(stack, model=model, device=device)
        return float(np.median(np.linalg.norm(np.asarray(r.shifts) - truth, axis=1)[1:]))

    return run


def cases(smoke: bool) -> list[Case]:
    if smoke:
        return [
            Case("2-D affine 64²", lambda: _affine_case((64, 64)), "corner px"),
            Case("2-D deformable 64²", lambda: _deformable_case((64, 64), 2.0), "EPE px"),
            Case("drift 4 × 64², translation", lambda: _drift_case(4, 64, "translation"), "px"),
        ]
    return [
        Case("2-D affine 512²", lambda: _affine_case((512, 512)), "corner px"),
        Case("2-D deformable 512² (~4 px)", lambda: _deformable_case((512, 512)), "EPE px"),
        Case("3-D affine 96³", lambda: _affine_case((96, 96, 96)), "corner px"),
        Case("3-D deformable 64³", lambda: _deformable_case((64, 64, 64), 3.0), "EPE px"),
        Case("drift 100 × 512², translation", lambda: _drift_case(100, 512, "translation"), "px"),
        Case("drift 100 × 512², rigid", lambda: _drift_case(100, 512, "rigid"), "px"),
        Case(
            "2-D deformable 2048²", lambda: _deformable_case((2048, 2048), 6.0), "EPE px", cpu=False
        ),
        Case("3-D deformable 192³", lambda: _deformable_case((192,) * 3, 4.0), "EPE px", cpu=False),
    ]


def _timed(run: Callable[[str], float], device: str, repeat: int) -> tuple[float, float]:
    """``(median seconds, error)`` of ``repeat`` runs after one warm-up on a GPU."""
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    if device == "cuda":
        run(device)
    times, error = [], float("nan")
    for _ in range(repeat):
        sync()
        start = time.perf_counter()
        error = run(device)
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times), error


def table(smoke: bool, repeat: int, deadline: float, emit: Callable[[str], None]) -> None:
    """The table, one row at a time: ``emit(markdown so far)`` after each, so a run cut
    short by its time box still leaves every row it finished."""
    gpu = "cuda" if torch.cuda.is_available() else None
    lines = [
        "| case | GPU s | CPU s | CPU ÷ GPU | error GPU | error CPU |",
        "|---|---:|---:|---:|---:|---:|",
    ]

    def fmt(v, spec):
        return "—" if v is None else format(v, spec)

    for case in cases(smoke):
        if time.monotonic() > deadline:
            lines.append(f"| {case.name} | not run: time box | | | | |")
            emit("\n".join(lines))
            continue
        g_time = g_err = c_time = c_err = None
        try:
            run = case.make()
            if gpu:
                g_time, g_err = _timed(run, gpu, repeat)
            if case.cpu or not gpu:
                c_time, c_err = _timed(run, "cpu", 1)
        except Exception as exc:  # one case's failure is a row, not the end of the table
            lines.append(f"| {case.name} | failed: {type(exc).__name__}: {exc} | | | | |")
            emit("\n".join(lines))
            continue
        ratio = c_time / g_time if g_time and c_time else None
        lines.append(
            f"| {case.name} | {fmt(g_time, '.3f')} | {fmt(c_time, '.3f')} | {fmt(ratio, '.1f')} "
            f"| {fmt(g_err, '.4f')} {case.unit} | {fmt(c_err, '.4f')} {case.unit} |"
        )
        print(lines[-1], flush=True)
        emit("\n".join(lines))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, any device")
    parser.add_argument("--repeat", type=int, default=3, help="GPU runs per case (median)")
    parser.add_argument("--budget", type=float, default=150.0, help="seconds; later cases skip")
    parser.add_argument("--markdown", help="write the section (heading and table) here")
    args = parser.parse_args(argv)
    torch.set_num_threads(os.cpu_count() or 1)
    deadline = time.monotonic() + args.budget
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"
    head = (
        f"## {SECTION}\n\n{datetime.date.today().isoformat()}, {gpu}, torch {torch.__version__}, "
        f"{os.cpu_count()} CPU cores (`benchmarks/bench_gpu_register.py`, run by "
        '`scripts/gpu_check.sh`): the library\'s defaults, device "cuda" (median of '
        f'{args.repeat} after a warm-up) against device "cpu" (one run), same machine.\n'
    )

    def emit(rows: str) -> None:
        if args.markdown:
            pathlib.Path(args.markdown).write_text(f"{head}\n{rows}\n")

    last = ["(no case finished)"]

    def keep(rows: str) -> None:
        last[0] = rows
        emit(rows)

    emit(last[0])
    try:
        table(args.smoke, args.repeat, deadline, keep)
        emit(last[0] + "\n\n" + batch_table(args.smoke, deadline))
    except KeyboardInterrupt:  # the GPU check's time box: the rows so far are written
        print("interrupted: the rows finished so far are kept", file=sys.stderr)
        return 1
    return 0


def batch_table(smoke: bool, deadline: float) -> str:
    """Issue 24's "many pairs at once": one batched register call against one call per
    pair, on the GPU (``benchmarks/bench_batch_pairs.py``), as far as the time box lets."""
    from bench_batch_pairs import HEADER, row

    device = "cuda" if torch.cuda.is_available() else "cpu"
    sizes = [("deformable", 2, 64)] if smoke else [("deformable", 16, 512), ("affine", 16, 512)]
    lines = ["### Many pairs at once (one batched call against one call per pair)", "", *HEADER]
    for model, n, size in sizes:
        if time.monotonic() > deadline:
            lines.append(f"| {n} × {size}² {model} | not run: time box | | | | | |")
            continue
        try:
            lines.append(row(model, n, size, device, 1))
        except Exception as exc:  # a failure is a row
            failure = f"failed: {type(exc).__name__}: {exc}"
            lines.append(f"| {n} × {size}² {model} | {failure} | | | | | |")
        print(lines[-1], flush=True)
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
