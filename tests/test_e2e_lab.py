"""The notebooks with widgets in a real browser: JupyterLab runs them, and the widgets render and answer.

nbval runs every cell of every notebook and checks the saved outputs; tests/test_e2e_fresh.py opens every
notebook as committed and checks that those outputs show. This checks what only a running Lab shows:
widgets drawn by their lab extension, and explorers that answer their controls. A JupyterLab server
(loopback, free port, token) serves an output-stripped copy of each notebook whose saved outputs hold a
widget, in which only the cells its widgets need run (``notebook_names.cells_widgets_need``: the widget
cells, the first code cell and, back from them, every cell binding a name they load; the others become
comments). Headless Chromium opens them in JupyterLab, a few tabs at a time, each notebook with a fresh
kernel, runs Run All, and fails on an error a cell shows without the ``raises-exception`` tag, a cell
that never ran, a widget shown as text, a plot that did not load, or an error in the page
(``lab_notebook``). Every explorer's controls are then moved, one step each, one at a time, and the plot
must follow; a burst of quick changes then brings them all back, and the plot must be the first one; every
control, a disabled one too, must lie within its row in a 1280 x 800 window and a narrower one
(``lab_explorer``). A screenshot of each notebook and ``report.txt`` land in
``build/e2e/``. Notebooks are found by glob, so a new one with a widget is run without changes here;
the server and every kernel are stopped at the end. The browser checks that need none of these kernels
(tests/test_e2e_fresh.py and test_e2e_zh.py's visit, test_e2e_html.py's pages) start here too and run
beside the notebooks, in threads of their own (``lab_beside``): notebook 04's explorer, one redraw after
another in one kernel, leaves a core idle for most of the run. One error in the page is excused, and only
as often as the server's log proves it: the failed kernel list of a race inside jupyter_server
(``lab_server.KERNEL_LIST_RACE``), which Lab retries.

Run it with ``make test-e2e`` (``make test`` runs it when Chromium is installed), or
``pytest -m e2e tests/test_e2e_lab.py``; it needs Chromium (Debian: ``apt-get install chromium``,
or set ``CHROMIUM`` to the browser) and the ``playwright`` Python package, and it uses no browser
download of Playwright's own.

How it was shown to fail (once, by hand; the self-tests at the end check the first two on every run,
on tiny notebooks of their own):
- the widget manager disabled (what ``jupyter labextension disable @jupyter-widgets/jupyterlab-manager``
  does; here the server's ``disabledExtensions``): notebooks 02, 04 and 05 failed with "cell N (...)
  shows a widget as text: Run this cell to get the controls." (the explorer's still; shown when every
  cell ran, and the self-test shows it on every run);
- a cell raising an error (``1 / 0`` inserted untagged atop notebook 02's first code cell): 02 fails
  with "cell 2 (1 / 0) raised ZeroDivisionError" and "cells 4, 6, ..., 22 never ran" (its cells that
  became comments too);
- an explorer that drops a change arriving within 0.3 s of a draw (a rate limit in ``_Redraw.request``):
  notebooks 04 and 05 fail with "after a burst of N quick changes the plot is not the one drawn for
  the final values" (only the burst catches it there), the self-test's explorer with "the plot did not
  change" (rerun with only the cells the widgets need; earlier, with every cell, 02 failed that way).
  With each control stepped once and the burst bringing them back (2026-12-05), 05 and the self-test's
  explorer failed with that burst message ("... (the first values: the first plot)").
In these runs no two redraws overlapped (the widgets send one change per control at a time, and the
kernel ran them one after another), so a redraw that mishandles overlapping callbacks is not provoked
here; tests/test_widgets.py fires those from threads.
"""

from __future__ import annotations

import asyncio
import os
import resource
import time
from pathlib import Path
from typing import Any

import pytest
from chromium import CHROMIUM, CHROMIUM_ARGS, skip_without_chromium
from lab_beside import start_all
from lab_notebook import WIDGET_VIEW, LabTab, NotebookRun, saved_widget_views
from lab_server import LabServer, excuse_kernel_list_races
from notebook_names import cells_widgets_need

from cglab.lab.interactive import STILL_LINE

nbformat = pytest.importorskip("nbformat", reason="the notebook tests need Jupyter (make installs it)")

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[1]
# The notebooks whose saved outputs hold a widget. nbval runs every cell of every notebook, and
# tests/test_e2e_fresh.py opens every notebook as committed; the Chinese edition (notebooks/zh/) has the
# English code cells, and tests/test_e2e_zh.py opens it.
NOTEBOOKS = sorted(
    p.relative_to(ROOT).as_posix()
    for p in (ROOT / "notebooks").rglob("*.ipynb")
    if ".ipynb_checkpoints" not in p.parts and "zh" not in p.parts and saved_widget_views(p)
)
ARTIFACTS = ROOT / "build" / "e2e"
# Notebooks running at once, one per tab (each with its kernel): one per core. While tabs wait for redraws,
# the checks beside them (lab_beside) fill the cores, and notebook 04 alone sets the pace (2 cores, on
# 2026-12-05: the other tab's four notebooks took 231 s of 04's 261 s); a third tab would cost one more boot
# of Lab, seconds of Chromium's CPU. E2E_TABS changes it.
PARALLEL_TABS = int(os.environ.get("E2E_TABS", str(min(os.cpu_count() or 2, 4))))
WIDGET_MANAGER = "@jupyter-widgets/jupyterlab-manager"
SELFTEST_WITHOUT_WIDGETS = "selftest/widget.ipynb without the widget manager"

skip_without_chromium()

ERROR_CELLS = [
    "print('before')",
    "raise ValueError('a lesson about errors')",  # tagged raises-exception: shown, and allowed
    "1 / 0",
    "print('after')",
]
# The suite's explorers run in the notebooks above; here one made with the same ``interactive`` (no torch
# to import), with a control it always disables: the test must look at it and never move it (Playwright
# would wait for it to be enabled until its timeout).
WIDGET_CELLS = [
    "%matplotlib inline\nimport ipywidgets",
    "ipywidgets.IntProgress(value=3, max=10)",  # a widget, not an explorer
    (
        "from matplotlib.figure import Figure\nfrom cglab.lab.interactive import interactive\n\n"
        "def picture(step, frozen):\n    figure = Figure(figsize=(3, 1))\n"
        "    figure.add_subplot().set_title(f'step {step}, frozen {frozen}')\n    return figure\n\n"
        "interactive(picture, {'step': ipywidgets.IntSlider(value=2, max=6, description='step'),\n"
        "                      'frozen': ipywidgets.Checkbox(description='frozen')},\n"
        "            state=lambda values: (('frozen',), 'frozen changes nothing here'))"
    ),
]


def _write_notebook(path: Path, sources: list[str], raising: tuple[int, ...] = ()) -> None:
    cells = [nbformat.v4.new_code_cell(source) for source in sources]
    for index in raising:
        cells[index].metadata["tags"] = ["raises-exception"]
    notebook = nbformat.v4.new_notebook(cells=cells)
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(notebook, path)


def stripped_suite(target: Path) -> None:
    """The notebooks with widgets as a learner who clears the outputs has them: copied without outputs
    or saved widget state, and without the work of the cells their widgets do not need; every other
    top-level entry linked, so ``../data`` and ``../tests`` resolve."""
    for entry in ROOT.iterdir():
        if entry.name != "notebooks" and not entry.name.startswith(".") and entry.name != "build":
            (target / entry.name).symlink_to(entry)
    for relative in NOTEBOOKS:
        notebook = nbformat.read(ROOT / relative, as_version=4)
        needed = cells_widgets_need(notebook.cells)
        for index, cell in enumerate(notebook.cells):
            if cell.cell_type == "code":
                cell.outputs, cell.execution_count = [], None
                if index not in needed:
                    # nbval ran this cell (make test); Lab runs it as a comment, so the cell numbers stay.
                    cell.source = "# run by nbval, not here: the browser test runs only the cells the widgets need"
                elif "nbval-skip" in cell.metadata.get("tags", []):
                    # The cells nbval skips (work make test already does: the regression tests run in a
                    # subprocess) are skipped here too; the cell still runs, as a comment.
                    cell.source = "# skipped by the browser test, as by nbval (make test runs this work itself)"
        notebook.metadata.pop("widgets", None)
        (target / relative).parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(notebook, target / relative)
    (target / "selftest").mkdir()
    _write_notebook(target / "selftest" / "error_cell.ipynb", ERROR_CELLS, raising=(1,))
    _write_notebook(target / "selftest" / "widget.ipynb", WIDGET_CELLS)


Job = tuple[str, str, Path | None]  # (result key, notebook path under the server's root, screenshot)


async def _run_all(queues: dict[LabServer, list[Job]], tabs: dict[LabServer, int]) -> dict[str, NotebookRun]:
    """Every queued notebook, each server's queue shared by that many tabs."""
    from playwright.async_api import async_playwright

    results: dict[str, NotebookRun] = {}
    async with async_playwright() as playwright:
        # A fresh profile in a temporary folder each launch (Playwright's default); one context for
        # every tab, so Lab's scripts are fetched once.
        browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        context = await browser.new_context()

        async def tab_worker(server: LabServer, queue: list[Job], workspace: str) -> None:
            tab = await LabTab.open(context, server, workspace)
            try:
                while queue:
                    key, path, screenshot = queue.pop(0)
                    results[key] = await tab.run(path, screenshot)
            finally:
                await tab.close()

        try:
            await asyncio.gather(
                *(
                    tab_worker(server, queue, f"e2e-{n}-{k}")
                    for n, (server, queue) in enumerate(queues.items())
                    for k in range(tabs[server])
                )
            )
        finally:
            await browser.close()
    return results


def _selected_notebooks(request: pytest.FixtureRequest) -> list[str]:
    """The notebooks whose tests this session runs (all, unless ``-k`` picked some)."""
    chosen = set()
    for item in request.session.items:
        callspec = getattr(item, "callspec", None)
        if getattr(item, "module", None) is request.module and callspec is not None and "path" in callspec.params:
            chosen.add(callspec.params["path"])
    return sorted(chosen) if chosen else NOTEBOOKS


def _cpu_seconds() -> float:
    """CPU time of this process (its threads too: the checks that run beside the notebooks, lab_beside) and
    of every child it has waited for (servers with their kernels, the browsers)."""
    usage = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    return sum(u.ru_utime + u.ru_stime for u in usage)


def _code_cells(path: Path) -> int:
    return sum(cell.cell_type == "code" for cell in nbformat.read(path, as_version=4).cells)


def _screenshot_name(path: str) -> Path:
    return ARTIFACTS / (path.removeprefix("notebooks/").replace("/", "__").removesuffix(".ipynb") + ".jpg")


@pytest.fixture(scope="module")
def lab_runs(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> dict[str, Any]:
    """Every notebook and both self-tests, run once, several tabs at a time; then everything stopped."""
    start_all(request)  # the checks that run beside these notebooks (lab_beside)
    start, cpu_start = time.perf_counter(), _cpu_seconds()
    root = tmp_path_factory.mktemp("suite")
    stripped_suite(root)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    for old in ARTIFACTS.glob("*.jpg"):
        old.unlink()
    lab = LabServer(root, tmp_path_factory.mktemp("lab"), log=ARTIFACTS / "jupyterlab.log")
    without_widgets = LabServer(
        root,
        tmp_path_factory.mktemp("lab-no-widgets"),
        disabled_extensions=[WIDGET_MANAGER],
        log=ARTIFACTS / "jupyterlab-no-widgets.log",
    )
    runs: dict[str, Any] = {}
    try:
        for server in (lab, without_widgets):
            server.start()  # both start at once; their Python imports overlap
        for server in (lab, without_widgets):
            server.wait_ready()
        # The longest notebooks first (by code cells), so the last tab to finish has a short one.
        ordered = sorted(_selected_notebooks(request), key=lambda p: -_code_cells(ROOT / p))
        main = [(path, path, _screenshot_name(path)) for path in ordered]
        main += [(path, path, None) for path in ("selftest/error_cell.ipynb", "selftest/widget.ipynb")]
        queues = {lab: main, without_widgets: [(SELFTEST_WITHOUT_WIDGETS, "selftest/widget.ipynb", None)]}
        runs |= asyncio.run(_run_all(queues, {lab: PARALLEL_TABS, without_widgets: 1}))
    finally:
        runs["leftover processes"] = lab.stop() + without_widgets.stop()
    excused = excuse_kernel_list_races(
        (run for key, run in runs.items() if isinstance(run, NotebookRun) and key != SELFTEST_WITHOUT_WIDGETS), lab
    )
    excused += excuse_kernel_list_races([runs[SELFTEST_WITHOUT_WIDGETS]], without_widgets)
    with request.config.pluginmanager.get_plugin("capturemanager").global_and_fixture_disabled():
        print(
            f"\nJupyterLab e2e: {time.perf_counter() - start:.0f} s, {_cpu_seconds() - cpu_start:.0f} s of CPU "
            f"(servers, kernels, browsers, the checks beside them), {PARALLEL_TABS} tabs at a time"
        )
        report = []
        for path, run in runs.items():
            if isinstance(run, NotebookRun):
                report.append(
                    f"{path}: {run.seconds:.1f} s, {run.cells} code cells, {run.widgets} widgets "
                    f"({run.explorers} explorers, {run.control_moves} control moves), "
                    f"{len(run.problems)} problems"
                )
                report += [f"    {problem}" for problem in run.problems]
        if excused:
            report.append(
                f"excused {excused} failed page load(s): jupyter_server's kernel-list race, "
                "named in its log (lab_server.KERNEL_LIST_RACE)"
            )
        print("\n".join(f"  {line}" for line in report if not line.startswith("    ")))
        (ARTIFACTS / "report.txt").write_text("\n".join(report) + "\n")
    return runs


@pytest.mark.parametrize("path", NOTEBOOKS)
def test_notebook_runs_in_jupyterlab(lab_runs: dict[str, Any], path: str) -> None:
    run = lab_runs[path]
    assert not run.problems, f"{path} in JupyterLab:\n  " + "\n  ".join(run.problems)
    assert run.screenshot is not None and run.screenshot.stat().st_size > 0


def _saved_widgets(path: Path) -> tuple[int, int]:
    """The committed notebook's widget outputs, and how many of them are explorers (their saved
    state holds an Output widget)."""
    notebook = nbformat.read(path, as_version=4)
    state = notebook.metadata.get("widgets", {}).get("application/vnd.jupyter.widget-state+json", {})
    models = state.get("state", {})

    def holds_output(model_id: str) -> bool:
        model = models.get(model_id)
        return model is not None and (
            model["model_name"] == "OutputModel"
            or any(holds_output(child.removeprefix("IPY_MODEL_")) for child in model["state"].get("children", []))
        )

    views = [
        output["data"][WIDGET_VIEW]["model_id"]
        for cell in notebook.cells
        if cell.cell_type == "code"
        for output in cell.outputs
        if WIDGET_VIEW in output.get("data", {})
    ]
    return len(views), sum(map(holds_output, views))


def test_the_explorers_were_explored(lab_runs: dict[str, Any]) -> None:
    """The browser showed as many widgets and explorers as each committed notebook saved, and moved
    the controls of every explorer (so the widget checks above are not vacuous)."""
    for path in (p for p in NOTEBOOKS if p in lab_runs):  # all of them, unless -k picked some
        widgets, explorers = _saved_widgets(ROOT / path)
        run = lab_runs[path]
        assert (run.widgets, run.explorers) == (widgets, explorers), (
            f"{path}: {run.widgets} widgets and {run.explorers} explorers in the browser, saved: {widgets}, {explorers}"
        )
        assert (run.control_moves > 0) == (explorers > 0), f"{path}: {run.control_moves} control moves"
    assert sum(_saved_widgets(ROOT / path)[1] for path in NOTEBOOKS) > 0, "no explorer anywhere: nothing was driven"


def test_an_error_cell_fails_the_run(lab_runs: dict[str, Any]) -> None:
    """Self-test: an untagged cell that raises is reported, and so is the cell Run All never reached;
    the tagged one is not."""
    assert lab_runs["selftest/error_cell.ipynb"].problems == [
        "cell 2 (1 / 0) raised ZeroDivisionError: division by zero",
        "cell 3 never ran (Run All stopped before it)",
    ]


def test_a_widget_without_its_lab_extension_fails_the_run(lab_runs: dict[str, Any]) -> None:
    """Self-test: the same widgets (an explorer with a disabled control, and a progress bar) pass with the
    widget manager and fail without it."""
    run = lab_runs["selftest/widget.ipynb"]
    assert (run.problems, run.widgets, run.explorers) == ([], 2, 1) and run.control_moves > 0
    problems = lab_runs[SELFTEST_WITHOUT_WIDGETS].problems
    assert problems and all(" shows a widget as text: " in p or "console error" in p for p in problems), problems
    assert any(
        p.startswith(f"cell 2 (from matplotlib.figure import Figure) shows a widget as text: {STILL_LINE}")
        for p in problems
    ), problems


def test_server_and_kernels_stopped(lab_runs: dict[str, Any]) -> None:
    assert lab_runs["leftover processes"] == [], "processes outlived the JupyterLab servers"
