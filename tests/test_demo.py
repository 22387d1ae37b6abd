"""The README's headless quick start for real (_demo.py): ``napari-simwarp demo --headless
--out DIR`` in a subprocess, its outputs checked against the sample data's ground truth and
against SciPy / scikit-image references of each map."""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest
from scipy import ndimage as ndi

from napari_simwarp import _demo, data
from napari_simwarp.registration import load_transform

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"
#: where the demo cuts its 48² template from (its documented behavior)
TEMPLATE_CORNER, TEMPLATE_SIZE = (200, 230), 48
INNER = (slice(16, -16), slice(16, -16))


def _run_demo(out: pathlib.Path) -> None:
    # The worktree's package, whatever console script is installed: python -m.
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "napari_simwarp._cli",
            "demo",
            "--headless",
            "--out",
            str(out),
            "--device",
            "cpu",
        ],
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "MPLBACKEND": "Agg"},
    )
    (out / "returncode").write_text(f"{result.returncode}\n{result.stdout}\n{result.stderr}")


@pytest.fixture(scope="session")
def demo(tmp_path_factory) -> pathlib.Path:
    """The demo's output folder, made once per test session (once across xdist workers)."""
    from filelock import FileLock

    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent  # the session's folder, common to the workers
    out = shared / "headless-demo"
    with FileLock(str(shared / "headless-demo.lock")):
        if not (out / "returncode").is_file():
            out.mkdir(exist_ok=True)
            _run_demo(out)
    code, _, log = (out / "returncode").read_text().partition("\n")
    assert code == "0", log
    return out


@pytest.fixture(scope="module")
def pair():
    return data.deformed_pair()


@pytest.fixture(scope="module")
def timelapse():
    return data.drifting_timelapse()


def test_summary_finds_the_template_where_it_was_cut(demo):
    summary = json.loads((demo / "summary.json").read_text())
    assert summary["template_cut_at"] == list(TEMPLATE_CORNER)
    assert summary["template_found_at"] == list(TEMPLATE_CORNER)
    assert summary["template_peak_zncc"] > 0.99
    assert summary["device"] == "cpu"


def test_registration_error_against_the_ground_truth(demo, pair):
    fixed, moving, true = pair
    estimated = np.load(demo / "displacement.npy")
    assert estimated.shape == true.shape == (2, *fixed.shape)
    before = np.sqrt((true**2).sum(0))[INNER].mean()
    after = np.sqrt(((estimated - true) ** 2).sum(0))[INNER].mean()
    # Measured 0.111 px (0.12 with the former bilinear field, issue 16).
    assert after < 0.2 and after < 0.25 * before, (before, after)
    summary = json.loads((demo / "summary.json").read_text())
    assert summary["registration_epe_after_px"] == pytest.approx(after, abs=1e-3)
    assert summary["registration_epe_before_px"] == pytest.approx(before, abs=1e-3)
    # transform.npz holds the same field; registered.npy is moving(x + d(x)).
    np.testing.assert_allclose(
        load_transform(demo / "transform.npz").to_displacement(fixed.shape), estimated, atol=1e-5
    )
    registered = np.load(demo / "registered.npy")
    resampled = ndi.map_coordinates(
        moving, np.indices(fixed.shape) + estimated, order=1, mode="nearest"
    )
    np.testing.assert_allclose(registered[INNER], resampled[INNER], atol=1e-4)
    assert np.abs(registered - fixed)[INNER].mean() < 0.5 * np.abs(moving - fixed)[INNER].mean()


def test_drift_error_against_the_ground_truth(demo, timelapse):
    stack, shifts = timelapse
    estimated = np.load(demo / "drift_shifts.npy")
    assert estimated.shape == shifts.shape
    assert np.abs(estimated - shifts).max() < 0.1
    summary = json.loads((demo / "summary.json").read_text())
    assert summary["drift_max_error_px"] < 0.1 and summary["drift_frames"] == len(stack)
    assert np.load(demo / "drift_corrected.npy").shape == stack.shape


def test_the_maps_match_scipy_and_scikit_image(demo, pair):
    from skimage.feature import match_template
    from skimage.metrics import structural_similarity

    fixed, moving, _ = pair
    f, m = fixed.astype(np.float64), moving.astype(np.float64)
    box = lambda x, k: ndi.uniform_filter(x, k, mode="reflect")
    std = np.sqrt(np.maximum(box(f * f, 15) - box(f, 15) ** 2, 0))
    np.testing.assert_allclose(np.load(demo / "local_std.npy"), std, atol=1e-4)
    (r, c), k = TEMPLATE_CORNER, TEMPLATE_SIZE
    zncc = match_template(f, f[r : r + k, c : c + k], pad_input=True)
    np.testing.assert_allclose(np.load(demo / "zncc.npy"), zncc, atol=1e-3)
    cov = box(f * m, 9) - box(f, 9) * box(m, 9)
    lncc = cov / np.sqrt((box(f * f, 9) - box(f, 9) ** 2) * (box(m * m, 9) - box(m, 9) ** 2))
    np.testing.assert_allclose(np.load(demo / "local_ncc.npy"), lncc, atol=1e-3)
    _, ssim = structural_similarity(
        f,
        m,
        full=True,
        gaussian_weights=True,
        sigma=1.5,
        use_sample_covariance=False,
        data_range=1.0,
    )
    np.testing.assert_allclose(np.load(demo / "ssim.npy"), ssim, atol=1e-3)


def test_every_output_the_readme_and_the_demo_name_exists_with_its_shape(demo, pair, timelapse):
    fixed = pair[0]
    stack, shifts = timelapse
    shapes = {
        "local_std.npy": fixed.shape,
        "zncc.npy": fixed.shape,
        "local_ncc.npy": fixed.shape,
        "ssim.npy": fixed.shape,
        "registered.npy": fixed.shape,
        "displacement.npy": (2, *fixed.shape),
        "drift_shifts.npy": shifts.shape,
        "drift_corrected.npy": stack.shape,
    }
    named = set(re.findall(r"([A-Za-z0-9_]+\.npy)\b", README.read_text(encoding="utf-8")))
    unknown = named - set(shapes)
    assert not unknown, f"the README names outputs this test does not know: {unknown}"
    for name, shape in shapes.items():
        array = np.load(demo / name)
        assert array.shape == shape, name
        assert np.isfinite(array).all(), name
    assert {p.name for p in demo.glob("*.npy")} == set(shapes)


def test_demo_png_is_a_readable_picture(demo):
    from PIL import Image

    with Image.open(demo / "demo.png") as image:
        assert image.format == "PNG"
        width, height = image.size
        pixels = np.asarray(image.convert("RGB"))
    assert 800 <= width <= 4000 and 600 <= height <= 4000
    assert pixels.std() > 10  # a figure, not a blank canvas


def test_the_demo_writes_the_files_the_command_protects(demo):
    # napari-simwarp demo refuses a folder where one of these is a file of the user's
    written = sorted(p.name for p in demo.iterdir() if p.name != "returncode")  # the fixture's
    assert written == sorted(_demo.OUTPUTS)
