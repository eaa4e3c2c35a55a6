"""The CLI's JSON contract (DESIGN.md): keys, order and exit codes that headless users rely on."""

from __future__ import annotations

import json
import time

import pytest

from cglab.cli import main

KEYS = ["mode", "piecewise_flavor", "legacy_skip_attn", "layers", "backend", "steps", "prefill_chunk", "cudagraph_mode",
        "captured_sizes", "steps_by_mode", "max_abs_diff", "state_diverged", "error"]


def _repro_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    assert main(["repro", "--json", "--steps", "4", "--batch-sizes", "3,1", *argv]) == 0
    return json.loads(capsys.readouterr().out)


def test_repro_json_contract(capsys: pytest.CaptureFixture[str]) -> None:
    data = _repro_json(capsys, "--mode", "full")
    assert list(data) == KEYS
    # Plain FULL captures every size (not only up to the 3 requests), so every step replays a graph.
    assert data["backend"] == "sim" and data["captured_sizes"] == {"full": [1, 2, 4, 8]} and data["error"] is None
    assert data["steps_by_mode"] == {"full": 4} and data["cudagraph_mode"] == "full"  # nothing lowered
    assert data["state_diverged"] is False and data["max_abs_diff"] < 1e-4


def test_divergence_and_refused_capture_still_exit_zero(capsys: pytest.CaptureFixture[str]) -> None:
    assert _repro_json(capsys, "--legacy-skip-attn")["state_diverged"] is True  # divergence is the finding
    error = _repro_json(capsys, "--legacy-skip-attn", "--strict-layers")["error"]
    assert error.startswith("MissingMetadataError: capturing the PIECEWISE")


@pytest.mark.parametrize("argv", [["--mode", "full_decode_only", "--capture-sizes", "16"], ["--batch-sizes", "100"]])
def test_an_all_eager_run_is_never_called_a_graph_result(capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    assert main(["repro", "--steps", "2", *argv]) == 0
    out = capsys.readouterr().out
    assert "NO GRAPH REPLAYED" in out and "matches eager" not in out
    assert main(["repro", "--steps", "2", "--check", *argv]) == 1  # --check refuses it as a pass


def test_strict_layers_error_fails_check_and_modes_ignore_case(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["repro", "--legacy-skip-attn", "--strict-layers", "--steps", "2", "--check"]) == 1
    assert "ERROR: MissingMetadataError" in capsys.readouterr().out
    assert _repro_json(capsys, "--mode", "PIECEWISE")["mode"] == "piecewise"


def test_repro_json_with_speculative_tokens(capsys: pytest.CaptureFixture[str]) -> None:
    """The two acceptance keys come last; --check passes the fixed drafter and fails the legacy one, whose
    target outputs are exact (an attention-only target) but whose acceptance fell below the eager drafter's."""
    argv = ["repro", "--json", "--check", "--steps", "4", "--batch-sizes", "1,2", "--layers", "attn,attn",
            "--num-speculative-tokens", "2", "--seed", "5"]
    assert main(argv) == 0
    fixed = json.loads(capsys.readouterr().out)
    assert list(fixed) == [*KEYS, "acceptance_rate", "reference_acceptance_rate"]
    assert fixed["captured_sizes"] == {"piecewise": [3, 6, 12, 24]}  # K + 1 times 1, 2, 4, 8
    assert fixed["acceptance_rate"] == fixed["reference_acceptance_rate"] and fixed["state_diverged"] is False
    assert main([*argv, "--legacy-skip-attn"]) == 1
    legacy = json.loads(capsys.readouterr().out)
    assert legacy["max_abs_diff"] < 1e-4 and legacy["error"] is None
    assert legacy["reference_acceptance_rate"] == fixed["reference_acceptance_rate"]
    assert legacy["acceptance_rate"] < legacy["reference_acceptance_rate"]
    assert legacy["state_diverged"] is True  # the drafter's own caches


@pytest.mark.parametrize(("argv", "fix"), [
    (["--num-speculative-tokens", "-1"], "at least 0"),
    (["--num-speculative-tokens", "8", "--capture-sizes", "1,2,4,8"], "lower num_speculative_tokens to at most 7"),
    (["--num-speculative-tokens", "1000"], "num_speculative_tokens 1000 is above 16, the most the toy drafts"),
    (["--num-speculative-tokens", "17"], "is above 16"),
    (["--num-speculative-tokens", "16", "--batch-sizes", "256", "--steps", "300"], "fewer speculative tokens"),
    (["--frozen-step-index"], "add --num-speculative-tokens"),
    (["--num-speculative-tokens", "2", "--prefill-chunk", "4"], "drop one of the two"),
], ids=["negative", "beyond-capture-sizes", "far-above-the-limit", "just-above-the-limit", "beyond-the-caches",
        "drafter-option-alone", "with-chunked-prefill"])
def test_bad_speculative_arguments_exit_2_with_one_line(capsys: pytest.CaptureFixture[str], argv: list[str],
                                                         fix: str) -> None:
    started = time.monotonic()
    assert main(["repro", *argv]) == 2
    assert time.monotonic() - started < 5  # refused before any work: 1000 tokens used to run until killed
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and fix in err, err


# -- switches that would change nothing ------------------------------------------------------------------

GRAPH_SWITCHES = [["--legacy-skip-attn", "--check"], ["--piecewise-flavor", "breakable"],
                  ["--splitting-ops", "cglab::unified_attention"], ["--capture-sizes", "1,2"], ["--strict-layers"],
                  ["--python-guards"], ["--strict-attention"], ["--uniform-decode-by-shape"],
                  ["--num-speculative-tokens", "2", "--frozen-step-index"]]


@pytest.mark.parametrize("switch", GRAPH_SWITCHES, ids=lambda argv: argv[0] if len(argv) < 3 else argv[-1])
def test_graph_switches_under_mode_none_exit_2_with_one_line(capsys: pytest.CaptureFixture[str],
                                                             switch: list[str]) -> None:
    started = time.monotonic()
    assert main(["repro", "--mode", "none", *switch]) == 2
    assert time.monotonic() - started < 5  # before any work
    captured = capsys.readouterr()
    flag = next(a for a in switch if a not in ("--check", "--num-speculative-tokens", "2"))
    lines = captured.err.splitlines()
    assert captured.out == "" and len(lines) == 1, captured
    assert (f"--mode none captures no graph, so {flag} would change nothing (the run compares eager with eager): "
            "drop it, or choose a graph mode such as --mode piecewise") in lines[0]


def test_every_graph_switch_under_mode_none_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["repro", "--mode", "none", "--legacy-skip-attn", "--strict-layers"]) == 2
    assert "so --legacy-skip-attn and --strict-layers would change nothing" in capsys.readouterr().err


def test_mode_none_still_runs_with_check(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["repro", "--mode", "none", "--steps", "2", "--check"]) == 0
    assert "matches eager" in capsys.readouterr().out


NOTE = ("  --legacy-skip-attn changes nothing here: this policy captures no PIECEWISE graph, and FULL graphs got "
        "capture metadata before the fix too")


def test_the_legacy_switch_under_full_is_noted(capsys: pytest.CaptureFixture[str]) -> None:
    """Accepted (notebook 00's first exercise runs it, to show that FULL never had the bug), and said."""
    assert main(["repro", "--mode", "full", "--piecewise-flavor", "breakable", "--legacy-skip-attn", "--steps", "2"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert NOTE in out and out[-1].endswith("-> matches eager")
    # FULL lowered to FULL_AND_PIECEWISE (linear_attn's builder): PIECEWISE graphs, where the switch matters.
    assert main(["repro", "--mode", "full", "--piecewise-flavor", "breakable", "--legacy-skip-attn", "--steps", "2",
                 "--layers", "linear_attn,attn"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "lowered to FULL_AND_PIECEWISE" in out[2] and NOTE not in out
