"""The committed notebooks in one JupyterLab, each opened once for every check that reads it as committed.

``committed_visits`` starts one server (serving a copy of notebooks/ and a notebook signed in an earlier
session) and one headless Chromium tab, at 1280 x 800 with the file browser open (``make lab``'s layout),
and opens every notebook without a kernel: what tests/test_e2e_fresh.py checks (widget outputs, saved
outputs, images, errors in the page, tables that fit) and what tests/test_e2e_zh.py checks of the Chinese
edition (its prose and headings) are read in the same visit. The notebooks with widgets are opened again
with a kernel, and the Chinese notebook with the fewest code cells runs with Lab's Run All. Each part runs
only where a module of this pytest session asks for it; the first module to ask starts the visit, and
the other reads its findings. Screenshots land in ``build/e2e/fresh/`` and ``build/e2e/zh/``.
"""

from __future__ import annotations

import asyncio
import shutil
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from chromium import CHROMIUM, CHROMIUM_ARGS
from lab_beside import findings, register
from lab_notebook import CLOSE_NOTEBOOK, OPEN_NOTEBOOK, PANEL, WIDGET_VIEW, LabTab, saved_widget_views
from lab_server import LabServer, excuse_kernel_list_races

from cglab.lab.interactive import STILL_LINE

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "build" / "e2e"
WIDTH, HEIGHT = 1280, 800
FITTING = ("verdict_table(", "describe_dispatch(", "getsource(")  # cells whose printed lines must not wrap
SETTLE_TIMEOUT_S = 60.0
STABLE_S = 0.5  # how long the widget outputs must stay the same, with nothing loading, to count as settled
SIGNED = "signed/02_toy_engine.ipynb"  # run and saved in an earlier session
# A notebook opened with "No Kernel" makes the widget manager (ipywidgets' lab extension) read the kernel of
# a session that does not exist: one uncaught error per notebook, nothing shown. `make lab` opens every
# notebook with a kernel, so a learner never meets it; the test excuses it once per such notebook.
NO_KERNEL_ERROR_TEXT = "Cannot read properties of null (reading 'kernel')"
NO_KERNEL_ERROR = "the widget manager's error without a kernel"


def _code(path: Path) -> list[str]:
    import nbformat

    return [cell.source for cell in nbformat.read(path, as_version=4).cells if cell.cell_type == "code"]


NOTEBOOKS = sorted(
    p.relative_to(ROOT).as_posix() for p in (ROOT / "notebooks").rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts
)
WITH_WIDGETS = [p for p in NOTEBOOKS if saved_widget_views(ROOT / p)]
WITH_TABLES = [p for p in NOTEBOOKS if any(f in source for source in _code(ROOT / p) for f in FITTING)]
ZH = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "notebooks" / "zh").glob("*.ipynb"))
# The Chinese notebook run with Lab's Run All: the one with the fewest code cells, of those with any.
ZH_RUN_ALL = min((p for p in ZH if _code(ROOT / p)), key=lambda p: len(_code(ROOT / p)))

# Without a kernel: the notebook factory told not to start one, as if the learner chose "No Kernel".
_PREFER_KERNEL = "(kernel) => { window.jupyterapp.docRegistry.getWidgetFactory('Notebook')._preferKernel = kernel; }"
# Every widget output as shown: a widget, a still, or something else (its text).
_WIDGETS = (
    """(path) => {
  const panel = PANEL;
  const kernel = panel.sessionContext.session && panel.sessionContext.session.kernel;
  const found = [];
  panel.content.widgets.forEach((cell, index) => {
    if (cell.model.type !== 'code') return;
    const shown = Array.from(cell.outputArea.node.querySelectorAll(
        ':scope > .jp-OutputArea-child > .jp-OutputArea-output'));
    cell.model.outputs.toJSON().forEach((output, k) => {
      if (!(output.data && output.data['WIDGET_VIEW'])) return;
      const node = shown[k];
      const text = node ? node.innerText.trim() : '(nothing shown)';
      const images = node ? Array.from(node.querySelectorAll('img')) : [];
      const loaded = images.length > 0 && images.every(img => img.complete && img.naturalWidth > 0);
      const widget = !!(node && node.querySelector('.jupyter-widgets .widget-output'));
      const still = text.startsWith('STILL_LINE') && loaded;
      if (node) node.setAttribute('data-e2e-fresh', String(found.length));
      found.push({cell: index, shows: widget && !/Error displaying widget/.test(text) ? 'widget'
                                     : still ? 'still' : 'text', text: text.slice(0, 100)});
    });
  });
  return {kernel: kernel ? kernel.status : 'none', found};
}""".replace("PANEL", PANEL)
    .replace("WIDGET_VIEW", WIDGET_VIEW)
    .replace("STILL_LINE", STILL_LINE)
)
# Every saved output of the code cells, and whether each shows: one rendered output per saved one, and
# the images among them loaded (images still loading are counted apart, so the caller can wait for them).
_OUTPUTS = """(path) => {
  const code = (PANEL).content.widgets.filter(cell => cell.model.type === 'code');
  const images = code.flatMap(cell => Array.from(cell.outputArea.node.querySelectorAll('img')));
  return {saved: code.reduce((n, cell) => n + cell.model.outputs.length, 0),
          shown: code.reduce((n, cell) => n + cell.outputArea.node.querySelectorAll(
              ':scope > .jp-OutputArea-child > .jp-OutputArea-output').length, 0),
          images: images.length, loading: images.filter(img => !img.complete).length,
          broken: images.filter(img => img.complete && img.naturalWidth === 0).length};
}""".replace("PANEL", PANEL)
# The output area's width, and every line of a FITTING cell's output wider than the area: each line
# of printed source, and each table row (a line with " | " or "-+-"), measured as rendered unwrapped.
_LAYOUT = """([path, fitting]) => {
  const panel = PANEL;
  const area = panel.content.node.querySelector('.jp-OutputArea-output');
  const pre = panel.content.node.querySelector('.jp-OutputArea-output pre');
  const probe = document.createElement('span');
  probe.textContent = 'x'.repeat(100);
  pre.appendChild(probe);
  const charWidth = probe.getBoundingClientRect().width / 100;
  probe.remove();
  const wrapped = [];
  panel.content.widgets.forEach((cell, index) => {
    const source = cell.model.sharedModel.getSource();
    if (cell.model.type !== 'code' || !fitting.some(f => source.includes(f))) return;
    const code = source.includes('getsource(');
    cell.outputArea.node.querySelectorAll('.jp-OutputArea-output pre').forEach(node => {
      const line = document.createElement('span');
      line.style.whiteSpace = 'pre';
      node.appendChild(line);
      for (const text of node.textContent.split('\\n')) {
        line.textContent = text;
        if ((code || / \\| |-\\+-/.test(text)) && line.getBoundingClientRect().width > node.clientWidth)
          wrapped.push({cell: index, characters: text.length, line: text.slice(0, 60)});
      }
      line.remove();
    });
  });
  return {areaPx: area.clientWidth, prePx: pre.clientWidth, chars: Math.floor(pre.clientWidth / charWidth),
          leftPanelPx: document.querySelector('#jp-left-stack').getBoundingClientRect().width, wrapped};
}""".replace("PANEL", PANEL)


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


def _signed_earlier(source: Path, target: Path, data_dir: Path) -> None:
    """``source`` as JupyterLab saves it after Run All: the widget outputs name new widgets (the saved
    state keeps the old ones), and the notebook is signed in ``data_dir``'s notary database."""
    import nbformat
    from nbformat.sign import NotebookNotary

    notebook = nbformat.read(source, as_version=4)
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            if WIDGET_VIEW in output.get("data", {}):
                output["data"][WIDGET_VIEW]["model_id"] = uuid.uuid4().hex
    data_dir.mkdir(parents=True, exist_ok=True)
    NotebookNotary(data_dir=str(data_dir)).sign(notebook)
    target.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(notebook, target)


async def _settled(page: Any, path: str) -> dict[str, Any]:
    """The widget outputs once none is still loading, the kernel, if any, is idle, and both have stayed
    so for ``STABLE_S`` (a late redraw would show in a later look)."""
    deadline, state, since = time.monotonic() + SETTLE_TIMEOUT_S, {}, None
    while time.monotonic() < deadline:
        last, state = state, await page.evaluate(_WIDGETS, path)
        loading = any("Loading widget" in w["text"] for w in state["found"])
        if loading or state["kernel"] not in ("none", "idle") or state != last:
            since = None
        elif since is None:
            since = time.monotonic()
        elif time.monotonic() - since >= STABLE_S:
            return state
        await asyncio.sleep(0.2)
    return state


def _page_error(error: Any) -> str:
    """An uncaught error in the page, as a problem; ``NO_KERNEL_ERROR`` where it is that one."""
    known = str(error).endswith(NO_KERNEL_ERROR_TEXT) and "@jupyter-widgets/jupyterlab-manager" in (error.stack or "")
    return NO_KERNEL_ERROR if known else f"page error: {error}"


async def _outputs_shown(page: Any, path: str) -> dict[str, Any]:
    """``_OUTPUTS`` once no image is still loading (or after ``SETTLE_TIMEOUT_S``)."""
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    while (state := await page.evaluate(_OUTPUTS, path))["loading"] and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    return state


async def _look(server: LabServer, *, fresh: bool, zh: bool) -> dict[str, Any]:
    from playwright.async_api import async_playwright

    seen: dict[str, Any] = {"widgets": {}, "layout": {}, "outputs": {}, "zh": {}, "excused": 0}
    shots = ARTIFACTS / "fresh"
    for folder in (shots, ARTIFACTS / "zh"):
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = await browser.new_page(viewport={"width": WIDTH, "height": HEIGHT})
            errors: list[str] = []  # errors in the page, charged to the notebook open at the time
            page.on("pageerror", lambda error: errors.append(_page_error(error)))
            page.on("console", lambda m: errors.append(f"console error: {m.text[:300]}") if m.type == "error" else None)
            await page.goto(server.url("lab/workspaces/fresh?reset"))
            await page.wait_for_function("window.jupyterapp && window.jupyterapp.shell", timeout=60_000)
            await page.evaluate("async () => { await window.jupyterapp.restored; }")  # file browser left open
            opened = [*NOTEBOOKS, SIGNED] if fresh else ZH
            visits = [(p, False) for p in opened] + [(p, True) for p in WITH_WIDGETS if fresh]
            for path, kernel in visits:
                await page.evaluate(_PREFER_KERNEL, kernel)
                panel = await page.evaluate(OPEN_NOTEBOOK, path)
                key = f"{path} ({'a kernel' if kernel else 'no kernel'})"
                if fresh and (path in WITH_WIDGETS or path == SIGNED):
                    seen["widgets"][key] = await _settled(page, path)
                    for number in range(len(seen["widgets"][key]["found"])):
                        node = page.locator(f'#{panel} [data-e2e-fresh="{number}"]')
                        await node.scroll_into_view_if_needed()
                        stem = path.removeprefix("notebooks/").removesuffix(".ipynb").replace("/", "__")
                        name = f"{stem}-{'kernel' if kernel else 'nokernel'}-{number}.jpg"
                        await page.screenshot(path=str(shots / name), type="jpeg", quality=70)
                if not kernel and path in WITH_TABLES:
                    seen["layout"][path] = await page.evaluate(_LAYOUT, [path, list(FITTING)])
                if not kernel and path in NOTEBOOKS:
                    seen["outputs"][path] = await _outputs_shown(page, path)
                if not kernel and path in ZH:
                    await page.wait_for_function(f"(path) => ({_RENDERED})(path)", arg=path, timeout=60_000)
                    seen["zh"][path] = await page.evaluate(_SHOWN, path)
                    shot = ARTIFACTS / "zh" / f"{Path(path).stem}-fresh.jpg"
                    await page.screenshot(path=str(shot), type="jpeg", quality=70)
                await page.evaluate(CLOSE_NOTEBOOK, path)
                if not kernel and path in NOTEBOOKS:  # with a kernel, closing logs its cancelled start-up requests
                    if NO_KERNEL_ERROR in errors:  # once per notebook opened without a kernel, no more
                        errors.remove(NO_KERNEL_ERROR)
                        seen["excused"] += 1
                    seen["outputs"][path]["errors"] = errors[:]
                errors.clear()
            if zh:  # a kernel for Run All; the tab's own record of errors starts here
                await page.evaluate(_PREFER_KERNEL, True)
                tab = LabTab(page)
                stem = Path(ZH_RUN_ALL).stem
                seen["zh run"] = await tab.run(ZH_RUN_ALL, ARTIFACTS / "zh" / f"{stem}-run.jpg")
        finally:
            await browser.close()
    return seen


def _visit(factory: pytest.TempPathFactory, modules: set[str]) -> dict[str, Any]:
    """The visit, for the parts whose modules this session runs (``fresh``'s: every notebook, the signed
    one, those with widgets again with a kernel; ``zh``'s: the Chinese ones, and Run All of ``ZH_RUN_ALL``).
    The server and every kernel are stopped at the end: ``leftovers`` names any process that outlived them."""
    fresh, zh = "test_e2e_fresh" in modules, "test_e2e_zh" in modules
    root, home = factory.mktemp("committed"), factory.mktemp("committed-lab")
    for entry in ROOT.iterdir():
        if not entry.name.startswith(".") and entry.name not in ("notebooks", "build"):
            (root / entry.name).symlink_to(entry)
    # A copy: Run All must not touch the files.
    shutil.copytree(ROOT / "notebooks", root / "notebooks", ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
    _signed_earlier(ROOT / "notebooks" / "02_toy_engine.ipynb", root / SIGNED, home / "data")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    server = LabServer(root, home, log=ARTIFACTS / "jupyterlab-committed.log")
    try:
        server.start()
        server.wait_ready()
        seen = asyncio.run(_look(server, fresh=fresh or not zh, zh=zh))
    finally:
        seen_leftovers = server.stop()
    seen["leftovers"] = seen_leftovers
    if "zh run" in seen:
        excuse_kernel_list_races([seen["zh run"]], server)
    return seen


# Read by both modules; tests/test_e2e_lab.py starts it, to run beside its notebooks (lab_beside).
register("committed notebooks", _visit, modules=("test_e2e_fresh", "test_e2e_zh"))


def committed_visits(request: pytest.FixtureRequest) -> dict[str, Any]:
    """The visit's findings (``_visit``), once it has run."""
    return findings(request, "committed notebooks")
