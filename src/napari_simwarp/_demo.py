"""The headless demo: the operators on the bundled sample data, results written to a folder.

The same functions a script would call; no napari, no Qt.
"""

from __future__ import annotations

import json
import pathlib
import time

import numpy as np

from . import data




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

    Writes ``local_std.npy``, ``zncc.npy``, ``local_ncc.npy``, ``ssim.npy``, then
    registers the deformed pair (``registered.npy``, ``displacement.npy``, ``transform.npz``)
    and the drifting time-lapse (``drift_shifts.npy``, ``drift_corrected.npy``) with the
    same functions the napari widgets call, and writes ``summary.json`` and ``demo.png``
    (fixed, moving, local std / ZNCC / local NCC / SSIM maps / registered moving, its
    difference to fixed before and after, time-lapse mean before and after drift
    correction). Returns the summary.
    """
    import torch

    from . import ops

    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    from .register._inputs import resolve_device

    dev = resolve_device(device)
    fixed, moving, _ = data.deformed_pair()
    as_tensor = lambda a: torch.from_numpy(a)[None, None].to(dev)  # noqa: E731
    fixed_t, moving_t = as_tensor(fixed), as_tensor(moving)

    corner = (200, 230)  # the template is cut from here, so that is where ZNCC must peak
    template = fixed[corner[0]: corner[0] + 48, corner[1]: corner[1] + 48]

    timings = {}
    # Build (or load) the compiled kernels first: a first-ever build takes tens of seconds
    # and must not be mistaken for the first operator's time.
    from .ops import _backend

    t0 = time.perf_counter()
    if _backend.requested_backend() != "torch":
        _backend.ensure_loaded()
    timings["kernels_load_s"] = time.perf_counter() - t0
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
    summary.update(_register_samples(out, fixed, moving, dev))
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")

    zncc_full = np.zeros_like(fixed)
    zncc_full[: maps["zncc"].shape[0], : maps["zncc"].shape[1]] = maps["zncc"]
    picture = _panel([
        _to_uint8(fixed, 0, 1), _to_uint8(moving, 0, 1), _to_uint8(maps["local_std"]),
        _to_uint8(zncc_full, -1, 1), _to_uint8(maps["local_ncc"], -1, 1),
        _to_uint8(maps["ssim"], 0, 1),
        _to_uint8(np.load(out / "registered.npy"), 0, 1),
        _to_uint8(np.abs(moving - fixed), 0, 0.5),
        _to_uint8(np.abs(np.load(out / "registered.npy") - fixed), 0, 0.5),
        _to_uint8(_upsample(np.load(out / "_drift_mean_before.npy"), fixed.shape)),
        _to_uint8(_upsample(np.load(out / "drift_corrected.npy").mean(axis=0), fixed.shape)),
    ])
    (out / "_drift_mean_before.npy").unlink()
    from skimage.io import imsave

    imsave(out / "demo.png", picture, check_contrast=False)
    return summary


def _upsample(image: np.ndarray, shape) -> np.ndarray:
    """Nearest-neighbour resize to ``shape`` (for the picture's equal-sized tiles)."""
    idx = [np.minimum((np.arange(n) * s / n).astype(int), s - 1)
           for n, s in zip(shape, image.shape)]
    return image[np.ix_(*idx)]


def _register_samples(out: pathlib.Path, fixed, moving, dev) -> dict:
    """Deformable registration of the pair and drift correction of the time-lapse."""
    from .register import register, register_stack

    t0 = time.perf_counter()
    res = register(fixed, moving, model="deformable", metric="lncc", iterations=30,
                   device=str(dev))
    seconds = time.perf_counter() - t0
    _, _, true = data.deformed_pair()
    est = res.transform.to_displacement(fixed.shape)
    inner = (slice(16, -16), slice(16, -16))
    epe = np.sqrt(((est - true) ** 2).sum(0))[inner]
    np.save(out / "registered.npy", res.warped)
    np.save(out / "displacement.npy", est)
    res.transform.save(out / "transform.npz")

    stack, shifts = data.drifting_timelapse()
    t0 = time.perf_counter()
    drift = register_stack(stack, model="translation", device=str(dev))
    drift_seconds = time.perf_counter() - t0
    np.save(out / "drift_shifts.npy", drift.shifts)
    np.save(out / "drift_corrected.npy", drift.warped)
    np.save(out / "_drift_mean_before.npy", stack.mean(axis=0))
    return {
        "registration_model": "deformable",
        "registration_epe_before_px": round(float(np.sqrt((true ** 2).sum(0))[inner].mean()), 4),
        "registration_epe_after_px": round(float(epe.mean()), 4),
        "registration_s": round(seconds, 2),
        "drift_max_error_px": round(float(np.abs(drift.shifts - shifts).max()), 4),
        "drift_frames": int(stack.shape[0]),
        "drift_s": round(drift_seconds, 2),
    }


def run_gui_demo(device: str = "auto"):
    """Open napari with the sample data and the three widgets docked (blocks until closed).

    Needs the ``napari`` extra and a display.
    """
    import napari

    viewer = napari.Viewer(title="napari-simwarp demo")
    build_demo_viewer(viewer, device)
    napari.run()
    return viewer


def build_demo_viewer(viewer, device: str = "auto"):
    """Add the sample pair and time-lapse to ``viewer`` and dock the widgets, set up.

    Returns the widgets by name ("Similarity map", "Template matching", "Register").
    """
    from . import _sample_data
    from ._qt import RegisterWidget, SimilarityMapWidget, TemplateMatchingWidget

    layers = {}
    for factory in (_sample_data.deformed_pair, _sample_data.drifting_timelapse):
        for array, kwargs, _kind in factory():
            layers[kwargs["name"]] = viewer.add_image(array, **kwargs)
    layers["time-lapse"].visible = False
    corner = (200, 230)
    box = np.array([[0, 0], [0, 48], [48, 48], [48, 0]], float) + corner - 0.5
    shapes = viewer.add_shapes([box], shape_type="rectangle", name="template box",
                               edge_color="cyan", face_color="transparent", edge_width=2)

    sim = SimilarityMapWidget(viewer)
    match = TemplateMatchingWidget(viewer)
    reg = RegisterWidget(viewer)
    for widget, name in ((sim, "Similarity map"), (match, "Template matching"),
                         (reg, "Register")):
        viewer.window.add_dock_widget(widget, name=name, area="right")
        widget.reset_choices()
    sim._live.value = False  # set the layers first, then start the live map
    sim._image.value, sim._second.value = layers["fixed"], layers["moving"]
    sim._metric.value = "local NCC"
    sim._live.value = True
    sim.compute()
    match._image.value, match._shapes.value = layers["fixed"], shapes
    reg._fixed.value, reg._moving.value = layers["fixed"], layers["moving"]
    reg._model.value = "deformable"
    for widget in (sim, match, reg):
        widget._device.value = device if device in widget._device.choices else "auto"
    return {"Similarity map": sim, "Template matching": match, "Register": reg}
