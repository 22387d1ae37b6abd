"""widgets_logic/warm.py: the warm-up does the work a first run would otherwise do."""

import os
import subprocess
import sys
from pathlib import Path

SRC = str(Path(__file__).resolve().parents[2] / "src")


def test_warm_optimizers_imports_what_a_first_optimizer_imports():
    # In a fresh process: the engine and torch imported, torch._dynamo not yet (a first
    # optimizer imports it: 1-2 s holding the GIL); the warm-up imports it.
    code = (
        "import sys\n"
        "import napari_simwarp.registration.pair\n"
        "assert 'torch._dynamo' not in sys.modules, 'imported already'\n"
        "from napari_simwarp.widgets_logic.warm import warm_optimizers\n"
        "warm_optimizers()\n"
        "assert 'torch._dynamo' in sys.modules\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
