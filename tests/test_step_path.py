"""The code path of one replayed step stays short: a reader can follow it file by file.

One compiled ``ModelRunner.step`` after capture (PIECEWISE, then FULL) runs under ``sys.setprofile``,
with plain torch.compile (the trace cache off). Every call
that lands in a ``cglab/`` file is charged to the ``cglab/`` code that made it, found by walking back
through torch's frames (dynamo, the generated split forward, ``nn.Module.__call__``). The path may
not climb back into ``runner.py`` from a deeper module (as a replay that called back into a closure
of the runner once did), and the files and file-to-file calls it touches are capped, so the path
cannot grow back unseen. The step runs as on a GPU, without the simulator's address check (a debug
aid that reads every cache through its layer before each replay); a test below bounds what it adds.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

from cglab import CompilationConfig, ModelRunner, ToyConfig
from cglab.compilation import CompiledModel, caching

PACKAGE = Path(__file__).resolve().parents[1] / "cglab"
MAX_FILES = {"piecewise": 13, "full": 8}
MAX_CALLS = 48


@pytest.fixture(autouse=True)
def plain_compile(monkeypatch: pytest.MonkeyPatch) -> None:
    """The path a learner traces: without the trace cache the tests install (``caching.py``)."""
    monkeypatch.setattr(CompiledModel, "compile", caching.PLAIN_COMPILE)


def _cglab_file(frame: FrameType | None) -> str | None:
    path = Path(frame.f_code.co_filename) if frame is not None else None
    return path.relative_to(PACKAGE).as_posix() if path is not None and path.is_relative_to(PACKAGE) else None


def _caller_in_cglab(frame: FrameType) -> str | None:
    caller = frame.f_back
    while caller is not None and _cglab_file(caller) is None:
        caller = caller.f_back
    return _cglab_file(caller)


def step_calls(runner: ModelRunner, scheduled: dict[str, list[int]]) -> Counter[tuple[str, str]]:
    """(caller file, callee file) of every call between two ``cglab/`` files during one step."""
    calls: Counter[tuple[str, str]] = Counter()

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event != "call":
            return
        callee = _cglab_file(frame)
        caller = _caller_in_cglab(frame) if callee is not None else None
        if caller is not None and caller != callee:
            calls[caller, callee] += 1

    sys.setprofile(profile)
    try:
        runner.step(scheduled)
    finally:
        sys.setprofile(None)
    return calls


def _piecewise_step(mode: str, check_addresses: bool = False) -> tuple[ModelRunner, Counter[tuple[str, str]]]:
    runner = ModelRunner(ToyConfig(), CompilationConfig(mode, (2,), check_addresses=check_addresses))
    for name, prompt in (("a", [1, 2, 3]), ("b", [4, 5])):
        runner.add_request(name)
        runner.step({name: prompt}, eager=True)
    runner.step({"a": [6], "b": [7]})  # first replay: anything lazy happens here, not in the counted step
    return runner, step_calls(runner, {"a": [8], "b": [9]})


@pytest.mark.parametrize(
    "mode, desc", [("piecewise", "PIECEWISE(tokens=2, reqs=any)"), ("full", "FULL(tokens=2, reqs=2)")]
)
def test_a_compiled_step_never_climbs_back_into_the_runner(mode: str, desc: str) -> None:
    runner, calls = _piecewise_step(mode)
    assert {str(d): n for d, n in runner.graph_replays().items()} == {desc: 2}
    back = {caller: n for (caller, callee), n in calls.items() if callee == "runner.py"}
    assert not back, f"calls back into runner.py from deeper modules: {back}"
    files = {f for pair in calls for f in pair}
    assert len(files) <= MAX_FILES[mode], sorted(files)
    assert sum(calls.values()) <= MAX_CALLS, calls.most_common()


def test_the_full_step_is_no_longer_than_the_piecewise_one() -> None:
    _, piecewise = _piecewise_step("piecewise")
    _, full = _piecewise_step("full")
    assert sum(full.values()) <= sum(piecewise.values())


def test_the_address_check_adds_only_the_reads_of_the_caches() -> None:
    _, plain = _piecewise_step("piecewise")
    _, checked = _piecewise_step("piecewise", check_addresses=True)
    added = checked - plain
    assert {callee for _, callee in added} <= {
        "cudagraph_utils.py",
        "model.py",
        "layers/attention.py",
        "layers/sconv.py",
        "layers/compressor.py",
    }, added
