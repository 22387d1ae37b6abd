"""What a GPU would pay per iteration: aten ops and host syncs of the registration loop
(issue 24), counted on any machine with ``tests/_dispatch_count.py``.

A GPU runs these registrations bound by latency (/work/shared/GPU.md): each aten op is a
kernel launch of 4-6 µs of host time, each host sync tens of µs and a drained queue. This
counts, for each case, the whole run (ops, syncs, iterations: ``len(loss_history)``) and
one iteration of the finest level: the ops between the first and the last progress
snapshot of that level over the iterations between them (the level's set-up and its end
left out). Also the error against the known transform, and the wall time on this CPU.

    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/bench_dispatch.py [--time]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))  # the repository root: tests/_dispatch_count.py

from bench_quality import affine_matrix, dense_pair, linear_pair  # noqa: E402
from bench_register import corner_error  # noqa: E402
from bench_stack import make_stack, rigid_drift, truth_of  # noqa: E402
from tests._dispatch_count import DispatchCounter  # noqa: E402

SECTION = "Registration loop: aten ops and host syncs per iteration (issue 24)"


# ----------------------------------------------------------------------------- cases


def deformable_case(shape=(256, 256)):
    """A 2-D deformable pair of bench_quality (smooth field, ~4 px) and its EPE measure."""
    truth, fixed, moving = dense_pair(1, shape, 4.0, None)
    border = 16

    def error(result):
        est = result.transform.to_displacement(shape)
        inner = (slice(border, -border),) * len(shape)
        return float(np.linalg.norm(est - truth, axis=0)[inner].mean())

    return fixed, moving, error


def affine_case(shape=(256, 256)):
    """A 2-D affine pair of bench_quality (5°, 3 % scale, shear, shift) and its corner error."""
    rng = np.random.default_rng(16)
    matrix = affine_matrix(rng, shape, 5.0, (1.03, 0.98), 0.03, (3.5, -2.0))
    fixed, moving = linear_pair(rng, shape, matrix)
    return fixed, moving, lambda result: corner_error(result.transform.matrix, matrix, shape)


def drift_case(frames=20):
    """bench_stack's rigid drift, ``frames`` × 128², and its median corner error."""
    rng = np.random.default_rng(24)
    drift = rigid_drift(rng, frames=frames)
    truth = truth_of(drift)
    stack = make_stack(rng, drift)
    shape = stack.shape[1:]

    def error(result):
        mats = np.stack([t.matrix for t in result.transforms])
        mats = mats @ np.linalg.inv(mats[0])
        return float(np.median([corner_error(m, t, shape) for m, t in zip(mats[1:], truth[1:])]))

    return stack, error


# ----------------------------------------------------------------------------- counting


def count_run(run):
    """Drive the generator ``run`` (of ``register_iter`` or ``register_stack_iter``) under a
    :class:`DispatchCounter`: ``(counter, result, per_iteration)``, ``per_iteration`` the
    ``(ops, launches, syncs)`` per iteration of the finest level (None when it took fewer
    than two snapshots)."""
    counter = DispatchCounter()
    marks = []  # (level, levels, iteration, snapshot) at each progress
    with counter:
        try:
            while True:
                p = next(run)
                marks.append((p.level, p.levels, p.iteration, counter.snapshot()))
        except StopIteration as done:
            result = done.value
    finest = [m for m in marks if m[0] == m[1] - 1]
    per = None
    if len(finest) >= 2:
        # one batch (a stack's first): its iterations restart at 0
        first = finest[0]
        last = first
        for m in finest[1:]:
            if m[2] <= last[2]:
                break
            last = m
        its = last[2] - first[2]
        if its:
            delta = last[3] - first[3]
            per = (delta.ops / its, delta.launches / its, delta.syncs / its)
    return counter, result, per


def cases():
    """``(name, make_run, error)``: each ``make_run()`` a fresh generator."""
    from napari_simwarp.registration import register_stack_iter
    from napari_simwarp.registration.pair import register_iter

    fixed, moving, dense_error = deformable_case()
    yield (
        "2-D deformable 256², defaults",
        lambda: register_iter(fixed, moving, model="deformable", device="cpu"),
        dense_error,
    )
    a_fixed, a_moving, affine_error = affine_case()
    yield (
        "2-D affine 256², Gauss–Newton",
        lambda: register_iter(a_fixed, a_moving, model="affine", device="cpu", report_every=1),
        affine_error,
    )
    stack, drift_error = drift_case()
    for model in ("rigid", "translation"):
        yield (
            f"drift 20 × 128², {model}",
            lambda model=model: register_stack_iter(
                stack, model=model, device="cpu", report_every=1
            ),
            drift_error,
        )


def timing_cases():
    """Issue 24's CPU cases: ``(name, call, target seconds or None)``: its two small-image
    targets and the counted cases."""
    from napari_simwarp.registration import register, register_stack

    fixed, moving, _ = deformable_case((128, 128))
    yield (
        "2-D deformable 128²",
        lambda: register(fixed, moving, model="deformable", device="cpu"),
        0.3,
    )
    a_fixed, a_moving, _ = affine_case()
    yield "2-D affine 256²", lambda: register(a_fixed, a_moving, device="cpu"), 0.1
    d_fixed, d_moving, _ = deformable_case()
    yield (
        "2-D deformable 256²",
        lambda: register(d_fixed, d_moving, model="deformable", device="cpu"),
        None,
    )
    stack, _ = drift_case()
    for model in ("rigid", "translation"):
        yield (
            f"drift 20 × 128², {model}",
            lambda model=model: register_stack(stack, model=model, device="cpu"),
            None,
        )


def gpu_policy() -> None:
    """Run the GPU's loop on the CPU: the moment engine's float32 sums and the loss buffer
    read every so many iterations (as the tests' fixtures force them)."""
    from napari_simwarp.ops import _numerics
    from napari_simwarp.registration import optimize

    _numerics.FLOAT32_MOMENT_DEVICE_TYPES = _numerics.FLOAT32_MOMENT_DEVICE_TYPES | {"cpu"}
    if hasattr(optimize, "READ_EVERY"):  # (not before issue 24)
        from napari_simwarp.registration import drift, models

        optimize.READ_EVERY["cpu"] = optimize.READ_EVERY_DEFAULT
        models.WIDE_DEVICE_TYPES = frozenset()
        if hasattr(models, "INF_NORM_DEVICE_TYPES"):
            models.INF_NORM_DEVICE_TYPES = models.INF_NORM_DEVICE_TYPES | {"cpu"}
        drift.SLICE_DEVICE_TYPES = frozenset()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time", action="store_true", help="time the cases (no counting)")
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument(
        "--cpu-policy", action="store_true", help="count the CPU's loop, not the GPU's"
    )
    parser.add_argument("--only", default="", help="run the cases whose name has this")
    args = parser.parse_args(argv)
    import torch

    if not args.cpu_policy:
        gpu_policy()

    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}")
    print(
        "| run | aten ops | host syncs | iterations | finest level, per iteration "
        "(ops / launches / syncs) | error (px) |"
    )
    print("|---|---:|---:|---:|---|---:|")
    for name, make, error in [] if args.time else cases():
        if args.only not in name:
            continue
        counter, result, per = count_run(make())
        its = len(result.loss_history)
        total = sum(counter.ops.values())
        per_text = "—" if per is None else f"{per[0]:.0f} / {per[1]:.0f} / {per[2]:.2f}"
        print(
            f"| {name} | {total:,} | {counter.syncs:,} | {its} | {per_text} "
            f"| {error(result):.4f} |",
            flush=True,
        )
        if os.environ.get("SIMWARP_DISPATCH_DETAIL"):
            print("   ", counter.ops.most_common(25))
            print("   ", dict(counter.sync_ops), "float64:", dict(counter.float64_ops))
    if args.time:
        if not args.cpu_policy:
            print("(timed under the GPU policy: pass --cpu-policy for the CPU's own)")
        # CPU time beside wall time: on a shared machine it is the steadier of the two
        print("\n| case | median time (s) | median CPU time (s) | target (s) |")
        print("|---|---:|---:|---:|")
        for name, call, target in timing_cases():
            if args.only not in name:
                continue
            call()
            times, cpu = [], []
            for _ in range(args.repeat):
                t0, c0 = time.perf_counter(), time.process_time()
                call()
                times.append(time.perf_counter() - t0)
                cpu.append(time.process_time() - c0)
            target = "" if target is None else target
            print(
                f"| {name} | {statistics.median(times):.3f} | {statistics.median(cpu):.3f} "
                f"| {target} |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
