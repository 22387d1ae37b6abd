"""scripts/demo.sh installs what the demo it runs needs: napari and Qt for the viewer,
nothing more for --headless (setup.sh and the command stubbed in a copy of the layout)."""

from __future__ import annotations

import pathlib
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
BASH = shutil.which("bash")

pytestmark = pytest.mark.skipif(BASH is None, reason="needs bash")


@pytest.fixture
def checkout(tmp_path):
    """A checkout with the real demo.sh, a setup.sh that records its extras and a
    napari-simwarp that records its arguments."""
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "demo.sh", tmp_path / "scripts" / "demo.sh")
    (tmp_path / "scripts" / "setup.sh").write_text('echo "setup [$*]" >> log\n')
    command = tmp_path / ".venv" / "bin" / "napari-simwarp"
    command.parent.mkdir(parents=True)
    command.write_text(f'#!{BASH}\necho "napari-simwarp $*" >> log\n')
    command.chmod(0o755)
    return tmp_path


def _demo(checkout, *argv, display=None):
    env = {"PATH": "/usr/bin:/bin", **({"DISPLAY": display} if display else {})}
    result = subprocess.run(
        [BASH, str(checkout / "scripts" / "demo.sh"), *argv],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return (checkout / "log").read_text().splitlines()


@pytest.mark.skipif(shutil.which("uname") is None, reason="needs uname")
def test_headless_installs_no_napari(checkout):
    assert _demo(checkout, "--headless", "--out", "x") == [
        "setup []",
        "napari-simwarp demo --headless --out x",
    ]


def test_the_viewer_installs_napari(checkout):
    assert _demo(checkout, "--device", "cpu") == ["setup [all]", "napari-simwarp demo --device cpu"]


def test_no_arguments_and_no_display_runs_headless_without_napari(checkout):
    if subprocess.run(["uname"], capture_output=True, text=True).stdout.strip() == "Darwin":
        pytest.skip("macOS always has a display")
    assert _demo(checkout) == ["setup []", "napari-simwarp demo --headless --out out/demo"]
