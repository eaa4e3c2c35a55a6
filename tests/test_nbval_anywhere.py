"""The saved outputs do not depend on the machine: nbval passes with another CPU's kernels and no
thread setting at all, as on a runner that is not ours.

``make test`` already runs nbval with ``OMP_NUM_THREADS`` unset. This test adds what no run on one
machine can: PyTorch's portable kernels (``ATEN_CPU_CAPABILITY=default``, no AVX), whose sums round
differently from the vectorised ones, on the express notebook, whose verdicts compare replayed logits
with eager ones. It runs nbval the way a user would type it, without the Makefile's environment.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("nbval", reason="nbval re-executes notebooks (make installs it)")
ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = "notebooks/00b_express.ipynb"


def test_the_express_notebook_reads_the_same_with_another_cpus_kernels() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "PYTEST_XDIST_WORKER")}
    env["ATEN_CPU_CAPABILITY"] = "default"
    run = subprocess.run(
        # (no hypothesis plugin: seconds of imports that checking a notebook never uses)
        [sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "-p", "no:hypothesispytest", "--nbval", NOTEBOOK],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout[-4000:]
    assert " passed" in run.stdout.splitlines()[-1]
