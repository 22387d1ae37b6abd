"""The headless demo's picture (_demo_figure.py) drawn from known arrays: every panel is
titled and has a colour bar with its unit, each row is headed by the figures the summary
gives, and the drift plot shows exactly the shifts it was given."""

from __future__ import annotations

import io

import numpy as np
import pytest

from napari_simwarp._demo_figure import demo_figure

SIZE, CORNER, T = 64, (20, 30), 6


@pytest.fixture(scope="module")
def figure():
    rng = np.random.default_rng(1)
    image = lambda: rng.uniform(0, 1, (SIZE, SIZE)).astype(np.float32)
    maps = {name: image() for name in ("local_std", "zncc", "local_ncc", "ssim")}
    true = rng.uniform(-3, 3, (2, SIZE, SIZE))
    pair = {"registered": image(), "displacement": true + 0.1, "true": true}
    true_shifts = rng.uniform(-8, 8, (T, 2))
    drift = {
        "frame": image(),
        "mean_before": image(),
        "mean_after": image(),
        "shifts": true_shifts + 0.01,
        "true_shifts": true_shifts,
    }
    summary = {
        "device": "cpu",
        "template_found_at": [21, 31],
        "template_peak_zncc": 0.987,
        "registration_epe_before_px": 2.1017,
        "registration_epe_after_px": 0.1234,
        "registration_s": 1.5,
        "drift_max_error_px": 0.0118,
        "drift_s": 0.58,
    }
    fig = demo_figure(image(), image(), maps, pair, drift, summary, (CORNER, 16))
    return fig, drift


def _panels(fig):
    """The axes that show an image, over the three row subfigures."""
    return [ax for sub in fig.subfigs for ax in sub.axes if ax.images]


def test_every_image_panel_has_a_title_and_a_labelled_colour_bar(figure):
    fig, _ = figure
    panels = _panels(fig)
    assert len(panels) == 13  # 5 maps, 5 registration panels, 3 time-lapse images
    for ax in panels:
        assert ax.get_title().strip(), "an untitled panel"
        bar = ax.images[0].colorbar
        assert bar is not None, ax.get_title()
        assert bar.ax.get_ylabel().strip(), f"colour bar without unit: {ax.get_title()}"
    titles = [ax.get_title() for ax in panels]
    assert len(set(titles)) == len(titles)
    # the pixel grid is named once per row
    assert [ax.get_xlabel() for ax in panels].count("x (px)") == 3


def test_rows_are_headed_by_what_the_demo_found(figure):
    fig, _ = figure
    heads = [sub.get_suptitle() for sub in fig.subfigs]
    assert len(heads) == 3
    assert "(row 20, col 30)" in heads[0] and "(row 21, col 31)" in heads[0]
    assert "0.987" in heads[0]
    assert "2.10 px before" in heads[1] and "0.123 px after" in heads[1]
    assert "6-frame" in heads[2] and "0.0118 px" in heads[2]
    assert "cpu" in fig.get_suptitle()


def test_the_drift_plot_shows_the_given_shifts(figure):
    fig, drift = figure
    (plot,) = [ax for ax in fig.subfigs[2].axes if ax.lines and not ax.images]
    lines = {line.get_label(): line for line in plot.get_lines()}
    for axis, name in ((0, "y"), (1, "x")):
        for label, key in (
            (f"true {name} shift", "true_shifts"),
            (f"estimated {name} shift", "shifts"),
        ):
            np.testing.assert_array_equal(lines[label].get_xdata(), np.arange(T))
            np.testing.assert_array_equal(lines[label].get_ydata(), drift[key][:, axis])
    assert "px" in plot.get_ylabel() and plot.get_xlabel() == "frame"


def test_zncc_panel_marks_the_template_and_the_padded_border(figure):
    fig, _ = figure
    (zncc,) = [ax for ax in _panels(fig) if ax.get_title().startswith("ZNCC")]
    boxes = {p.get_label(): p for p in zncc.patches}
    assert boxes["cut here"].get_xy() == (CORNER[1] - 0.5, CORNER[0] - 0.5)
    assert boxes["found"].get_xy() == (31 - 0.5, 21 - 0.5)
    (border,) = [p for label, p in boxes.items() if label.startswith("outside")]
    # a 16-px template centred on each pixel hangs off the image within 8 px of the top-left
    # and 7 px of the bottom-right edge
    assert border.get_xy() == (8 - 0.5, 8 - 0.5)
    assert (border.get_width(), border.get_height()) == (SIZE - 15, SIZE - 15)


def test_the_figure_renders_to_a_png(figure):
    from PIL import Image

    fig, _ = figure
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=40)
    buffer.seek(0)
    with Image.open(buffer) as image:
        assert image.format == "PNG" and image.size == (800, 540)
