"""Compute and accumulation dtypes shared by the operators (ops/_numerics.py)."""

from __future__ import annotations

import torch

from napari_simwarp.ops._numerics import accumulate_dtype, compute_dtype, moment_dtype, to_compute


def test_compute_dtype():
    assert compute_dtype(torch.float16) == torch.float32
    assert compute_dtype(torch.bfloat16) == torch.float32
    assert compute_dtype(torch.float32) == torch.float32
    assert compute_dtype(torch.float64) == torch.float64


def test_to_compute_casts_only_half_types():
    x = torch.ones(3, dtype=torch.float16)
    assert to_compute(x).dtype == torch.float32
    y = torch.ones(3, dtype=torch.float64)
    assert to_compute(y) is y


def test_accumulate_dtype_widens_float32_except_on_mps():
    cpu = torch.device("cpu")
    assert accumulate_dtype(torch.float32, cpu) == torch.float64
    assert accumulate_dtype(torch.float64, cpu) == torch.float64
    assert accumulate_dtype(torch.float32, torch.device("mps")) == torch.float32


def test_moment_dtype_float32_on_gpus_float64_on_cpu():
    cuda, cpu, mps = torch.device("cuda"), torch.device("cpu"), torch.device("mps")
    assert moment_dtype(torch.float32, cuda) == torch.float32
    assert moment_dtype(torch.float32, mps) == torch.float32
    assert moment_dtype(torch.float32, cpu) == torch.float64
    assert moment_dtype(torch.float64, cuda) == torch.float64
