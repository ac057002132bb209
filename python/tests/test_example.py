"""examples/python_op.py runs and checks itself."""

import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "python_op.py"


def test_python_op_example_runs():
    done = subprocess.run([sys.executable, str(EXAMPLE)], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "relative error" in done.stdout
