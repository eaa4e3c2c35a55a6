"""The Chinese edition in JupyterLab, in headless Chromium: every notebook of notebooks/zh/, opened as
committed, shows its Chinese prose and its saved outputs with no error; the one with the fewest code cells
(00b) then runs from notebooks/zh/ with Lab's Run All.

The Chinese notebooks' code cells are the English ones (tools/translations.py copies them), and nbval runs
those; only the folder they run from is new, and one Run All shows it works. Notebooks are found by glob,
so a new one is checked without changes here. All share one tab. A screenshot of each lands in
``build/e2e/zh/``. The text check reads the page's DOM; whether the glyphs look right depends on the
machine's fonts (a Chinese font, e.g. Debian's fonts-noto-cjk, for the screenshots to show them).

Shown to fail once by hand, with the generated 00b's title cell made English again and an untagged
``1 / 0`` cell with a saved error inserted: as committed, "its first heading shows no Chinese" and "shows
an error output (ZeroDivisionError) in a cell not tagged raises-exception"; after Run All, "cell 3 (1 / 0)
raised ZeroDivisionError" and "cells 5, 7, ... never ran".

Run it with ``make test-e2e`` or ``pytest -m e2e tests/test_e2e_zh.py``.
"""

from __future__ import annotations

import asyncio
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
from chromium import CHROMIUM, CHROMIUM_ARGS, skip_without_chromium
from lab_notebook import OPEN_NOTEBOOK, PANEL, LabTab, NotebookRun
from lab_server import LabServer, excuse_kernel_list_races

nbformat = pytest.importorskip("nbformat", reason="the notebook tests need Jupyter (make installs it)")

pytestmark = pytest.mark.e2e
skip_without_chromium()

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "build" / "e2e" / "zh"
CJK = re.compile(r"[\u4e00-\u9fff]")
NOTEBOOKS = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "notebooks" / "zh").glob("*.ipynb"))


def _code_cells(path: str) -> int:
    return sum(cell.cell_type == "code" for cell in nbformat.read(ROOT / path, as_version=4).cells)


# The one run with Lab's Run All: the notebook with the fewest code cells, of those with any.
RUN_ALL = min((p for p in NOTEBOOKS if _code_cells(p)), key=_code_cells)

# Every markdown cell rendered (Lab renders them when the notebook is shown).
_RENDERED = f"""(path) => {{ const panel = {PANEL};
  const markdown = panel ? panel.content.widgets.filter(c => c.model.type === 'markdown') : [];
  return markdown.length > 0 && markdown.every(c => c.rendered && c.node.querySelector('.jp-RenderedMarkdown h1, '
    + '.jp-RenderedMarkdown h2, .jp-RenderedMarkdown p, .jp-RenderedMarkdown li')); }}"""
# What a reader sees without running anything: the rendered prose, the headings, the saved outputs.
_SHOWN = f"""(path) => {{ const panel = {PANEL};
  const cells = panel.content.widgets;
  const markdown = cells.filter(c => c.model.type === 'markdown');
  const code = cells.filter(c => c.model.type === 'code');
  return {{
    prose: markdown.map(c => c.node.querySelector('.jp-RenderedMarkdown').innerText).join('\\n'),
    headings: Array.from(panel.content.node.querySelectorAll('.jp-RenderedMarkdown h1, .jp-RenderedMarkdown h2'))
      .map(h => h.innerText),
    outputs: code.reduce((n, c) => n + c.outputArea.node.querySelectorAll('.jp-OutputArea-output').length, 0),
    errors: code.filter(c => !(c.model.getMetadata('tags') || []).includes('raises-exception'))
      .flatMap(c => c.model.outputs.toJSON().filter(o => o.output_type === 'error').map(o => o.ename)),
    brokenImages: Array.from(panel.content.node.querySelectorAll('img'))
      .filter(img => !(img.complete && img.naturalWidth > 0)).length,
  }};
}}"""


def fresh_problems(shown: dict[str, Any], saved_outputs: int) -> list[str]:
    """What is wrong with a freshly opened Chinese notebook, from ``_SHOWN``'s findings."""
    problems = []
    if not shown["headings"] or not CJK.search(shown["headings"][0]):
        problems.append(f"its first heading shows no Chinese: {shown['headings'][:2]}")
    if (count := len(CJK.findall(shown["prose"]))) < 200:
        problems.append(f"its prose shows {count} Chinese characters")
    if saved_outputs and not shown["outputs"]:
        problems.append("shows none of its saved outputs")
    problems += [f"shows an error output ({name}) in a cell not tagged raises-exception" for name in shown["errors"]]
    if shown["brokenImages"]:
        problems.append(f"{shown['brokenImages']} image(s) did not load")
    return problems


async def _open_fresh(tab: LabTab, path: str, screenshot: Path) -> NotebookRun:
    """``path`` opened as committed, nothing run: its problems, errors in the page since the last look
    included. It stays open: closing a notebook whose kernel has just started cancels the debugger's start-up
    request, which Lab reports as a console error. ``LabTab.run`` runs it in the same panel; the tab's close
    ends the rest, and the server's stop shuts every kernel down."""
    run = NotebookRun(path)
    await tab.page.evaluate(OPEN_NOTEBOOK, path)
    await tab.page.wait_for_function(f"(path) => ({_RENDERED})(path)", arg=path, timeout=60_000)
    saved = sum(len(c.outputs) for c in nbformat.read(ROOT / path, as_version=4).cells if c.cell_type == "code")
    run.problems += fresh_problems(await tab.page.evaluate(_SHOWN, path), saved)
    screenshot.parent.mkdir(parents=True, exist_ok=True)
    await tab.page.screenshot(path=str(screenshot), type="jpeg", quality=70)
    run.problems += tab.take_problems()
    return run


async def _check(server: LabServer) -> dict[str, NotebookRun]:
    from playwright.async_api import async_playwright

    found: dict[str, NotebookRun] = {}
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        context = await browser.new_context()
        try:
            tab = await LabTab.open(context, server, "zh")  # one tab for all: booting Lab costs seconds of CPU
            try:
                for path in NOTEBOOKS:
                    name = Path(path).stem
                    found[f"{path} as committed"] = await _open_fresh(tab, path, ARTIFACTS / f"{name}-fresh.jpg")
                    if path == RUN_ALL:
                        found[f"{path} after Run All"] = await tab.run(path, ARTIFACTS / f"{name}-run.jpg")
            finally:
                await tab.close()
        finally:
            await browser.close()
    return found


@pytest.fixture(scope="module")
def zh_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, NotebookRun]:
    """The Chinese notebooks opened in a Lab serving a copy of notebooks/ (Run All must not touch the files)."""
    root = tmp_path_factory.mktemp("suite")
    shutil.copytree(ROOT / "notebooks", root / "notebooks", ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
    for entry in ("cglab", "data"):
        (root / entry).symlink_to(ROOT / entry)
    server = LabServer(root, tmp_path_factory.mktemp("lab"), log=ARTIFACTS / "jupyterlab.log")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    server.start()
    try:
        server.wait_ready()
        found = asyncio.run(_check(server))
    finally:
        leftovers = server.stop()
    assert not leftovers, f"processes outlived the JupyterLab server: {leftovers}"
    excuse_kernel_list_races(found.values(), server)
    return found


@pytest.mark.parametrize("key", [f"{p} as committed" for p in NOTEBOOKS] + [f"{RUN_ALL} after Run All"])
def test_the_chinese_notebooks_render_in_jupyterlab(zh_runs: dict[str, NotebookRun], key: str) -> None:
    problems = zh_runs[key].problems
    assert not problems, f"{key}:\n  " + "\n  ".join(problems)


def test_fresh_problems_names_english_prose_and_an_error_output() -> None:
    shown = {"prose": "中" * 300, "headings": ["00b · 快速路径"], "outputs": 3, "errors": [], "brokenImages": 0}
    assert fresh_problems(shown, 3) == []
    assert fresh_problems({**shown, "outputs": 0}, 0) == []  # a notebook of prose alone (the glossary)
    english = {**shown, "prose": "The express path", "headings": ["00b · The express path", "1 · 复现"]}
    assert fresh_problems(english, 3) == [
        "its first heading shows no Chinese: ['00b · The express path', '1 · 复现']",
        "its prose shows 0 Chinese characters",
    ]
    assert fresh_problems({**shown, "errors": ["ZeroDivisionError"], "outputs": 0}, 3) == [
        "shows none of its saved outputs",
        "shows an error output (ZeroDivisionError) in a cell not tagged raises-exception",
    ]
