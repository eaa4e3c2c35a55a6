"""Input the engine accepts must run, and input it cannot run must be refused up front.

Regression tests: capture sizes whose dummy capture batch overflows a request's block-table row
(an IndexError deep in the metadata builders), repro batch sizes above the step's token budget,
and API arguments of the wrong type that ended in a TypeError or AttributeError.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from cglab import ConfigError, ModelRunner, ToyConfig, run_repro


@pytest.mark.parametrize("mode", ["piecewise", "full"])
def test_capture_batch_overflowing_a_request_is_refused_by_the_config(mode: str) -> None:
    # One request would hold all 64 capture tokens, more than max_model_len (48) allows.
    with pytest.raises(ConfigError, match="max_model_len"):
        ModelRunner(ToyConfig(capture_sizes=(64,), max_num_reqs=1), mode)


def test_capture_batch_that_just_fits_is_captured() -> None:
    config = ToyConfig(layers="sconv,attn,compressor", capture_sizes=(48,), max_num_reqs=1)
    runner = ModelRunner(config, "piecewise")
    runner.add_request("a")
    assert runner.step({"a": [1] * 40}).descriptor.num_tokens == 48


def test_repro_capture_size_above_what_the_scenario_batches_is_refused() -> None:
    with pytest.raises(ConfigError, match="drop capture sizes above"):
        run_repro("piecewise", capture_sizes=[512])


def test_repro_batch_sizes_above_the_default_token_budget_run() -> None:
    result = run_repro("piecewise", capture_sizes=[1, 2], batch_sizes=[200], steps=2)
    assert result.error is None
    assert result.steps_by_mode == {"none": 2}
    assert not result.diverged


def test_cli_refuses_an_unusable_capture_size_in_one_line_before_any_work() -> None:
    proc = subprocess.run([sys.executable, "-m", "cglab", "repro", "--capture-sizes", "512"],
                          check=False, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert len(proc.stderr.splitlines()) == 1, proc.stderr
    assert "drop capture sizes above" in proc.stderr


@pytest.fixture(scope="module")
def runner() -> ModelRunner:
    r = ModelRunner(ToyConfig(), "none")
    r.add_request("a")
    return r


@pytest.mark.parametrize("eager", ["no", 1, None])
def test_eager_must_be_a_bool(runner: ModelRunner, eager: object) -> None:
    with pytest.raises(ConfigError, match="eager must be True or False"):
        runner.step({"a": [1]}, eager=eager)  # type: ignore[arg-type]


def test_zero_dim_tensor_is_not_a_token_list(runner: ModelRunner) -> None:
    with pytest.raises(ConfigError, match=r"\{'a': \[5\]\}"):
        runner.step({"a": torch.tensor(5)})


@pytest.mark.parametrize("builders, fix", [
    ({"sconv": object()}, r"builders\['sconv'\] must have a build"),
    ({"conv": None}, "valid kinds"),
    ([("sconv", None)], "builders must be a dict"),
])
def test_bad_builders_name_the_argument(builders: object, fix: str) -> None:
    with pytest.raises(ConfigError, match=fix):
        ModelRunner(ToyConfig(), "piecewise", builders=builders)  # type: ignore[arg-type]
