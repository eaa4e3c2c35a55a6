"""Start-up cost: what a start is split into (compile, warmup and capture), the fix's ratio against the
legacy path, the files, and the run itself on the simulator (times are reported, never asserted)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from cglab.bench import startup
from cglab.bench.report import startup_targets
from cglab.bench.startup import StartupConfig, StartupResult, load_startup, save_startup
from cglab.cli import main
from cglab.compilation import CompiledModel
from cglab.cudagraph_utils import CaptureStats
from cglab.errors import ConfigError


def _row(policy: str, flavor: str, path: str, compile_s: float, capture_s: float) -> dict:
    return {
        "policy": policy,
        "flavor": flavor,
        "path": path,
        "backend": "cuda",
        "graphs": 70,
        "compile_s": compile_s,
        "capture_s": capture_s,
        "startup_s": compile_s + capture_s + 1.0,
        "memory_mib": 64.0,
    }


def test_quick_cli_run_on_the_simulator(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "startup"
    assert main(["startup", "--quick", "--out", str(out), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    result = load_startup(out)
    assert printed["rows"] == result.rows
    assert [(r["policy"], r["flavor"], r["path"]) for r in result.rows] == [
        ("full_and_piecewise", "compiled", "fixed"),
        ("full_and_piecewise", "compiled", "legacy"),
    ]
    assert result.config["capture_sizes"] == [1, 2, 4, 8]
    for r in result.rows:
        assert r["backend"] == "sim" and r["graphs"] == 8  # PIECEWISE and FULL for each of the 4 sizes
        assert r["compile_s"] > 0 and r["capture_s"] > 0
        assert r["startup_s"] >= r["compile_s"] + r["capture_s"] - 1e-3  # building the engine includes both
        assert r["memory_mib"] == r["memory_mib"]  # measured (the process's resident memory), not nan
    fixed, legacy = result.rows
    assert result.fix_ratio("full_and_piecewise", "compiled") == fixed["capture_s"] / legacy["capture_s"]
    assert main(["startup", "--quick", "--out", str(out)]) == 2  # never over a result without --force
    assert "--force" in capsys.readouterr().err


def test_compile_and_capture_times_are_reported_apart(monkeypatch: pytest.MonkeyPatch) -> None:
    """The profiling run compiled for 2 s, then warmup and capture took 3 s; 1 MiB of memory."""
    compiled = object.__new__(CompiledModel)
    compiled.compile_seconds = 2.0
    manager = SimpleNamespace(capture_stats=CaptureStats(3.0, 3, 2**20), backend=SimpleNamespace(name="cuda"))
    closed = []
    fake = SimpleNamespace(cudagraph_manager=manager, forward_model=compiled, close=lambda: closed.append(True))
    monkeypatch.setattr(startup, "ModelRunner", lambda *args, **kwargs: fake)
    quick = StartupConfig.quick_preset()
    row = startup._start(
        quick.toy_config(),
        quick.capture_sizes,
        startup.resolve_device("cpu"),
        "full_and_piecewise",
        "compiled",
        "fixed",
    )
    assert (row["compile_s"], row["capture_s"], row["graphs"], row["memory_mib"]) == (2.0, 3.0, 3, 1.0)
    assert closed == [True]
    fake.forward_model = SimpleNamespace()  # the breakable flavor: no compile at all
    row = startup._start(
        quick.toy_config(), quick.capture_sizes, startup.resolve_device("cpu"), "piecewise", "breakable", "fixed"
    )
    assert (row["compile_s"], row["capture_s"]) == (0.0, 3.0)


def test_fix_ratio_and_the_startup_target() -> None:
    result = StartupResult(
        [
            _row("full_and_piecewise", "compiled", "fixed", 20.0, 6.0),
            _row("full_and_piecewise", "compiled", "legacy", 20.0, 4.0),
        ],
        {},
        {},
    )
    assert result.fix_ratio("full_and_piecewise", "compiled") == 1.5
    (target,) = startup_targets(result)
    assert (target.measured, target.met) == (26.0, True)
    (target,) = startup_targets(result, seconds=25)
    assert target.met is False and target.goal == "<= 25 s"
    assert startup_targets(StartupResult([_row("piecewise", "breakable", "fixed", 0.0, 1.0)], {}, {})) == []


def test_files_round_trip_and_damage_is_refused(tmp_path: Path) -> None:
    result = StartupResult([_row("full", "compiled", "fixed", 10.0, 2.5)], {"backend": "cuda"}, {"quick": False})
    save_startup(result, str(tmp_path / "run"))
    assert load_startup(str(tmp_path / "run")).rows == result.rows
    csv_path = tmp_path / "run.csv"
    csv_path.write_text(csv_path.read_text().replace(",2.500,", ",two,"))
    with pytest.raises(ConfigError, match="could not convert .*python -m cglab startup"):
        load_startup(str(tmp_path / "run"))
    with pytest.raises(ConfigError, match="no results at .*python -m cglab startup"):
        load_startup(str(tmp_path / "missing"))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"policies": ("turbo",)}, "policies"),
        ({"flavors": "eager"}, "flavors"),
        ({"max_capture_size": 0}, "max_capture_size must be a positive integer"),
        ({"num_heads": 7}, "divisible by num_heads"),  # the model's own checks (ToyConfig)
    ],
)
def test_bad_config_is_refused(kwargs: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        StartupConfig.quick_preset(**kwargs)


RECORDED = sorted((Path(__file__).resolve().parents[1] / "data").glob("*_startup_*.csv"))


@pytest.mark.parametrize("path", RECORDED, ids=[p.stem for p in RECORDED])
def test_recorded_startup_runs_load(path: Path) -> None:
    result = load_startup(str(path))
    assert {"device_name", "driver", "torch", "cuda", "date"} <= set(result.environment)
    assert {r["backend"] for r in result.rows} == {"cuda"} and all(r["graphs"] > 0 for r in result.rows)
    sizes = len(result.config["capture_sizes"])
    assert all(r["graphs"] == sizes * (2 if r["policy"] == "full_and_piecewise" else 1) for r in result.rows)


def test_cli_refuses_bad_values_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["startup", "--quick", "--max-capture-size", "0", "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "max_capture_size" in err and "Traceback" not in err
    assert not list(tmp_path.iterdir())
