"""Every terminal command the docs give runs the venv's Python by its path (issue 35).

A bare ``python`` (or ``cglab``) is whatever comes first on the ``PATH``, and on most laptops the
shell's start-up files put pyenv's, conda's or Homebrew's there: ``No module named cglab``. So the docs
write ``.venv/bin/python -m cglab`` (from the repository root) or ``$VIRTUAL_ENV/bin/python -m cglab``
(JupyterLab's terminal, which opens in ``notebooks/``)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted(
    {ROOT / "README.md", ROOT / "CONTRIBUTING.md", *(ROOT / "notebooks").rglob("*.md"), *(ROOT / "docs").rglob("*.md")}
)
NOTEBOOKS = sorted((ROOT / "notebooks").rglob("*.ipynb"))
# `python -m cglab` (python3, python.exe too) with no folder before it, and the bare console script.
BARE_COMMAND = re.compile(
    r"(?<![\w/\\.$%-])python(?:3(?:\.\d+)?)?(?:\.exe)?\s+-m\s+cglab\b"
    r"|(?<![\w/\\.-])(?<!-m )cglab\s+(?:repro|bench|startup)\b"
)


def bare_commands(text: str) -> list[str]:
    """The lines of ``text`` that run cglab through whatever Python the PATH finds first."""
    return [line.strip() for line in text.splitlines() if BARE_COMMAND.search(line)]


def _markdown(path: Path) -> str:
    if path.suffix != ".ipynb":
        return path.read_text(encoding="utf-8")
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    return "\n".join("".join(cell["source"]) for cell in cells if cell["cell_type"] == "markdown")


@pytest.mark.parametrize(
    "path", [p for p in DOCS + NOTEBOOKS if p.exists()], ids=lambda p: p.relative_to(ROOT).as_posix()
)
def test_terminal_commands_name_the_venvs_python(path: Path) -> None:
    found = bare_commands(_markdown(path))
    assert not found, (
        f"{path.name}: a bare `python -m cglab` runs whatever Python the PATH finds first; write "
        f"`.venv/bin/python -m cglab` (repository root) or `$VIRTUAL_ENV/bin/python -m cglab`: {found}"
    )


def test_the_scan_tells_a_bare_python_from_the_venvs() -> None:
    text = (
        "`python -m cglab repro`\npython3 -m cglab bench --quick\n  cglab startup --quick\n"
        ".venv/bin/python -m cglab repro\n$VIRTUAL_ENV/bin/python -m cglab repro --help\n"
        "../.venv/bin/python3 -m cglab bench\n%CONDA_PREFIX%\\python.exe -m cglab repro\npython -m pytest\n"
    )
    assert bare_commands(text) == ["`python -m cglab repro`", "python3 -m cglab bench --quick", "cglab startup --quick"]
