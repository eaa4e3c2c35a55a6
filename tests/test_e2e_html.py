"""``make html``'s pages, read in Chromium with the network off: every plot and widget shows.

The pages are built into a temporary folder (``tools/build_html.py``, as ``make html`` does; the
first build downloads the widget manager from the npm registry, later ones use the cache), then
opened from disk in an offline browser that refuses every request that is not for a local file.
Each page must make no such request and raise no error, every widget the notebook saved must be
rendered by the bundled widget manager (an explorer with its plot inside), and every image must load.
A screenshot of each page, scrolled to its first widget, lands in ``build/e2e/html/``. The build and the
reading run in a thread beside tests/test_e2e_lab.py's notebooks where both run (``lab_beside``).

Shown to fail once by hand: with nbconvert's default CDN URL for the widget manager
(``widget_renderer_url`` unset) every page with widgets fails with a refused request to
cdn.jsdelivr.net and its widgets not rendered.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import pytest
from chromium import CHROMIUM, CHROMIUM_ARGS, skip_without_chromium
from lab_beside import findings, register
from lab_notebook import WIDGET_VIEW, saved_widget_views

nbformat = pytest.importorskip("nbformat", reason="the notebook tests need Jupyter (make installs it)")

pytestmark = pytest.mark.e2e
skip_without_chromium()

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted(p for p in (ROOT / "notebooks").rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)
ARTIFACTS = ROOT / "build" / "e2e" / "html"
RENDER_TIMEOUT_MS = 30_000

# Per page: the widget views the page holds, how many the manager rendered, explorers without a plot,
# images that did not load, and "Error displaying widget" messages.
_STATE = """() => {
  const views = Array.from(document.querySelectorAll('script[type="WIDGET_VIEW"]'));
  const rendered = views.filter(v => v.parentElement.querySelector('.widget-subarea .jupyter-widgets'));
  return {
    views: views.length, rendered: rendered.length,
    withoutPlot: rendered.filter(v => v.parentElement.querySelector('.widget-output')
                                   && !v.parentElement.querySelector('.widget-output img')).length,
    brokenImages: Array.from(document.images).filter(img => !(img.complete && img.naturalWidth > 0)).length,
    widgetErrors: Array.from(document.querySelectorAll('.jupyter-widgets')).filter(
        n => n.innerText.includes('Error displaying widget')).length,
  };
}""".replace("WIDGET_VIEW", WIDGET_VIEW)


def _build_html() -> Any:
    from test_build_html import load_build_html  # one loader of tools/build_html.py for both files

    return load_build_html()


async def _read_offline(out: Path, pages: list[Path], expected: list[int]) -> list[list[str]]:
    """Each page's problems, read in an offline browser that refuses every non-file request."""
    from playwright.async_api import Route, async_playwright
    from playwright.async_api import TimeoutError as PlaywrightTimeout

    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        context = await browser.new_context(offline=True, viewport={"width": 1280, "height": 900})
        refused: list[str] = []

        async def only_files(route: Route) -> None:
            if route.request.url.startswith("file://"):
                await route.continue_()
            else:
                refused.append(route.request.url)
                await route.abort()

        await context.route("**/*", only_files)
        found = []
        for page_path, widgets in zip(pages, expected):
            page = await context.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda error, errors=errors: errors.append(f"page error: {error}"))
            refused.clear()
            await page.goto(page_path.as_uri())
            if widgets:
                with contextlib.suppress(PlaywrightTimeout):  # the counts below say what is missing
                    await page.wait_for_function(f"() => ({_STATE})().rendered >= {widgets}", timeout=RENDER_TIMEOUT_MS)
            state = await page.evaluate(_STATE)
            problems = [*errors, *(f"requested {url}" for url in refused)]
            if state["views"] != widgets or state["rendered"] != widgets:
                problems.append(
                    f"{state['rendered']} of {state['views']} widget views rendered, the notebook saved {widgets}"
                )
            problems += [
                f"{state[key]} {label}"
                for key, label in (
                    ("withoutPlot", "explorer(s) without their plot"),
                    ("brokenImages", "image(s) that did not load"),
                    ("widgetErrors", "'Error displaying widget' message(s)"),
                )
                if state[key]
            ]
            first_widget = page.locator(".widget-subarea").first
            if await first_widget.count():
                await first_widget.scroll_into_view_if_needed()
            shot = ARTIFACTS / (page_path.relative_to(out).with_suffix(".jpg").as_posix().replace("/", "__"))
            shot.parent.mkdir(parents=True, exist_ok=True)
            await page.screenshot(path=str(shot), type="jpeg", quality=70)
            found.append(problems)
            await page.close()
        await browser.close()
    return found


def _build_and_read(factory: pytest.TempPathFactory, _modules: set[str]) -> tuple[Path, list[Path], list[list[str]]]:
    """The pages built and read offline: the output folder, the pages, each page's problems."""
    build_html = _build_html()
    out = factory.mktemp("html") / "html"
    pages = build_html.build(NOTEBOOKS, out)
    expected = [saved_widget_views(path) for path in NOTEBOOKS]
    assert sum(expected) > 0, "no notebook saved a widget: this test would check nothing about widgets"
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    for old in ARTIFACTS.glob("*.jpg"):
        old.unlink()
    return out, pages, asyncio.run(_read_offline(out, pages, expected))


# tests/test_e2e_lab.py starts it, to run beside its notebooks (lab_beside).
register("html pages", _build_and_read, modules=("test_e2e_html",))


def test_html_pages_show_plots_and_widgets_offline(request: pytest.FixtureRequest) -> None:
    out, pages, found = findings(request, "html pages")
    problems = [
        f"{page.relative_to(out)}: {problem}" for page, page_problems in zip(pages, found) for problem in page_problems
    ]
    assert not problems, "\n".join(problems)
    assert (out / "index.html").read_text().count('href="') == len(NOTEBOOKS)
