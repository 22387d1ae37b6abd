"""The headless demo: the operators on the bundled sample data, results written to a folder.

The same functions a script calls; no napari, no Qt. The viewer demo (the same data in
napari with the widgets docked) is :mod:`napari_simwarp._qt._demo`.
"""

from __future__ import annotations

import json
import pathlib
import time

import numpy as np

from . import data
from ._demo_figure import ERROR_BORDER, demo_figure

#: where the demo cuts its template from (so that is where ZNCC must peak), and its size
TEMPLATE_CORNER = (200, 230)
TEMPLATE_SIZE = 48
#: the files :func:`run_headless_demo` writes into its folder (``napari-simwarp demo``
#: checks that none of them would replace a file of the user's)
OUTPUTS = (
    "local_std.npy", "zncc.npy", "local_ncc.npy", "ssim.npy", "registered.npy",
    "displacement.npy", "transform.npz", "drift_shifts.npy", "drift_corrected.npy",
    "summary.json", "demo.png",
)  # fmt: skip


def run_headless_demo(out: str | pathlib.Path, device: str = "auto") -> dict:
    """Compute every similarity map on the sample data and write them into ``out``.

    Writes ``local_std.npy``, ``zncc.npy``, ``local_ncc.npy``, ``ssim.npy``, then
    registers the deformed pair (``registered.npy``, ``displacement.npy``, ``transform.npz``)
    and the drifting time-lapse (``drift_shifts.npy``, ``drift_corrected.npy``) with the
    same functions the napari widgets call, and writes ``summary.json`` and ``demo.png``
    (a titled figure of the maps and results,
    :func:`napari_simwarp._demo_figure.demo_figure`). Returns the summary.
    """
    import torch

    from . import ops
    from ._devices import resolve_device
    from .ops import _kernels

    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    dev = resolve_device(device)
    fixed, moving, _ = data.deformed_pair()

    def as_tensor(a):
        return torch.from_numpy(np.ascontiguousarray(a))[None, None].to(dev)

    fixed_t, moving_t = as_tensor(fixed), as_tensor(moving)
    (r, c), size = TEMPLATE_CORNER, TEMPLATE_SIZE
    template = fixed[r : r + size, c : c + size]

    timings = {}
    # Build (or load) the compiled kernels first: a first-ever build takes tens of seconds
    # and must not be mistaken for the first operator's time.
    t0 = time.perf_counter()
    if _kernels.requested_backend() != "torch":
        _kernels.ensure_loaded()
    timings["kernels_load_s"] = time.perf_counter() - t0
    maps = {}
    for name, compute in (
        ("local_std", lambda: ops.local_std(fixed_t, window=15)),
        ("zncc", lambda: ops.match_template(fixed_t, as_tensor(template), pad_input=True)),
        ("local_ncc", lambda: ops.local_ncc(fixed_t, moving_t, window=9)),
        ("ssim", lambda: ops.ssim(fixed_t, moving_t)),
    ):
        t0 = time.perf_counter()
        maps[name] = compute()[0, 0].cpu().numpy()
        timings[f"{name}_s"] = time.perf_counter() - t0
        np.save(out / f"{name}.npy", maps[name])

    peak = np.unravel_index(int(np.argmax(maps["zncc"])), maps["zncc"].shape)
    found = [int(p) - size // 2 for p in peak]  # pad_input: the map is centered
    summary = {
        "device": str(dev),
        "template_cut_at": list(TEMPLATE_CORNER),
        "template_found_at": found,
        "template_peak_zncc": float(maps["zncc"][peak]),
        "mean_local_ncc": float(maps["local_ncc"].mean()),
        "mean_ssim": float(maps["ssim"].mean()),
        **{k: round(v, 4) for k, v in timings.items()},
    }
    pair = _register_pair(out, fixed, moving, dev)
    drift = _correct_drift(out, dev)
    summary.update(pair.pop("summary"))
    summary.update(drift.pop("summary"))
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    figure = demo_figure(fixed, moving, maps, pair, drift, summary, (TEMPLATE_CORNER, size))
    figure.savefig(out / "demo.png", dpi=80)
    return summary


def _register_pair(out: pathlib.Path, fixed, moving, dev) -> dict:
    """Deformable registration of the pair; the arrays for the figure and a summary."""
    from .registration import register

    t0 = time.perf_counter()
    # The defaults (local NCC, bending weight 4, 60 iterations per level): 0.111 px here;
    # global NCC has nothing to hold the field by in the picture's flat sky (0.65 px;
    # docs/benchmarks.md, issue 16).
    res = register(fixed, moving, model="deformable", device=str(dev))
    seconds = time.perf_counter() - t0
    _, _, true = data.deformed_pair()
    est = res.transform.to_displacement(fixed.shape)
    inner = (slice(ERROR_BORDER, -ERROR_BORDER),) * 2  # the figure's box
    epe = np.sqrt(((est - true) ** 2).sum(0))
    np.save(out / "registered.npy", res.warped)
    np.save(out / "displacement.npy", est)
    res.transform.save(out / "transform.npz")
    return {
        "registered": res.warped,
        "displacement": est,
        "true": true,
        "summary": {
            "registration_model": "deformable",
            "registration_epe_before_px": round(float(np.sqrt((true**2).sum(0))[inner].mean()), 4),
            "registration_epe_after_px": round(float(epe[inner].mean()), 4),
            "registration_s": round(seconds, 2),
        },
    }


def _correct_drift(out: pathlib.Path, dev) -> dict:
    """Drift correction of the sample time-lapse; the arrays for the figure and a summary."""
    from .registration import register_stack

    stack, shifts = data.drifting_timelapse()
    t0 = time.perf_counter()
    drift = register_stack(stack, model="translation", device=str(dev))
    seconds = time.perf_counter() - t0
    np.save(out / "drift_shifts.npy", drift.shifts)
    np.save(out / "drift_corrected.npy", drift.warped)
    return {
        "frame": stack[0],
        "mean_before": stack.mean(axis=0),
        "mean_after": drift.warped.mean(axis=0),
        "shifts": drift.shifts,
        "true_shifts": shifts,
        "summary": {
            "drift_max_error_px": round(float(np.abs(drift.shifts - shifts).max()), 4),
            "drift_frames": int(stack.shape[0]),
            "drift_s": round(seconds, 2),
        },
    }
