"""Counting what a GPU would pay for: aten ops (kernel launches), host syncs, float64 results.

A GPU runs this project's registrations bound by latency, not by work (/work/shared/GPU.md):
each aten op is at least one kernel launch (4-6 µs of host time) and each host sync (the
host waiting for a value from the device) drains the launch queue. Both can be counted on
any machine with a :class:`~torch.utils._python_dispatch.TorchDispatchMode`, which sees
every op below autograd (forward and backward alike).

Used by the tests that hold the optimizer loop to its budgets and by
``benchmarks/bench_dispatch.py``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Generator
from dataclasses import dataclass

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

#: ops whose result the host must wait for (the value, or a data-dependent shape)
SYNC_OPS = frozenset(
    {
        "_local_scalar_dense",  # .item(), float(t), bool(t), int(t), `if t:`
        "nonzero",
        "nonzero_static",
        "masked_select",
        "unique",
        "_unique",
        "_unique2",
        "unique_consecutive",
        "unique_dim",
        "equal",
        "is_nonzero",
        "masked_scatter",
        "_assert_async",  # asserts a device value on the host
        "_linalg_check_errors",  # linalg.solve/inv/cholesky reading their info back
    }
)

#: ops that are no kernel launch: views and metadata, resolved on the host
FREE_OPS = frozenset(
    {
        "view",
        "_unsafe_view",
        "reshape",
        "expand",
        "as_strided",
        "t",
        "transpose",
        "permute",
        "unsqueeze",
        "squeeze",
        "select",
        "slice",
        "alias",
        "detach",
        "split",
        "split_with_sizes",
        "unbind",
        "narrow",
        "diagonal",
        "movedim",
        "view_as_real",
        "view_as_complex",
        "_reshape_alias",
        "_to_copy_noop",
        "sym_size",
        "sym_stride",
        "sym_numel",
        "sym_storage_offset",
        "is_same_size",
        "_has_compatible_shallow_copy_type",
        "_record_function_enter_new",  # profiler markers (torch.optim)
        "_record_function_exit",
        "promote_types",  # a dtype, worked out on the host
        "result_type",
    }
)


@dataclass
class Snapshot:
    """The counts at one moment (see :meth:`DispatchCounter.snapshot`)."""

    ops: int
    launches: int
    syncs: int
    float64: int

    def __sub__(self, other: Snapshot) -> Snapshot:
        return Snapshot(
            self.ops - other.ops,
            self.launches - other.launches,
            self.syncs - other.syncs,
            self.float64 - other.float64,
        )


class DispatchCounter(TorchDispatchMode):
    """Counts every aten op by name while active (``with DispatchCounter() as c:``).

    Reads to the host that dispatch no op where the data already is on the CPU
    (``.cpu()``, ``.tolist()``, ``.numpy()``, ``.to("cpu")``) are seen one level up, by a
    :class:`~torch.overrides.TorchFunctionMode` entered with it: on a GPU each is a sync.

    ``ops`` : Counter of op name → calls (every op, views included)
    ``launches`` : ops that are not mere views or metadata (:data:`FREE_OPS`): what a GPU
        launches a kernel for
    ``syncs`` : host syncs: the ops of :data:`SYNC_OPS`, and copies from a non-CPU device
        to the CPU (``.cpu()``, ``.tolist()``, ``.numpy()``)
    ``float64`` : ops that returned a float64 (or complex128) tensor on ``watch_device``
        (default: every device; for a CPU run with the GPU dtype policy forced, the
        float64 tensors a GPU would have created), by name in ``float64_ops``
    ``sync_ops`` : Counter of the syncing ops by name
    ``host_ops`` : ops on tensors read back to the host (the results of ``.cpu()`` and
        what is computed from them alone): neither launches nor syncs, not in ``ops``

    On the CPU every tensor lives on the host, so the counter plays the GPU: a tensor is
    "on the device" unless it came from a read (``.cpu()``, ``.to("cpu")``) or from Python
    or NumPy data (``torch.tensor``, ``torch.as_tensor``: ``lift_fresh``, counted as one
    launch for its transfer); tensors made by factories (``torch.zeros``, ``torch.eye``)
    count as made on the device.
    """

    def __init__(self, watch_device: str | None = None):
        super().__init__()
        self.ops: Counter = Counter()
        self.host_ops: Counter = Counter()
        self.sync_ops: Counter = Counter()
        self.float64_ops: Counter = Counter()
        self.launches = 0
        self.syncs = 0
        self.float64 = 0
        self.watch_device = watch_device

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        tensors = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        out = func(*args, **kwargs)
        if name == "lift_fresh":
            # A tensor from Python or NumPy data: it lives on the host (on a GPU it is
            # copied over, a transfer counted here as a launch; its dtype is the host's).
            self.ops[name] += 1
            self.launches += 1
            _mark_host(out)
            return out
        if tensors and all(_is_host(t) for t in tensors):
            # Arithmetic on values already read back (bookkeeping on the host): no launch.
            self.host_ops[name] += 1
            _mark_host(out)
            return out
        self.ops[name] += 1
        if name not in FREE_OPS:
            self.launches += 1
        if name in SYNC_OPS or _is_device_to_host(name, args, kwargs):
            self._sync(name)
        if name == "repeat_interleave" and "output_size" not in kwargs:
            self._sync(name)
        for t in tree_flatten(out)[0]:
            wide = isinstance(t, torch.Tensor) and t.dtype in (torch.float64, torch.complex128)
            if wide and (self.watch_device is None or t.device.type == self.watch_device):
                self.float64 += 1
                self.float64_ops[name] += 1
                break
        return out

    def __enter__(self):
        self._reads = _HostReads(self)
        self._reads.__enter__()
        return super().__enter__()

    def __exit__(self, *exc):
        out = super().__exit__(*exc)
        self._reads.__exit__(*exc)
        return out

    def _sync(self, name: str) -> None:
        self.syncs += 1
        self.sync_ops[name] += 1

    def snapshot(self) -> Snapshot:
        return Snapshot(sum(self.ops.values()), self.launches, self.syncs, self.float64)


class _HostReads(TorchFunctionMode):
    """Counts ``.cpu()``, ``.tolist()``, ``.numpy()`` and ``.to(<cpu>)`` of any tensor as
    syncs of ``counter`` (a copy from a CUDA tensor is not counted twice: on the CPU these
    dispatch nothing, on a GPU :func:`_is_device_to_host` sees the copy)."""

    def __init__(self, counter: DispatchCounter):
        super().__init__()
        self.counter = counter

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        src = args[0] if args and isinstance(args[0], torch.Tensor) else None
        read = name in ("cpu", "tolist", "numpy") or (name == "to" and _names_cpu(args[1:], kwargs))
        if src is None or not read or _is_host(src) or src.device.type != "cpu":
            return func(*args, **kwargs)  # a copy from a GPU: the dispatch mode sees it
        self.counter._sync(name if name != "to" else "to(cpu)")
        out = func(*args, **kwargs)
        if isinstance(out, torch.Tensor):
            # On the CPU ``.cpu()`` returns the tensor itself: a copy stands for the read,
            # so that the device tensor is not taken for a host one. Not counted as an op.
            with torch._C._DisableTorchDispatch():
                out = out.clone() if out is src else out
            _mark_host(out)
        return out


def _is_host(t: torch.Tensor) -> bool:
    return getattr(t, "_counted_on_host", False)


def _mark_host(out) -> None:
    for t in tree_flatten(out)[0]:
        if isinstance(t, torch.Tensor):
            t._counted_on_host = True


def _names_cpu(args, kwargs) -> bool:
    """Whether ``Tensor.to``'s arguments name the CPU device."""
    for a in (*args, kwargs.get("device")):
        if isinstance(a, (str, torch.device)) and torch.device(a).type == "cpu":
            return True
    return False


def _is_device_to_host(name, args, kwargs) -> bool:
    """A copy that lands on the CPU from another device (the host waits for it)."""
    if name == "_to_copy":
        src = args[0] if args else None
        dst = kwargs.get("device")
        return (
            isinstance(src, torch.Tensor)
            and src.device.type != "cpu"
            and dst is not None
            and torch.device(dst).type == "cpu"
        )
    if name == "copy_" and len(args) >= 2:
        dst, src = args[0], args[1]
        return (
            isinstance(dst, torch.Tensor)
            and isinstance(src, torch.Tensor)
            and dst.device.type == "cpu"
            and src.device.type != "cpu"
        )
    return False


def count_between_yields(run: Generator, counter: DispatchCounter) -> tuple[list, object]:
    """Drive ``run`` to its end under ``counter``; return the :class:`Snapshot` of what
    happened between consecutive yields (the first entry: before the first yield) and the
    generator's return value."""
    deltas = []
    with counter:
        last = counter.snapshot()
        try:
            while True:
                next(run)
                now = counter.snapshot()
                deltas.append(now - last)
                last = now
        except StopIteration as done:
            result = done.value
        deltas.append(counter.snapshot() - last)
    return deltas, result
