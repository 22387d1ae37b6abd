"""Run every benchmark module side by side with its peers and write docs/benchmarks.md.

    python benchmarks/run.py                 # all modules, writes docs/benchmarks.md
    python benchmarks/run.py ops warp        # only bench_ops.py and bench_warp.py
    python benchmarks/run.py --out FILE      # write elsewhere
    python benchmarks/run.py guard           # the speed guard (guard.py): ratios against
                                             # targets, exit status 1 below half of one

Each ``benchmarks/bench_<name>.py`` defines ``SECTION`` (a title) and ``run(report)``.
Times are medians of repeated calls after a warm-up; ratios are peer time / our time in
the same run, which is what carries over between machines (absolute times do not).
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import os
import pathlib
import platform
import sys

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _harness import Report  # noqa: E402


def machine_description() -> list[str]:
    import numpy
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    lines = [
        f"- date: {datetime.date.today().isoformat()}",
        f"- machine: {cpu}, {os.cpu_count()} logical cores, "
        f"torch threads {torch.get_num_threads()}",
        f"- python {platform.python_version()}, torch {torch.__version__}, "
        f"numpy {numpy.__version__}",
    ]
    from importlib import metadata

    versions = []
    # Distribution names: some peers (pytorch-msssim) have no module __version__.
    for dist in (
        "scipy",
        "scikit-image",
        "pytorch-msssim",
        "kornia",
        "monai",
        "pystackreg",
        "itk-elastix",
    ):
        try:
            versions.append(f"{dist} {metadata.version(dist)}")
        except metadata.PackageNotFoundError:  # a missing peer is reported, not fatal
            versions.append(f"{dist} (not installed)")
    lines.append("- peers: " + ", ".join(versions))
    from napari_simwarp.ops._kernels import _build

    lines.append(f"- compiled kernels built with: {' '.join(_build.host_cflags())}")
    if torch.cuda.is_available():
        lines.append(f"- GPU: {torch.cuda.get_device_name()}")
    return lines


#: glibc serves every allocation above 32 MiB with a fresh mmap, so each call page-faults
#: its large temporaries in again; at 2048² that alone made the same SSIM call take 45 to
#: 171 ms depending on the process's history. Keeping large blocks in the heap makes runs
#: repeatable and is what a long-lived process (a napari session) converges to; peers run
#: under the same setting.
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": "4294967296", "MALLOC_TRIM_THRESHOLD_": "68719476736"}


def _malloc_env() -> None:
    """Run again with :data:`MALLOC_ENV` set unless it is (glibc reads it at start-up)."""
    if any(os.environ.get(k) != v for k, v in MALLOC_ENV.items()):
        os.environ.update(MALLOC_ENV)
        os.execv(sys.executable, [sys.executable, os.path.abspath(__file__), *sys.argv[1:]])


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["guard"]:
        _malloc_env()
        import guard

        return guard.main(argv[1:])
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("modules", nargs="*", help="bench_<name>.py modules to run (default: all)")
    parser.add_argument("--out", default=str(HERE.parent / "docs" / "benchmarks.md"))
    args = parser.parse_args(argv)
    _malloc_env()
    names = args.modules or sorted(p.stem[len("bench_") :] for p in HERE.glob("bench_*.py"))
    report = Report()
    sections = []
    for name in names:
        module = importlib.import_module(f"bench_{name}")
        print(f"== {module.SECTION}", flush=True)
        start = len(report.rows)
        module.run(report)
        sections.append((module.SECTION, report.rows[start:]))
    text = [
        "# Benchmarks",
        "",
        *machine_description(),
        "",
        "Times are medians after a warm-up; 'peer time / ours' above 1 means we are faster.",
        "Peak memory is the resident-set peak during one call above the level before it"
        " (0 when the call fit in memory the process already held).",
        "Run with "
        + ", ".join(f"{k}={v}" for k, v in MALLOC_ENV.items())
        + " (set by run.py): large temporaries are reused instead of page-faulted in on"
        " every call, as in a long-lived session. Without it, timings depend on the"
        " process's history: our 2048² SSIM forward took 100 to 171 ms in fresh"
        " processes against 46 ms with it.",
        "",
    ]
    for title, rows in sections:
        sub = Report(rows=rows, section_notes=report.section_notes)
        text.append(sub.markdown(title))
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(text) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
