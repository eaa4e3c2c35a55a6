"""``bench --kernels aten|triton``: the choice reaches every custom op, is recorded with the results, and
a choice the machine cannot run fails at once with the remedy. Runs on the CPU: a stand-in for each
Triton launcher counts its calls (the kernels themselves are tested in test_triton_kernels.py)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import cglab.kernels
from cglab import ModelRunner, ToyConfig
from cglab.bench import BenchConfig, load_results, run_bench
from cglab.bench import config as bench_config
from cglab.cli import main
from cglab.errors import ConfigError
from cglab.kernels import check_kernels, use_kernels

ONE_STEP = dict(batch_sizes=(1,), modes=("none", "piecewise"), repeats=5, warmup=1, profile_steps=1)


@pytest.fixture
def launched(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Which ops asked for their Triton launcher. The stand-in computes nothing (no aten op the launch
    count would see): the outputs hold what ``empty_like`` left, which only the timing reads."""
    calls: Counter[str] = Counter()

    def launcher(op_name: str) -> Any:
        def launch(*args: Any) -> None:
            calls[op_name] += 1

        return launch

    monkeypatch.setattr(cglab.kernels, "_launcher", launcher)
    monkeypatch.setattr(bench_config, "check_kernels", lambda kernels, device_type: kernels or "aten")
    return calls


def test_the_switch_reaches_every_op_and_is_recorded(tmp_path: Path, launched: Counter[str]) -> None:
    assert (
        main(
            [
                "bench",
                "--quick",
                "--kernels",
                "aten",
                "--batch-sizes",
                "1",
                "--modes",
                "none,piecewise",
                "--repeats",
                "5",
                "--warmup",
                "1",
                "--out",
                str(tmp_path / "aten"),
            ]
        )
        == 0
    )
    aten = load_results(tmp_path / "aten")
    assert aten.environment["kernels"] == aten.config["kernels"] == "aten" and not launched
    before = cglab.kernels.triton_launches()
    result = run_bench(BenchConfig.quick_preset(kernels="triton", **ONE_STEP), progress=False)
    assert result.environment["kernels"] == result.config["kernels"] == "triton"
    assert set(launched) == {"unified_attention", "short_conv", "compressor"}
    assert cglab.kernels.triton_launches() > before
    # One launch per op (the compressor's two) instead of aten's dozens, counted though no aten op shows it.
    rows, aten_rows = ({r["mode"]: r for r in run.rows} for run in (result, aten))
    assert rows["none"]["launches"] < aten_rows["none"]["launches"] / 2
    assert rows["piecewise"]["launches"] == rows["piecewise"]["graph_segments"] + 2  # the two attention launches


def test_default_is_aten_on_the_cpu_and_triton_is_refused_there() -> None:
    assert BenchConfig.quick_preset().kernels == "aten"
    with pytest.raises(ConfigError, match="need CUDA tensors.*kernels 'aten'"):
        BenchConfig.quick_preset(kernels="triton")
    with pytest.raises(ConfigError, match="one of aten, triton"):
        check_kernels("cuda", "cuda")


def test_triton_without_triton_says_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cglab.kernels, "triton_available", lambda: False)
    assert check_kernels(None, "cuda") == "aten"  # the default falls back; an explicit choice fails
    with pytest.raises(ConfigError, match="pip install triton"):
        check_kernels("triton", "cuda")


def test_cli_refuses_triton_on_the_cpu_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--quick", "--kernels", "triton", "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert "kernels 'aten'" in err and len(err.splitlines()) == 1 and not list(tmp_path.iterdir())


def test_the_cpu_path_never_asks_for_a_triton_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """The aten bodies run on CPU tensors unless told otherwise, so Triton is never needed there."""
    monkeypatch.setattr(cglab.kernels, "_launcher", lambda op_name: pytest.fail(f"{op_name} asked for Triton"))
    runner = ModelRunner(ToyConfig(layers=("sconv", "attn", "compressor", "linear_attn")), "none")
    runner.add_request("a")
    with use_kernels(None):
        runner.step({"a": [1, 2, 3]})
