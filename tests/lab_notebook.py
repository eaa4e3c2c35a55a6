"""Notebooks in a JupyterLab tab, as a learner meets them: open, Run All, look at what rendered.

A ``LabTab`` is one browser tab running JupyterLab, reused for one notebook after another (booting
Lab costs seconds of CPU per page). ``LabTab.run`` opens a notebook, runs every cell with Lab's own
Run All, and lists the problems a learner would see: a cell that raised without the
``raises-exception`` tag, a cell that never ran because an earlier one failed, a widget shown as
text (``VBox(children=...)``), a plot that did not load, an error in the page or inside a widget.
It then drives every explorer (``lab_explorer.explore``), saves a screenshot of the whole notebook,
and closes it, shutting its kernel down. Problems are collected, not raised, so one run reports all.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lab_explorer import explore, is_explorer
from notebook_names import WIDGET_VIEW

if TYPE_CHECKING:  # the module imports without Playwright, so a test can skip when it is missing
    from lab_server import LabServer
    from playwright.async_api import BrowserContext, ConsoleMessage, Page

RUN_ALL_TIMEOUT_S = 300.0
QUIET_S = 0.4  # how long the kernel must stay idle, with nothing left to run, before Run All counts as done
WIDTH, HEIGHT = 1280, 900
MAX_SCREENSHOT_HEIGHT = 30_000

# The notebook panel showing PATH.
PANEL = "Array.from(window.jupyterapp.shell.widgets('main')).find(w => w.context && w.context.path === path)"
_KERNEL_STATUS = f"""(path) => {{ const session = ({PANEL}).sessionContext.session;
  return session && session.kernel ? session.kernel.status : 'none'; }}"""

# How far Run All is: cells Lab shows as queued or running, and cells without an execution count that
# the kernel will still run (those before the first untagged error, after which the kernel drops the
# rest). Lab's "running" flag alone is not enough: once a cell tagged raises-exception fails, Lab marks
# every waiting cell idle while the kernel goes on running them.
_PROGRESS = """(path) => {
  const cells = (PANEL).content.widgets.filter(cell => cell.model.type === 'code');
  const failed = cell => {
    const outputs = cell.model.outputs;
    for (let k = 0; k < outputs.length; k++) if (outputs.get(k).type === 'error') return true;
    return false;
  };
  let stop = cells.findIndex(cell => failed(cell)
      && !(cell.model.getMetadata('tags') || []).includes('raises-exception'));
  if (stop < 0) stop = cells.length;
  return {running: cells.filter(cell => cell.model.executionState === 'running').length,
          waiting: cells.slice(0, stop).filter(cell => cell.model.sharedModel.getSource().trim()
              && cell.model.executionCount === null).length};
}""".replace("PANEL", PANEL)

# What every code cell shows after the run, from Lab's models and the page together: the model says
# what the kernel sent, the page how it rendered. Rendered widgets get a data-e2e-widget number, so
# the explorer step can find them again.
_INSPECT = """(path) => {
  const panel = PANEL;
  let widgetNumber = 0;
  return panel.content.widgets.filter(cell => cell.model.type === 'code').map(cell => {
    const outputs = cell.model.outputs.toJSON();
    const shown = Array.from(cell.outputArea.node.querySelectorAll(
        ':scope > .jp-OutputArea-child > .jp-OutputArea-output'));
    return {
      index: panel.content.widgets.indexOf(cell), source: cell.model.sharedModel.getSource(),
      executionCount: cell.model.executionCount, tags: cell.model.getMetadata('tags') || [],
      errors: outputs.filter(o => o.output_type === 'error').map(o => o.ename + ': ' + o.evalue),
      stderr: outputs.filter(o => o.output_type === 'stream' && o.name === 'stderr')
        .map(o => [].concat(o.text).join('')),
      widgets: outputs.map((o, k) => [o, shown[k]])
        .filter(([o]) => o.data && o.data['application/vnd.jupyter.widget-view+json'])
        .map(([o, node]) => {
          const rendered = !!(node && node.querySelector('.jupyter-widgets'));
          if (rendered) node.setAttribute('data-e2e-widget', String(widgetNumber));
          return {number: rendered ? widgetNumber++ : null, rendered,
                  text: node ? node.innerText.slice(0, 120) : '(nothing shown)'};
        }),
      brokenImages: Array.from(cell.outputArea.node.querySelectorAll('img'))
        .filter(img => !(img.complete && img.naturalWidth > 0)).length,
    };
  });
}""".replace("PANEL", PANEL)

# Errors shown inside widgets: a failed redraw prints its traceback into the explorer's output area.
_WIDGET_ERRORS = """(path) => Array.from((PANEL).content.node.querySelectorAll(
    '.jupyter-widgets [data-mime-type="application/vnd.jupyter.stderr"], .jupyter-widgets .jupyter-widgets-error'))
  .map(node => node.innerText.slice(0, 300))""".replace("PANEL", PANEL)

OPEN_NOTEBOOK = """async (path) => {
  const panel = await window.jupyterapp.commands.execute('docmanager:open', {path, factory: 'Notebook'});
  await panel.context.ready;
  await panel.sessionContext.ready;
  window.jupyterapp.shell.activateById(panel.id);
  await panel.revealed;
  return panel.id;
}"""
_RUN_ALL = "() => window.jupyterapp.commands.execute('notebook:run-all-cells')"
# Closing a run notebook would ask whether to save it; shutting the kernel down and disposing of the
# panel closes it without a question and without writing the file.
CLOSE_NOTEBOOK = f"async (path) => {{ const panel = {PANEL}; await panel.sessionContext.shutdown(); panel.dispose(); }}"
# The notebook's scrolling area, scrolled back to the top (the explorers left it at the bottom); returns
# its full height.
_TO_TOP = f"""(path) => {{ const node = ({PANEL}).content.node;
  const scroller = node.querySelector('.jp-WindowedPanel-outer') || node;
  scroller.scrollTop = 0;
  return scroller.scrollHeight; }}"""


@dataclass
class NotebookRun:
    """What one notebook's run found; ``problems`` is empty when a learner would see it work."""

    path: str
    problems: list[str] = field(default_factory=list)
    cells: int = 0
    widgets: int = 0
    explorers: int = 0
    control_moves: int = 0
    seconds: float = 0.0
    screenshot: Path | None = None


def cell_problems(cells: list[dict[str, Any]]) -> list[str]:
    """The problems in the inspected cells (see ``_INSPECT``). Cells are numbered as in Lab's list,
    from 0, markdown cells included; each is named with the start of its first line."""
    problems, never_ran = [], []
    for cell in cells:
        first_line = cell["source"].strip().split("\n")[0]
        where = f"cell {cell['index']} ({first_line[:40]})"
        if "raises-exception" not in cell["tags"]:
            problems += [f"{where} raised {error}" for error in cell["errors"]]
            problems += [
                f"{where} printed a traceback: {text[-300:]}" for text in cell["stderr"] if "Traceback" in text
            ]
        if cell["source"].strip() and cell["executionCount"] is None:
            never_ran.append(str(cell["index"]))
        problems += [f"{where} shows a widget as text: {w['text']}" for w in cell["widgets"] if not w["rendered"]]
        if cell["brokenImages"]:
            problems.append(f"{where} has {cell['brokenImages']} image(s) that did not load")
    if never_ran:
        cells_named = f"cell{'s' * (len(never_ran) > 1)} {', '.join(never_ran)}"
        problems.append(f"{cells_named} never ran (Run All stopped before {'them' if len(never_ran) > 1 else 'it'})")
    return problems


class LabTab:
    """A browser tab with JupyterLab loaded, in a Lab workspace of its own (tabs share no layout)."""

    def __init__(self, page: Page) -> None:
        self.page = page
        self._problems: list[str] = []  # errors in the page, charged to the notebook open at the time
        page.on("pageerror", lambda error: self._problems.append(f"page error: {error}"))
        page.on("console", self._on_console)

    def _on_console(self, message: ConsoleMessage) -> None:
        if message.type == "error":
            self._problems.append(f"console error: {message.text[:300]}")

    @classmethod
    async def open(cls, context: BrowserContext, server: LabServer, workspace: str) -> LabTab:
        page = await context.new_page()
        await page.set_viewport_size({"width": WIDTH, "height": HEIGHT})
        tab = cls(page)
        await page.goto(server.url(f"lab/workspaces/{workspace}?reset"))
        await page.wait_for_function("window.jupyterapp && window.jupyterapp.shell", timeout=60_000)
        await page.evaluate("async () => { await window.jupyterapp.restored; window.jupyterapp.shell.collapseLeft(); }")
        return tab

    def take_problems(self) -> list[str]:
        """The errors in the page since the last call (or since the tab opened), forgotten here."""
        problems, self._problems = self._problems, []
        return problems

    async def run(self, path: str, screenshot: Path | None) -> NotebookRun:
        """Open ``path`` (relative to the server's root), Run All, check, explore, screenshot, close."""
        run = NotebookRun(path)
        start = time.perf_counter()
        try:
            panel_id = await self.page.evaluate(OPEN_NOTEBOOK, path)
            await asyncio.wait_for(self.page.evaluate(_RUN_ALL), RUN_ALL_TIMEOUT_S)
            await self._wait_until_ran(path)
            cells = await self.page.evaluate(_INSPECT, path)
            run.cells = len(cells)
            run.problems += cell_problems(cells)
            numbers = [w["number"] for c in cells for w in c["widgets"] if w["rendered"]]
            run.widgets = len(numbers)
            for number in numbers:
                widget = self.page.locator(f'#{panel_id} [data-e2e-widget="{number}"]')
                if not await is_explorer(widget):
                    continue
                problems, moves = await explore(widget, lambda: self.page.evaluate(_KERNEL_STATUS, path))
                run.problems += [f"explorer {number}: {problem}" for problem in problems]
                run.explorers += 1
                run.control_moves += moves
            widget_errors = await self.page.evaluate(_WIDGET_ERRORS, path)
            run.problems += [f"a widget shows an error: {text}" for text in widget_errors]
            if screenshot is not None:
                await self._screenshot(path, screenshot)
                run.screenshot = screenshot
        except Exception as error:
            run.problems.append(f"the run broke down: {type(error).__name__}: {error}")
        try:
            await self.page.evaluate(CLOSE_NOTEBOOK, path)
        except Exception as error:
            run.problems.append(f"closing the notebook failed: {type(error).__name__}: {error}")
        run.problems += self.take_problems()
        run.seconds = time.perf_counter() - start
        return run

    async def _wait_until_ran(self, path: str) -> None:
        """Wait until every cell the kernel will run has run, and the kernel has been idle for ``QUIET_S``."""
        deadline = time.monotonic() + RUN_ALL_TIMEOUT_S
        quiet_since, progress, status = None, {}, "unknown"
        while time.monotonic() < deadline:
            progress = await self.page.evaluate(_PROGRESS, path)
            status = await self.page.evaluate(_KERNEL_STATUS, path)
            if status == "dead":
                raise RuntimeError("the kernel died")
            if progress == {"running": 0, "waiting": 0} and status == "idle":
                quiet_since = quiet_since or time.monotonic()
                if time.monotonic() - quiet_since >= QUIET_S:
                    return
            else:
                quiet_since = None
            await asyncio.sleep(0.5)
        raise TimeoutError(f"Run All not done after {RUN_ALL_TIMEOUT_S:.0f} s ({progress}, kernel {status})")

    async def _screenshot(self, path: str, target: Path) -> None:
        """The whole notebook in one image: the viewport grows to the notebook's height first (Lab
        scrolls inside the page, so a full-page screenshot would show only the first screen)."""
        height = await self.page.evaluate(_TO_TOP, path)
        await self.page.set_viewport_size({"width": WIDTH, "height": min(int(height) + 200, MAX_SCREENSHOT_HEIGHT)})
        await self.page.wait_for_timeout(300)  # one layout pass at the new size
        await self.page.evaluate(_TO_TOP, path)
        target.parent.mkdir(parents=True, exist_ok=True)
        await self.page.screenshot(path=str(target), type="jpeg", quality=70)
        await self.page.set_viewport_size({"width": WIDTH, "height": HEIGHT})

    async def close(self) -> None:
        await self.page.close()


def saved_widget_views(path: Path) -> int:
    """How many widget outputs ``path`` holds, as saved."""
    import nbformat

    notebook = nbformat.read(path, as_version=4)
    return sum(
        WIDGET_VIEW in output.get("data", {})
        for cell in notebook.cells
        if cell.cell_type == "code"
        for output in cell.outputs
    )
