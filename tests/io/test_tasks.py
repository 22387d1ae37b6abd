"""Scale-out with dask.distributed: a two-worker LocalCluster (threads, processes=False, to
keep CI light) gives the local results for a chunked apply, a lazy aligned stack and a
tiled map."""

import numpy as np
import pytest
from scipy import ndimage

da = pytest.importorskip("dask.array")  # the [large] extra

distributed = pytest.importorskip("distributed")

from napari_simwarp import maps  # noqa: E402
from napari_simwarp.io.tasks import active_client, device_slot  # noqa: E402
from napari_simwarp.registration import register_stack  # noqa: E402
from napari_simwarp.registration.transforms import AffineTransform  # noqa: E402
from tests.registration.cases import shifted_stack  # noqa: E402


def test_results_on_a_local_cluster_equal_local_ones(rng):
    image = da.from_array(ndimage.gaussian_filter(rng.random((64, 80)), 2), chunks=24)
    m = np.array([[0.98, 0.1, 2.5], [-0.1, 0.98, -1.5], [0, 0, 1]])
    stack, _ = shifted_stack(rng, (64, 64), 4, max_shift=3.0)
    lazy_stack = da.from_array(stack.astype(np.float32), chunks=(1, 64, 64))
    local = [
        AffineTransform(m).apply(image).compute(),
        maps.local_std(lazy_stack, window=7, axes="tyx").compute(),
    ]
    drift = register_stack(lazy_stack, batch_size=2)
    local.append(drift.warped.compute())
    assert active_client() is None
    with (
        distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False) as cluster,
        distributed.Client(cluster) as client,
    ):
        assert active_client() is client
        remote = [
            AffineTransform(m).apply(image).compute(),
            maps.local_std(lazy_stack, window=7, axes="tyx").compute(),
            drift.warped.compute(),
        ]
        tasks = client.run(lambda dask_worker: len(dask_worker.data))
    assert len(tasks) == 2
    for a, b in zip(local, remote):
        np.testing.assert_array_equal(a, b)


def test_device_slot_caps_gpu_tasks_only(monkeypatch):
    import threading

    monkeypatch.setenv("SIMWARP_GPU_TASKS", "1")
    with device_slot("cpu"), device_slot("cpu"):
        pass  # no cap on the CPU (the thread pool is the cap)
    held = threading.Event()
    with device_slot("cuda:7"):
        t = threading.Thread(target=lambda: device_slot("cuda:7").__enter__() and held.set())
        t.start()
        t.join(0.2)
        assert not held.is_set()  # a second task waits for the GPU


def test_register_stack_of_numpy_imports_distributed_only_where_it_is_imported():
    # Asking for a client by importing distributed costs about 0.6 s: a process that has
    # not imported it has no client, and register_stack of a NumPy stack leaves it be (a
    # dask stack's compute imports it anyway: dask's own get_scheduler asks the same).
    import os
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from napari_simwarp import data\n"
        "from napari_simwarp.registration import register_stack\n"
        "stack, _ = data.drifting_timelapse(frames=3, size=32)\n"
        "register_stack(stack)\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'distributed'))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "SIMWARP_BACKEND": "torch"},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "[]"
