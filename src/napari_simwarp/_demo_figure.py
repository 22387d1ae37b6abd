"""The headless demo's picture (``demo.png``): one matplotlib figure a reader understands alone.

Three rows, one per thing the demo does, each headed by what it found: the similarity maps
of the sample pair, the deformable registration of that pair against its true field, and
the drift correction of the time-lapse against its true shifts. Every image panel has a
title, pixel axes and a colour bar with its unit; the drift row plots the shifts per frame.
Kept apart from :mod:`napari_simwarp._demo` so the figure can be drawn (and tested) from
arrays alone, without running the demo.
"""

from __future__ import annotations

import numpy as np

#: the border left out of the demo's mean end-point error (the field is unconstrained there)
ERROR_BORDER = 16
#: the end-point error colour bar's top, in pixels (larger errors are clipped to it)
ERROR_LIMIT_PX = 1.0


def demo_figure(fixed, moving, maps: dict, pair: dict, drift: dict, summary: dict, template):
    """The demo's results as one titled matplotlib figure.

    ``maps``: the ``local_std``, ``zncc``, ``local_ncc`` and ``ssim`` maps; ``pair``: the
    ``registered`` image, the estimated ``displacement`` and the ``true`` field, ``(2, H,
    W)`` each; ``drift``: the first ``frame``, ``mean_before`` and ``mean_after`` of the
    time-lapse, its estimated ``shifts`` and ``true_shifts`` ``(T, 2)``; ``summary``: the
    demo's summary (device, where the template was cut and found, errors, timings);
    ``template``: ``((row, col), size)`` of the template cut from ``fixed``.
    """
    from matplotlib.figure import Figure

    fig = Figure(figsize=(20, 13.5), layout="constrained")
    fig.suptitle(
        f"napari-simwarp headless demo on the bundled sample data (device: {summary['device']})",
        fontsize=15,
        fontweight="bold",
    )
    rows = fig.subfigures(3, 1, hspace=0.02)
    _maps_row(rows[0], fixed, maps, summary, template)
    _registration_row(rows[1], fixed, moving, pair, summary)
    _drift_row(rows[2], drift, summary)
    return fig


def _image(ax, image, title, cmap, limits, unit, first=False):
    """One image panel: title, pixel ticks, a colour bar labelled with its unit."""
    vmin, vmax = limits
    shown = ax.imshow(image, cmap=cmap, vmin=vmin, vmax=vmax, interpolation="nearest")
    ax.set_title(title, fontsize=11)
    ax.tick_params(labelsize=7)
    if first:  # one axis label per row: every panel of a row has the same pixel grid
        ax.set_xlabel("x (px)", fontsize=8)
        ax.set_ylabel("y (px)", fontsize=8)
    ax.figure.colorbar(shown, ax=ax, shrink=0.85, label=unit)
    return shown


def _maps_row(sub, fixed, maps, summary, template):
    from matplotlib.patches import Rectangle

    (r, c), size = template
    found = summary["template_found_at"]
    sub.suptitle(
        f"Similarity maps: the {size}×{size} template cut from fixed at (row {r}, col {c}) "
        f"is found at (row {found[0]}, col {found[1]}), peak ZNCC "
        f"{summary['template_peak_zncc']:.3f}",
        fontsize=13,
    )
    axes = sub.subplots(1, 5)
    std_top = float(np.percentile(maps["local_std"], 99.5))
    _image(axes[0], fixed, "fixed image", "gray", (0, 1), "intensity (0–1)", first=True)
    _image(
        axes[1],
        maps["local_std"],
        "local std of fixed, 15×15",
        "magma",
        (0, std_top),
        "std (intensity)",
    )
    _image(axes[2], maps["zncc"], "ZNCC of the template over fixed", "RdBu_r", (-1, 1), "ZNCC")
    _image(axes[3], maps["local_ncc"], "local NCC fixed vs moving, 9×9", "RdBu_r", (-1, 1), "NCC")
    _image(axes[4], maps["ssim"], "SSIM fixed vs moving", "viridis", (0, 1), "SSIM")
    zncc = axes[2]
    # The map is centred on the template (pad_input): within half a template of an edge
    # the template hangs outside the image and the values there compare it with padding.
    h, w = maps["zncc"].shape
    lo, hi = size // 2, size - size // 2 - 1
    zncc.add_patch(
        Rectangle(
            (lo - 0.5, lo - 0.5),
            w - lo - hi,
            h - lo - hi,
            fill=False,
            ls="--",
            color="black",
            lw=1,
            label="outside: template\npartly off the image",
        )
    )
    for (y, x), color, label, lw in (
        ((r, c), "lime", "cut here", 3),
        (found, "gold", "found", 1.5),
    ):
        zncc.add_patch(
            Rectangle((x - 0.5, y - 0.5), size, size, fill=False, color=color, lw=lw, label=label)
        )
    zncc.legend(loc="lower right", fontsize=7, framealpha=0.9)


def _registration_row(sub, fixed, moving, pair, summary):
    from matplotlib.patches import Rectangle

    sub.suptitle(
        "Deformable registration of moving onto fixed: mean end-point error against the true "
        f"field {summary['registration_epe_before_px']:.2f} px before → "
        f"{summary['registration_epe_after_px']:.3f} px after "
        f"({ERROR_BORDER}-px border left out), {summary['registration_s']} s",
        fontsize=13,
    )
    axes = sub.subplots(1, 5)
    before = np.abs(moving - fixed)
    after = np.abs(pair["registered"] - fixed)
    top = float(np.percentile(before, 99.5))
    true_max = float(np.hypot(*pair["true"]).max())
    error = np.hypot(*(pair["displacement"] - pair["true"]))
    _image(
        axes[0],
        moving,
        f"moving (fixed deformed, up to {true_max:.1f} px)",
        "gray",
        (0, 1),
        "intensity (0–1)",
        first=True,
    )
    _image(axes[1], pair["registered"], "registered moving", "gray", (0, 1), "intensity (0–1)")
    _image(axes[2], before, "|moving − fixed| (before)", "inferno", (0, top), "|difference|")
    _image(axes[3], after, "|registered − fixed| (after)", "inferno", (0, top), "|difference|")
    _image(
        axes[4],
        error,
        "end-point error |estimated − true field|",
        "magma",
        (0, ERROR_LIMIT_PX),
        f"error (px; clipped at {ERROR_LIMIT_PX:g})",
    )
    h, w = error.shape
    b = ERROR_BORDER
    axes[4].add_patch(
        Rectangle(
            (b - 0.5, b - 0.5),
            w - 2 * b,
            h - 2 * b,
            fill=False,
            ls="--",
            color="cyan",
            lw=1,
            label="area of the mean",
        )
    )
    axes[4].legend(loc="lower right", fontsize=7, framealpha=0.9)


def _drift_row(sub, drift, summary):
    frames = len(drift["shifts"])
    sub.suptitle(
        f"Drift correction of a {frames}-frame time-lapse (translation): largest error against "
        f"the true shifts {summary['drift_max_error_px']} px, {summary['drift_s']} s",
        fontsize=13,
    )
    grid = sub.add_gridspec(1, 5)
    axes = [sub.add_subplot(grid[0, i]) for i in range(3)]
    plot = sub.add_subplot(grid[0, 3:])
    limits = (0, 1)
    _image(
        axes[0],
        drift["frame"],
        "frame 0 (the reference)",
        "gray",
        limits,
        "intensity (0–1)",
        first=True,
    )
    _image(
        axes[1],
        drift["mean_before"],
        f"mean of the {frames} frames, before",
        "gray",
        limits,
        "intensity (0–1)",
    )
    _image(
        axes[2],
        drift["mean_after"],
        "mean after (dark edge: off the frames)",
        "gray",
        limits,
        "intensity (0–1)",
    )
    t = np.arange(frames)
    true, est = np.asarray(drift["true_shifts"]), np.asarray(drift["shifts"])
    for axis, name, color in ((0, "y", "tab:blue"), (1, "x", "tab:orange")):
        plot.plot(t, true[:, axis], "-", color=color, lw=1.5, label=f"true {name} shift")
        plot.plot(
            t, est[:, axis], "o", color=color, mfc="none", ms=7, label=f"estimated {name} shift"
        )
    plot.axhline(0, color="0.6", lw=0.8)
    plot.set_xlabel("frame")
    plot.set_ylabel("shift of the frame (px)")
    plot.set_xticks(t[:: max(1, frames // 10)])
    plot.set_title("shift per frame: true (lines) and estimated (circles)", fontsize=11)
    plot.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)
    plot.grid(alpha=0.3)
