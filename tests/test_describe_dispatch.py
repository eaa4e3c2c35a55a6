"""``describe_dispatch``: the table of batch shape -> descriptor, per policy, that notebooks 02 and 03 print."""

import pytest

from cglab import ModelRunner, ToyConfig
from cglab.compilation_config import UNIFORM_DECODE_RULES, CompilationConfig
from cglab.lab.describe import BatchShape, describe_dispatch, describe_uniform_decode_rules, dispatch_cell

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
        BatchShape("1-token prompt", (1, 1), (True,)),
        BatchShape("1-token prompt, by shape", (1, 1), (True,), rule="shape"),
        BatchShape("last prompt token", (1, 1), (True,), (4,)),
        BatchShape("last prompt token, #51865", (1, 1), (True,), (4,), rule="51865"),
        BatchShape("too large", (8, 1), (True,)),
    ]
    table = describe_dispatch(SIZES, MAX_REQS, shapes)
    assert _row(table, "3 decodes")[1:] == ["1", "FULL 4/4", "FULL 4/4 u=1", "FULL 4/4 u=1", "PIECEWISE 4"]
    # FULL(8) would need 8 requests > max_num_reqs: the uniform-decode candidates stop at 4, PIECEWISE takes over
    assert _row(table, "5 decodes")[2:] == ["FULL 8/6", "PIECEWISE 8", "eager", "PIECEWISE 8"]
    # plain FULL serves a mixed batch; the decode-only policies do not
    assert _row(table, "chunk")[1:] == ["-", "FULL 8/6", "PIECEWISE 8", "eager", "PIECEWISE 8"]
    assert _row(table, "1-token prompt")[1:4] == ["-", "FULL 2/2", "PIECEWISE 2"]
    assert _row(table, "1-token prompt, by shape")[1:4] == ["1", "FULL 2/2", "FULL 2/2 u=1"]
    assert _row(table, "last prompt token")[1:4] == ["1", "FULL 2/2", "FULL 2/2 u=1"]
    assert _row(table, "last prompt token, #51865")[1:4] == ["-", "FULL 2/2", "PIECEWISE 2"]
    assert _row(table, "too large")[2:] == ["eager"] * 4
    assert max(map(len, table.splitlines())) <= 107  # beside JupyterLab's file browser at 1280 pixels


@pytest.mark.parametrize("rule", UNIFORM_DECODE_RULES)
def test_shapes_are_classified_as_the_runner_classifies_them(rule: str) -> None:
    """A first and a later 1-token prompt chunk beside a decode: the tables and a real runner agree."""
    runner = ModelRunner(
        ToyConfig(layers="attn", max_num_reqs=MAX_REQS),
        CompilationConfig("full_and_piecewise", SIZES, uniform_decode_rule=rule),
    )
    runner.add_request("old")
    runner.step({"old": [1, 2, 3]}, eager=True)
    runner.add_request("new", num_prompt_tokens=3)
    shapes = [BatchShape("first", (1, 1), (False, True), rule=rule), BatchShape("later", (1, 1), (False, True), (3, 1))]
    tables = [
        describe_dispatch(SIZES, MAX_REQS, shapes[:1], policies=[runner.dispatcher.policy]),
        describe_uniform_decode_rules(SIZES, MAX_REQS, shapes),
    ]
    column = 1 + UNIFORM_DECODE_RULES.index(rule)
    for label, tokens in (("first", [5]), ("later", [6])):
        real = dispatch_cell(runner.step({"old": [4], "new": tokens}).descriptor)
        if label == "first":
            assert _row(tables[0], label)[2] == real
        assert _row(tables[1], label)[column] == real


def test_the_rules_table_has_one_column_per_rule_and_fits_beside_the_file_browser() -> None:
    table = describe_uniform_decode_rules(SIZES, MAX_REQS, [BatchShape("3 decodes", (1, 1, 1))])
    assert [c.strip() for c in table.splitlines()[1].split(" | ")] == [
        "batch",
        "vLLM today: current",
        "#51865 (Aug 2026): 51865",
        "before #51865: shape",
    ]
    assert _row(table, "3 decodes")[1:] == ["FULL 4/4 u=1"] * 3
    assert max(map(len, table.splitlines())) <= 107


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
