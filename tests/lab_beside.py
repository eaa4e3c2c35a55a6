"""Browser checks that run beside tests/test_e2e_lab.py's notebooks, each in a thread of its own.

The notebooks of tests/test_e2e_lab.py keep about one core busy for most of their run: notebook 04's
explorer, which redraws one change after another in one kernel, sets the pace. A check that needs none of
that test's servers or kernels (the committed notebooks' visit, ``make html``'s pages) registers here when
its module is imported; test_e2e_lab starts every registered check that a module of this session reads,
and each module reads its check's findings with ``findings``, which starts the check where nothing did
(the module run alone). A check's error is raised again where its findings are read.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection
from typing import Any

import pytest

# A check takes the session's temporary-path factory and the names of the test modules this session runs.
Check = Callable[[pytest.TempPathFactory, set[str]], Any]
_CHECKS: dict[str, tuple[Check, Collection[str]]] = {}
_RUNS: dict[str, tuple[threading.Thread, dict[str, Any]]] = {}


def register(name: str, check: Check, *, modules: Collection[str]) -> None:
    """``check``, run once a session for whichever of ``modules`` (test modules' names) this session runs."""
    _CHECKS[name] = (check, modules)


def _session_modules(request: pytest.FixtureRequest) -> set[str]:
    return {item.module.__name__.rsplit(".", 1)[-1] for item in request.session.items if hasattr(item, "module")}


def start(request: pytest.FixtureRequest, name: str) -> None:
    """Start check ``name`` in a thread, unless it has started already."""
    if name in _RUNS:
        return
    check, _ = _CHECKS[name]
    factory: pytest.TempPathFactory = request.getfixturevalue("tmp_path_factory")
    # The session's base folder is made on first use and pytest does not lock it: made here, in the main
    # thread, a check's thread and the main thread cannot each make one and mix their paths.
    factory.getbasetemp()
    modules, box = _session_modules(request), {}

    def run() -> None:
        try:
            box["findings"] = check(factory, modules)
        except BaseException as error:  # raised again where the findings are read
            box["error"] = error

    thread = threading.Thread(target=run, name=name, daemon=True)
    _RUNS[name] = (thread, box)
    thread.start()


def start_all(request: pytest.FixtureRequest) -> None:
    """Start every registered check that a module of this session reads."""
    modules = _session_modules(request)
    for name, (_, readers) in _CHECKS.items():
        if modules & set(readers):
            start(request, name)


def findings(request: pytest.FixtureRequest, name: str) -> Any:
    """Check ``name``'s findings, once it has run (started here unless it was already)."""
    start(request, name)
    thread, box = _RUNS[name]
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["findings"]
