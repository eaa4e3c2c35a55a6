"""The CLI's JSON contract (DESIGN.md): keys, order and exit codes that headless users rely on."""

from __future__ import annotations

import json

import pytest

from cglab.cli import main

KEYS = ["mode", "piecewise_flavor", "legacy_skip_attn", "layers", "backend", "steps", "prefill_chunk", "captured_sizes",
        "steps_by_mode", "max_abs_diff", "state_diverged", "error"]


def _repro_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    assert main(["repro", "--json", "--steps", "4", "--batch-sizes", "3,1", *argv]) == 0
    return json.loads(capsys.readouterr().out)


def test_repro_json_contract(capsys: pytest.CaptureFixture[str]) -> None:
    data = _repro_json(capsys, "--mode", "full")
    assert list(data) == KEYS
    # Plain FULL captures every size (not only up to the 3 requests), so every step replays a graph.
    assert data["backend"] == "sim" and data["captured_sizes"] == {"full": [1, 2, 4, 8]} and data["error"] is None
    assert data["steps_by_mode"] == {"full": 4}
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
