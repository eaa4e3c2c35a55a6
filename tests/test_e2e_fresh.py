"""The committed notebooks opened in JupyterLab and not run: what a learner sees first, at 1280 x 800
with the file browser open (``make lab``'s layout).

Every notebook (the Chinese edition's too) is opened without a kernel: it must show one output for each
output it saved, every image among them loaded, with no error in the page. nbval runs each notebook and
compares its outputs with these, so the browser need not run it again (tests/test_e2e_lab.py runs only
what the widgets need).

JupyterLab draws a widget only in an output it trusts, and it trusts no notebook it did not run and
save itself (a fresh clone's): elsewhere it shows the output's other formats. So every widget output
must show either its still (``cglab.lab.interactive.still_html``: "Run this cell to get the controls."
above a picture that loaded) or the widget drawn from the state saved in the notebook; never its text
(``VBox(children=...)``), "Error displaying widget" or "Loading widget...". Each notebook with widgets is
opened twice, with no kernel and with one. A third case: a notebook run and saved in an earlier session
(signed in the notary database, its explorer naming a widget the saved state lacks) must show the still
too, since `make lab` and the test server keep signatures for one server only (Makefile's LAB_TRUST).

Tables and printed source must fit the output area: no table row (a line with " | " or "-+-") of a
cell calling ``verdict_table`` or ``describe_dispatch``, and no line printed by ``inspect.getsource``,
may be wider than the area, measured as rendered. The area's width, in pixels and characters, goes to
``build/e2e/fresh.txt``, and a screenshot of each explorer to ``build/e2e/fresh/``.

The notebooks are opened in one visit (``lab_committed``) that tests/test_e2e_zh.py reads too (each Chinese
notebook is opened once for both), and that runs beside tests/test_e2e_lab.py's notebooks (``lab_beside``).
Run it with ``pytest -m e2e tests/test_e2e_fresh.py`` (Chromium needed, as for test_e2e_lab.py).
Shown to fail once by hand: with 02 as committed before the still, it fails with "cell 18 shows as
text: VBox(children=..." (with and without a kernel) and its dispatch table's rows (184 characters);
without ``TRUST_OPTIONS`` the signed notebook shows "Loading widget..." for good (no kernel; with one,
JupyterLab says "Error displaying widget: model not found").
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from chromium import skip_without_chromium

pytest.importorskip("nbformat", reason="the notebook tests need Jupyter (make installs it)")
pytestmark = pytest.mark.e2e
skip_without_chromium()

from lab_committed import (  # noqa: E402  (after the skip: it reads the notebooks with nbformat)
    ARTIFACTS,
    HEIGHT,
    NO_KERNEL_ERROR_TEXT,
    NOTEBOOKS,
    SETTLE_TIMEOUT_S,
    SIGNED,
    WIDTH,
    WITH_TABLES,
    WITH_WIDGETS,
    committed_visits,
)
from lab_notebook import saved_widget_views  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
_IMAGES = (("loading", f"still loading after {SETTLE_TIMEOUT_S:.0f} s"), ("broken", "that did not load"))


@pytest.fixture(scope="module")
def fresh(request: pytest.FixtureRequest) -> dict[str, Any]:
    """Every notebook opened as committed, those with widgets again with a kernel, and the signed one;
    then all stopped (``lab_committed``, whose visit tests/test_e2e_zh.py reads too)."""
    seen = committed_visits(request)
    report = [
        f"{path}: output area {v['areaPx']} px ({v['chars']} characters of 13 px monospace), file browser "
        f"{v['leftPanelPx']} px, window {WIDTH}x{HEIGHT}; wrapped table lines: {v['wrapped'] or 'none'}"
        for path, v in seen["layout"].items()
    ]
    report += [
        f"{key}: kernel {v['kernel']}; " + "; ".join(f"cell {w['cell']}: {w['shows']}" for w in v["found"])
        for key, v in seen["widgets"].items()
    ]
    report += [
        f"{path}: {v['shown']} of {v['saved']} saved outputs shown, {v['images']} images ({v['broken']} broken), "
        f"{len(v['errors'])} errors in the page"
        for path, v in seen["outputs"].items()
    ]
    report.append(
        f"excused {seen['excused']} page error(s) of the widget manager without a kernel ({NO_KERNEL_ERROR_TEXT})"
    )
    (ARTIFACTS / "fresh.txt").write_text("\n".join(report) + "\n")
    return seen


def test_explorers_show_a_widget_or_their_still_never_text(fresh: dict[str, Any]) -> None:
    assert {
        "notebooks/02_toy_engine.ipynb",
        "notebooks/04_missing_metadata_bug.ipynb",
        "notebooks/05_replay_latency.ipynb",
    } <= set(WITH_WIDGETS)
    assert len(fresh["widgets"]) == 2 * len(WITH_WIDGETS) + 1
    problems = []
    for key, state in fresh["widgets"].items():
        path = key.split(" (")[0].replace("signed/", "notebooks/")
        if len(state["found"]) != saved_widget_views(ROOT / path):
            problems.append(
                f"{key}: {len(state['found'])} widget outputs shown, {saved_widget_views(ROOT / path)} saved"
            )
        if (state["kernel"] == "none") != key.endswith("(no kernel)"):
            problems.append(f"{key}: the kernel is {state['kernel']}")
        problems += [
            f"{key} cell {w['cell']} shows as text: {w['text']}" for w in state["found"] if w["shows"] == "text"
        ]
    assert not problems, "\n".join(problems)


def test_the_signed_notebook_from_an_earlier_session_shows_the_still(fresh: dict[str, Any]) -> None:
    assert [w["shows"] for w in fresh["widgets"][f"{SIGNED} (no kernel)"]["found"]] == ["still"]


def test_tables_and_printed_code_fit_beside_the_file_browser(fresh: dict[str, Any]) -> None:
    assert set(fresh["layout"]) == set(WITH_TABLES) and WITH_TABLES
    wrapped = {path: v["wrapped"] for path, v in fresh["layout"].items() if v["wrapped"]}
    assert not wrapped, (
        f"lines wider than the output area ({next(iter(fresh['layout'].values()))['chars']} characters): {wrapped}"
    )


def test_every_notebook_shows_its_saved_outputs(fresh: dict[str, Any]) -> None:
    """Each committed notebook, opened without a kernel, shows every output it saved, its images load,
    and the page logs no error. (nbval runs each notebook and compares these outputs with its own.)"""
    assert set(fresh["outputs"]) == set(NOTEBOOKS)
    problems = []
    for path, v in fresh["outputs"].items():
        if v["shown"] != v["saved"]:
            problems.append(f"{path}: {v['shown']} of its {v['saved']} saved outputs shown")
        problems += [f"{path}: {v[key]} image(s) {label}" for key, label in _IMAGES if v[key]]
        problems += [f"{path}: {error}" for error in v["errors"]]
    assert not problems, "\n".join(problems)
    assert sum(v["images"] for v in fresh["outputs"].values()) > 0, "no image anywhere: the image check saw nothing"


def test_server_and_kernels_stopped(fresh: dict[str, Any]) -> None:
    assert fresh["leftovers"] == [], "processes outlived the JupyterLab server"
