"""The capture matrix: every row is the repro's own verdict, and ``python -m cglab matrix`` keeps the CLI
contract (one JSON object, ``--check`` on the fixed path only, exit 2 and one line for bad input)."""

from __future__ import annotations

import json

import pytest

from cglab import ToyConfig, capture_matrix
from cglab.capture_matrix import BATCHES, CASES, CaptureMatrix, MatrixCase, padding_changes, run_capture_matrix
from cglab.cli import main
from cglab.compilation_config import CompilationConfig

LEGACY_COMPILED = {
    "piecewise/compiled/legacy/uniform_decode",
    "full_and_piecewise/compiled/legacy/chunked_prefill",
}


def test_the_cases_cover_every_mode_flavour_path_and_batch() -> None:
    assert {c.mode for c in CASES} == {"full", "full_decode_only", "piecewise", "full_and_piecewise"}
    assert {(c.piecewise_flavor, c.capture_path) for c in CASES} >= {
        ("compiled", "legacy"),
        ("compiled", "fixed"),
        ("breakable", "legacy"),
        ("breakable", "fixed"),
        (None, "fixed"),
    }
    assert {c.batch for c in CASES} == set(BATCHES)
    assert len({c.key for c in CASES}) == len(CASES)


@pytest.fixture(scope="module")
def default_matrices() -> dict[str, CaptureMatrix]:
    """The default pattern's matrix by device, run once for the tests that read it."""
    return {}


def _default_matrix(matrices: dict[str, CaptureMatrix], device: str) -> CaptureMatrix:
    if device not in matrices:
        matrices[device] = run_capture_matrix("sconv,attn", device=device)
    return matrices[device]


def test_the_default_pattern_diverges_on_the_legacy_compiled_rows_only(
    device: str, default_matrices: dict[str, CaptureMatrix]
) -> None:
    matrix = _default_matrix(default_matrices, device)
    assert matrix.backend == ("sim" if device == "cpu" else "cuda")
    assert set(matrix.failing(None)) == LEGACY_COMPILED
    assert matrix.failing("fixed") == []
    for row in matrix.rows:
        assert row.replays > 0, f"{row.case.key} replayed no graph: it compared eager with eager"
        if row.case.key in LEGACY_COMPILED:
            assert (row.verdict, row.first_diverged_step, row.diverged_in) == ("diverged", 1, "logits and state")
            assert row.finding == "no attention metadata at capture: sconv recorded its None branch"
        else:
            assert (row.verdict, row.first_diverged_step, row.diverged_in, row.finding) == ("matches", None, None, None)


def test_attention_alone_matches_everywhere_even_on_the_legacy_path() -> None:
    matrix = run_capture_matrix("attn", cases=[c for c in CASES if c.capture_path == "legacy"])
    assert matrix.failing(None) == []


def test_a_strict_layer_is_an_error_row_with_its_one_line() -> None:
    cases = [MatrixCase("piecewise", "compiled", "legacy", "uniform_decode")]
    (row,) = run_capture_matrix(ToyConfig(layers="sconv,attn", strict_layers=True), cases=cases).rows
    assert (row.verdict, row.first_diverged_step) == ("error", None)
    assert row.finding.startswith("MissingMetadataError: ") and "\n" not in row.finding


@pytest.mark.parametrize("pad_requests", [False, True])
def test_padding_changes_no_built_in_cache(pad_requests: bool) -> None:
    config = ToyConfig(layers="sconv,attn,compressor,linear_attn")
    assert padding_changes(config, pad_requests=pad_requests) == []


def test_each_case_builds_the_config_it_names() -> None:
    case = MatrixCase("full_and_piecewise", "breakable", "legacy", "padded")
    assert case.compilation_config(check_addresses=True) == CompilationConfig(
        "full_and_piecewise", use_breakable_cg=True, legacy_skip_attn=True, check_addresses=True
    )
    assert case.key == "full_and_piecewise/breakable/legacy/padded"


def test_the_command_prints_one_json_object_and_checks_the_fixed_path_only(
    capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch, default_matrices: dict[str, CaptureMatrix]
) -> None:
    def same_matrix(config: ToyConfig, *, device: str, progress) -> CaptureMatrix:  # the one computed above
        assert (config, device) == (ToyConfig(layers="sconv,attn"), "cpu")
        return _default_matrix(default_matrices, device)

    monkeypatch.setattr(capture_matrix, "run_capture_matrix", same_matrix)
    assert main(["matrix", "--layers", "sconv,attn", "--json", "--check"]) == 0  # the legacy rows diverge
    data = json.loads(capsys.readouterr().out)
    assert (data["layers"], data["backend"], len(data["rows"])) == ("sconv,attn", "sim", len(CASES))
    assert list(data["rows"][0]) == [
        "mode",
        "piecewise_flavor",
        "capture_path",
        "batch",
        "verdict",
        "first_diverged_step",
        "diverged_in",
        "replays",
        "finding",
    ]
    verdicts = {"/".join(str(r[k] or "-") for k in list(r)[:4]): r["verdict"] for r in data["rows"]}
    assert {k for k, v in verdicts.items() if v != "matches"} == LEGACY_COMPILED


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["matrix", "--layers", "sconv,atn"], "unknown layer kind(s) 'atn'"),
        (["matrix", "--layers", ""], "the layer pattern is empty"),
        (["matrix", "--layers", "sconv,,attn"], "has an empty item"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(argv: list[str], message: str, capsys: pytest.CaptureFixture) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
