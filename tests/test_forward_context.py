"""The forward context is per thread: two concurrent forward passes never see each other's metadata."""

from __future__ import annotations

import threading

import pytest

from cglab import get_forward_context, set_forward_context
from cglab.config import CUDAGraphMode


def test_each_thread_sees_its_own_forward_context():
    barrier = threading.Barrier(2, timeout=10)
    seen: dict[str, list[object]] = {"a": [], "b": []}

    def forward(name: str, mode: CUDAGraphMode) -> None:
        with set_forward_context({"layer": name}, cg_mode=mode):
            barrier.wait()  # both contexts are set before either thread reads: a shared global must clash
            for _ in range(2000):
                context = get_forward_context()
                seen[name].append((context.attn_metadata["layer"], context.cg_mode))
            barrier.wait()  # neither leaves (and restores) while the other still reads
        with pytest.raises(RuntimeError, match="no forward context is set"):
            get_forward_context()  # leaving restores this thread's own previous state: none

    errors: list[BaseException] = []

    def run(name: str, mode: CUDAGraphMode) -> None:
        try:
            forward(name, mode)
        except BaseException as e:
            errors.append(e)
            barrier.abort()

    threads = [
        threading.Thread(target=run, args=("a", CUDAGraphMode.FULL)),
        threading.Thread(target=run, args=("b", CUDAGraphMode.PIECEWISE)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert set(seen["a"]) == {("a", CUDAGraphMode.FULL)} and len(seen["a"]) == 2000
    assert set(seen["b"]) == {("b", CUDAGraphMode.PIECEWISE)} and len(seen["b"]) == 2000
    assert not errors


def test_nested_contexts_restore_the_outer_one():
    with set_forward_context(None) as outer:
        with set_forward_context({"x": 1}, cg_mode=CUDAGraphMode.FULL):
            assert get_forward_context().attn_metadata == {"x": 1}
        assert get_forward_context() is outer
