"""The `napari-simwarp` command: `demo` (viewer with a display, the headless pipeline
without one), its errors naming the options as typed."""

from __future__ import annotations

import numpy as np
import pytest

from napari_simwarp import _cli, _demo


def _record(monkeypatch):
    calls = []
    monkeypatch.setattr(
        _demo,
        "run_headless_demo",
        lambda out, device="auto": calls.append(("headless", str(out))) or {},
    )
    return calls


def test_headless_flag_writes_into_out(monkeypatch, tmp_path):
    calls = _record(monkeypatch)
    assert _cli.main(["demo", "--headless", "--out", str(tmp_path)]) == 0
    assert calls == [("headless", str(tmp_path))]


def test_no_display_falls_back_to_headless(monkeypatch, capsys, tmp_path):
    monkeypatch.chdir(tmp_path)  # the command makes its folder, out/demo
    calls = _record(monkeypatch)
    monkeypatch.setattr(_cli, "_has_display", lambda: False)
    assert _cli.main(["demo"]) == 0
    assert calls == [("headless", "out/demo")] and "no display" in capsys.readouterr().err


def test_out_without_a_display_says_only_that_it_runs_headless(monkeypatch, capsys, tmp_path):
    monkeypatch.chdir(tmp_path)
    calls = _record(monkeypatch)
    monkeypatch.setattr(_cli, "_has_display", lambda: False)
    assert _cli.main(["demo", "--out", "out/demo1"]) == 0
    assert calls == [("headless", "out/demo1")]
    assert (
        capsys.readouterr().err == "napari-simwarp demo: no display; running --headless instead\n"
    )


def test_display_opens_the_viewer(monkeypatch):
    import pytest

    pytest.importorskip("napari")
    from napari_simwarp._qt import _demo as gui_demo

    calls = _record(monkeypatch)
    monkeypatch.setattr(
        gui_demo, "run_gui_demo", lambda device="auto": calls.append(("gui", device))
    )
    monkeypatch.setattr(_cli, "_has_display", lambda: True)
    assert _cli.main(["demo", "--device", "cpu"]) == 0
    assert calls == [("gui", "cpu")]


def test_display_without_napari_falls_back_to_headless(monkeypatch, capsys):
    import importlib.util

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "napari" else real_find_spec(name, *a),
    )
    calls = _record(monkeypatch)
    monkeypatch.setattr(_cli, "_has_display", lambda: True)
    assert _cli.main(["demo"]) == 0
    assert calls == [("headless", "out/demo")]
    assert "napari is not installed" in capsys.readouterr().err


def test_python_dash_m_runs_the_command():
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-m", "napari_simwarp", "register", "--help"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: napari-simwarp register")


def test_importing_the_main_module_runs_nothing():
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-c", "import napari_simwarp.__main__ as m; print(m.main.__name__)"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "main\n" and result.stderr == ""


def test_every_subcommand_has_a_description():
    parser = _cli.build_parser()
    for name, sub in parser._subparsers._group_actions[0].choices.items():
        assert sub.description and len(sub.description) > 60, name
    info = " ".join(parser._subparsers._group_actions[0].choices["info"].format_help().split())
    assert "which backend (compiled kernels or pure torch) runs each op" in info


def _info(loaded=True, cuda_kernels=False, cuda_error="torch has no usable CUDA", ops=None):
    build = {"loaded": loaded, "error": "no C++ compiler found", "cuda_kernels": cuda_kernels}
    return {"requested": "auto", "build": {**build, "cuda_error": cuda_error}, "ops": ops or {}}


def test_info_says_which_torch_gpu_and_kernels_without_a_gpu(monkeypatch):
    import torch

    monkeypatch.setattr(torch.version, "cuda", None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    lines = _cli.machine_lines(_info())
    assert lines == [
        f"torch: {torch.__version__} (no CUDA: a CPU build)",
        "GPU: none (torch is a CPU build)",
        "kernels: compiled CPU kernels",
        "kernels: no CUDA kernels (torch has no usable CUDA)",
    ]
    assert _cli.machine_lines(_info(loaded=False))[2:] == [
        "kernels: none (the pure torch operators run): no C++ compiler found"
    ]


def test_info_names_the_gpu_and_how_many_ops_run_its_kernels(monkeypatch):
    import torch

    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i: (9, 0))
    ops = {
        "local_std": {"cpu": ("compiled", ""), "cuda": ("compiled", "")},
        "ssim": {"cpu": ("compiled", ""), "cuda": ("torch", "self-check failed")},
        "warp": {"cpu": ("torch", ""), "cuda": ("torch", "")},
    }
    lines = _cli.machine_lines(_info(cuda_kernels=True, cuda_error=None, ops=ops))
    assert lines[:2] == [
        f"torch: {torch.__version__} (CUDA 12.8)",
        "GPU cuda:0: NVIDIA H100 80GB HBM3 (compute capability 9.0)",
    ]
    assert lines[3].startswith("kernels: compiled CUDA kernels, 1 of 2 ops on the GPU")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert _cli.machine_lines(_info())[1] == "GPU: none (torch finds no CUDA device)"


@pytest.mark.parametrize(
    "options, expected",
    [
        (["--grid-spacing", "-8", "--model", "deformable"], "--grid-spacing must be positive"),
        (["--fixed-spacing", "0"], "--fixed-spacing must be positive"),
        (["--iterations", "-5"], "--iterations must be >= 0"),
        (["--landmark-weight", "nan"], "--landmark-weight must be finite"),
        (["--device", "gpu9"], "--device must be"),
    ],
)
def test_an_option_the_library_refuses_is_named_as_typed(tmp_path, capsys, options, expected):
    # the library's checks name its keywords (grid_spacing); the command's user typed
    # --grid-spacing
    y, x = np.mgrid[:32, :32]
    picture = np.sin(x / 3.0) * np.cos(y / 4.0)
    np.save(tmp_path / "f.npy", picture)
    np.save(tmp_path / "m.npy", picture)
    out = tmp_path / "r.npy"
    code = _cli.main(
        ["register", str(tmp_path / "f.npy"), str(tmp_path / "m.npy"), "-o", str(out), *options]
    )
    err = capsys.readouterr().err
    assert code == 2 and err.startswith(f"napari-simwarp register: error: {expected}"), err
    assert not out.exists()


def test_a_message_that_names_no_option_is_left_as_it_is():
    options = {"grid_spacing": "--grid-spacing", "levels": "--levels"}
    assert _cli._as_option("levels=50 shrinks", options) == "--levels=50 shrinks"
    assert _cli._as_option("levelsx must", options) == "levelsx must"
    assert _cli._as_option("fixed: 'a.tif' does not exist", options) == (
        "fixed: 'a.tif' does not exist"
    )


def test_demo_out_that_is_a_file_is_refused_untouched(monkeypatch, tmp_path, capsys):
    # it said "File exists: 'afile'", naming no option
    calls = _record(monkeypatch)
    (tmp_path / "afile").write_bytes(b"mine")
    assert _cli.main(["demo", "--headless", "--out", str(tmp_path / "afile")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("napari-simwarp demo: error: --out: ") and "is a file" in err, err
    assert calls == [] and (tmp_path / "afile").read_bytes() == b"mine"


def test_demo_never_replaces_a_file_of_the_users(monkeypatch, tmp_path, capsys):
    # the demo wrote registered.npy, summary.json... over whatever the folder held
    calls = _record(monkeypatch)
    (tmp_path / "registered.npy").write_bytes(b"my data")
    assert _cli.main(["demo", "--headless", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "--out: " in err and "holds registered.npy, not from an earlier demo run" in err
    assert calls == [] and (tmp_path / "registered.npy").read_bytes() == b"my data"


def test_demo_reruns_into_its_own_earlier_folder(monkeypatch, tmp_path):
    calls = _record(monkeypatch)
    (tmp_path / "registered.npy").write_bytes(b"from the demo")
    (tmp_path / "summary.json").write_text('{"template_cut_at": [200, 230]}')
    assert _cli.main(["demo", "--headless", "--out", str(tmp_path)]) == 0
    assert calls == [("headless", str(tmp_path))]


def test_demo_bad_device_makes_no_folder(monkeypatch, tmp_path, capsys):
    # the folder was made before the device was checked
    calls = _record(monkeypatch)
    out = tmp_path / "new"
    assert _cli.main(["demo", "--headless", "--out", str(out), "--device", "gpu9"]) == 2
    assert "--device must be" in capsys.readouterr().err
    assert calls == [] and not out.exists()
