"""``describe_dispatch``: the table of batch shape -> descriptor, per policy, that notebooks 02 and 03 print."""

from cglab import ModelRunner, ToyConfig
from cglab.compilation_config import CompilationConfig
from cglab.lab.describe import BatchShape, describe_dispatch, dispatch_cell

SIZES, MAX_REQS = (1, 2, 4, 8), 6


def _row(table: str, label: str) -> list[str]:
    [line] = [ln for ln in table.splitlines() if ln.split(" | ")[0].strip() == label]
    return [c.strip() for c in line.split(" | ")]


def test_one_column_per_policy_in_order():
    table = describe_dispatch(SIZES, MAX_REQS, [BatchShape("3 decodes", (1, 1, 1))])
    header = [c.strip() for c in table.splitlines()[2].split(" | ")]
    assert header == ["batch", "uniform", "FULL", "FULL_AND_PIECEWISE", "FULL_DECODE_ONLY", "PIECEWISE"]


def test_rows_follow_the_dispatch_rules():
    shapes = [
        BatchShape("3 decodes", (1, 1, 1)),
        BatchShape("5 decodes", (1,) * 5),
        BatchShape("chunk", (4, 1, 1), (True,)),
        BatchShape("1-token chunk", (1, 1), (True,)),
        BatchShape("1-token chunk, by shape", (1, 1), (True,), by_shape=True),
        BatchShape("too large", (8, 1), (True,)),
    ]
    table = describe_dispatch(SIZES, MAX_REQS, shapes)
    assert _row(table, "3 decodes")[1:] == ["1", "FULL 4/4", "FULL 4/4 u=1", "FULL 4/4 u=1", "PIECEWISE 4"]
    # FULL(8) would need 8 requests > max_num_reqs: the uniform-decode candidates stop at 4, PIECEWISE takes over
    assert _row(table, "5 decodes")[2:] == ["FULL 8/6", "PIECEWISE 8", "eager", "PIECEWISE 8"]
    # plain FULL serves a mixed batch; the decode-only policies do not
    assert _row(table, "chunk")[1:] == ["-", "FULL 8/6", "PIECEWISE 8", "eager", "PIECEWISE 8"]
    assert _row(table, "1-token chunk")[1:4] == ["-", "FULL 2/2", "PIECEWISE 2"]
    assert _row(table, "1-token chunk, by shape")[1:4] == ["1", "FULL 2/2", "FULL 2/2 u=1"]
    assert _row(table, "too large")[2:] == ["eager"] * 4
    assert max(map(len, table.splitlines())) <= 107  # beside JupyterLab's file browser at 1280 pixels


def test_shapes_are_classified_as_the_runner_classifies_them():
    """A 1-token prompt chunk beside a decode: the table and a real runner agree, under both rules."""
    for by_shape in (False, True):
        runner = ModelRunner(
            ToyConfig(layers="attn", max_num_reqs=MAX_REQS),
            CompilationConfig("full_and_piecewise", SIZES, uniform_decode_by_shape=by_shape),
        )
        runner.add_request("old")
        runner.step({"old": [1, 2, 3]}, eager=True)
        runner.add_request("new", num_prompt_tokens=3)
        real = dispatch_cell(runner.prepare_step({"old": [4], "new": [5]}).descriptor)
        table = describe_dispatch(
            SIZES,
            MAX_REQS,
            [BatchShape("x", (1, 1), (False, True), by_shape=by_shape)],
            policies=[runner.dispatcher.policy],
        )
        assert _row(table, "x")[2] == real


def test_spec_decode_sizes_of_both_model_runners():
    """v1 rounds every size under a policy that decodes in FULL; v2 keeps PIECEWISE at the sizes given."""
    from cglab.config import CUDAGraphMode
    from cglab.lab.describe import describe_spec_decode_sizes

    assert describe_spec_decode_sizes((1, 2, 4, 8), 2, 3).splitlines()[1:] == [
        "model runner v1: PIECEWISE 3, 6 | FULL 3, 6",
        "model runner v2: PIECEWISE 1, 2, 4, 8 | FULL 3, 6",
    ]
    assert describe_spec_decode_sizes((1, 2, 4, 8), 8, 8).splitlines()[1:] == [
        "model runner v1: start-up error, no size left",
        "model runner v2: PIECEWISE 1, 2, 4, 8",
    ]
    assert describe_spec_decode_sizes((1, 2, 4, 8), 7, 8).splitlines()[1] == "model runner v1: PIECEWISE 8 | FULL 8"
    piecewise = describe_spec_decode_sizes((1, 2, 4, 8), 2, 8, CUDAGraphMode.PIECEWISE).splitlines()[1:]
    assert piecewise == ["model runner v1: PIECEWISE 1, 2, 4, 8", "model runner v2: PIECEWISE 1, 2, 4, 8"]
