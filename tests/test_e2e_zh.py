"""The Chinese edition in JupyterLab, in headless Chromium: every notebook of notebooks/zh/, opened as
committed, shows its Chinese prose and its saved outputs with no error; the one with the fewest code cells
(00b) then runs from notebooks/zh/ with Lab's Run All.

The Chinese notebooks' code cells are the English ones (tools/translations.py copies them), and nbval runs
those; only the folder they run from is new, and one Run All shows it works. Notebooks are found by glob,
so a new one is checked without changes here. They are opened without a kernel in the visit that
tests/test_e2e_fresh.py reads too (``lab_committed``: one tab, each notebook opened once for both), with
its errors in the page; the Run All follows in the same tab. A screenshot of each lands in
``build/e2e/zh/``. The text check reads the page's DOM; whether the glyphs look right depends on the
machine's fonts (a Chinese font, e.g. Debian's fonts-noto-cjk, for the screenshots to show them).

Shown to fail once by hand, with the generated 00b's title cell made English again and an untagged
``1 / 0`` cell with a saved error inserted: as committed, "its first heading shows no Chinese" and "shows
an error output (ZeroDivisionError) in a cell not tagged raises-exception"; after Run All, "cell 3 (1 / 0)
raised ZeroDivisionError" and "cells 5, 7, ... never ran".

Run it with ``make test-e2e`` or ``pytest -m e2e tests/test_e2e_zh.py``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from chromium import skip_without_chromium

nbformat = pytest.importorskip("nbformat", reason="the notebook tests need Jupyter (make installs it)")
pytestmark = pytest.mark.e2e
skip_without_chromium()

from lab_committed import ZH, ZH_RUN_ALL, committed_visits  # noqa: E402  (after the skip)

ROOT = Path(__file__).resolve().parents[1]
CJK = re.compile(r"[\u4e00-\u9fff]")
NOTEBOOKS, RUN_ALL = ZH, ZH_RUN_ALL


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


@pytest.fixture(scope="module")
def zh_runs(request: pytest.FixtureRequest) -> dict[str, list[str]]:
    """Each Chinese notebook's problems as committed (its look in ``lab_committed``'s visit, shared with
    tests/test_e2e_fresh.py, and the errors in the page while it was open), and those of the Run All."""
    seen = committed_visits(request)
    assert not seen["leftovers"], f"processes outlived the JupyterLab server: {seen['leftovers']}"
    found = {}
    for path in NOTEBOOKS:
        saved = sum(len(c.outputs) for c in nbformat.read(ROOT / path, as_version=4).cells if c.cell_type == "code")
        found[f"{path} as committed"] = fresh_problems(seen["zh"][path], saved) + seen["outputs"][path]["errors"]
    found[f"{RUN_ALL} after Run All"] = seen["zh run"].problems
    return found


@pytest.mark.parametrize("key", [f"{p} as committed" for p in NOTEBOOKS] + [f"{RUN_ALL} after Run All"])
def test_the_chinese_notebooks_render_in_jupyterlab(zh_runs: dict[str, list[str]], key: str) -> None:
    problems = zh_runs[key]
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
