"""Tests of ``ops.match_template`` (ops/match_template.py) against scikit-image."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from skimage.feature import match_template as sk_match_template

from napari_simwarp.ops import match_template
from tests import images

# Every test runs on the pure torch path and on the compiled kernels (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("backend")


def _as_tensor(x: np.ndarray, device, dtype=torch.float64) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(x)).to(device=device, dtype=dtype)[None, None]


def _image_and_template(kind: str, rng, shape, tshape):
    if kind == "natural":
        img = images.natural(shape) if len(shape) == 2 else images.random_smooth(rng, shape)
    elif kind == "random":
        img = images.random_smooth(rng, shape, sigma=1.0)
    else:
        img = images.microscopy(rng, shape)
    corner = tuple(n // 3 for n in shape)
    tpl = img[tuple(slice(c, c + t) for c, t in zip(corner, tshape))]
    tpl = tpl + rng.normal(0.0, 0.05 * tpl.std(), tshape)
    return img, tpl


def _reference_zncc_torch(image: torch.Tensor, template: torch.Tensor) -> torch.Tensor:
    """Straightforward float64 ZNCC, valid mode: conv sums, plain autograd."""
    conv = F.conv2d if image.dim() == 4 else F.conv3d
    t = template - template.mean()
    m = t.numel()
    ones = torch.ones_like(template)
    s1 = conv(image, ones)
    s2 = conv(image * image, ones)
    numerator = conv(image, t)
    return numerator / torch.sqrt((s2 - s1 * s1 / m) * (t * t).sum())


class TestMatchTemplate:
    def test_smoke(self, device):
        image = torch.rand(2, 3, 20, 24, device=device)
        template = torch.rand(1, 3, 5, 4, device=device)
        out = match_template(image, template)
        assert out.shape == (2, 3, 16, 21) and out.dtype == image.dtype
        assert match_template(image, template, pad_input=True).shape == image.shape
        out3 = match_template(
            torch.rand(1, 1, 9, 8, 7, device=device), torch.rand(1, 1, 3, 2, 3, device=device)
        )
        assert out3.shape == (1, 1, 7, 7, 5)
        assert out.abs().max() <= 1 + 1e-6

    @pytest.mark.parametrize("kind", ["natural", "random", "microscopy"])
    @pytest.mark.parametrize("pad_input", [False, True])
    @pytest.mark.parametrize(
        "shape, tshape",
        [
            ((64, 70), (7, 9)),
            ((64, 70), (8, 6)),
            ((20, 22, 18), (5, 3, 5)),
            ((20, 22, 18), (4, 6, 3)),
        ],
    )
    def test_against_skimage(self, device, rng, kind, pad_input, shape, tshape):
        img, tpl = _image_and_template(kind, rng, shape, tshape)
        ref = sk_match_template(img, tpl, pad_input=pad_input)
        out = match_template(_as_tensor(img, device), _as_tensor(tpl, device), pad_input=pad_input)
        assert out.shape[2:] == ref.shape
        np.testing.assert_allclose(out[0, 0].cpu().numpy(), ref, rtol=0, atol=1e-4)
        out32 = match_template(
            _as_tensor(img, device, torch.float32),
            _as_tensor(tpl, device, torch.float32),
            pad_input=pad_input,
        )
        np.testing.assert_allclose(out32[0, 0].double().cpu().numpy(), ref, rtol=0, atol=1e-3)

    def test_finds_the_template(self, device, rng):
        img, _ = _image_and_template("microscopy", rng, (80, 90), (9, 9))
        tpl = img[30:39, 50:59]
        out = match_template(
            _as_tensor(img, device, torch.float32),
            _as_tensor(tpl, device, torch.float32),
            pad_input=True,
        )
        assert np.unravel_index(int(out.argmax()), out.shape[2:]) == (34, 54)
        assert abs(float(out.max()) - 1.0) < 1e-5

    def test_broadcast_template(self, device):
        image = torch.rand(2, 3, 16, 15, dtype=torch.float64, device=device)
        template = torch.rand(1, 1, 5, 4, dtype=torch.float64, device=device)
        out = match_template(image, template)
        for n in range(2):
            for c in range(3):
                torch.testing.assert_close(
                    out[n, c], match_template(image[n : n + 1, c : c + 1], template)[0, 0]
                )
        per_channel = torch.rand(1, 3, 5, 4, dtype=torch.float64, device=device)
        out = match_template(image, per_channel)
        torch.testing.assert_close(
            out[1, 2], match_template(image[1:2, 2:3], per_channel[:, 2:3])[0, 0]
        )

    @pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
    def test_flat_window_and_template(self, device, dtype):
        image = torch.full((1, 1, 20, 20), 1000.0, dtype=dtype, device=device)
        image[..., 10:, :] += torch.rand(10, 20, dtype=dtype, device=device)
        image.requires_grad_()
        template = torch.rand(1, 1, 3, 3, dtype=dtype, device=device, requires_grad=True)
        out = match_template(image, template)
        assert (out[..., :8, :] == 0).all() and (out[..., 10:, :] != 0).any()
        grads = torch.autograd.grad(out.sum(), (image, template))
        assert all(torch.isfinite(g).all() for g in grads)
        flat_template = torch.full(
            (1, 1, 3, 3), 7.3, dtype=dtype, device=device, requires_grad=True
        )
        out = match_template(image, flat_template, pad_input=True)
        assert (out == 0).all()
        grads = torch.autograd.grad(out.sum(), (image, flat_template))
        assert all(torch.isfinite(g).all() and (g == 0).all() for g in grads)

    @pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
    def test_half_dtypes(self, device, rng, dtype):
        img, tpl = _image_and_template("random", rng, (32, 30), (5, 5))
        out = match_template(_as_tensor(img, device, dtype), _as_tensor(tpl, device, dtype))
        assert out.dtype == dtype
        ref = sk_match_template(img, tpl)
        np.testing.assert_allclose(out[0, 0].float().cpu().numpy(), ref, atol=5e-2)

    def test_noncontiguous(self, device, rng):
        img, tpl = _image_and_template("random", rng, (30, 40), (5, 7))
        image, template = _as_tensor(img, device), _as_tensor(tpl, device)
        ref = match_template(image, template)
        image_t = image.transpose(-1, -2).contiguous().transpose(-1, -2)
        template_t = template.transpose(-1, -2).contiguous().transpose(-1, -2)
        assert not image_t.is_contiguous()
        torch.testing.assert_close(match_template(image_t, template_t), ref)
        cl = image.expand(1, 3, 30, 40).contiguous(memory_format=torch.channels_last)
        torch.testing.assert_close(match_template(cl, template)[:, 1:2], ref)
        big = torch.rand(1, 1, 60, 80, dtype=torch.float64, device=device)
        sliced = big[..., ::2, ::2]
        torch.testing.assert_close(
            match_template(sliced, template), match_template(sliced.contiguous(), template)
        )

    @pytest.mark.parametrize("pad_input", [False, True])
    def test_gradcheck(self, device, pad_input):
        image = torch.rand(1, 2, 7, 6, dtype=torch.float64, device=device, requires_grad=True)
        template = torch.rand(1, 2, 3, 2, dtype=torch.float64, device=device, requires_grad=True)
        fn = lambda i, t: match_template(i, t, pad_input=pad_input)
        assert torch.autograd.gradcheck(fn, (image, template))
        image3 = torch.rand(1, 1, 5, 4, 5, dtype=torch.float64, device=device, requires_grad=True)
        template3 = torch.rand(
            1, 1, 2, 3, 3, dtype=torch.float64, device=device, requires_grad=True
        )
        assert torch.autograd.gradcheck(fn, (image3, template3))

    @pytest.mark.parametrize("kind", ["random", "microscopy"])
    def test_gradient_float32_vs_float64_reference(self, device, rng, kind):
        img, tpl = _image_and_template(kind, rng, (256, 256), (16, 16))
        upstream = torch.from_numpy(rng.standard_normal((1, 1, 241, 241))).to(device)
        image64, template64 = _as_tensor(img, device), _as_tensor(tpl, device)
        image64.requires_grad_()
        template64.requires_grad_()
        refs = torch.autograd.grad(
            _reference_zncc_torch(image64, template64), (image64, template64), upstream
        )
        image32 = _as_tensor(img, device, torch.float32).requires_grad_()
        template32 = _as_tensor(tpl, device, torch.float32).requires_grad_()
        grads = torch.autograd.grad(
            match_template(image32, template32), (image32, template32), upstream.float()
        )
        for grad, ref in zip(grads, refs):
            assert (grad.double() - ref).abs().max() < 1e-4 * ref.abs().max()

    def test_exception(self, device):
        image = torch.rand(1, 1, 10, 10, device=device)
        template = torch.rand(1, 1, 3, 3, device=device)
        with pytest.raises(TypeError, match="image must be a torch.Tensor"):
            match_template(np.zeros((1, 1, 10, 10)), template)
        with pytest.raises(TypeError, match="template must be a torch.Tensor"):
            match_template(image, np.zeros((1, 1, 3, 3)))
        with pytest.raises(ValueError, match="image must be"):
            match_template(torch.rand(10, 10, device=device), template)
        with pytest.raises(ValueError, match="template must have as many dimensions"):
            match_template(image, torch.rand(1, 1, 3, 3, 3, device=device))
        with pytest.raises(ValueError, match="template must be"):
            match_template(image, torch.rand(3, 3, device=device))
        with pytest.raises(ValueError, match="template spatial shape .* larger"):
            match_template(image, torch.rand(1, 1, 11, 3, device=device))
        with pytest.raises(ValueError, match="template's C"):
            match_template(image, torch.rand(1, 2, 3, 3, device=device))
        with pytest.raises(ValueError, match="template's N"):
            match_template(image, torch.rand(2, 1, 3, 3, device=device))
        with pytest.raises(ValueError, match="image must not be empty"):
            match_template(torch.rand(1, 0, 10, 10, device=device), template)
        for dtype in (torch.int64, torch.bool, torch.complex128):
            with pytest.raises(TypeError, match="image must be"):
                match_template(image.to(dtype), template)
            with pytest.raises(TypeError, match="template must be"):
                match_template(image, template.to(dtype))
        with pytest.raises(TypeError, match="pad_input"):
            match_template(image, template, pad_input=1)


def test_one_pixel_template_with_pad_input_leaves_the_image_untouched():
    # Nothing is padded for a 1-pixel template: the centering must not happen in place on
    # the caller's tensor (it did, and raised for leaves that require grad).
    image = torch.rand(1, 1, 12, 13, dtype=torch.float64) + 5.0
    before = image.clone()
    out = match_template(image, torch.ones(1, 1, 1, 1, dtype=torch.float64), pad_input=True)
    assert torch.equal(image, before)
    assert torch.all(out == 0)  # a 1-pixel template is flat, as in scikit-image
    leaf = image.clone().requires_grad_()
    match_template(
        leaf, torch.ones(1, 1, 1, 1, dtype=torch.float64), pad_input=True
    ).sum().backward()


# -- scikit-image's padding modes (pad_input=True) ---------------------------------------

MODES = [
    "constant",
    "edge",
    "reflect",
    "symmetric",
    "wrap",
    "linear_ramp",
    "maximum",
    "mean",
    "median",
    "minimum",
]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("shape, tshape", [((26, 31), (7, 6)), ((11, 12, 13), (4, 3, 5))])
def test_every_skimage_mode(rng, mode, shape, tshape):
    img, tpl = _image_and_template("random", rng, shape, tshape)
    img = img + 0.4  # the constant and the ramp's 0 then differ from the image
    ref = sk_match_template(img, tpl, pad_input=True, mode=mode, constant_values=0.9)
    out = match_template(
        _as_tensor(img, "cpu"),
        _as_tensor(tpl, "cpu"),
        pad_input=True,
        mode=mode,
        constant_values=0.9,
    )
    np.testing.assert_allclose(out[0, 0].numpy(), ref, rtol=0, atol=1e-6)
    if mode != "constant":  # the border matters: another mode gives another map
        other = sk_match_template(img, tpl, pad_input=True)
        assert np.abs(other - ref).max() > 1e-3
    valid = match_template(
        _as_tensor(img, "cpu"), _as_tensor(tpl, "cpu"), mode=mode, constant_values=0.9
    )
    np.testing.assert_allclose(valid[0, 0].numpy(), sk_match_template(img, tpl), atol=1e-6)


@pytest.mark.parametrize("mode", ["edge", "median", "linear_ramp"])
def test_modes_are_differentiable(mode):
    gen = torch.Generator().manual_seed(3)
    image = torch.rand(1, 1, 9, 8, generator=gen, dtype=torch.float64, requires_grad=True)
    template = torch.rand(1, 1, 3, 4, generator=gen, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda i, t: match_template(i, t, pad_input=True, mode=mode), (image, template)
    )


@pytest.mark.parametrize(
    "mode, nan_rows", [("constant", [0, 1, 2]), ("edge", [0, 1, 2]), ("wrap", [0, 1, 2, 10, 11])]
)
def test_a_nan_pixel_reaches_the_windows_that_see_it_or_its_copies(mode, nan_rows):
    image = torch.rand(1, 1, 12, 12, dtype=torch.float64)
    image[0, 0, 0, 5] = float("nan")
    out = match_template(
        image, torch.rand(1, 1, 5, 3, dtype=torch.float64), pad_input=True, mode=mode
    )
    rows = torch.isnan(out[0, 0]).any(1).nonzero().flatten().tolist()
    assert rows == nan_rows


def test_mode_checks():
    image, template = torch.rand(1, 1, 10, 10), torch.rand(1, 1, 3, 3)
    with pytest.raises(ValueError, match="'nearest' is SciPy's name.*'edge' is the same"):
        match_template(image, template, pad_input=True, mode="nearest")
    with pytest.raises(ValueError, match="mode must be one of"):
        match_template(image, template, pad_input=True, mode="empty")
    with pytest.raises(TypeError, match="constant_values must be a number"):
        match_template(image, template, pad_input=True, constant_values=(0, 1))


# -- float32 transforms, block by block (ops/_blocked_cc.py) --------------------------------


def _microscopy_uint16(rng, shape):
    """uint16-like camera data: offset 1000, a smooth texture of a few tens of counts."""
    return np.round(1000.0 + 20.0 * images.random_smooth(rng, shape, sigma=3.0))


@pytest.mark.parametrize("kind", ["microscopy", "uint16"])
def test_float32_blocks_agree_with_skimage_float64_on_offset_data(rng, kind):
    # 300 x 280 with a 16 x 12 template: several blocks per axis, the last ones extended.
    shape, tshape = (300, 280), (16, 12)
    img = images.microscopy(rng, shape) if kind == "microscopy" else _microscopy_uint16(rng, shape)
    img = img.astype(np.float32)
    tpl = img[100 : 100 + tshape[0], 40 : 40 + tshape[1]].copy()
    out = match_template(
        _as_tensor(img, "cpu", torch.float32), _as_tensor(tpl, "cpu", torch.float32)
    )
    ref = sk_match_template(img.astype(np.float64), tpl.astype(np.float64))
    assert out.dtype == torch.float32
    np.testing.assert_allclose(out[0, 0].numpy(), ref, rtol=0, atol=1e-5)


def test_blocks_float32_cannot_resolve_are_redone_in_float64(rng, monkeypatch):
    from napari_simwarp.ops import _blocked_cc

    redone = []
    redo = _blocked_cc._redo
    monkeypatch.setattr(_blocked_cc, "_redo", lambda s, r, *a: redone.append(r) or redo(s, r, *a))
    image = rng.random((300, 260)).astype(np.float32)
    image[:150] *= 1e4  # a bright half beside a dark one
    tpl = image[280:289, 5:16].copy()  # from the dark half
    image_t = _as_tensor(image, "cpu", torch.float32).requires_grad_()
    out = match_template(image_t, _as_tensor(tpl, "cpu", torch.float32))
    ref = sk_match_template(image.astype(np.float64), tpl.astype(np.float64))
    assert redone and 0 < redone[0].numel() < out.numel()  # some blocks, not all
    np.testing.assert_allclose(out[0, 0].detach().numpy(), ref, rtol=0, atol=1e-5)
    # The gradient through the redone blocks against float64 autograd.
    v = torch.from_numpy(rng.standard_normal(out.shape[2:]).astype(np.float32))[None, None]
    (grad,) = torch.autograd.grad((out * v).sum(), image_t)
    image64 = _as_tensor(image, "cpu").requires_grad_()
    ref_t = _reference_zncc_torch(image64 - image64.detach().mean(), _as_tensor(tpl, "cpu"))
    (grad64,) = torch.autograd.grad((ref_t * v.double()).sum(), image64)
    dark = (slice(None), slice(None), slice(160, None))  # the bright half's gradient is tiny
    assert (grad[dark].double() - grad64[dark]).abs().max() < 1e-3 * grad64[dark].abs().max()


@pytest.mark.usefixtures("float32_moments")
@pytest.mark.parametrize("kind", ["microscopy", "uint16"])
def test_gpu_policy_float32_within_1e4_of_skimage_float64(rng, kind):
    # The GPU's rule (float32 throughout, no float64 redo) forced on the CPU.
    shape, tshape = (300, 280), (16, 12)
    img = images.microscopy(rng, shape) if kind == "microscopy" else _microscopy_uint16(rng, shape)
    img = img.astype(np.float32)
    tpl = img[100 : 100 + tshape[0], 40 : 40 + tshape[1]].copy()
    out = match_template(
        _as_tensor(img, "cpu", torch.float32), _as_tensor(tpl, "cpu", torch.float32)
    )
    ref = sk_match_template(img.astype(np.float64), tpl.astype(np.float64))
    np.testing.assert_allclose(out[0, 0].numpy(), ref, rtol=0, atol=1e-4)
    assert out[0, 0, 100, 40] == pytest.approx(1.0, abs=1e-5)


@pytest.mark.usefixtures("float32_moments")
def test_gpu_policy_scores_windows_float32_cannot_resolve_as_flat(rng):
    image = rng.random((300, 260)).astype(np.float32)
    image[:150] *= 1e4  # a bright half beside a dark one
    tpl = image[280:289, 5:16].copy()
    out = match_template(
        _as_tensor(image, "cpu", torch.float32), _as_tensor(tpl, "cpu", torch.float32)
    )
    ref = sk_match_template(image.astype(np.float64), tpl.astype(np.float64))
    out = out[0, 0].numpy()
    scored = out != 0  # the rest is flat by design: noise in float32
    assert scored.mean() > 0.5
    np.testing.assert_allclose(out[scored], ref[scored], rtol=0, atol=1e-4)
    assert out[280, 5] == pytest.approx(1.0, abs=1e-5)


@pytest.mark.parametrize(
    "shape, tshape", [((300, 280), (16, 12)), ((260, 300), (9, 16)), ((70, 60, 72), (5, 6, 4))]
)
def test_packed_blocks_equal_one_transform_per_block(rng, shape, tshape):
    # The CPU's route without autograd transforms two blocks per complex FFT; the numerator
    # must be the per-block real transforms' (odd and even block counts, 2-D and 3-D), and
    # each block's noise scale the norm of its pair.
    from napari_simwarp.ops import _blocked_cc

    y = torch.from_numpy(images.microscopy(rng, shape)).float()[None, None] / 2048
    tpl = torch.from_numpy(rng.standard_normal(tshape))[None, None]
    unit = ((tpl - tpl.mean()) / (tpl - tpl.mean()).norm()).float()
    out_shape = [n - t + 1 for n, t in zip(shape, tshape)]
    grid = _blocked_cc.block_grid(out_shape, tshape)
    assert grid.counts[-1] > 1
    packed, pair_norm = _blocked_cc._packed_numerator(y, unit, grid)
    centered, norm = _blocked_cc._center_blocks(
        grid.tiles(_blocked_cc._extend(y, grid)), len(shape)
    )
    spectrum = _blocked_cc._template_spectrum(unit, grid)
    plain = grid.untile(_blocked_cc._numerator(centered, spectrum, grid))
    assert packed.shape == plain.shape == (1, 1, *out_shape)
    scale = float(norm.max())
    assert (packed - plain).abs().max() < 1e-5 * scale
    # pair norms: blocks 2j and 2j + 1 along the last block axis share sqrt(n² + n'²)
    flat = norm.flatten(-len(shape))[..., 0]
    n_last = flat.shape[-1]
    for j in range(n_last):
        mate = j ^ 1 if (j ^ 1) < n_last else None
        expected = flat[..., j] if mate is None else torch.hypot(flat[..., j], flat[..., mate])
        got = pair_norm.flatten(-len(shape))[..., 0][..., j]
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=0)
