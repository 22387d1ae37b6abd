"""register_stack's frame batches as dask.distributed tasks: a two-worker LocalCluster gives
the local run's transforms (to float rounding) for every reference and route, the batches
really run on both workers, a stop cancels the tasks, and (with worker processes) the
frames are read on the workers from a Zarr store or a TIFF file by path."""

from collections import Counter

import numpy as np
import pytest

da = pytest.importorskip("dask.array")  # the [large] extra

distributed = pytest.importorskip("distributed")

from napari_simwarp.registration import _batches, register_stack  # noqa: E402
from tests.registration.cases import shifted_stack  # noqa: E402

T, SIDE = 9, 48


@pytest.fixture(scope="module")
def case():
    stack, truth = shifted_stack(np.random.default_rng(7), (SIDE, SIDE), T, max_shift=3.0)
    stack = (stack * 1000 + 300).astype(np.uint16)  # as a microscope gives it
    return stack, truth


@pytest.fixture(scope="module")
def client():
    # threads (processes=False) keep CI light; pickling is exercised by the process test
    with (
        distributed.LocalCluster(
            n_workers=2, threads_per_worker=1, processes=False, dashboard_address=":0"
        ) as cluster,
        distributed.Client(cluster) as c,
    ):
        yield c


def _lazy(stack):
    return da.from_array(stack, chunks=(1, SIDE, SIDE))


def _matrices(result):
    return np.stack([np.asarray(t.to_displacement((SIDE, SIDE))) for t in result.transforms])


def _ran(stream) -> Counter:
    """Batch tasks per worker in a task stream."""
    jobs = [d for d in stream.data if str(d["key"]).startswith("_run_job")]
    return Counter(d["worker"] for d in jobs)


CASES = [
    {"model": "translation", "reference": "first"},
    {"model": "translation", "reference": "previous"},
    {"model": "translation", "reference": "mean"},
    {"model": "translation", "reference": 4},
    {"model": "rigid", "reference": "first"},
    {"model": "rigid", "reference": "previous"},
    {"model": "rigid", "reference": "mean"},
    {"model": "deformable", "reference": "previous", "iterations": 5, "levels": 1},
]


@pytest.mark.parametrize("options", CASES, ids=lambda o: f"{o['model']}-{o['reference']}")
def test_cluster_run_equals_the_local_run(case, client, options, monkeypatch):
    stack, truth = case
    with monkeypatch.context() as m:  # the same lazy stack, run here
        m.setattr(_batches, "active_client", lambda: None)
        local = register_stack(_lazy(stack), batch_size=2, **options)
    with distributed.get_task_stream(client) as stream:
        remote = register_stack(_lazy(stack), batch_size=2, **options)
    ran = _ran(stream)
    batches = -(-(T - (options["reference"] == "previous")) // 2)
    # every batch a task on the workers, not here (which worker is the scheduler's choice:
    # batches waiting on a shared future may all be placed beside it)
    assert sum(ran.values()) >= batches, ran
    np.testing.assert_allclose(_matrices(remote), _matrices(local), atol=1e-4)
    np.testing.assert_allclose(remote.frame_similarity, local.frame_similarity, atol=1e-5)
    assert remote.stopped is False and len(remote.transforms) == T
    if options["model"] == "translation":  # and both are right (the shifts are known)
        origin = 4 if options["reference"] == 4 else 0
        shifts, expected = remote.shifts - remote.shifts[origin], truth - truth[origin]
        tol = 0.15 if options["reference"] == "mean" else 0.1
        assert np.median(np.linalg.norm(shifts - expected, axis=1)) < tol


def test_a_stop_cancels_the_batches_not_finished(case, client):
    stack, _ = case
    seen = []
    with distributed.get_task_stream(client) as stream:
        result = register_stack(
            _lazy(stack), batch_size=1, callback=lambda p: seen.append(p) or True
        )
    assert result.stopped and len(seen) == 1 and len(result.transforms) == T
    done = seen[0].frames.start  # the finished batch reported keeps its transform
    np.testing.assert_allclose(result.transforms[done].matrix, seen[0].transforms[0].matrix)
    identity = [t for t in range(T) if np.allclose(result.transforms[t].matrix, np.eye(3))]
    assert len(identity) >= 3, identity  # frames whose tasks were cancelled keep the identity
    assert sum(_ran(stream).values()) < T


def test_a_stack_that_cannot_be_sent_runs_here_with_a_warning(case, client, monkeypatch):
    stack, _ = case
    monkeypatch.setattr(_batches, "GRAPH_ARRAY_BYTES", 0)  # any array in the graph: "pixels"
    with (
        distributed.get_task_stream(client) as stream,
        pytest.warns(RuntimeWarning, match="not on the dask workers"),
    ):
        result = register_stack(_lazy(stack), batch_size=2)
    assert sum(_ran(stream).values()) == 0 and len(result.transforms) == T


def test_worker_processes_read_a_zarr_store_and_a_tiff_by_path(case, tmp_path):
    import tifffile

    from napari_simwarp import _cli
    from napari_simwarp.registration import load_transform
    from napari_simwarp.registration.cli import stack_transforms_path

    stack, truth = case
    da.to_zarr(_lazy(stack), str(tmp_path / "s.zarr"))
    tifffile.imwrite(tmp_path / "s.tif", stack)
    lazy = da.from_zarr(str(tmp_path / "s.zarr"))
    local = register_stack(lazy, batch_size=2, reference="previous")
    argv = ["register-stack", str(tmp_path / "s.tif"), "--batch-size", "2", "--quiet"]
    assert _cli.main([*argv, "-o", str(tmp_path / "local.zarr")]) == 0
    with (
        distributed.LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0"
        ) as cluster,
        distributed.Client(cluster) as c,
    ):
        # every batch a task on the workers (which worker is the scheduler's choice: a
        # batch waiting on another's result may be placed beside it)
        batches = -(-(T - 1) // 2)
        with distributed.get_task_stream(c) as stream:
            remote = register_stack(lazy, batch_size=2, reference="previous")
        assert sum(_ran(stream).values()) >= batches
        out = tmp_path / "remote.zarr"
        with distributed.get_task_stream(c) as stream:
            code = _cli.main([*argv, "-o", str(out), "--scheduler", cluster.scheduler_address])
        assert code == 0 and sum(_ran(stream).values()) >= batches
    np.testing.assert_allclose(_matrices(remote), _matrices(local), atol=1e-4)
    shifts = remote.shifts - remote.shifts[0]
    assert np.median(np.linalg.norm(shifts - (truth - truth[0]), axis=1)) < 0.1

    def saved(name):
        folder = stack_transforms_path(tmp_path / f"{name}.zarr")
        files = sorted(folder.glob("frame_*.transform.npz"))
        return np.stack([load_transform(f).matrix for f in files])

    assert len(saved("remote")) == T
    np.testing.assert_allclose(saved("remote"), saved("local"), atol=1e-4)


def test_a_task_budget_is_a_share_of_a_worker_memory_limit(case):
    import torch

    from napari_simwarp.registration._frames import FrameSource
    from napari_simwarp.registration._stack_memory import _budgets

    src = FrameSource(_lazy(case[0]), torch.device("cpu"))
    with (
        distributed.LocalCluster(
            n_workers=1,
            threads_per_worker=2,
            processes=False,
            memory_limit="1GiB",
            dashboard_address=":0",
        ) as cluster,
        distributed.Client(cluster),
    ):
        runner = _batches.runner_for(src, "cpu")
        ram, _ = _budgets(None, torch.device("cpu"), runner)
        given, _ = _budgets("3GiB", torch.device("cpu"), runner)
    assert isinstance(runner, _batches.ClusterBatches)
    assert ram.bytes == 2**30 // 2 // 2 and "dask worker" in ram.source  # half of 1 GiB / 2
    # a budget given bounds the worker: its 2 threads' tasks share it
    assert given.bytes == 3 * 2**30 // 2 and "shared by a worker's 2 threads" in given.source


def test_a_lazy_batch_trims_only_past_the_budget(monkeypatch):
    """After a lazy batch the freed memory goes back to the system only once the resident
    set has grown past the run's budget: a run well within it pays no trims (each makes
    the next batch fault its pages in again)."""
    import torch

    from napari_simwarp.io import trim
    from napari_simwarp.registration._frames import FrameSource

    src = FrameSource(_lazy(np.zeros((4, SIDE, SIDE), np.float32)), torch.device("cpu"))
    runner = _batches.LocalBatches(src)
    resident = [100 * 2**20]
    calls = []
    monkeypatch.setattr(trim, "resident_bytes", lambda: resident[0])
    monkeypatch.setattr(trim, "release", lambda: calls.append(1) or True)
    runner.bound(64 * 2**20)
    runner._release()
    resident[0] += 32 * 2**20  # within the budget
    runner._release()
    assert calls == []
    resident[0] += 48 * 2**20  # past it
    runner._release()
    assert calls == [1]
