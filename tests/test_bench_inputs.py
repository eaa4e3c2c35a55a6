"""Bad input to the benchmark fails early, in one line that says what to do.

``--out`` is checked before anything is measured, a result pair is replaced whole or not at all,
the config refuses what it cannot run, and ``load_results`` refuses damaged data rather than plotting it.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from cglab import bench
from cglab.bench import CSV_COLUMNS, BenchConfig, BenchResult, check_output, load_results, save_results, startup
from cglab.cli import main
from cglab.errors import ConfigError

DATA = Path(__file__).resolve().parents[1] / "data"
PAIRS = sorted(p for p in DATA.glob("*.csv") if "_startup_" not in p.stem)  # latency runs
SMALL = DATA / "h200_decode_small_fp32"  # 3 modes x 7 batch sizes = 21 rows
TINY = ["bench", "--quick", "--device", "cpu", "--batch-sizes", "1,2", "--repeats", "5", "--warmup", "1"]


@pytest.fixture
def result() -> BenchResult:
    row = {c: 1 for c in CSV_COLUMNS} | {"mode": "full", "backend": "sim", "median_us": 2.5}
    return BenchResult([row], {"backend": "sim", "device_name": "CPU"}, {"modes": ["full"], "batch_sizes": [1]})


def _one_line(exc: pytest.ExceptionInfo[ConfigError]) -> str:
    message = str(exc.value)
    assert "\n" not in message and "Traceback" not in message
    return message


# ----------------------------------------------------------------------------------- --out
@pytest.mark.parametrize("out", ["", ".", ".."])
def test_out_must_name_a_file(tmp_path: Path, out: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match="--out must name a file") as exc:
        check_output(out, force=True)
    _one_line(exc)


@pytest.mark.parametrize("command", ["bench", "startup"])
@pytest.mark.parametrize(("existing", "out", "message"), [("run.json", "run", "--force"), (None, "", "--out")])
def test_cli_checks_out_before_measuring(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    command: str,
    existing: str | None,
    out: str,
    message: str,
) -> None:
    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("measured before checking --out")

    monkeypatch.setattr(bench, "run_bench", never)
    monkeypatch.setattr(startup, "measure_startup", never)
    if existing:
        (tmp_path / existing).write_text("recorded")
    assert main([command, "--quick", "--out", str(tmp_path / out) if out else out]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err and message in err


def test_failed_replace_keeps_the_old_pair(tmp_path: Path, result: BenchResult, json_replace_fails: None) -> None:
    for suffix in (".csv", ".json"):
        (tmp_path / f"run{suffix}").write_text(f"old {suffix}")
    with pytest.raises(OSError, match="disk full"):
        save_results(result, tmp_path / "run", force=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.csv", "run.json"]  # no temporary file left
    assert (tmp_path / "run.csv").read_text() == "old .csv" and (tmp_path / "run.json").read_text() == "old .json"


def test_files_get_the_usual_permissions(tmp_path: Path, result: BenchResult) -> None:
    before = os.umask(0o022)
    try:
        csv_path, json_path = save_results(result, tmp_path / "run")
    finally:
        os.umask(before)
    assert [p.stat().st_mode & 0o777 for p in (csv_path, json_path)] == [0o644, 0o644]


# ----------------------------------------------------------------------------------- the config
@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"modes": ("full_and_piecewise",)}, "modes must be some of"),
        ({"batch_sizes": ()}, "batch_sizes must be a non-empty list"),
        ({"batch_sizes": (0,)}, "every batch size must be a positive integer"),
        ({"repeats": 2}, "repeats must be an integer of at least 5"),
        ({"warmup": -1}, "warmup must be an integer of at least 0"),
        ({"profile_steps": 0}, "profile_steps must be a positive integer"),
        ({"prompt_len": "8"}, "prompt_len must be a positive integer"),
        ({"prompt_len": 40}, "max_model_len .* must be an integer of at least 41"),
        ({"num_heads": 7}, "divisible by num_heads"),  # the model's own checks (ToyConfig)
        ({"layers": "attn,turbo"}, "unknown layer kind"),
    ],
)
def test_bad_config_is_refused_in_one_line(kwargs: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match) as exc:
        BenchConfig.quick_preset(**kwargs)
    _one_line(exc)


def test_defaults_and_quick_preset_are_valid() -> None:
    assert BenchConfig().hidden_size == 1024 and BenchConfig.quick_preset().repeats == 20


# ----------------------------------------------------------------------------------- loading
@pytest.mark.parametrize("path", PAIRS, ids=[p.stem for p in PAIRS])
def test_every_recorded_pair_loads(path: Path) -> None:
    result = load_results(path)
    config = result.config
    assert len(result.rows) == len(config["modes"]) * len(config["batch_sizes"])


def _damaged(tmp_path: Path, edit: Callable[[list[str]], list[str]]) -> Path:
    shutil.copy(SMALL.with_suffix(".json"), tmp_path / "run.json")
    lines = SMALL.with_suffix(".csv").read_text().splitlines()
    (tmp_path / "run.csv").write_text("\n".join(edit(lines)) + "\n")
    return tmp_path / "run"


def _cell(lines: list[str], row: int, column: str, value: str) -> list[str]:
    header = lines[0].split(",")
    cells = lines[row].split(",")
    cells[header.index(column)] = value
    return [*lines[:row], ",".join(cells), *lines[row + 1 :]]


@pytest.mark.parametrize(
    ("match", "edit"),
    [
        ("no rows", lambda lines: lines[:1]),
        ("could not convert", lambda lines: _cell(lines, 1, "kernels", "many")),
        ("different number of fields", lambda lines: [*lines[:-1], lines[-1] + ",7"]),
        ("missing column", lambda lines: [line.replace(",p90_us", "") for line in lines]),
    ],
)
def test_damaged_results_are_refused(tmp_path: Path, match: str, edit: Callable[[list[str]], list[str]]) -> None:
    with pytest.raises(ConfigError, match=match) as exc:
        load_results(_damaged(tmp_path, edit))
    assert "python -m cglab bench" in _one_line(exc)


def test_an_undamaged_copy_loads(tmp_path: Path) -> None:
    assert len(load_results(_damaged(tmp_path, lambda lines: lines)).rows) == 21
