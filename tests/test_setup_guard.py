"""``make setup``'s guard: a Python older than 3.10 stops set-up at once with one line, and a venv that
a too-old or vanished Python built is made again, not reused (issue 35). Each test runs the Makefile in
a scratch folder with a fake old Python, so nothing is installed and the project's own venv is untouched."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs make")

# Python 3.9.6 as far as a `-c CODE` version check can tell (the real interpreter runs CODE with an
# older sys.version_info); anything else, such as `-m venv`, fails loudly, so a guard that let it
# through would not pass unnoticed.
FAKE_PYTHON_39 = f"""#!/bin/sh
if [ "$1" = "-c" ]; then exec "{sys.executable}" -c "import sys; sys.version_info = (3, 9, 6, 'final', 0)
$2"; fi
echo "fake Python 3.9 asked to run: $*" >&2; exit 1
"""
# A working venv's Python: this test run's own.
REAL_PYTHON = f'#!/bin/sh\nexec "{sys.executable}" "$@"\n'


def _script(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A scratch copy of what the set-up rules read: the Makefile, pyproject.toml and uv's overrides."""
    (tmp_path / "tools").mkdir()
    for name in ("Makefile", "pyproject.toml", "tools/uv_overrides.txt"):
        shutil.copy(ROOT / name, tmp_path / name)
    return tmp_path


def _make(project: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MAKE", "MFLAGS"))}
    return subprocess.run(
        ["make", "--no-print-directory", "-C", str(project), *args], env=env, capture_output=True, text=True, timeout=60
    )


def _stamped_venv(project: Path, python: str) -> None:
    """A venv as a finished set-up leaves it: its Python, and a stamp newer than pyproject.toml and the overrides."""
    _script(project / ".venv" / "bin" / "python", python)
    stamp = project / ".venv" / ".installed-stamp"
    stamp.touch()
    os.utime(stamp, (time.time() + 60, time.time() + 60))


def test_an_old_python_stops_setup_with_one_line_and_builds_nothing(project: Path) -> None:
    old = _script(project / "fake" / "python3.9", FAKE_PYTHON_39)
    start = time.monotonic()
    run = _make(project, "setup", f"PYTHON={old}")
    seconds = time.monotonic() - start
    lines = (run.stdout + run.stderr).strip().splitlines()
    assert run.returncode != 0 and len(lines) == 1, f"expected one line and a failure, got {run.returncode}: {lines}"
    assert "3.9.6" in lines[0] and "3.10 or newer" in lines[0] and "PYTHON=python3.12" in lines[0], lines[0]
    assert seconds < 10, f"the guard took {seconds:.1f} s"
    assert not (project / ".venv").exists(), "an old Python must not leave a venv behind"


def test_a_python_that_does_not_run_is_named(project: Path) -> None:
    run = _make(project, "setup", "PYTHON=no-such-python3")
    lines = (run.stdout + run.stderr).strip().splitlines()
    assert run.returncode != 0 and len(lines) == 1 and "no-such-python3 is not a Python that runs" in lines[0], lines


@pytest.mark.parametrize("venv_python", ["old", "missing"])
def test_a_venv_of_an_old_or_vanished_python_is_made_again(project: Path, venv_python: str) -> None:
    _stamped_venv(project, FAKE_PYTHON_39)
    if venv_python == "missing":  # the Python the venv was made from has been uninstalled
        python = project / ".venv" / "bin" / "python"
        python.unlink()
        python.symlink_to(project / "gone" / "python3.11")
    planned = _make(project, "-n", "setup", f"PYTHON={sys.executable}")
    assert planned.returncode == 0, planned.stderr
    assert f"rm -rf .venv && {sys.executable} -m venv .venv" in planned.stdout.splitlines()[0], planned.stdout
    # With an old PYTHON too, set-up stops; the stale venv stays stale, so the next run replaces it.
    old = _script(project / "fake" / "python3.9", FAKE_PYTHON_39)
    assert _make(project, "setup", f"PYTHON={old}").returncode != 0


def test_a_working_venv_is_reused_whatever_python_is(project: Path) -> None:
    _stamped_venv(project, REAL_PYTHON)
    old = _script(project / "fake" / "python3.9", FAKE_PYTHON_39)
    for python in (sys.executable, str(old)):  # PYTHON only makes venvs: a finished one does not need it
        planned = _make(project, "-n", "setup", f"PYTHON={python}")
        assert planned.returncode == 0 and "Nothing to be done" in planned.stdout, planned.stdout + planned.stderr
