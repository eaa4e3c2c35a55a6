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
    stray = [
        i
        for i, c in enumerate(_code_cells(nbformat.read(path, as_version=4)))
        if "raises-exception" not in _tags(c)
        and any(o.output_type == "error" or (o.output_type == "stream" and "Traceback" in o.text) for o in c.outputs)
    ]
    assert not stray, f"code cells {stray} show an error: fix them, or tag a teaching error 'raises-exception'"


@needs_notebooks
@by_notebook
def test_no_absolute_paths(path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    found = [
        (i, m.group())
        for i, cell in enumerate(nb.cells)
        for text in [cell.source, *(t for o in cell.get("outputs", []) for t in _output_texts(o))]
        for m in ABSOLUTE_PATH.finditer(text)
    ]
    assert not found, f"absolute paths (cell index, path): {found}; use paths relative to the notebook"


@needs_notebooks
@by_notebook
def test_the_first_code_cell_sets_the_notebook_up(path: Path) -> None:
    """``setup_notebook()`` pins one CPU thread (the saved outputs then read the same on any core count,
    with or without OMP_NUM_THREADS) and, on a GPU, the lessons' compile backend."""
    first = _code_cells(nbformat.read(path, as_version=4))[0].source
    assert re.search(r"^(DEVICE = )?setup_notebook\(\)", first, re.MULTILINE), (
        f"{path.name}: the first code cell must call setup_notebook() (from cglab.lab.notebook)"
    )


# --- Markdown and names (issue 21) ------------------------------------------------------------------

import ast  # noqa: E402
import builtins  # noqa: E402

from notebook_names import names_bound, names_loaded, without_magics  # noqa: E402

MAIN_NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
# Text that a template or an author left behind: a reader should never see a placeholder or a note to self.
UNRENDERED = re.compile(r"\{PR\(|\{\{|\}\}|\bTODO\b|\bFIXME\b")
PR_MENTION = re.compile(r"#(\d{4,6})\b")
MARKDOWN_LINK = re.compile(r"\[([^\]\n]*)\]\(([^)\s]+)\)")
# Names IPython itself provides to notebook code.
IPYTHON_NAMES = {"get_ipython", "display", "In", "Out", "_", "__", "___", "exit", "quit"}
# Issue 21 set 13,000; issue 42 adds notebook 07 (about 20 minutes) and its solutions: 1,700 more.
MAX_SUITE_WORDS = 14_700


def _markdown(nb: Any) -> str:
    return "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")


def _section(markdown: str, heading: str) -> str:
    """The text under the first heading that contains ``heading``, up to the next heading of its level or above."""
    match = re.search(rf"^(#+)[^\n]*{re.escape(heading)}[^\n]*$", markdown, re.MULTILINE)
    assert match, f"no heading containing {heading!r}"
    level = len(match.group(1))
    end = re.compile(rf"^#{{1,{level}}} ", re.MULTILINE).search(markdown, match.end())
    return markdown[match.end() : end.start() if end else len(markdown)]


@needs_notebooks
@by_notebook
def test_no_unrendered_template_text_in_markdown(path: Path) -> None:
    found = sorted({m.group() for m in UNRENDERED.finditer(_markdown(nbformat.read(path, as_version=4)))})
    assert not found, f"{path.name}: markdown shows {found}: render the template, or finish the note"


@needs_notebooks
@by_notebook
def test_every_pr_is_a_link_at_its_first_mention(path: Path) -> None:
    """A reader can open each PR from where a notebook first names it."""
    markdown = _markdown(nbformat.read(path, as_version=4))
    links = [(m.start(1), m.end(1), m.group(2)) for m in MARKDOWN_LINK.finditer(markdown)]
    first: dict[str, int] = {}
    for m in PR_MENTION.finditer(markdown):
        first.setdefault(m.group(1), m.start())
    unlinked = [
        f"#{number}"
        for number, at in first.items()
        if not any(start <= at < end and re.search(rf"/{number}(?:\D|$)", url) for start, end, url in links)
    ]
    assert not unlinked, f"{path.name}: first mention not a link to the PR: {unlinked}"


@pytest.mark.parametrize(
    ("map_notebook", "heading"), [("00_welcome.ipynb", "The map of the suite"), ("00b_express.ipynb", "Where to go on")]
)
def test_the_maps_name_every_notebook(map_notebook: str, heading: str) -> None:
    path = ROOT / "notebooks" / map_notebook
    if not path.exists():
        pytest.skip(f"no {map_notebook}")
    section = _section(_markdown(nbformat.read(path, as_version=4)), heading)
    missing = [p.name for p in MAIN_NOTEBOOKS if p.name != map_notebook and p.name not in section]
    assert not missing, f"{map_notebook}, '{heading}': no link to {missing}"


def undefined_names(cells: list[tuple[str, bool]]) -> list[tuple[int, list[str]]]:
    """For each (source, checked) code cell, in order: the names a checked cell loads that no cell up to
    and including it binds, and that are neither builtins nor IPython's. A cell magic (%%) is skipped."""
    known = set(dir(builtins)) | IPYTHON_NAMES
    problems = []
    for index, (source, checked) in enumerate(cells):
        if source.lstrip().startswith("%%"):
            continue
        tree = ast.parse(without_magics(source))
        known |= names_bound(tree)
        if checked:
            if missing := sorted(names_loaded(tree) - known):
                problems.append((index, missing))
    return problems


def _code_cells_to_check(path: Path) -> list[tuple[str, bool]]:
    """A solutions notebook: every code cell. A lesson: the code cells after its Exercises heading."""
    every = "solutions" in path.parts
    cells, exercises = [], False
    for cell in nbformat.read(path, as_version=4).cells:
        if cell.cell_type == "markdown" and re.search(r"^#+ .*Exercises", cell.source, re.MULTILINE):
            exercises = True
        elif cell.cell_type == "code" and cell.source.strip():
            cells.append((cell.source, every or exercises))
    return cells


@needs_notebooks
@by_notebook
def test_exercise_and_solution_code_uses_only_names_defined_before(path: Path) -> None:
    problems = undefined_names(_code_cells_to_check(path))
    assert not problems, f"{path.name}: (code cell, names never defined or imported before it): {problems}"


def test_undefined_names_sees_a_missing_import_and_not_a_bound_name() -> None:
    cells = [
        ("%matplotlib inline\nimport torch\nx = torch.ones(2)", False),
        ("for i in range(2):\n    y = [j for j in x] + [i]\nwith open('f') as f:\n    pass", True),
        ("def g(a, *args, k=1):\n    return a + k + len(args) + undefined_thing", True),
    ]
    assert undefined_names(cells) == [(2, ["undefined_thing"])]


@needs_notebooks
def test_the_suite_markdown_stays_short() -> None:
    """All notebooks' markdown, solutions included, at most ``MAX_SUITE_WORDS`` (``len(text.split())``)."""
    words = {p.relative_to(ROOT).as_posix(): len(_markdown(nbformat.read(p, as_version=4)).split()) for p in NOTEBOOKS}
    total = sum(words.values())
    assert total <= MAX_SUITE_WORDS, f"{total} words of markdown, more than {MAX_SUITE_WORDS}: {words}"


def test_the_browser_runs_the_cells_a_widget_needs_and_no_other() -> None:
    """``cells_widgets_need`` (tests/test_e2e_lab.py runs only these in JupyterLab): the setup cell, the
    widget's cell and, back from it, every cell binding a name a kept cell loads."""
    from notebook_names import WIDGET_VIEW, cells_widgets_need

    widget = nbformat.v4.new_output("display_data", data={WIDGET_VIEW: {"model_id": "m"}, "text/plain": "VBox()"})
    new = nbformat.v4
    cells = [
        new.new_markdown_cell("# title"),
        new.new_code_cell("%matplotlib inline\nsetup_notebook()"),  # kept as the first code cell
        new.new_code_cell("x = 1\nunused = 2"),
        new.new_code_cell("from lab import explorer\ny = x + 1"),
        new.new_code_cell("def f():\n    return 3\nprint(unused)"),
        new.new_code_cell("%%bash\necho y"),
        new.new_markdown_cell("the widget"),
        new.new_code_cell("explorer(y)", outputs=[widget]),
        new.new_code_cell("y = 4"),
    ]
    assert cells_widgets_need(cells) == {1, 2, 3, 7}
