"""scripts/test.sh's choices on a machine with no display, with commands stubbed on a PATH
of the test's own (no xvfb-run; root or not; sudo or not; apt-get that installs a stub
xvfb-run). SIMWARP_TEST_DRY_RUN makes it print the pytest command instead of setting up
and running the suite."""

from __future__ import annotations

import pathlib
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
BASH = shutil.which("bash")
WIDGET_TESTS = len(list((ROOT / "tests" / "_qt").glob("test_*.py")))

pytestmark = pytest.mark.skipif(BASH is None, reason="needs bash")


def _stub(folder: pathlib.Path, name: str, body: str) -> None:
    path = folder / name
    path.write_text(f"#!{BASH}\n{body}\n")
    path.chmod(0o755)


@pytest.fixture
def machine(tmp_path):
    """A PATH with the few real tools the script needs and nothing else: no xvfb-run, no
    dpkg, no sudo; ``id -u`` says 1000 (not root)."""
    folder = tmp_path / "bin"
    folder.mkdir()
    for tool in ("bash", "dirname", "uname", "cat"):
        (folder / tool).symlink_to(shutil.which(tool))
    _stub(folder, "id", 'echo "${STUB_UID:-1000}"')
    return folder


def _run(machine, *argv, uid=1000):
    env = {
        "PATH": str(machine),
        "HOME": str(machine.parent),
        "SIMWARP_TEST_DRY_RUN": "1",
        "STUB_UID": str(uid),
        "STUB_LOG": str(machine.parent / "log"),
        "STUB_BIN": str(machine),
    }
    return subprocess.run(
        [BASH, str(ROOT / "scripts" / "test.sh"), *argv],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )


def _apt_get_that_installs_xvfb_run(machine):
    # apt-get install puts xvfb-run on the PATH, as the real one does
    _stub(
        machine,
        "apt-get",
        'echo "apt-get $*" >> "$STUB_LOG"\n'
        'if [ "$1" = install ]; then printf "#!/bin/sh\\n" > "$STUB_BIN/xvfb-run"; '
        'chmod +x "$STUB_BIN/xvfb-run"; fi',
    )


def test_without_xvfb_or_the_right_to_install_it_everything_else_runs(machine):
    result = _run(machine, "-x")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "would run: .venv/bin/python -m pytest -n 2 -x --ignore=tests/_qt\n"
    # said plainly, at the start and again at the end: what was left out and the command
    notes = [line for line in result.stderr.splitlines() if "the napari widget tests" in line]
    assert notes == [
        f"scripts/test.sh: leaving out the napari widget tests, tests/_qt ({WIDGET_TESTS} "
        "files: they need a display,",
        f"scripts/test.sh: left out the napari widget tests, tests/_qt ({WIDGET_TESTS} "
        "files: they need a display,",
    ]
    assert result.stderr.count("    sudo bash scripts/install_display.sh") == 2
    assert not (machine.parent / "log").exists()  # no install tried without the right


def test_as_root_it_installs_the_display_itself_and_runs_the_widget_tests(machine):
    _apt_get_that_installs_xvfb_run(machine)
    result = _run(machine, uid=0)
    assert result.returncode == 0, result.stderr
    log = (machine.parent / "log").read_text().splitlines()
    packages = subprocess.run(
        [BASH, str(ROOT / "scripts" / "install_display.sh"), "--list"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert {"xvfb", "libgl1-mesa-dri", "libxcb-cursor0"} <= set(packages)
    assert log == ["apt-get update -qq", "apt-get install -y -qq " + " ".join(packages)]
    assert result.stdout == (
        "would run: xvfb-run -a -s -screen 0 1280x1024x24 .venv/bin/python -m pytest -n 2\n"
    )
    assert "left out" not in result.stderr


def test_with_passwordless_sudo_it_installs_through_sudo(machine):
    _apt_get_that_installs_xvfb_run(machine)
    _stub(
        machine,
        "sudo",
        'echo "sudo $*" >> "$STUB_LOG"\n[ "$1" = -n ] && shift\n"$@"',
    )
    result = _run(machine)
    assert result.returncode == 0, result.stderr
    log = (machine.parent / "log").read_text().splitlines()
    assert log[:2] == ["sudo -n true", "sudo bash scripts/install_display.sh"]
    assert result.stdout.startswith("would run: xvfb-run -a")


def test_a_failed_install_falls_back_to_the_other_tests(machine):
    _stub(machine, "apt-get", "exit 100")  # no network, a broken mirror...
    result = _run(machine, uid=0)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "would run: .venv/bin/python -m pytest -n 2 --ignore=tests/_qt\n"
    assert "left out the napari widget tests" in result.stderr


@pytest.mark.parametrize(
    "argv",
    [
        ["--ignore=tests/_qt"],
        ["--ignore=tests/_qt/"],
        ["--ignore", "tests/_qt"],
        ["--ignore", "tests/_qt/"],
        ["--ignore=./tests/_qt"],
        ["-q", "--ignore", "tests/_qt", "tests/ops"],
    ],
)
def test_every_spelling_of_leaving_out_the_widget_tests_needs_no_display(machine, argv):
    result = _run(machine, *argv)
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"would run: .venv/bin/python -m pytest -n 2 {' '.join(argv)}\n"
    assert result.stderr == ""


def test_a_display_runs_the_widget_tests_on_it(machine):
    env_display = {"DISPLAY": ":0"}
    result = subprocess.run(
        [BASH, str(ROOT / "scripts" / "test.sh")],
        capture_output=True,
        text=True,
        env={"PATH": str(machine), "SIMWARP_TEST_DRY_RUN": "1", **env_display},
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "would run: .venv/bin/python -m pytest -n 2\n"


def test_ci_installs_the_display_from_the_same_list():
    ci = (ROOT / ".ci" / "run").read_text()
    assert "bash scripts/install_display.sh" in ci and "libxcb" not in ci


def test_the_pytest_options_pass_through_with_spaces(machine):
    result = _run(machine, "-k", "a and not b", "--ignore=tests/_qt")
    assert result.stdout == (
        "would run: .venv/bin/python -m pytest -n 2 -k a and not b --ignore=tests/_qt\n"
    )
