"""One case, ours beside its peer in this process: the ratio docs/benchmarks.md's issue 25
table gives (run it once per tree, alternating trees, for a before/after comparison).

    PYTHONPATH=src python benchmarks/pair_ratio.py {ssim1024,ssim2048,mt2048} THREADS

Three rounds, each ours (median of 3 calls) then the peer (one call); prints the medians
and the ratio peer / ours. SSIM: forward + backward of the mean SSIM, gradients to both
images, against pytorch-msssim; mt2048: match_template of a float32 2048² image (1000 +
noise σ 5) and a 64² crop against scikit-image on the float64 copies.
"""

from __future__ import annotations

import os
import statistics
import sys
import time

import numpy as np
import torch


def _median(fn, repeat):
    fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _cases(case):
    if case.startswith("mt"):
        from skimage.feature import match_template as sk_match_template

        from napari_simwarp.ops import match_template

        n = int(case[2:])
        rng = np.random.default_rng(0)
        image = (1000 + 5 * rng.standard_normal((n, n))).astype(np.float32)
        template = image[100:164, 200:264].copy()
        ti, tt = torch.from_numpy(image)[None, None], torch.from_numpy(template)[None, None]
        return (
            lambda: match_template(ti, tt),
            lambda: sk_match_template(image.astype(np.float64), template.astype(np.float64)),
        )
    from guard import _ssim  # the guard's own SSIM pair, at this size

    return _ssim(int(case[4:]))


def main(argv=None) -> int:
    case, threads = (argv or sys.argv[1:])[:2]
    torch.set_num_threads(int(threads))
    ours, peer = _cases(case)
    mine, theirs = [], []
    for _ in range(3):
        mine.append(_median(ours, 3))
        theirs.append(_median(peer, 1))
    o, p = statistics.median(mine), statistics.median(theirs)
    label = os.environ.get("LABEL", "")
    print(
        f"{label} {case} T{threads} ours {o * 1e3:.1f} ms peer {p * 1e3:.1f} ms ratio {p / o:.2f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
