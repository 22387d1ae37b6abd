"""The CUDA extension built by the project's own loader against a CUDA build of torch.

No GPU is needed to compile, link and load it: CI runs this file in a virtual environment
of its own with a CUDA torch (scripts/ci_cuda_build.sh), so every submission proves that
csrc/cuda/ builds against torch's real CUDA headers and registers every op's CUDA
kernel. In the CPU-torch test environment it is skipped.
"""

from __future__ import annotations

import os
import subprocess

import pytest
import torch

from tests.compiled import require_compiled
from tests.csrc.test_cuda_sources import CPU_ONLY, CUDA_ONLY, defined_ops

pytestmark = pytest.mark.skipif(
    torch.version.cuda is None, reason="torch has no CUDA build (scripts/ci_cuda_build.sh has)"
)


@pytest.fixture(scope="module")
def cuda_build():
    """Build and load the CUDA extension (after the CPU one, which defines the schemas)."""
    require_compiled()
    from napari_simwarp.ops._kernels import _build

    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "9.0")  # no GPU to ask
    return _build.build("cuda", verbose=os.environ.get("SIMWARP_VERBOSE_BUILD") == "1")


def test_every_cuda_op_is_registered(cuda_build):
    for op in defined_ops():
        has_cuda = torch._C._dispatch_has_kernel_for_dispatch_key(f"simwarp::{op}", "CUDA")
        assert has_cuda == (op not in CPU_ONLY), op
        assert torch._C._dispatch_has_kernel_for_dispatch_key(f"simwarp::{op}", "CPU"), op
    for op in CUDA_ONLY:  # defined by the CUDA library itself, with no CPU kernel
        assert torch._C._dispatch_has_kernel_for_dispatch_key(f"simwarp::{op}", "CUDA"), op
        assert not torch._C._dispatch_has_kernel_for_dispatch_key(f"simwarp::{op}", "CPU"), op


def test_the_library_links_the_cuda_runtime_of_torch(cuda_build):
    library = next(cuda_build.glob("simwarp_ops_cuda*.so"))
    needed = subprocess.run(["readelf", "-d", str(library)], capture_output=True, text=True).stdout
    assert "libc10_cuda.so" in needed and "libcudart.so" in needed, needed
    major = torch.version.cuda.split(".")[0]
    assert f"libcudart.so.{major}" in needed or "libcudart.so\n" in needed, needed


def test_cpu_tensors_still_run_the_cpu_kernels(cuda_build):
    x = torch.rand(1, 1, 9, 10, dtype=torch.float64)
    torch.testing.assert_close(
        torch.ops.simwarp.box_sum(x, [3, 3]),
        torch.nn.functional.avg_pool2d(x, 3, stride=1) * 9,
        rtol=1e-12,
        atol=1e-12,
    )
