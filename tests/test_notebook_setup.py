"""The notebooks' first cell (``setup_notebook``) and what ``compile_backend="auto"`` means."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator

import pytest
import torch

from cglab import ModelRunner, ToyConfig, run_repro
from cglab.bench.config import BenchConfig
from cglab.bench.run import _make_runner
from cglab.compilation_config import COMPILE_BACKEND_ENV, CompilationConfig
from cglab.errors import ConfigError
from cglab.lab.notebook import setup_notebook

GPU = torch.cuda.is_available()


def auto_compiler(device_type: str) -> str:
    """What ``backend="auto"`` resolves to on this device type."""
    return CompilationConfig().resolve(ToyConfig(), torch.device(device_type), ()).backend


@pytest.fixture
def threads() -> Iterator[None]:
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.fixture
def no_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    monkeypatch.delenv(COMPILE_BACKEND_ENV, raising=False)
    return monkeypatch


def test_setup_pins_one_thread_and_picks_the_visible_device(threads: None, no_env: pytest.MonkeyPatch) -> None:
    torch.set_num_threads(2)
    assert setup_notebook() == ("cuda" if GPU else "cpu")
    assert torch.get_num_threads() == 1


def test_setup_on_the_cpu_leaves_the_compile_backend_alone(threads: None, no_env: pytest.MonkeyPatch) -> None:
    assert setup_notebook("cpu") == "cpu"
    assert COMPILE_BACKEND_ENV not in os.environ
    assert auto_compiler("cuda") == "inductor"


@pytest.mark.skipif(not GPU, reason="needs a CUDA GPU (runs on the GPU machine)")
def test_setup_on_a_gpu_compiles_the_pieces_eagerly(
    threads: None, no_env: pytest.MonkeyPatch, replays: Counter[str]
) -> None:
    assert setup_notebook() == "cuda"
    assert (
        ModelRunner(ToyConfig(), CompilationConfig("piecewise", (1, 2)), device="cuda").compilation_config.backend
        == "eager"
    )
    result = run_repro("piecewise", device="cuda")  # the lesson holds with the eager backend's pieces
    assert result.error is None and not result.diverged
    assert result.steps_by_mode == {"piecewise": result.steps} and replays == {"piecewise": result.steps}


def test_setup_keeps_a_compile_backend_the_user_chose(threads: None, no_env: pytest.MonkeyPatch) -> None:
    no_env.setenv(COMPILE_BACKEND_ENV, "inductor")
    setup_notebook()
    assert auto_compiler("cuda") == "inductor"


@pytest.mark.parametrize(
    "device, message",
    [
        ("gpu", "setup_notebook takes 'cpu', 'cuda' or nothing"),
        pytest.param("cuda", "no CUDA GPU is visible", marks=pytest.mark.skipif(GPU, reason="a GPU is visible")),
    ],
)
def test_setup_refuses_a_device_it_cannot_use(device: str, message: str, threads: None) -> None:
    with pytest.raises(ConfigError, match=message):
        setup_notebook(device)


@pytest.mark.parametrize(
    "env, device_type, expected",
    [
        (None, "cpu", "eager"),
        (None, "cuda", "inductor"),
        ("inductor", "cpu", "inductor"),
        ("eager", "cuda", "eager"),
        (" Eager ", "cuda", "eager"),
        ("", "cuda", "inductor"),
    ],
)
def test_auto_compiler_follows_the_environment(
    env: str | None, device_type: str, expected: str, no_env: pytest.MonkeyPatch
) -> None:
    if env is not None:
        no_env.setenv(COMPILE_BACKEND_ENV, env)
    assert auto_compiler(device_type) == expected


def test_a_wrong_compile_backend_in_the_environment_is_one_clear_error(no_env: pytest.MonkeyPatch) -> None:
    no_env.setenv(COMPILE_BACKEND_ENV, "tvm")
    with pytest.raises(ConfigError, match=r"CGLAB_COMPILE_BACKEND='tvm' is not a compile backend; set it to eager"):
        ModelRunner(ToyConfig(), "piecewise")


def test_the_runner_reads_auto_from_the_environment(no_env: pytest.MonkeyPatch) -> None:
    no_env.setenv(COMPILE_BACKEND_ENV, "inductor")
    assert ModelRunner(ToyConfig(), "none").compilation_config.backend == "inductor"  # "none" compiles nothing
    assert ModelRunner(ToyConfig(), CompilationConfig("none", backend="eager")).compilation_config.backend == "eager"


def test_the_bench_compiles_as_vllm_whatever_the_environment_says(no_env: pytest.MonkeyPatch) -> None:
    """A compiled bench row must measure what its description says, inductor on a GPU, even in a
    notebook whose setup chose eager for the lessons (and never inductor on the CPU)."""
    no_env.setenv(COMPILE_BACKEND_ENV, "inductor")
    config = BenchConfig.quick_preset(batch_sizes=(1,), modes=("compiled_full",))
    runner = _make_runner(
        "compiled_full", config.toy_config(), config.batch_sizes, torch.device("cpu"), lambda *a, **k: None
    )
    assert runner.compilation_config.backend == "eager"
    if GPU:
        no_env.setenv(COMPILE_BACKEND_ENV, "eager")
        runner = _make_runner(
            "compiled_full", config.toy_config(), config.batch_sizes, torch.device("cuda"), lambda *a, **k: None
        )
        assert runner.compilation_config.backend == "inductor"


def test_notebook_05s_live_run_is_short_on_either_device() -> None:
    gpu = BenchConfig.live_preset("cuda")
    assert (gpu.hidden_size, gpu.dtype, gpu.batch_sizes, gpu.repeats) == (1024, "bfloat16", (1, 16, 128), 50)
    assert gpu.modes == ("none", "piecewise", "full")
    cpu = BenchConfig.live_preset("cpu")
    assert (cpu.quick, cpu.hidden_size, cpu.batch_sizes, cpu.repeats, cpu.device) == (True, 32, (1, 8), 5, "cpu")
