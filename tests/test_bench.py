"""The benchmark's plumbing on the CPU: the CLI run, its files, overwrite rules, atomic writes, plots.

Speed is never asserted here: the targets are reported from the recorded GPU runs in data/.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import pytest
import torch

from cglab import CUDAGraphMode, ModelRunner
from cglab.bench import CSV_COLUMNS, BenchResult, load_results, save_results
from cglab.bench import files as results
from cglab.cli import main
from cglab.errors import ConfigError
from cglab.lab import plots
from cglab.runner import PreparedStep

DATA = Path(__file__).resolve().parents[1] / "data"
RECORDED = sorted(p for p in DATA.glob("*.csv") if "_startup_" not in p.stem)  # latency runs
TINY = [
    "bench",
    "--quick",
    "--device",
    "cpu",
    "--batch-sizes",
    "1,2",
    "--repeats",
    "5",
    "--warmup",
    "1",
    "--modes",
    "none,piecewise,full",
]
PLOTS = (
    plots.plot_latency,
    plots.plot_speedup,
    plots.plot_kernel_floor,
    plots.plot_piecewise_break_cost,
    plots.plot_ladder,
)


def _plot_all(result: BenchResult) -> list[str]:
    titles = [fn(result).get_title() for fn in PLOTS]
    plt.close("all")
    plots.plot_overview(result)
    plt.close("all")
    return titles


def test_quick_cli_run_writes_parseable_files(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "quick"
    # The quick preset, fewer steps: every mode the CPU can run, each compiled one compiling once.
    assert (
        main(
            [
                "bench",
                "--quick",
                "--device",
                "cpu",
                "--batch-sizes",
                "1,2",
                "--repeats",
                "10",
                "--out",
                str(out),
                "--json",
            ]
        )
        == 0
    )
    captured = capfd.readouterr()
    assert "USDT:" not in captured.err  # the profiler's C-level log lines are dropped, not shown
    summary = json.loads(captured.out.strip().splitlines()[-1])
    result = load_results(out)
    assert summary["rows"] == result.rows and summary["backend"] == "sim"
    cpu_modes = ("none", "piecewise", "full", "compiled_piecewise", "compiled_full")  # the peer needs a GPU
    assert {(r["mode"], r["batch_size"]) for r in result.rows} == {(m, b) for m in cpu_modes for b in (1, 2)}
    assert list(result.rows[0])[: len(CSV_COLUMNS)] == list(CSV_COLUMNS)
    for r in result.rows:
        assert r["repeats"] == 10  # exactly --repeats samples
        assert 0 < r["p10_us"] <= r["median_us"] <= r["p90_us"] and r["kernel_floor_us"] > 0
        graph_launches = {"none": 0, "full": 1, "compiled_full": 1}.get(r["mode"], r["graph_segments"])
        assert r["launches"] >= graph_launches
    by_mode = {r["mode"]: r for r in result.rows if r["batch_size"] == 1}
    assert by_mode["full"]["launches"] == 1 < by_mode["piecewise"]["launches"] < by_mode["none"]["launches"]
    assert by_mode["none"]["launches"] == by_mode["none"]["kernels"] == by_mode["full"]["kernels"]
    # Compiled PIECEWISE replays the same pieces as breakable PIECEWISE: one launch per piece, attention's
    # ops one by one between them (counted through the compiled forward, not the breakable loop).
    assert by_mode["compiled_piecewise"]["launches"] == by_mode["piecewise"]["launches"]
    assert by_mode["compiled_piecewise"]["graph_segments"] == by_mode["piecewise"]["graph_segments"] == 3
    assert (
        by_mode["compiled_full"]["launches"] == 1 and by_mode["compiled_full"]["kernels"] == by_mode["full"]["kernels"]
    )
    env = result.environment
    assert env["backend"] == "sim" and env["torch"] and env["date"] and env["host_cpu"]
    # Every row computes eager's logits (float32 on the CPU: to rounding); eager against itself exactly.
    assert set(env["max_abs_diff_vs_eager"]) == set(cpu_modes) and env["max_abs_diff_vs_eager"]["none"] == 0.0
    assert all(diff <= 1e-4 for diff in env["max_abs_diff_vs_eager"].values())  # NaN fails: max() would drop it
    assert env["piecewise_flavor"] == "breakable"  # what the recorded runs measured
    # The roofline as recorded: the weights over the bandwidth, which is saved rounded to 0.1 GB/s: the
    # roofline lies between the two bandwidths that round to it (on a busy machine, a few GB/s, that
    # rounding alone is more than 1%).
    low, high = (env["weight_bytes"] / max(env["memory_bandwidth_gb_s"] + d, 1e-3) / 1e3 for d in (0.05, -0.05))
    assert low * 0.999 <= env["roofline_us"] <= high * 1.001
    assert result.config["quick"] is True and result.config["capture_sizes"] == [1, 2]
    assert all(plots.SIM_LABEL in title for title in _plot_all(result))


@pytest.mark.parametrize("value", [math.nan, math.inf], ids=["nan", "inf"])
def test_a_row_with_non_finite_logits_is_no_match(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], value: float
) -> None:
    """FULL goes bad at its second batch size only (max() would drop a NaN there): the check keeps the
    value, a warning names it, and the printed summary and the sidecar stay strict JSON."""
    execute = ModelRunner.execute

    def poisoned(self: ModelRunner, prepared: PreparedStep) -> torch.Tensor:
        out = execute(self, prepared)
        if prepared.descriptor.cg_mode is CUDAGraphMode.FULL and prepared.num_tokens == 2:
            with torch.inference_mode():
                out[0, 0] = value
        return out

    monkeypatch.setattr(ModelRunner, "execute", poisoned)
    assert main([*TINY, "--modes", "none,full", "--out", str(tmp_path / "run"), "--json"]) == 0
    captured = capsys.readouterr()
    summary = json.loads(captured.out, parse_constant=lambda c: pytest.fail(f"bare {c} in the JSON"))
    sidecar = json.loads((tmp_path / "run.json").read_text(), parse_constant=lambda c: pytest.fail(f"bare {c}"))
    assert sidecar["environment"]["max_abs_diff_vs_eager"] == {"none": 0.0, "full": str(value)}
    assert summary["rows"] == load_results(tmp_path / "run").rows
    assert f"warning: the logits of full ({value}) differ from eager's" in captured.err


def test_the_peer_runs_the_plain_linears_even_in_a_fused_run() -> None:
    """The peer is what a user would compile instead: the plain model, its linears cuBLAS's, also when the
    bench fuses the engine's linears (``--fused-linear``)."""
    from cglab.bench.run import ReduceOverheadForward
    from cglab.kernels.fused_linear import FUSED, fused_linears

    peer, seen = ReduceOverheadForward(torch.nn.Linear(2, 2)), []
    peer._compiled = lambda *inputs: seen.append(FUSED.linears)  # what the compiled forward would trace under
    with fused_linears():
        peer(torch.zeros(1), torch.zeros(1))
        assert FUSED.linears
    assert seen == [False]


@pytest.mark.parametrize("output", [["--json"], []], ids=["json", "table"])
def test_a_closed_stdout_is_no_disk_problem(tmp_path: Path, output: list[str]) -> None:
    """``bench ... | true``: the reader went away, the result is saved; only the report is lost, so exit 0."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "cglab", *TINY, "--modes", "full", "--out", str(tmp_path / "run"), *output],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    proc.stdout.close()  # long before the first line is printed: importing torch takes seconds
    err = proc.stderr.read()  # may hold torch's own warnings (its profiler warns on a GPU), never ours
    assert proc.wait(timeout=300) == 0 and "disk" not in err and "Traceback" not in err, err
    assert [r["mode"] for r in load_results(tmp_path / "run").rows] == ["full", "full"]


def test_refuses_to_overwrite_without_force(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    existing = tmp_path / "run.json"
    existing.write_text("keep me")
    assert main([*TINY, "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "--force" in err and "run.json" in err and len(err.strip().splitlines()) == 1
    assert existing.read_text() == "keep me" and not (tmp_path / "run.csv").exists()


def test_force_overwrites(tmp_path: Path) -> None:
    for suffix in (".csv", ".json"):
        (tmp_path / f"run{suffix}").write_text("stale")
    assert main([*TINY, "--modes", "full", "--out", str(tmp_path / "run.csv"), "--force"]) == 0
    result = load_results(tmp_path / "run.json")
    assert [(r["mode"], r["batch_size"]) for r in result.rows] == [("full", 1), ("full", 2)]


@pytest.fixture
def small_result() -> BenchResult:
    row = {c: 1 for c in CSV_COLUMNS} | {"mode": "full", "backend": "sim", "median_us": 2.5}
    return BenchResult([row], {"backend": "sim", "device_name": "CPU"}, {"modes": ["full"], "batch_sizes": [1]})


def test_atomic_write_leaves_nothing_on_error(
    tmp_path: Path, small_result: BenchResult, monkeypatch: pytest.MonkeyPatch, json_replace_fails: None
) -> None:
    with pytest.raises(OSError, match="disk full"):
        save_results(small_result, tmp_path / "run")
    assert list(tmp_path.iterdir()) == []  # no CSV without its JSON, no temp files

    (tmp_path / "old.csv").write_text("old")
    monkeypatch.setattr(results.json, "dumps", lambda *a, **k: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        save_results(small_result, tmp_path / "old", force=True)
    assert [p.name for p in tmp_path.iterdir()] == ["old.csv"] and (tmp_path / "old.csv").read_text() == "old"


def test_save_and_load_round_trip(tmp_path: Path, small_result: BenchResult) -> None:
    small_result.rows[0]["kernel_floor_us"] = math.nan
    save_results(small_result, tmp_path / "sub" / "run")
    loaded = load_results(tmp_path / "sub" / "run.csv")
    assert loaded.rows[0]["median_us"] == 2.5 and loaded.rows[0]["launches"] == 1
    assert math.isnan(loaded.rows[0]["kernel_floor_us"]) and loaded.environment == small_result.environment
    with pytest.raises(ConfigError, match="force"):
        save_results(small_result, tmp_path / "sub" / "run")


def test_load_errors_are_clear(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no results at .*python -m cglab bench"):
        load_results(tmp_path / "missing")
    (tmp_path / "bad.csv").write_text("mode,batch_size\nfull,1\n")
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(ConfigError, match="missing column"):
        load_results(tmp_path / "bad")


def test_recorded_files_exist() -> None:
    assert len(RECORDED) >= 2, "data/ should hold the recorded GPU runs (see data/README.md)"


@pytest.mark.parametrize("path", RECORDED, ids=[p.stem for p in RECORDED])
def test_recorded_files_parse_and_plot(path: Path) -> None:
    result = load_results(path)
    assert result.rows and result.backend == "cuda"
    # (runs since 2026-12-05 have no driver entry: bench stopped querying it; data/README names it)
    assert {"device_name", "torch", "cuda", "date", "host_cpu"} <= set(result.environment)
    assert {r["backend"] for r in result.rows} == {"cuda"}
    # Recordings made while ToyConfig held the capture sizes keep them in their toy_config.
    sizes = result.config.get("capture_sizes") or result.config["toy_config"]["capture_sizes"]
    assert sizes == sorted({r["batch_size"] for r in result.rows})
    titles = _plot_all(result)
    assert all(result.device_name in t and plots.SIM_LABEL not in t for t in titles)
