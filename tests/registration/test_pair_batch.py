"""register() on a batch of pairs: one run, one result per pair, each as a run of its own
would give it (compared with one-by-one runs and with the known transforms)."""

import numpy as np
import pytest
from scipy import ndimage as ndi

from napari_simwarp.registration import register, register_iter
from tests.registration.cases import affine_pair, centered_affine, corner_error, deformed_pair


def _rotation(deg, scale=1.0):
    th = np.deg2rad(deg)
    return scale * np.array([[np.cos(th), -np.sin(th)], [np.sin(th), np.cos(th)]])


@pytest.fixture(scope="module")
def affine_pairs():
    """Three pairs of one shape with different known matrices."""
    shape = (96, 96)
    cases = []
    for seed, (deg, scale, shift) in enumerate([(4, 1.03, (3, -2)), (-7, 0.97, (-4, 1)),
                                                (2, 1.0, (1.5, 5))]):  # fmt: skip
        m = centered_affine(_rotation(deg, scale), shift, shape)
        fixed, moving = affine_pair(np.random.default_rng(seed), shape, m)
        cases.append((fixed, moving, m))
    return cases


def test_a_batch_of_affine_pairs_gives_each_pair_its_own_run(affine_pairs):
    fixed = [c[0] for c in affine_pairs]
    moving = [c[1] for c in affine_pairs]
    batch = register(fixed, moving, model="affine")
    assert isinstance(batch, list) and len(batch) == 3
    for result, (f, m, truth) in zip(batch, affine_pairs):
        alone = register(f, m, model="affine")
        assert corner_error(result.transform.matrix, truth, f.shape) < 0.05
        # the same answer as a run of the pair alone, well within its error
        assert corner_error(result.transform.matrix, alone.transform.matrix, f.shape) < 0.02
        assert result.warped.shape == f.shape
        np.testing.assert_allclose(result.similarity, alone.similarity, atol=2e-3)
        np.testing.assert_allclose(result.initial_similarity, alone.initial_similarity, atol=1e-6)


def test_a_batch_of_deformable_pairs_matches_one_by_one_runs():
    shape = (64, 64)
    cases = [deformed_pair(np.random.default_rng(s), shape, amplitude=1.5) for s in (1, 2)]
    kwargs = dict(model="deformable", levels=2, iterations=40)
    batch = register([c[0] for c in cases], [c[1] for c in cases], **kwargs)
    inner = (slice(None), slice(6, -6), slice(6, -6))
    for result, (f, m, truth) in zip(batch, cases):
        alone = register(f, m, **kwargs).transform.to_displacement(shape)
        field = result.transform.to_displacement(shape)
        error = np.abs(alone - truth)[inner].mean()
        assert np.abs(field - truth)[inner].mean() < 1.5 * error + 0.01
        assert np.abs(field - alone)[inner].mean() < 0.5 * error + 0.01


def test_one_template_against_many_samples(affine_pairs):
    """One fixed image for every moving image (and the reverse): the single side is shared,
    and each pair's answer is its own run's."""
    f, m, truth = affine_pairs[0]
    shifted = centered_affine(np.eye(2), (2.0, -3.0), f.shape)
    m2 = affine_pair(np.random.default_rng(0), f.shape, shifted)[1]  # fixed is the same
    results = register(f, [m, m2], model="affine")
    assert corner_error(results[0].transform.matrix, truth, f.shape) < 0.05
    assert corner_error(results[1].transform.matrix, shifted, f.shape) < 0.05
    back = register([m, m2], f, model="translation")
    for result, moving_image in zip(back, [m, m2]):
        alone = register(moving_image, f, model="translation")
        np.testing.assert_allclose(result.transform.matrix, alone.transform.matrix, atol=2e-3)
        np.testing.assert_allclose(result.warped, alone.warped, atol=1e-3)


def test_progress_carries_one_transform_per_pair_and_stop_keeps_the_batch(affine_pairs):
    fixed = [c[0] for c in affine_pairs]
    moving = [c[1] for c in affine_pairs]
    run = register_iter(fixed, moving, model="affine", optimizer="adam", iterations=50)
    progress = next(run)
    assert len(progress.transforms) == 3
    with pytest.raises(StopIteration) as info:
        run.send(True)
    results = info.value.value
    assert len(results) == 3 and all(r.stopped for r in results)


def test_per_pair_masks_and_inits_reach_their_pair(affine_pairs):
    """Each pair takes its own mask and its own start: the similarity of the masked pair is
    measured where its mask is (a corrupted band left out scores higher than counted), and
    the pair started at the truth reports its start as aligned."""
    f, m, truth = affine_pairs[1]
    corrupted = m.copy()
    corrupted[:30] = np.random.default_rng(5).random((30, m.shape[1]))
    mask = np.ones(f.shape, bool)
    mask[:40] = False
    masked, unmasked = register([f, f], [corrupted, corrupted], model="affine", mask=[mask, None])
    assert masked.similarity > unmasked.similarity + 0.05
    assert corner_error(masked.transform.matrix, truth, f.shape) < 0.1
    started, searched = register([f, f], [m, m], model="affine", init=[truth, None])
    assert started.initial_similarity > 0.99 > searched.initial_similarity + 0.05
    for r in (started, searched):
        assert corner_error(r.transform.matrix, truth, f.shape) < 0.05


def test_a_pair_given_no_start_is_searched_when_another_pair_has_one():
    """init=[M, None, None]: the pairs without a start get the rotation and shift search a
    run of their own gives them (25° and a 22 px shift are beyond the pyramid's reach)."""
    shape = (96, 96)
    truths = [
        centered_affine(np.eye(2), (1.0, 1.0), shape),
        centered_affine(_rotation(25), (0.0, 0.0), shape),
        centered_affine(np.eye(2), (22.0, -20.0), shape),
    ]
    pairs = [affine_pair(np.random.default_rng(10 + i), shape, t) for i, t in enumerate(truths)]
    results = register(
        [p[0] for p in pairs], [p[1] for p in pairs], model="rigid", init=[truths[0], None, None]
    )
    for result, truth in zip(results, truths):
        assert corner_error(result.transform.matrix, truth, shape) < 0.05


def test_a_batch_on_two_grids_starts_each_pair_at_the_grids_identity():
    """Moving images of another pixel size and origin: a pair the search leaves alone
    starts at the grids' identity (not the pixel identity), as its own run does."""
    from napari_simwarp.registration.grid import Grid

    rng = np.random.default_rng(3)
    fixed = [affine_pair(rng, (96, 96), np.eye(3))[0] for _ in range(2)]
    fixed_grid, moving_grid = Grid((1.0, 1.0), (0.0, 0.0)), Grid((2.0, 2.0), (0.5, 0.5))
    # the moving images: the fixed ones sampled on the moving grid (pixel p at 2p + 0.5),
    # the second also turned by 20° about the center (found only by the search)
    onto = fixed_grid.to_pixels() @ moving_grid.to_physical()
    turn = centered_affine(_rotation(20), (0.0, 0.0), (96, 96))
    moving = []
    for f, extra in zip(fixed, [np.eye(3), turn]):
        m = extra @ onto
        moving.append(ndi.affine_transform(f, m[:2, :2], m[:2, 2], (48, 48), order=3))
    kwargs = dict(model="rigid", moving_spacing=(2.0, 2.0), moving_origin=(0.5, 0.5))
    batch = register(fixed, moving, **kwargs)
    assert batch[0].similarity > 0.99 and not batch[0].warnings  # (87 px off before the fix)
    for result, f, m in zip(batch, fixed, moving):
        alone = register(f, m, **kwargs)
        np.testing.assert_allclose(
            result.transform.physical_matrix, alone.transform.physical_matrix, atol=0.02
        )


@pytest.mark.parametrize(
    "fixed_n,moving_n,kwargs,match",
    [
        (2, 3, {}, "fixed has 2 images and moving 3"),
        (2, 2, {"mask": [None, None, None]}, "mask holds 3 entries for 2 pairs"),
        (2, 2, {"init": [None]}, "init holds 1 entries for 2 pairs"),
        (2, 2, {"landmarks": (np.zeros((3, 2)), np.zeros((3, 2)))}, "landmarks apply to one"),
    ],
)
def test_batch_errors_name_the_argument(affine_pairs, fixed_n, moving_n, kwargs, match):
    f, m, _ = affine_pairs[0]
    with pytest.raises(ValueError, match=match):
        register([f] * fixed_n, [m] * moving_n, model="affine", **kwargs)


def test_images_of_a_batch_must_share_a_shape(affine_pairs):
    f, m, _ = affine_pairs[0]
    with pytest.raises(ValueError, match=r"moving\[1\] \(80, 96\)"):
        register([f, f], [m, m[:80]], model="affine")
    with pytest.raises(ValueError, match="empty sequence"):
        register([], [m])
    with pytest.raises(ValueError, match=r"fixed\[1\] contains NaN"):
        register([f, np.full_like(f, np.nan)], [m, m])


def test_a_nested_list_of_numbers_is_one_image_not_a_batch():
    rng = np.random.default_rng(0)
    image = rng.random((40, 40))
    result = register(image.tolist(), image, model="translation", levels=1)
    assert not isinstance(result, list)
    assert np.abs(result.transform.translation).max() < 0.05


def test_each_pair_reports_its_own_loss_history(affine_pairs):
    """The batch's result i holds pair i's losses, not the batch's mean: its last loss is
    its own final loss, and the pairs' histories differ."""
    fixed = [c[0] for c in affine_pairs[:2]]
    moving = [c[1] for c in affine_pairs[:2]]
    results = register(fixed, moving, model="affine", optimizer="adam", iterations=20, levels=2)
    alone = [register(f, m, model="affine", optimizer="adam", iterations=20, levels=2)
             for f, m in zip(fixed, moving)]  # fmt: skip
    a, b = (r.loss_history for r in results)
    assert len(a) == len(b) and a != b
    for result, single in zip(results, alone):
        np.testing.assert_allclose(result.loss_history[0], single.loss_history[0], rtol=1e-5)
        assert min(result.loss_history) == pytest.approx(min(single.loss_history), rel=0.05)


def test_a_batch_names_the_pair_in_its_warnings(affine_pairs):
    f, m, _ = affine_pairs[0]
    noise = np.random.default_rng(9).random(f.shape)
    with pytest.warns(UserWarning, match=r"^pair 1: "):
        results = register([f, f], [m, noise], model="translation")
    assert not results[0].warnings and results[1].warnings[0].startswith("pair 1: ")


def test_a_list_of_planes_is_a_batch_and_a_mismatch_says_so(affine_pairs):
    f, m, _ = affine_pairs[0]
    with pytest.raises(ValueError, match="a list of images is a batch of pairs"):
        register([f, f], np.stack([m, m]), model="translation")
