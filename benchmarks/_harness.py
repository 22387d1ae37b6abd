"""Timing and peak-memory measurement shared by every benchmark module.

Each benchmark module defines ``run(report: Report) -> None`` and calls ``report.measure``
for each implementation of each case, ours and the peers', in the same process and run,
so that the ratios in docs/benchmarks.md compare like with like.

Peak memory: on Linux, writing "5" to /proc/self/clear_refs resets the process's peak
resident set (VmHWM); the peak during a call minus the resident set before it is what the
call needed on top of its inputs (torch's CPU allocator and NumPy both show up there).
"""

from __future__ import annotations

import gc
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field


def _read_status_kb(key: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _release_free_memory() -> None:
    """Return the heap's free pages to the OS (glibc ``malloc_trim``), so that the next
    call's temporaries show up in the resident set even when large blocks are kept in the
    heap between calls (run.py's malloc settings)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def peak_memory_mb(fn: Callable[[], object]) -> float | None:
    """Peak resident memory above the starting level while ``fn()`` runs, in MiB."""
    gc.collect()
    _release_free_memory()
    if not _reset_peak():
        return None
    before = _read_status_kb("VmRSS")
    result = fn()
    peak = _read_status_kb("VmHWM")
    del result
    if before is None or peak is None:
        return None
    return max(peak - before, 0) / 1024.0


def time_call(
    fn: Callable[[], object],
    *,
    repeat: int = 5,
    warmup: int = 1,
    warmup_s: float = 0.3,
    budget_s: float = 20.0,
) -> float:
    """Median wall time of ``fn()`` in seconds, after at least ``warmup`` untimed calls
    and at least ``warmup_s`` seconds of them (at most 50 calls).

    A fast call needs several warm-up calls: the first calls of a process pay for heap
    growth and thread start-up (a 6 ms local std measured 12 to 16 ms after a single one).
    Stops early once ``budget_s`` is spent (at least 3 timed calls when repeat >= 3),
    so slow peers do not dominate the run.
    """
    warm_start = time.perf_counter()
    calls = 0
    while calls < warmup or (calls < 50 and time.perf_counter() - warm_start < warmup_s):
        fn()
        calls += 1
    times = []
    start = time.perf_counter()
    for i in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
        if time.perf_counter() - start > budget_s and i >= min(2, repeat - 1):
            break
    return statistics.median(times)


def forward_backward(fn: Callable, *inputs):
    """A callable for timing one forward and backward of ``fn`` on fresh leaf copies of
    ``inputs``: the output is summed unless it is already a scalar, then back-propagated.
    """
    leaves = [x.detach().clone().requires_grad_() for x in inputs]

    def run():
        for leaf in leaves:
            leaf.grad = None
        out = fn(*leaves)
        (out if out.dim() == 0 else out.sum()).backward()

    return run


def smooth_displacement(shape, amplitude: float, generator):
    """A ``(1, D, *S)`` float32 field: coarse random noise upsampled, ``amplitude`` px at most."""
    import torch

    d = len(shape)
    coarse = torch.randn((1, d) + tuple(max(n // 32, 2) for n in shape), generator=generator)
    mode = "bilinear" if d == 2 else "trilinear"
    field = torch.nn.functional.interpolate(
        coarse, size=tuple(shape), mode=mode, align_corners=True
    )
    return field * (amplitude / field.abs().max())


@dataclass
class Row:
    group: str  # e.g. "local_std 2048² w15"
    impl: str  # e.g. "simwarp (torch)" or "scipy uniform_filter (float64)"
    phase: str  # "forward" or "forward+backward"
    seconds: float
    peak_mb: float | None
    ours: bool
    note: str = ""


@dataclass
class Report:
    """Collects rows; ``markdown()`` renders them grouped, with ratios to our own row."""

    rows: list[Row] = field(default_factory=list)
    section_notes: dict[str, list[str]] = field(default_factory=dict)

    def measure(
        self,
        group: str,
        impl: str,
        phase: str,
        fn: Callable[[], object],
        *,
        ours: bool = False,
        repeat: int = 5,
        memory: bool = True,
        note: str = "",
    ) -> Row:
        seconds = time_call(fn, repeat=repeat)
        peak = peak_memory_mb(fn) if memory else None
        row = Row(group, impl, phase, seconds, peak, ours, note)
        self.rows.append(row)
        mem = f"{peak:8.1f} MiB" if peak is not None else "      n/a"
        print(f"  {group:32s} {phase:17s} {impl:40s} {seconds * 1e3:10.1f} ms {mem}", flush=True)
        return row

    def note(self, section: str, text: str) -> None:
        self.section_notes.setdefault(section, []).append(text)

    def markdown(self, section: str, groups_prefix: str | None = None) -> str:
        lines = [f"## {section}", ""]
        for text in self.section_notes.get(section, []):
            lines += [text, ""]
        groups = []
        for r in self.rows:
            if (
                groups_prefix is None or r.group.startswith(groups_prefix)
            ) and r.group not in groups:
                groups.append(r.group)
        for g in groups:
            lines += [
                f"### {g}",
                "",
                "| implementation | phase | time (ms) | peer time / ours "
                "| peak memory (MiB) | note |",
                "|---|---|---:|---:|---:|---|",
            ]
            rows = [r for r in self.rows if r.group == g]
            for r in rows:
                ours = next((o for o in rows if o.ours and o.phase == r.phase), None)
                ratio = (
                    f"{r.seconds / ours.seconds:.2f}"
                    if ours and not r.ours
                    else ("1 (ours)" if r.ours else "")
                )
                mem = f"{r.peak_mb:.1f}" if r.peak_mb is not None else "n/a"
                name = f"**{r.impl}**" if r.ours else r.impl
                lines.append(
                    f"| {name} | {r.phase} | {r.seconds * 1e3:.1f} | {ratio} | {mem} | {r.note} |"
                )
            lines.append("")
        return "\n".join(lines)


def print_markdown(report: Report, section: str, out: str | None = None) -> int:
    """Print ``report``'s table of ``section`` (and write it to ``out`` if given); 0."""
    text = report.markdown(section)
    if out:
        with open(out, "w") as f:
            f.write(text + "\n")
    print(text)
    return 0


def with_backend(backend: str, fn: Callable[[], object]) -> Callable[[], object]:
    """``fn`` run with ``SIMWARP_BACKEND=backend`` (restored afterwards): compiled or torch."""

    def run():
        previous = os.environ.get("SIMWARP_BACKEND")
        os.environ["SIMWARP_BACKEND"] = backend
        try:
            return fn()
        finally:
            if previous is None:
                os.environ.pop("SIMWARP_BACKEND", None)
            else:
                os.environ["SIMWARP_BACKEND"] = previous

    return run
