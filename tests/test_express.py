"""The express path's picture (cglab.lab.express): what a compiled piece recorded, with and without metadata."""

from __future__ import annotations

import pytest
from matplotlib.figure import Figure

from cglab import ModelRunner, ToyConfig
from cglab.compilation_config import CompilationConfig
from cglab.errors import ConfigError
from cglab.lab.express import OpRow, compare_recordings, describe_recordings, draw_recordings, recorded_ops

# The short conv's kernel as the toy records it: write the new state row, read the taps, convolve.
SHORT_CONV_OPS = ["index_put_", "index", "ge", "where", "mul", "sum", "mul", "add"]


@pytest.fixture(scope="module")
def runners() -> dict[bool, ModelRunner]:
    """Compiled PIECEWISE on the simulator, one graph size, fixed (False) and legacy (True)."""
    return {
        legacy: ModelRunner(ToyConfig(), CompilationConfig("piecewise", (4,), legacy_skip_attn=legacy), device="cpu")
        for legacy in (False, True)
    }


def test_legacy_piece_lacks_exactly_the_short_conv_kernel(runners: dict[bool, ModelRunner]) -> None:
    fixed, legacy = recorded_ops(runners[False]), recorded_ops(runners[True])
    rows = compare_recordings(fixed, legacy)
    assert [r.op for r in rows if r.in_first and not r.in_second] == SHORT_CONV_OPS
    assert all(r.in_first for r in rows), "the legacy piece recorded an op the fixed one did not"
    assert len(fixed) - len(legacy) == len(SHORT_CONV_OPS)


def test_pieces_without_stateful_layers_record_the_same(runners: dict[bool, ModelRunner]) -> None:
    assert recorded_ops(runners[False], "submod_4") == recorded_ops(runners[True], "submod_4")


def test_counts_agree_with_the_anatomy(runners: dict[bool, ModelRunner]) -> None:
    from cglab.lab.anatomy import graph_pieces

    for runner in runners.values():
        (piece,) = [p for p in graph_pieces(runner) if p.name == "submod_0"]
        assert len(recorded_ops(runner)) == piece.num_ops


def test_splitting_ops_and_unknown_pieces_are_refused(runners: dict[bool, ModelRunner]) -> None:
    with pytest.raises(ConfigError, match="splitting op"):
        recorded_ops(runners[False], "submod_1")
    with pytest.raises(ConfigError, match="not a piece"):
        recorded_ops(runners[False], "submod_9")


def test_runners_without_compiled_pieces_are_refused() -> None:
    with pytest.raises(ConfigError, match="compiled PIECEWISE"):
        recorded_ops(ModelRunner(ToyConfig(), CompilationConfig("full", (4,)), device="cpu"))
    with pytest.raises(ConfigError, match="compiled PIECEWISE"):
        recorded_ops(
            ModelRunner(ToyConfig(), CompilationConfig("piecewise", (4,), use_breakable_cg=True), device="cpu")
        )


def test_compare_recordings_aligns_in_order() -> None:
    rows = compare_recordings(["a", "b", "c", "d"], ["a", "d", "e"])
    assert rows == [
        OpRow("a", True, True),
        OpRow("b", True, False),
        OpRow("c", True, False),
        OpRow("d", True, True),
        OpRow("e", False, True),
    ]


def test_describe_and_draw() -> None:
    text = describe_recordings(["a", "b"], ["a"])
    assert text.splitlines()[2].split() == ["b", "---", "<-", "only", "with", "metadata"]
    assert "2 ops" in text.splitlines()[-1] and "1 ops" in text.splitlines()[-1]
    fig = draw_recordings(["a", "b"], ["a"], piece="submod_0")
    assert isinstance(fig, Figure)
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert texts.count("nothing recorded") == 1 and "without metadata (legacy): 1 ops" in texts
