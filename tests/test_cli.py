"""`napari-simwarp demo`: viewer with a display, the headless pipeline without one."""

from __future__ import annotations

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


def test_no_display_falls_back_to_headless(monkeypatch, capsys):
    calls = _record(monkeypatch)
    monkeypatch.setattr(_cli, "_has_display", lambda: False)
    assert _cli.main(["demo"]) == 0
    assert calls == [("headless", "out/demo")] and "no display" in capsys.readouterr().err


def test_out_without_a_display_says_only_that_it_runs_headless(monkeypatch, capsys):
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
