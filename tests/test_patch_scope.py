"""What a patch changes outside the model is held while something needs it, and put back after.

The scenarios (``patch_scope_scenarios.py``) count the holders of the shared replacements from zero, which a process
that already holds patched models (other test files' shared fixtures) cannot give: they run in a fresh interpreter.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def test_patch_scope_scenarios_in_a_fresh_process():
    scenarios = os.path.join(HERE, "patch_scope_scenarios.py")
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0", "-m", "",
                          "-o", "python_files=patch_scope_scenarios.py", scenarios],
                         capture_output=True, text=True, cwd=HERE, timeout=900)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert re.search(r"^8 passed", run.stdout, re.M), run.stdout[-2000:]
