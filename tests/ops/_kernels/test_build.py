"""Build directories and compiler flags of the kernels (ops/_kernels/_build.py)."""

from __future__ import annotations

from napari_simwarp.ops._kernels import _build


def test_build_cache_is_keyed_by_cpu_and_flags(monkeypatch, tmp_path):
    # A home directory shared by machines with different CPUs must never load a build
    # made for another instruction set (-march=native).
    monkeypatch.setenv(_build.ENV_CACHE, str(tmp_path))
    files = _build.sources("cpu")
    monkeypatch.setattr(_build, "cpu_fingerprint", lambda: "x86_64 flags: sse2 avx2")
    avx2 = _build.build_directory("cpu", files, ["-O3", "-march=native"])
    assert avx2 == _build.build_directory("cpu", files, ["-O3", "-march=native"])
    monkeypatch.setattr(_build, "cpu_fingerprint", lambda: "x86_64 flags: sse2 avx2 avx512f")
    assert _build.build_directory("cpu", files, ["-O3", "-march=native"]) != avx2
    assert _build.build_directory("cpu", files, ["-O3"]) != avx2


def test_native_flags_only_on_linux_x86_64(monkeypatch):
    monkeypatch.setattr(_build.platform, "system", lambda: "Darwin")
    monkeypatch.setattr(_build.platform, "machine", lambda: "arm64")
    assert "-march=native" not in _build.host_cflags()
    monkeypatch.setattr(_build.platform, "system", lambda: "Linux")
    monkeypatch.setattr(_build.platform, "machine", lambda: "x86_64")
    assert "-march=native" in _build.host_cflags()


def test_build_cache_is_keyed_by_the_source_location(monkeypatch, tmp_path):
    # Two checkouts with the same sources must not share a build directory: torch's ninja
    # file names the sources by absolute path, so they would rebuild it in turn (and could
    # replace a library another process has loaded).
    import shutil

    monkeypatch.setenv(_build.ENV_CACHE, str(tmp_path / "cache"))
    here = _build.csrc_root()
    copy = tmp_path / "other-checkout" / "csrc"
    shutil.copytree(here, copy)
    flags = ["-O3"]
    ours = _build.build_directory("cpu", _build.sources("cpu"), flags)
    assert ours == _build.build_directory("cpu", _build.sources("cpu"), flags)
    monkeypatch.setattr(_build, "csrc_root", lambda: copy)
    theirs = _build.build_directory("cpu", _build.sources("cpu"), flags)
    assert [f.read_bytes() for f in _build.sources("cpu")] == [
        (here / f.relative_to(copy)).read_bytes() for f in _build.sources("cpu")
    ]
    assert theirs != ours
