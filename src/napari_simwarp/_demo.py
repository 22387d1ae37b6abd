"""The headless demo: the operators on the bundled sample data, results written to a folder.

The same functions a script would call; no napari, no Qt.
"""

from __future__ import annotations

import json
import pathlib
import time

import numpy as np

from . import data


def pick_device(device: str = "auto"):
    """``"auto"``: CUDA, then MPS, then CPU; anything else is passed to ``torch.device``."""
    import torch

    if device != "auto":
        return torch.device(device)
    if torch.cuda.is_available():
        return torch.device("cuda")
    if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def _to_uint8(image: np.ndarray, lo: float | None = None, hi: float | None = None) -> np.ndarray:
    lo = float(np.min(image)) if lo is None else lo
    hi = float(np.max(image)) if hi is None else hi
    scaled = (np.asarray(image, np.float64) - lo) / max(hi - lo, 1e-12)
    return (np.clip(scaled, 0.0, 1.0) * 255.0 + 0.5).astype(np.uint8)


def _panel(images: list[np.ndarray], columns: int = 3, gap: int = 8) -> np.ndarray:
    """Tile equally sized uint8 images into one grid picture with white gaps."""
    h, w = images[0].shape
    rows = -(-len(images) // columns)
    canvas = np.full((rows * h + (rows - 1) * gap, columns * w + (columns - 1) * gap), 255,
                     np.uint8)
    for i, img in enumerate(images):
        r, c = divmod(i, columns)
        canvas[r * (h + gap): r * (h + gap) + h, c * (w + gap): c * (w + gap) + w] = img
    return canvas


def run_headless_demo(out: str | pathlib.Path, device: str = "auto") -> dict:
    """Compute every similarity map on the sample data and write them into ``out``.

    Writes ``local_std.npy``, ``zncc.npy``, ``local_ncc.npy``, ``ssim.npy``,
    ``summary.json`` and ``demo.png`` (fixed, moving, local std / ZNCC / local NCC / SSIM
    maps). Returns the summary.
    """
    import torch

    from . import ops

    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    dev = pick_device(device)
    fixed, moving, _ = data.deformed_pair()
    as_tensor = lambda a: torch.from_numpy(a)[None, None].to(dev)  # noqa: E731
    fixed_t, moving_t = as_tensor(fixed), as_tensor(moving)

    corner = (200, 230)  # the template is cut from here, so that is where ZNCC must peak
    template = fixed[corner[0]: corner[0] + 48, corner[1]: corner[1] + 48]

    timings = {}
    t0 = time.perf_counter()
    std = ops.local_std(fixed_t, 15)
    timings["local_std_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    zncc = ops.match_template(fixed_t, as_tensor(np.ascontiguousarray(template)))
    timings["match_template_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    lncc = ops.local_ncc(fixed_t, moving_t, 9)
    timings["local_ncc_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    ssim_map = ops.ssim(fixed_t, moving_t, reduction="none")
    timings["ssim_s"] = time.perf_counter() - t0

    maps = {
        "local_std": std[0, 0].cpu().numpy(),
        "zncc": zncc[0, 0].cpu().numpy(),
        "local_ncc": lncc[0, 0].cpu().numpy(),
        "ssim": ssim_map[0, 0].cpu().numpy(),
    }
    for name, value in maps.items():
        np.save(out / f"{name}.npy", value)

    peak = np.unravel_index(int(np.argmax(maps["zncc"])), maps["zncc"].shape)
    summary = {
        "device": str(dev),
        "template_cut_at": list(corner),
        "template_found_at": [int(p) for p in peak],
        "template_peak_zncc": float(maps["zncc"][peak]),
        "mean_local_ncc": float(maps["local_ncc"].mean()),
        "mean_ssim": float(maps["ssim"].mean()),
        **{k: round(v, 4) for k, v in timings.items()},
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")

    zncc_full = np.zeros_like(fixed)
    zncc_full[: maps["zncc"].shape[0], : maps["zncc"].shape[1]] = maps["zncc"]
    picture = _panel([
        _to_uint8(fixed, 0, 1), _to_uint8(moving, 0, 1), _to_uint8(maps["local_std"]),
        _to_uint8(zncc_full, -1, 1), _to_uint8(maps["local_ncc"], -1, 1),
        _to_uint8(maps["ssim"], 0, 1),
    ])
    from skimage.io import imsave

    imsave(out / "demo.png", picture, check_contrast=False)
    return summary
