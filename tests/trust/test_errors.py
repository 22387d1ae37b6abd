"""Class "raw errors": every invalid value gets one message naming it, never a traceback
from deep inside, and messages say what is true."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from napari_simwarp import load_transform, register, register_stack
from napari_simwarp.registration import AffineTransform, DisplacementTransform


@pytest.fixture(scope="module")
def images():
    from scipy import ndimage as ndi

    rng = np.random.default_rng(5)
    f = ndi.gaussian_filter(rng.random((48, 48)), 2)
    return f, np.roll(f, 2, axis=0)


@pytest.mark.parametrize(
    "options,error,words",
    [
        (dict(regularization=-0.1, model="deformable"), ValueError, "regularization"),
        (dict(regularization=float("nan"), model="deformable"), ValueError, "regularization"),
        (dict(grid_spacing=0, model="deformable"), ValueError, "grid_spacing"),
        (dict(grid_spacing=-4.0, model="deformable"), ValueError, "grid_spacing"),
        (dict(levels=0), ValueError, "levels"),
        (dict(levels=2.5), TypeError, "levels"),
        (dict(steps=10**9, model="diffeomorphic"), ValueError, "steps"),
        (dict(steps=-1, model="diffeomorphic"), ValueError, "steps"),
        (dict(lr=0), ValueError, "lr"),
        (dict(lr=float("inf")), ValueError, "lr"),
        (dict(tol=-1), ValueError, "tol"),
        (dict(iterations=-5), ValueError, "iterations"),
        (dict(window=0), ValueError, "window"),
        (dict(window=float("nan")), ValueError, "window"),
        (
            dict(fixed_spacing=(1.0, 1.0, 1.0)),
            ValueError,
            "fixed_spacing must have one value per axis",
        ),
        (dict(fixed_spacing=(0.0, 1.0)), ValueError, "fixed_spacing must be positive"),
        (dict(moving_spacing=-0.5), ValueError, "moving_spacing must be positive"),
        (dict(moving_spacing=(1.0, float("nan"))), ValueError, "moving_spacing must be finite"),
        (dict(fixed_origin=(1.0,)), ValueError, "fixed_origin must have one value per axis"),
        (dict(moving_origin="far"), TypeError, "moving_origin"),
        (dict(report_every=0), ValueError, "report_every"),
        (dict(init=np.eye(4)), ValueError, "init"),
        (dict(init=np.zeros((2, 10, 10)), model="deformable"), ValueError, "init"),
        (dict(init=np.full((3, 3), np.nan)), ValueError, "init"),
        (dict(mask=np.full((48, 48), np.nan)), ValueError, "mask"),
        (dict(mask=np.zeros((48, 48))), ValueError, "mask"),
        (dict(mask=np.ones((10, 10))), ValueError, "mask"),
        (dict(model="rigidd"), ValueError, "model"),
        (dict(metric="xcorr"), ValueError, "metric"),
        (dict(optimizer="sgd"), ValueError, "optimizer"),
        (dict(device="mps"), ValueError, "mps"),
        (dict(device="tpu"), ValueError, "device"),
    ],
)
def test_invalid_registration_options_name_themselves(images, options, error, words):
    with pytest.raises(error, match=words):
        register(*images, **options)


@pytest.mark.parametrize(
    "options,words",
    [
        (dict(batch_size=0), "batch_size"),
        (dict(batch_size=2.5), "batch_size"),
        (dict(reference="last"), "reference"),
        (dict(reference=7), "reference"),
        (dict(grid_spacing=0, model="deformable"), "grid_spacing"),
    ],
)
def test_invalid_stack_options_name_themselves(images, options, words):
    with pytest.raises(ValueError, match=words):
        register_stack(np.stack([images[0], images[1], images[0]]), **options)


def test_values_beyond_float32_are_not_called_nan(images):
    """float64 data near 1e300 is registered as the same data near 1 (intensity scale
    does not matter), and comes back in float64, finite."""
    fixed, moving = (x.astype(np.float64) * 1e300 for x in images)
    result = register(fixed, moving, model="translation")
    plain = register(*images, model="translation")
    np.testing.assert_allclose(result.transform.matrix, plain.transform.matrix, atol=1e-5)
    assert result.warped.dtype == np.float64 and np.isfinite(result.warped).all()
    np.testing.assert_allclose(result.warped / 1e300, plain.warped, rtol=1e-5, atol=1e-9)


def test_the_memory_message_names_only_options_register_takes(images, monkeypatch):
    from napari_simwarp.registration import _inputs

    monkeypatch.setattr(_inputs, "available_memory", lambda device: 1000)
    with pytest.raises(MemoryError) as info:
        register(*images)
    assert "batch_size" not in str(info.value) and "GiB" in str(info.value)


@pytest.mark.parametrize(
    "array,error,words",
    [
        (np.ones((8, 8), complex), TypeError, "real"),
        (np.array([["a"] * 8] * 8), TypeError, "numbers"),
        (np.zeros((0, 8)), ValueError, "empty"),
        (np.zeros(8), ValueError, "dimensions"),
    ],
)
def test_transform_apply_refuses_what_it_cannot_resample(array, error, words):
    for transform in (AffineTransform(np.eye(3)), DisplacementTransform(np.zeros((2, 8, 8)))):
        with pytest.raises(error, match=words):
            transform.apply(array)


@pytest.mark.parametrize(
    "content,words",
    [
        (b"", "empty"),
        (b"not a zip at all", "not a .npz"),
        ("TRUNCATED", "cannot be read"),
        ("NOHEADER", "no header"),
        ("INCOMPLETE", "incomplete"),
        ("UNKNOWN", "unknown transform"),
    ],
)
def test_load_transform_names_the_file_and_what_is_wrong(tmp_path, content, words):
    path = tmp_path / "t.npz"
    good = AffineTransform(np.eye(3)).save(tmp_path / "good.npz").read_bytes()
    if content == "TRUNCATED":
        content = good[: len(good) // 2]
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content == "NOHEADER":
        np.savez(path, matrix=np.eye(3))
    else:
        kind = "affine" if content == "INCOMPLETE" else "spline"
        np.savez(path, header=np.array(json.dumps({"kind": kind})))
    with pytest.raises(ValueError, match=words) as info:
        load_transform(path)
    assert str(path) in str(info.value)
    with pytest.raises(FileNotFoundError):
        load_transform(tmp_path / "missing.npz")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    from skimage import io

    folder = tmp_path_factory.mktemp("files")
    image = (np.random.default_rng(0).random((40, 40)) * 255).astype(np.uint8)
    io.imsave(folder / "good.png", image, check_contrast=False)
    np.save(folder / "empty.npy", np.zeros((0, 3)))
    (folder / "corrupt.png").write_bytes(b"\x89PNG\r\n\x1a\n broken")
    (folder / "notes.xyz").write_text("hello")
    (folder / "adir").mkdir()
    np.save(folder / "objects.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    (folder / "text.npy").write_text("hello")
    return folder


@pytest.mark.parametrize(
    "argv,words",
    [
        (["register", "good.png", "empty.npy", "-o", "o.tif"], "empty"),
        (["register", "good.png", "corrupt.png", "-o", "o.tif"], "could not be read as PNG"),
        (["register", "good.png", "notes.xyz", "-o", "o.tif"], "unsupported type"),
        (["register", "good.png", "adir", "-o", "o.tif"], "directory"),
        (["register", "good.png", "objects.npy", "-o", "o.tif"], "could not be read"),
        (["register", "good.png", "text.npy", "-o", "o.tif"], "not a NumPy .npy file"),
        (["register-stack", "text.npy", "-o", "o.npy"], "not a NumPy .npy file"),
        (["register", "good.png", "missing.tif", "-o", "o.tif"], "does not exist"),
        (["register", "good.png", "good.png", "-o", "o.tif", "--lr", "fast"], "--lr"),
        (["register", "good.png", "good.png", "-o", "o.tif", "--levels", "-2"], "--levels"),
        (["register", "good.png", "good.png", "-o", "o.tif", "--model", "wobbly"], "--model"),
        (["register", "good.png", "good.png", "-o", "o.png", "--dtype", "float32"], "PNG"),
        (["register", "good.png", "good.png", "-o", "adir"], "unsupported output type"),
    ],
)
def test_cli_errors_are_one_line_with_status_2(files, argv, words):
    result = subprocess.run(
        [sys.executable, "-m", "napari_simwarp._cli", *argv],
        cwd=files,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "SIMWARP_BACKEND": "torch"},
    )
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stderr
    assert len(lines) == 1 and words in lines[0] and "Traceback" not in result.stderr
    assert sorted(p.name for p in files.iterdir()) == sorted(
        ["good.png", "empty.npy", "corrupt.png", "notes.xyz", "adir", "objects.npy", "text.npy"]
    )


# -- thin images and deep pyramids (issue 28): torch.gradient refused an axis of 1 pixel --


def _smooth_line(shape, shift, seed=1):
    """A smooth random image of ``shape`` and a copy shifted by ``shift`` pixels (SciPy's
    cubic spline shift: the reference)."""
    from scipy import ndimage as ndi

    rng = np.random.default_rng(seed)
    image = ndi.gaussian_filter(rng.random(shape), 3.0, mode="wrap").astype(np.float32)
    image = (image - image.min()) / np.ptp(image)
    return image, ndi.shift(image, shift, order=3, mode="nearest")


@pytest.mark.parametrize(
    "shape, shift",
    [((1, 96), (0, 2.4)), ((96, 1), (-1.8, 0)), ((1, 40, 40), (0, 1.5, -2.0))],
)
def test_thin_images_register_by_translation(shape, shift):
    fixed, moving = _smooth_line(shape, shift)
    found = register(fixed, moving, model="translation").transform.translation
    np.testing.assert_allclose(found, shift, atol=0.05)


def test_a_stack_of_thin_frames_is_drift_corrected():
    fixed, moving = _smooth_line((1, 96), (0, 2.4))
    _, back = _smooth_line((1, 96), (0, -1.5))
    result = register_stack(np.stack([fixed, moving, back]))
    np.testing.assert_allclose(result.shifts, [[0, 0], [0, 2.4], [0, -1.5]], atol=0.05)


def test_a_deep_pyramid_finds_the_shift_or_says_how_many_levels_fit():
    """levels=12 on 64² raised torch.gradient's error; a translation copes, a rigid fit on
    the 2 x 2 coarsest level rotated the image by 0.48 rad and never came back."""
    fixed, moving = _smooth_line((64, 64), (1.7, -2.2))
    found = register(fixed, moving, model="translation", levels=12).transform.translation
    np.testing.assert_allclose(found, (1.7, -2.2), atol=0.05)
    with pytest.raises(ValueError, match=r"levels=12 shrinks .*\(1, 1\).* use levels <= 5"):
        register(fixed, moving, model="rigid", levels=12)
    found = register(fixed, moving, model="rigid", levels=5).transform.translation
    np.testing.assert_allclose(found, (1.7, -2.2), atol=0.05)
    with pytest.raises(ValueError, match="levels=12 shrinks"):
        register_stack(np.stack([fixed, moving]), model="affine", levels=12)


@pytest.mark.parametrize("model", ["rigid", "similarity", "affine"])
def test_rotations_across_an_axis_of_one_pixel_are_refused(model):
    """A 1 x 96 line registered rigidly came back shifted 4.4 px off its own row."""
    fixed, moving = _smooth_line((1, 96), (0, 2.4))
    with pytest.raises(ValueError, match=f"model='{model}' needs at least 2 pixels .*fixed"):
        register(fixed, moving, model=model)
    with pytest.raises(ValueError, match=f"model='{model}' needs at least 2 pixels .*frames"):
        register_stack(np.stack([fixed, moving]), model=model)
