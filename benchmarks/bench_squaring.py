"""Scaling and squaring (``integrate_velocity``'s 7 squarings, forward and backward): the
compiled op (``simwarp::squaring_fwd`` / ``squaring_bwd``) against the torch path it
replaced (``torch_squarings``: grid_sampler, three launches per squaring each way), same
run, same input: a smooth float32 velocity of at most 5 px, 512² and 64³, best of 5.

Run: ``PYTHONPATH=src python benchmarks/bench_squaring.py`` (the CPU; ``--device cuda``
on a GPU).
"""

from __future__ import annotations

import argparse
import time

import torch

from _harness import smooth_displacement


def _best(fn, device, repeat=5) -> float:
    best = float("inf")
    for _ in range(repeat):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    from napari_simwarp.ops._kernels import calls, ensure_loaded
    from napari_simwarp.ops.integrate_velocity import torch_squarings

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    device = torch.device(parser.parse_args().device)
    if not ensure_loaded():
        raise SystemExit("compiled kernels unavailable")
    generator = torch.Generator().manual_seed(0)
    print(f"torch {torch.__version__}, {device}, {torch.get_num_threads()} threads")
    for shape in ((512, 512), (64, 64, 64)):
        v = smooth_displacement(shape, 5.0, generator).to(device)
        u = (v / 2**7).requires_grad_()
        upstream = torch.randn(u.shape, generator=generator).to(device)
        for name, fn in (("compiled", calls.squarings), ("torch", torch_squarings)):

            def run(fn=fn, u=u, upstream=upstream):
                fn(u, 7).backward(upstream)

            forward = _best(lambda fn=fn, u=u: fn(u.detach(), 7), device)
            both = _best(run, device)
            label = "x".join(map(str, shape))
            print(
                f"{label:>9} {name:>8}: forward {forward * 1e3:7.1f} ms, "
                f"forward+backward {both * 1e3:7.1f} ms"
            )


if __name__ == "__main__":
    main()
