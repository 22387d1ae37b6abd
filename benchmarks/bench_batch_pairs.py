"""Many pairs at once: ``register`` on a batch of N pairs against N runs one after another
(issue 24), on known transforms; same process, same device.

    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/bench_batch_pairs.py            # CPU
    PYTHONPATH=src python benchmarks/bench_batch_pairs.py --device cuda --pairs 16 --size 512

Each pair has its own known transform (affine: a rotation, scaling and shift; deformable:
a smooth field of about 2 px), so the batch must find N different answers. Reported: the
wall time of the batch and of the N single runs (after one warm-up of each), their ratio,
the peak RSS growth of each, and the mean error against the truth of both (they must
agree: the batch is the same maths, pair by pair).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np
import torch
from scipy import ndimage as ndi

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _harness import peak_memory_mb

SECTION = "Many pairs at once: register on a batch against one run per pair (issue 24)"


def _scene(rng, shape) -> np.ndarray:
    coarse = ndi.gaussian_filter(rng.standard_normal(shape), min(shape) / 32)
    fine = ndi.gaussian_filter(rng.standard_normal(shape), 1.5)
    x = coarse / coarse.std() + 0.5 * fine / fine.std()
    return ((x - x.min()) / np.ptp(x)).astype(np.float32)


def _affine(rng, shape) -> np.ndarray:
    angle = np.deg2rad(rng.uniform(-6, 6))
    scale = rng.uniform(0.96, 1.04)
    lin = scale * np.array([[np.cos(angle), -np.sin(angle)], [np.sin(angle), np.cos(angle)]])
    c = (np.asarray(shape, float) - 1) / 2
    m = np.eye(3)
    m[:2, :2] = lin
    m[:2, 2] = c + rng.uniform(-5, 5, 2) - lin @ c
    return m


def _corners(m_est, m_true, shape) -> float:
    corners = np.array(np.meshgrid(*[[0, n - 1] for n in shape], indexing="ij")).reshape(2, -1)
    h = np.vstack([corners, np.ones(corners.shape[1])])
    return float(np.linalg.norm((m_est @ h - m_true @ h)[:2], axis=0).mean())


def make_pairs(model: str, n: int, size: int, seed: int = 0):
    """``(fixed list, moving list, error(result, i))`` of ``n`` pairs of ``size``²."""
    rng = np.random.default_rng(seed)
    shape = (size, size)
    fixed, moving, truths = [], [], []
    grid = np.indices(shape, dtype=np.float32)
    for _ in range(n):
        f = _scene(rng, shape)
        if model == "affine":
            m = _affine(rng, shape)
            mv = ndi.affine_transform(f, np.linalg.inv(m), order=3, mode="nearest")
        else:
            d = np.stack([ndi.gaussian_filter(rng.standard_normal(shape), size / 8) for _ in "yx"])
            m = (d * 2.0 / np.linalg.norm(d, axis=0).max()).astype(np.float32)
            u = -m.copy()
            for _ in range(8):  # the inverse field, u(y) = -d(y + u(y))
                u = -np.stack([ndi.map_coordinates(c, grid + u, order=1) for c in m])
            mv = ndi.map_coordinates(f, grid + u, order=1, mode="nearest")
        fixed.append(f)
        moving.append(mv.astype(np.float32))
        truths.append(m)
    inner = (slice(None),) + (slice(size // 16, -(size // 16)),) * 2

    def error(result, i) -> float:
        if model == "affine":
            return _corners(result.transform.matrix, truths[i], shape)
        est = result.transform.to_displacement(shape)
        return float(np.linalg.norm((est - truths[i])[inner], axis=0).mean())

    return fixed, moving, error


def measure(model: str, n: int, size: int, device: str, repeat: int = 1) -> dict:
    """Batch and one-by-one seconds (median of ``repeat`` after a warm-up), peak RSS
    growth and mean error of each."""
    from napari_simwarp import register

    fixed, moving, error = make_pairs(model, n, size)
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)

    def batch():
        return register(fixed, moving, model=model, device=device)

    def one_by_one():
        return [register(f, m, model=model, device=device) for f, m in zip(fixed, moving)]

    out = {}
    for name, fn in (("batch", batch), ("single", one_by_one)):
        results = fn()  # warm-up (and the errors)
        times = []
        for _ in range(repeat):
            sync()
            start = time.perf_counter()
            fn()
            sync()
            times.append(time.perf_counter() - start)
        out[name] = statistics.median(times)
        out[name + "_error"] = float(np.mean([error(r, i) for i, r in enumerate(results)]))
        out[name + "_mb"] = peak_memory_mb(fn) if device == "cpu" else None
    return out


def row(model: str, n: int, size: int, device: str, repeat: int) -> str:
    r = measure(model, n, size, device, repeat)
    unit = "corner px" if model == "affine" else "EPE px"

    def mb(v):
        return "—" if v is None else f"{v:.0f}"

    return (
        f"| {n} × {size}² {model} | {device} | {r['batch']:.3f} | {r['single']:.3f} | "
        f"{r['single'] / r['batch']:.2f} | {mb(r['batch_mb'])} / {mb(r['single_mb'])} | "
        f"{r['batch_error']:.4f} / {r['single_error']:.4f} {unit} |"
    )


HEADER = [
    "| pairs | device | batch s | one by one s | one by one ÷ batch | peak RSS MiB, batch "
    "/ one by one | error, batch / one by one |",
    "|---|---|---:|---:|---:|---:|---|",
]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--pairs", type=int, default=8)
    parser.add_argument("--size", type=int, default=0, help="default: 256 affine, 128 dense")
    parser.add_argument("--models", default="affine,deformable")
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args(argv)
    print("\n".join(HEADER))
    for model in args.models.split(","):
        size = args.size or (256 if model == "affine" else 128)
        print(row(model, args.pairs, size, args.device, args.repeat), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
