"""The benchmark's ladder beyond FULL, on known numbers: the roofline, the tables, the targets, the row
kinds it measures, and the profiler's log lines kept out of the user's way.

Every statistic is checked against the exact value a correct implementation gives; speed itself is
never asserted (the targets are reported from the recorded GPU runs).
"""

from __future__ import annotations

import os
import sys
from typing import Any

import pytest
import torch

from cglab.bench import BenchConfig, BenchResult
from cglab.bench import environment as roofline_module
from cglab.bench.breakdown import breakdown, category
from cglab.bench.environment import measure_bandwidth, roofline, weight_bytes
from cglab.bench.profiling import Window, without_profiler_log_lines
from cglab.bench.report import (
    SIM_FLOOR_NOTE,
    bench_table,
    breakdown_table,
    kernel_set,
    kernel_sets_table,
    ladder,
    targets,
)
from cglab.bench.run import build_order, capture_safe
from cglab.cli import main
from cglab.config import ToyConfig
from cglab.errors import ConfigError
from cglab.model import ToyTransformer
from cglab.runner import ModelRunner


def _result(medians: dict[str, dict[int, float]], backend: str = "cuda", **environment: Any) -> BenchResult:
    rows = [
        {
            "mode": mode,
            "batch_size": b,
            "median_us": m,
            "p10_us": m,
            "p90_us": m,
            "kernel_floor_us": m / 2,
            "launches": 1,
            "kernels": 10,
            "backend": backend,
            "enqueue_median_us": 1.0,
        }
        for mode, by_batch in medians.items()
        for b, m in by_batch.items()
    ]
    return BenchResult(rows, {"backend": backend, "device_name": "GPU", **environment}, {})


# ----------------------------------------------------------------------------------- roofline
def test_weight_bytes_count_every_weight_but_the_embedding_tables() -> None:
    h, vocab, max_len = 32, 64, 48
    model = ToyTransformer(ToyConfig(layers=("attn",), hidden_size=h, vocab_size=vocab, max_model_len=max_len))
    attention = h + 3 * h * h + h * h  # norm, qkv, o
    mlp = h + 4 * h * h + 2 * h * h  # norm, gate_up, down
    head = h + vocab * h  # final norm, lm_head
    assert weight_bytes(model) == 4 * (attention + mlp + head)  # float32; embeddings (vocab and positions) left out
    assert sum(p.numel() for p in model.parameters()) * 4 - weight_bytes(model) == 4 * (vocab + max_len) * h


def test_bandwidth_is_the_best_copy_read_and_written(monkeypatch: pytest.MonkeyPatch) -> None:
    """Copies of 1 MiB taking 0.5, 0.25 and 1 s: the best moved 2 MiB (read plus write) in 0.25 s."""
    ticks = iter([0.0, 0.5, 10.0, 10.25, 20.0, 21.0])
    monkeypatch.setattr(roofline_module.time, "perf_counter", lambda: next(ticks))
    assert measure_bandwidth(torch.device("cpu"), megabytes=1, repeats=3) == 2 * 2**20 / 0.25


def test_roofline_is_the_weights_over_the_bandwidth() -> None:
    model = ToyTransformer(ToyConfig(layers=("sconv",), hidden_size=16, num_heads=2))
    limit = roofline(model, bandwidth=4e12)
    assert limit["weight_bytes"] == weight_bytes(model)
    assert limit["memory_bandwidth_gb_s"] == 4000.0
    assert limit["roofline_us"] == round(weight_bytes(model) / 4e12 * 1e6, 3)


# ----------------------------------------------------------------------------------- tables and targets
def test_simulator_table_names_its_floor_for_what_it_is() -> None:
    sim = bench_table(_result({"full": {1: 900.0}}, backend="sim"))
    assert "op time us*" in sim and "floor us" not in sim and SIM_FLOOR_NOTE in sim
    assert "may exceed the median" in SIM_FLOOR_NOTE and "no kernel floor" in SIM_FLOOR_NOTE
    gpu = bench_table(_result({"full": {1: 900.0}}, roofline_us=34.5, weight_bytes=145e6, memory_bandwidth_gb_s=4200))
    assert "floor us" in gpu and "op time" not in gpu and SIM_FLOOR_NOTE not in gpu
    # 145 MB in 900 us: 161 GB/s, 3.8% of 4200; no peer to divide by
    assert gpu.splitlines()[1].split() == [
        "full",
        "1",
        "900.0",
        "900.0",
        "900.0",
        "450.0",
        "1",
        "1.0",
        "-",
        "161",
        "3.8",
    ]
    assert "roofline: 34.5 us per step (145.0 MB of weights at 4200 GB/s, measured)" in gpu


def test_ladder_at_one_batch_size() -> None:
    result = _result({"none": {1: 5000.0, 8: 5200.0}, "full": {1: 800.0, 8: 810.0}, "compiled_full": {1: 400.0}})
    rows = ladder(result, 1)
    assert [r["mode"] for r in rows] == ["none", "full", "compiled_full"]
    assert [r["speedup_over_eager"] for r in rows] == [1.0, 6.25, 12.5]
    assert [r["mode"] for r in ladder(result, 8)] == ["none", "full"]


def test_targets_are_decided_by_the_worst_batch() -> None:
    result = _result(
        {
            "none": {1: 4000.0, 8: 4100.0, 32: 4200.0},
            "full": {1: 800.0, 8: 1000.0, 32: 2000.0},
            "compiled_full": {1: 480.0, 8: 650.0, 32: 1900.0},  # 0.6 at batch 1, 0.65 at 8; 32 is above 16
            "reduce_overhead": {1: 500.0, 8: 640.0, 32: 2000.0},  # compiled FULL slower only at batch 8
        }
    )
    by_name = {t.name: t for t in targets(result)}
    ratio = by_name["compiled FULL / FULL"]
    assert (ratio.measured, ratio.met, ratio.detail) == (0.65, False, "worst at batch 8")
    peer = by_name['compiled FULL / torch.compile "reduce-overhead"']
    assert (peer.measured, peer.met, peer.detail) == (round(650 / 640, 3), False, "worst at batch 8")
    eager = by_name["eager / compiled FULL"]
    assert (eager.measured, eager.met) == (round(4000 / 480, 3), True)
    assert str(ratio).startswith("MISSED: compiled FULL / FULL 0.65")


def test_targets_need_their_modes() -> None:
    assert targets(_result({"none": {1: 1.0}})) == []
    assert [t.name for t in targets(_result({"none": {1: 1.0}, "full": {1: 1.0}}))] == ["FULL replay / kernel floor"]


def test_the_fused_kernel_targets_read_the_rows_and_the_baseline() -> None:
    medians = {"full": {1: 300.0, 16: 400.0, 64: 900.0}, "compiled_full": {1: 140.0, 4: 290.0, 8: 150.0}}
    result = _result(medians | {"reduce_overhead": {1: 400.0}}, roofline_us=35.0)
    for r in result.rows:  # FULL froze the whole key range at batch 16 only
        r["attn_key_range"] = 48 if (r["mode"], r["batch_size"]) == ("full", 16) else 7
    result.config["max_model_len"] = 48
    result.rows[0]["kernel_floor_us"], result.rows[1]["kernel_floor_us"] = 290.0, 320.0  # worst 1.25, at 16
    # (FULL at batch 64 sits at 2.0 over its floor, but above batch 16)
    baseline = _result({"full": {1: 741.0}})
    by_name = {t.name: (t.measured, t.met) for t in targets(result, baseline=baseline)}
    assert by_name["FULL replay / kernel floor"] == (1.25, False)
    keys = next(t for t in targets(result) if t.name == "rows whose attention reads max_model_len keys")
    assert (keys.measured, keys.met, keys.detail) == (1, False, "full")
    assert by_name["compiled FULL step"] == (140.0, True) and by_name["kernels per compiled FULL step"] == (10, True)
    assert by_name["compiled FULL / roofline"] == (4.0, True)
    assert by_name["compiled FULL, batch 1 / 8"] == (round(140 / 150, 3), True)
    assert by_name['compiled FULL / torch.compile "reduce-overhead" at batch 1'] == (0.35, True)
    assert by_name["compiled FULL / the FULL step before the fused kernels"] == (round(140 / 741, 3), True)
    assert "compiled FULL / the FULL step before the fused kernels" not in {t.name for t in targets(result)}
    # The step's goal is the card's: 150 us on an H200, 170 on an H100 (slower memory); 160 meets only the latter.
    medians["compiled_full"][1] = 160.0
    for card, met in (("NVIDIA H200", False), ("NVIDIA H100 80GB HBM3", True)):
        (step,) = [t for t in targets(_result(medians, device_name=card)) if t.name == "compiled FULL step"]
        assert (step.measured, step.met, step.goal) == (160.0, met, f"<= {150 if met is False else 170} us at batch 1")


def test_two_kernel_sets_side_by_side() -> None:
    before = _result({"none": {1: 8000.0}, "full": {1: 750.0}}, roofline_us=50.0)  # recorded before --kernels
    after = _result(
        {"none": {1: 2200.0}, "full": {1: 400.0}, "compiled_full": {1: 350.0}}, roofline_us=40.0, kernels="triton"
    )
    for r in after.rows:
        r["kernels"] = 97
    assert (kernel_set(before), kernel_set(after)) == ("aten", "triton")
    lines = kernel_sets_table(before, after, 1).splitlines()
    assert lines[0] == "  batch 1: aten -> triton"
    assert [line.split()[0] for line in lines[2:]] == ["none", "full"]  # the modes both runs have
    # median, kernels, floor (median / 2 here) and multiple of each run's own roofline
    assert lines[3].split() == ["full", "750", "->", "400", "10", "->", "97", "375", "->", "200", "15", "->", "10"]


# ----------------------------------------------------------------------------------- row kinds
def test_the_peer_needs_a_gpu() -> None:
    assert BenchConfig.quick_preset().modes == ("none", "piecewise", "full", "compiled_piecewise", "compiled_full")
    with pytest.raises(ConfigError, match="reduce_overhead needs a CUDA GPU"):
        BenchConfig.quick_preset(modes=("full", "reduce_overhead"))


def test_cli_refuses_the_peer_on_the_cpu(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--quick", "--modes", "reduce_overhead", "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "needs a CUDA GPU" in err and len(err.strip().splitlines()) == 1
    with pytest.raises(SystemExit) as exc:  # argparse's own one-line error
        main(["bench", "--quick", "--modes", "turbo", "--out", str(tmp_path / "run")])
    assert exc.value.code == 2 and "compiled_full" in capsys.readouterr().err  # the valid names are listed
    assert not list(tmp_path.iterdir())


def test_the_peer_gets_capture_safe_metadata_in_the_same_buffers() -> None:
    """Like FULL, the peer's graph freezes its host-side sizes at recording: they must span max_model_len."""
    toy = ToyConfig(layers=("sconv", "attn"), max_num_reqs=4)
    runner = ModelRunner(toy, "none")
    runner.add_request("a")
    runner.step({"a": [1, 2, 3]}, eager=True)
    prepared = runner.prepare_step({"a": [4]})
    safe = capture_safe(runner, prepared)
    before, after = prepared.attn_metadata["layers.1.attn"], safe.attn_metadata["layers.1.attn"]
    assert (before.max_seq_len, after.max_seq_len, after.for_capture) == (4, toy.max_model_len, True)
    assert after.slot_mapping.data_ptr() == before.slot_mapping.data_ptr()  # rebuilt in place, not reallocated
    assert torch.equal(after.slot_mapping, before.slot_mapping) and safe.input_batch is prepared.input_batch


def test_the_peer_is_built_and_recorded_before_any_engine_captures() -> None:
    """torch's graph trees free cuBLAS's workspaces when they record: an engine graph captured before would
    keep using a freed workspace (on the H200 this ended in an illegal memory access)."""
    modes = ("none", "piecewise", "full", "compiled_full", "reduce_overhead")
    assert build_order(modes) == ["reduce_overhead", "none", "piecewise", "full", "compiled_full"]
    assert build_order(("none", "full")) == ["none", "full"]


def test_each_row_against_the_peer_and_the_bandwidth() -> None:
    """100 MB of weights at 4000 GB/s; FULL at 500 us streams them at 200 GB/s, 5% of the bandwidth."""
    medians = {"full": {1: 500.0, 8: 400.0}, "reduce_overhead": {1: 1000.0}}
    table = bench_table(_result(medians, roofline_us=25.0, weight_bytes=100e6, memory_bandwidth_gb_s=4000.0))
    rows = {tuple(line.split()[:2]): line.split() for line in table.splitlines()[1:4]}
    assert rows["full", "1"][-3:] == ["0.50", "200", "5.0"]
    assert rows["full", "8"][-3:] == ["-", "250", "6.2"]  # no peer at batch 8
    assert rows["reduce_overhead", "1"][-3:] == ["1.00", "100", "2.5"]


def test_the_kernel_breakdown_sorts_kernels_and_measures_the_gaps() -> None:
    """Three kernels: a 10 us matmul, a 1 us copy 2 us later, a 3 us inductor kernel overlapping it by 0.5."""
    kernels = [("sm90_xmma_gemm_bf16", 0.0, 10.0), ("Memcpy DtoD", 12.0, 13.0), ("triton_poi_fused_add_0", 12.5, 15.5)]
    found = breakdown(Window(kernels=kernels), weights=20_000_000)
    assert found["categories"] == {
        "linear": {"nodes": 1, "us": 10.0, "bytes": 20_000_000, "gb_s": 2000.0},
        "copy": {"nodes": 1, "us": 1.0, "bytes": None, "gb_s": None},
        "inductor fused": {"nodes": 1, "us": 3.0, "bytes": None, "gb_s": None},
    }
    assert (found["span_us"], found["idle_us"], found["gaps"], found["mean_gap_us"]) == (15.5, 2.0, 2, 1.0)
    assert [category(n) for n in ("_unified_attention_kernel", "_fused_linear_kernel", "vectorized_elementwise")] == [
        "attention",
        "linear",
        "other aten",
    ]
    result = _result({"full": {1: 50.0}}, kernel_breakdown={"full/1": found})
    table = breakdown_table(result, "full", 1)
    assert table.splitlines()[1].split() == ["linear", "1", "10.0", "20.0", "2000"]
    assert "idle 2.0 us over 2 gaps (1.00 us each)" in table
    assert "no kernel breakdown" in breakdown_table(result, "compiled_full", 1)


# ----------------------------------------------------------------------------------- profiler log lines
def test_profiler_log_lines_are_dropped_and_the_rest_kept(capfd: pytest.CaptureFixture[str]) -> None:
    fd = sys.__stderr__.fileno()
    with without_profiler_log_lines():
        os.write(fd, b"USDT:2026-12-01 09:03:30 1:1 SyncActivityProfilerHandler.cpp:52] profiler_start\n")
        os.write(fd, b"a real warning\n")
        os.write(fd, b"USDT:2026-12-01 09:03:30 1:1 SyncActivityProfilerHandler.cpp:59] profiler_stop\n")
    os.write(fd, b"after\n")
    assert capfd.readouterr().err == "a real warning\nafter\n"


def test_real_profiler_start_and_stop_print_nothing(capfd: pytest.CaptureFixture[str]) -> None:
    from torch.profiler import ProfilerActivity, profile

    prof = profile(activities=[ProfilerActivity.CPU])
    with without_profiler_log_lines():
        prof.start()
    torch.ones(2).add_(1)
    with without_profiler_log_lines():
        prof.stop()
    assert "USDT" not in capfd.readouterr().err and any(e.name.startswith("aten::") for e in prof.events())


def test_every_row_is_checked_against_eager(monkeypatch: pytest.MonkeyPatch) -> None:
    """A row whose logits differ from eager's by 0.5 somewhere reports 0.5; eager against itself 0."""
    from cglab.bench import run as run_module

    logits = torch.arange(12.0).view(4, 3)

    class FakeRunner:
        def __init__(self, shift: float) -> None:
            self.shift = shift

        def execute(self, batch_size: int) -> torch.Tensor:
            out = logits.clone()
            out[batch_size - 1, 1] += self.shift  # inside the real rows: counted
            out[3, 0] += 100.0  # a padded row beyond every batch size checked: ignored
            return out

    monkeypatch.setattr(run_module, "_prepare", lambda runner, mode, batch_size, decode: batch_size)
    runners = {"none": FakeRunner(0.0), "full": FakeRunner(0.5), "compiled_full": FakeRunner(-0.25)}
    assert run_module._check_outputs(runners, (1, 2), []) == {"none": 0.0, "full": 0.5, "compiled_full": 0.25}


def test_uncounted_launches_round_trip_as_nan(tmp_path: Any) -> None:
    """The peer's structure is torch's: its structural counts are nan on disk and back, not 0."""
    from cglab.bench import load_results, save_results

    row = {
        "mode": "reduce_overhead",
        "batch_size": 1,
        "median_us": 5.0,
        "p10_us": 4.0,
        "p90_us": 6.0,
        "kernel_floor_us": float("nan"),
        "launches": float("nan"),
        "backend": "cuda",
        "counted_launches": float("nan"),
        "graph_segments": float("nan"),
    }
    save_results(
        BenchResult([row], {"backend": "cuda"}, {"modes": ["reduce_overhead"], "batch_sizes": [1]}), tmp_path / "run"
    )
    loaded = load_results(tmp_path / "run").rows[0]
    assert all(loaded[c] != loaded[c] for c in ("launches", "counted_launches", "graph_segments"))  # nan
    assert loaded["median_us"] == 5.0
