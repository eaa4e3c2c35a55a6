"""Notebook hygiene: committed notebooks were run once, top to bottom, in a fresh kernel, cleanly.

nbval (``make test``) re-executes every notebook and compares it with the committed outputs; these
tests check what nbval does not: execution order, stray errors and absolute paths. (That a fresh run
prints what the committed one did is nbval's own check: the committed outputs come from one run.)
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

nbformat = pytest.importorskip("nbformat", reason="the notebook tests need Jupyter (make installs it)")

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb")) + sorted((ROOT / "notebooks" / "solutions").glob("*.ipynb"))
# A reader's machine is not ours: a path such as /home/alice/ or C:\Users\ in a committed notebook
# is a leaked local detail (often from a warning's file name) that will not match anyone's rerun.
ABSOLUTE_PATH = re.compile(r"(?<![\w.~/-])/(?:home|root|work|tmp|Users|mnt)/|(?<![A-Za-z])[A-Z]:\\[A-Za-z]")

needs_notebooks = pytest.mark.skipif(not NOTEBOOKS, reason="no notebooks yet (notebooks/NN_*.ipynb)")
by_notebook = pytest.mark.parametrize("path", NOTEBOOKS, ids=[str(p.relative_to(ROOT)) for p in NOTEBOOKS])


def _code_cells(nb: Any) -> list[Any]:
    return [c for c in nb.cells if c.cell_type == "code" and c.source.strip()]


def _tags(cell: Any) -> set[str]:
    return set(cell.get("metadata", {}).get("tags", []))


def _output_texts(output: Any) -> list[str]:
    """The text a reader sees in one output (streams, plain text and HTML, tracebacks)."""
    if output.output_type == "stream":
        return [output.text]
    if output.output_type == "error":
        return [output.evalue, *output.traceback]
    data = output.get("data", {})
    return [data[k] if isinstance(data[k], str) else "".join(data[k]) for k in ("text/plain", "text/html") if k in data]


@needs_notebooks
@by_notebook
def test_ran_once_top_to_bottom_in_a_fresh_kernel(path: Path) -> None:
    """Execution counts 1..N in order: every code cell ran, once, in one fresh kernel."""
    counts = [c.execution_count for c in _code_cells(nbformat.read(path, as_version=4))]
    assert counts == list(range(1, len(counts) + 1)), f"execution counts {counts}: run it again with `make notebooks`"


@needs_notebooks
@by_notebook
def test_no_error_outputs_unless_tagged(path: Path) -> None:
    stray = [i for i, c in enumerate(_code_cells(nbformat.read(path, as_version=4)))
             if "raises-exception" not in _tags(c)
             and any(o.output_type == "error" or (o.output_type == "stream" and "Traceback" in o.text)
                     for o in c.outputs)]
    assert not stray, f"code cells {stray} show an error: fix them, or tag a teaching error 'raises-exception'"


@needs_notebooks
@by_notebook
def test_no_absolute_paths(path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    found = [(i, m.group()) for i, cell in enumerate(nb.cells)
             for text in [cell.source, *(t for o in cell.get("outputs", []) for t in _output_texts(o))]
             for m in ABSOLUTE_PATH.finditer(text)]
    assert not found, f"absolute paths (cell index, path): {found}; use paths relative to the notebook"


@needs_notebooks
@by_notebook
def test_the_first_code_cell_sets_the_notebook_up(path: Path) -> None:
    """``setup_notebook()`` pins one CPU thread (the saved outputs then read the same on any core count,
    with or without OMP_NUM_THREADS) and, on a GPU, the lessons' compile backend."""
    first = _code_cells(nbformat.read(path, as_version=4))[0].source
    assert re.search(r"^(DEVICE = )?setup_notebook\(\)", first, re.MULTILINE), \
        f"{path.name}: the first code cell must call setup_notebook() (from cglab.lab.notebook)"
