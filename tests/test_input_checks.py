"""Input the engine accepts must run, and input it cannot run must be refused up front.

Regression tests: capture sizes whose dummy capture batch overflows a request's block-table row
(an IndexError deep in the metadata builders), repro batch sizes above the step's token budget,
API arguments of the wrong type that ended in a TypeError or AttributeError, and repro arguments of
the wrong type that were checked only after the reference runner was built, or reported as a
capture failure.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from cglab import ConfigError, ModelRunner, ToyConfig, run_repro
from cglab.bench import BenchConfig
from cglab.compilation_config import CompilationConfig, SpeculativeConfig
from cglab.config import parse_layer_pattern
from cglab.model import ToyTransformer
from cglab.spec_decode import run_spec_repro


@pytest.mark.parametrize("mode", ["piecewise", "full"])
def test_capture_batch_overflowing_a_request_is_refused_by_the_runner(mode: str) -> None:
    # One request would hold all 64 capture tokens, more than max_model_len (48) allows.
    with pytest.raises(ConfigError, match="max_model_len"):
        ModelRunner(ToyConfig(max_num_reqs=1), CompilationConfig(mode, (64,)))


def test_capture_batch_that_just_fits_is_captured() -> None:
    config = ToyConfig(layers="sconv,attn,compressor", max_num_reqs=1)
    runner = ModelRunner(config, CompilationConfig("piecewise", (48,)))
    runner.add_request("a")
    assert runner.step({"a": [1] * 40}).descriptor.num_tokens == 48


def test_repro_capture_size_above_what_the_scenario_batches_is_refused() -> None:
    with pytest.raises(ConfigError, match="^capture size 512: .* the largest capture size that fits is "):
        run_repro(CompilationConfig("piecewise", [512]))


def test_repro_batch_sizes_above_the_default_token_budget_run() -> None:
    result = run_repro(CompilationConfig("piecewise", [1, 2]), batch_sizes=[200], steps=2)
    assert result.error is None
    assert result.steps_by_mode == {"none": 2}
    assert not result.diverged


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


@pytest.mark.parametrize(
    "builders, fix",
    [
        ({"sconv": object()}, r"builders\['sconv'\] \(object\) must have a build"),
        ({"conv": None}, "valid kinds"),
        ({"sconv": SimpleNamespace(build=lambda common, for_capture: None)}, "a cudagraph_support such as"),
    ],
)
def test_bad_builders_name_the_argument(builders: object, fix: str) -> None:
    with pytest.raises(ConfigError, match=fix):
        ModelRunner(ToyConfig(), "piecewise", builders=builders)  # type: ignore[arg-type]


# -- run_repro and run_spec_repro: a wrong argument raises before any work, never becomes a finding ---


@pytest.fixture
def no_model_may_be_built(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a model was built before the arguments were checked")

    monkeypatch.setattr(ToyTransformer, "__init__", refuse)


@pytest.mark.usefixtures("no_model_may_be_built")
@pytest.mark.parametrize("spec", [None, SpeculativeConfig(2)], ids=["run_repro", "run_spec_repro"])
def test_a_wrong_device_raises_before_any_model_is_built(spec: SpeculativeConfig | None) -> None:
    args = ("piecewise", spec) if spec else ("piecewise",)
    with pytest.raises(ConfigError, match="use 'cpu' or 'cuda'"):
        (run_spec_repro if spec else run_repro)(*args, ToyConfig(layers="attn,attn"), steps=2, device="tpu")


def test_a_real_capture_failure_is_still_a_speculative_finding() -> None:
    result = run_spec_repro(
        CompilationConfig("piecewise", legacy_skip_attn=True),
        SpeculativeConfig(2),
        ToyConfig(layers="sconv,attn", strict_layers=True),
        steps=2,
        batch_sizes=(1,),
    )
    assert result.error.startswith("MissingMetadataError: capturing the PIECEWISE")
    assert result.backend == "sim" and result.cudagraph_mode == "piecewise" and result.max_abs_diff is None


@pytest.mark.parametrize(
    "call",
    [
        lambda: parse_layer_pattern("sconv,attn,"),
        lambda: CompilationConfig(splitting_ops="cglab::unified_attention,,cglab::short_conv"),
        lambda: CompilationConfig(splitting_ops=["cglab::unified_attention", ""]),
        lambda: BenchConfig.quick_preset(modes="none,,full"),
        lambda: run_repro(
            CompilationConfig("piecewise", splitting_ops="cglab::unified_attention,"),
            ToyConfig(layers="sconv,attn"),
            steps=2,
        ),
    ],
    ids=["layer pattern", "splitting ops string", "splitting ops list", "bench modes", "run_repro"],
)
def test_an_empty_list_item_is_refused(call) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError, match="has an empty item"):
        call()


def test_auto_is_resolved_in_one_function() -> None:
    """Every comparison with "auto" in the package lies in ``CompilationConfig.resolve``, the one place that
    decides what the compilation config leaves open."""
    import ast
    from pathlib import Path

    package = Path(__file__).resolve().parents[1] / "cglab"
    found = []
    for path in sorted(package.rglob("*.py")):
        tree = ast.parse(path.read_text())
        for function in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)):
            for node in ast.walk(function):
                if isinstance(node, ast.Compare) and any(
                    isinstance(c, ast.Constant) and c.value == "auto" for c in [node.left, *node.comparators]
                ):
                    found.append(f"{path.name}:{function.name}")
    assert found and set(found) == {"compilation_config.py:resolve"}, found
