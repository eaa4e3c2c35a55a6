"""The text and pictures of what a captured forward is made of: pieces, replays, the Python at replay."""

from __future__ import annotations

import pytest

from cglab import BatchExecutionDescriptor, ConfigError, CUDAGraphMode, ModelRunner, ToyConfig
from cglab.compilation_config import CompilationConfig
from cglab.lab.anatomy import Piece, describe_pieces, describe_replays, graph_pieces, trace_replay
from cglab.lab.draw import draw_graph_anatomy

CONFIG = ToyConfig(layers=("sconv", "attn", "compressor", "attn"), max_num_reqs=4)
SIZES = (1, 4)
PIECEWISE_4 = BatchExecutionDescriptor(CUDAGraphMode.PIECEWISE, 4)
FULL_4 = BatchExecutionDescriptor(CUDAGraphMode.FULL, 4, 4, uniform_token_count=1)
ATTN, SCONV = "cglab::unified_attention", "cglab::short_conv"
WHERE = {"cpu": "simulator", "cuda": "cuda"}  # how output names the graph backend


def _prefill(runner: ModelRunner) -> None:
    for i in range(3):
        runner.add_request(f"r{i}")
        runner.step({f"r{i}": [1 + i, 2, 3]}, eager=True)


def _texts(fig) -> list[str]:
    return [t.get_text() for t in fig.axes[0].texts]


def test_compiled_pieces_are_the_submodules_of_the_split_graph(device):
    runner = ModelRunner(CONFIG, CompilationConfig("full_and_piecewise", SIZES), device=device)
    pieces = graph_pieces(runner, PIECEWISE_4)
    assert [(p.name, p.eager) for p in pieces] == [
        ("submod_0", False),
        ("submod_1", True),
        ("submod_2", False),
        ("submod_3", True),
        ("submod_4", False),
    ]
    assert [p.num_ops for p in pieces if not p.eager] == [g.num_ops for g in runner.captured_graphs(PIECEWISE_4)]
    assert [p.op for p in pieces] == [SCONV, ATTN, "cglab::compressor", ATTN, ""]  # frozen inside, or run eagerly
    assert pieces[0].span == "embed_tokens … layers.1.mixer" and pieces[1].span == "layers.1.mixer"
    assert pieces[-1].span.endswith("lm_head")
    full_ops = runner.captured_graphs(FULL_4)[0].num_ops
    assert graph_pieces(runner, FULL_4) == [Piece("segment 0", False, full_ops)]
    runner.close()


def test_breakable_segments_cut_where_the_compiled_pieces_do(device):
    compiled = ModelRunner(CONFIG, CompilationConfig("piecewise", SIZES), device=device)
    breakable = ModelRunner(CONFIG, CompilationConfig("piecewise", SIZES, use_breakable_cg=True), device=device)
    pieces = graph_pieces(breakable)  # default: the first graph captured, the largest
    assert [p.name for p in pieces] == ["segment 0", "eager step", "segment 1", "eager step", "segment 2"]
    assert [p.op for p in pieces if p.eager] == [ATTN, ATTN]  # named by op, not by the Python function
    assert [p.eager for p in pieces] == [p.eager for p in graph_pieces(compiled)]
    if device == "cpu":  # the simulator runs a compiled piece as traced; on a GPU inductor fuses its ops
        assert [p.num_ops for p in pieces] == [p.num_ops for p in graph_pieces(compiled)]
    text = describe_pieces(breakable)
    assert text.splitlines()[0].startswith("PIECEWISE(tokens=4, reqs=any), breakable")
    assert "  eager step  eager  cglab::unified_attention: its Python runs at every step" in text.splitlines()
    compiled.close()
    breakable.close()


def test_a_short_conv_splitting_op_becomes_an_eager_piece(device):
    runner = ModelRunner(CONFIG, CompilationConfig("piecewise", SIZES, splitting_ops=[ATTN, SCONV]), device=device)
    pieces = graph_pieces(runner, PIECEWISE_4)
    assert [p.eager for p in pieces] == [False, True, False, True, False, True, False]
    assert (pieces[1].name, pieces[1].op, pieces[1].span) == ("submod_1", SCONV, "layers.0.mixer")
    assert pieces[0].op == ""  # nothing stateful is frozen in the first graph any more
    lines = describe_pieces(runner).splitlines()
    total = sum(g.num_ops for g in runner.captured_graphs(PIECEWISE_4))
    assert lines[1] == f"  4 graph(s), {total} ops; 3 eager step(s)"
    assert "split at cglab::unified_attention, cglab::short_conv" in lines[0]
    assert lines[3] == "  submod_1  eager  cglab::short_conv at layers.0.mixer: its Python runs at every step"
    every_op = ModelRunner(
        CONFIG, CompilationConfig("piecewise", SIZES, splitting_ops=[ATTN, SCONV, "cglab::compressor"]), device=device
    )
    assert [p.span for p in graph_pieces(every_op)[4:7]] == [  # spans name modules, not their projections
        "layers.1.mixer … layers.2.mixer",
        "layers.2.mixer",
        "layers.2.mixer … layers.3.mixer",
    ]
    every_op.close()
    texts = _texts(draw_graph_anatomy({"split": pieces}))
    assert texts.count("sconv") == 1 and texts.count("attn") == 2
    assert [t for t in texts if t.startswith("submod")] == ["submod_0", "submod_2", "submod_4", "submod_6"]
    runner.close()


def test_anatomy_of_plain_graphs_labels_eager_steps_by_their_op():
    runner = ModelRunner(CONFIG, CompilationConfig("full_and_piecewise", SIZES, use_breakable_cg=True))
    (full,), (piecewise,) = runner.captured_graphs(FULL_4), runner.captured_graphs(PIECEWISE_4)
    fig = draw_graph_anatomy({"full": full, "piecewise": piecewise})
    texts = _texts(fig)
    assert texts.count("attn") == 2 and texts.count("sconv") == 0  # breakable: cut at attention only
    assert not any(t.startswith(("submod", "segment")) for t in texts)  # plain graphs: no piece names
    assert str(fig) == "Figure(900x300)"  # notebooks show its text form; the size must not drift
    runner.close()


def _drawn_right_edge(fig) -> float:
    return max(bar.get_x() + bar.get_width() for bar in fig.axes[0].patches)


@pytest.mark.parametrize(
    "rows",
    [
        {
            "FULL": [Piece("segment 0", False, 133)],
            "PIECEWISE": [
                Piece("segment 0", False, 25),
                Piece("eager step", True, op=ATTN),
                Piece("segment 1", False, 10),
            ],
        },
        {
            "eager ends it": [Piece("segment 0", False, 130), Piece("eager step", True, op=ATTN)],
            "short": [Piece("segment 0", False, 5)],
        },
    ],
    ids=["graph-longest", "eager-longest"],
)
def test_the_anatomy_axis_ends_where_the_longest_row_does(rows):
    fig = draw_graph_anatomy(rows)
    ax = fig.axes[0]
    assert ax.get_xlim() == (0, _drawn_right_edge(fig))
    eager = [bar.get_width() for bar in ax.patches if bar.get_facecolor() != ax.patches[0].get_facecolor()]
    assert f"an eager step is drawn {eager[0]:.3g} ops wide" in ax.get_xlabel()  # the axis says how it counts
    if "FULL" in rows:
        assert ax.get_xlim()[1] == 133  # the op count the widest graph is labelled with


def test_replay_counts_per_piece_and_size(device):
    runner = ModelRunner(CONFIG, CompilationConfig("piecewise", SIZES), device=device)
    _prefill(runner)
    for _ in range(3):
        runner.step({"r0": [1], "r1": [2], "r2": [3]})  # 3 tokens: PIECEWISE(tokens=4)
    runner.step({"r0": [4]})  # PIECEWISE(tokens=1)
    assert runner.compiled_backend.num_compiles == 1
    assert describe_replays(runner).splitlines() == [
        "replays   tokens=4  tokens=1",
        "submod_0         3         1",
        "submod_2         3         1",
        "submod_4         3         1",
    ]
    runner.close()


def test_trace_shows_the_python_that_runs_at_replay(device):
    compiled = ModelRunner(CONFIG, CompilationConfig("full_and_piecewise", SIZES), device=device)
    _prefill(compiled)
    lines = trace_replay(compiled, {"r0": [1], "r1": [2, 3]}).splitlines()
    ops = [p.num_ops for p in graph_pieces(compiled, PIECEWISE_4)]
    attention = ["        _unified_attention: the Python body of cglab::unified_attention, run eagerly"]
    assert lines == [
        f"ModelRunner.execute: PIECEWISE(tokens=4, reqs=any) ({WHERE[device]})",
        "  CompiledModel: calls the compiled graph directly (dynamo traced the model once, at start-up)",
        "    split graph forward (Python generated by the compiler): calls the submodules in order",
        *[
            line
            for i in (0, 2, 4)
            for line in (
                f"      CUDAGraphWrapper(submod_{i}): replays its graph for this descriptor",
                f"        graph replay: {ops[i]} ops, as recorded at capture",
                *([f"      submod_{i + 1}.forward (generated Python of a splitting op)", *attention] if i < 4 else []),
            )
        ],
    ]  # no module's forward: they ran once, when dynamo traced them
    full = trace_replay(compiled, {"r0": [4], "r1": [5], "r2": [6]}).splitlines()
    full_ops = compiled.captured_graphs(FULL_4)[0].num_ops
    assert full == [
        f"ModelRunner.execute: FULL(tokens=4, reqs=4, uniform=1) ({WHERE[device]})",
        "  CudaGraphManager.run_fullgraph: replays the FULL graph, no forward context",
        "    CapturedGraph.replay: the recorded steps, in order",
        f"      graph replay: {full_ops} ops, as recorded at capture",
    ]
    assert compiled.requests["r0"].num_computed_tokens == 5  # the traced steps really ran
    compiled.close()

    breakable = ModelRunner(CONFIG, CompilationConfig("piecewise", SIZES, use_breakable_cg=True), device=device)
    _prefill(breakable)
    lines = trace_replay(breakable, {"r0": [1], "r1": [2, 3]}).splitlines()
    assert [line.strip().split(":")[0] for line in lines[2:]] == [
        "graph replay",
        "EagerStep.replay",
        "_unified_attention",
        "graph replay",
        "EagerStep.replay",
        "_unified_attention",
        "graph replay",
    ]
    breakable.close()


def test_trace_of_an_eager_step_runs_the_modules_or_the_generated_code():
    eager = ModelRunner(CONFIG, "none")
    _prefill(eager)
    lines = trace_replay(eager, {"r0": [1]}).splitlines()
    assert lines[0] == "ModelRunner.execute: NONE(tokens=1, reqs=1) (eager)"
    assert "    DecoderLayer.forward (layers.0)" in lines and "      ShortConv.forward (layers.0.mixer)" in lines
    compiled = ModelRunner(CONFIG, CompilationConfig("piecewise", SIZES))
    _prefill(compiled)
    lines = trace_replay(compiled, {"r0": [1]}, eager=True).splitlines()
    assert "      CUDAGraphWrapper(submod_0): mode NONE is not its own, so it runs the piece" in lines
    assert "        submod_0.forward (generated Python of a piece, run eagerly)" in lines
    assert not any("DecoderLayer" in line for line in lines)
    compiled.close()


def test_describing_a_runner_without_those_graphs_is_a_config_error():
    with pytest.raises(ConfigError, match="captured no graphs"):
        describe_pieces(ModelRunner(CONFIG, "none"))
    full = ModelRunner(CONFIG, CompilationConfig("full", SIZES))
    with pytest.raises(ConfigError, match=r"no graph was captured for PIECEWISE\(tokens=4, reqs=any\); captured: FULL"):
        graph_pieces(full, PIECEWISE_4)
    with pytest.raises(ConfigError, match="no compiled PIECEWISE pieces"):
        describe_replays(full)
    with pytest.raises(ConfigError, match="no compiled PIECEWISE pieces"):
        describe_replays(ModelRunner(CONFIG, CompilationConfig("piecewise", SIZES, use_breakable_cg=True)))
    full.close()
