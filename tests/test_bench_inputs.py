"""Bad input to the benchmark fails early, in one line that says what to do.

Output paths are checked before anything is measured, a result pair is replaced whole or not at
all, sizes have upper bounds (a typo must not hang the machine or exhaust its memory), and
``load_results`` refuses damaged data rather than plotting it.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from cglab import bench
from cglab.bench import CSV_COLUMNS, BenchConfig, BenchResult, check_output, load_results, save_results, startup
from cglab.bench import files as results
from cglab.cli import main
from cglab.errors import ConfigError

DATA = Path(__file__).resolve().parents[1] / "data"
PAIRS = sorted(p for p in DATA.glob("*.csv") if "_startup_" not in p.stem)  # latency runs
SMALL = DATA / "h200_decode_small_fp32"  # 3 modes x 7 batch sizes = 21 rows
TINY = ["bench", "--quick", "--device", "cpu", "--batch-sizes", "1,2", "--repeats", "5", "--warmup", "1"]


@pytest.fixture
def result() -> BenchResult:
    row = {c: 1 for c in CSV_COLUMNS} | {"mode": "full", "backend": "sim", "median_us": 2.5}
    return BenchResult([row], {"backend": "sim", "device_name": "CPU"}, {"layers": "attn"})


def _one_line(exc: pytest.ExceptionInfo[ConfigError]) -> str:
    message = str(exc.value)
    assert "\n" not in message and "Traceback" not in message
    return message


# ----------------------------------------------------------------------------------- defect 4: --out
@pytest.mark.parametrize("out", ["", ".", "..", "sub/"])
def test_out_must_name_a_file(tmp_path: Path, out: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match="--out") as exc:
        check_output(out, force=True)
    _one_line(exc)


def test_out_under_a_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "notes").write_text("a file, not a directory")
    with pytest.raises(ConfigError, match="not a directory") as exc:
        check_output(tmp_path / "notes" / "deeper" / "run", force=True)
    _one_line(exc)


def test_out_that_is_a_directory_is_refused_even_with_force(tmp_path: Path, result: BenchResult) -> None:
    (tmp_path / "run.csv").write_text("old csv")
    (tmp_path / "run.json").mkdir()
    with pytest.raises(ConfigError, match="directory") as exc:
        save_results(result, tmp_path / "run", force=True)
    _one_line(exc)
    assert (tmp_path / "run.csv").read_text() == "old csv" and (tmp_path / "run.json").is_dir()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.csv", "run.json"]


def test_unwritable_directory_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    if os.geteuid() == 0:  # root writes anywhere: simulate the refusal the file system would give
        real_open = results.os.open

        def refuse(name: str | os.PathLike[str], *args: object, **kwargs: object) -> int:
            if Path(name).parent == locked:
                raise PermissionError(13, "Permission denied", str(name))
            return real_open(name, *args, **kwargs)

        monkeypatch.setattr(results.os, "open", refuse)
    else:
        locked.chmod(0o555)
    try:
        with pytest.raises(ConfigError, match="cannot write") as exc:
            check_output(locked / "run")
        _one_line(exc)
    finally:
        locked.chmod(0o755)
    assert list(locked.iterdir()) == []


def test_cli_checks_out_before_measuring(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "notes").write_text("a file")

    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("measured before checking --out")

    monkeypatch.setattr(bench, "run_bench", never)
    for out in (str(tmp_path / "notes" / "run"), ""):
        assert main([*TINY, "--out", out]) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err and "--out" in err


def _name_max(folder: Path) -> int:
    return os.pathconf(folder, "PC_NAME_MAX") if hasattr(os, "pathconf") else 255


def test_out_name_too_long_for_the_temporary_files_is_refused(tmp_path: Path, result: BenchResult) -> None:
    """OUT.json itself fits, but the temporary file the save writes beside it (.OUT.json.<8 hex>.tmp)
    does not: the check must probe that name, not a short one."""
    limit = _name_max(tmp_path)
    longest = limit - len("..json.12345678.tmp")
    with pytest.raises(ConfigError, match=f"at most {longest} characters") as exc:
        check_output(tmp_path / ("a" * (longest + 1)))
    _one_line(exc)
    for name in ("a" * (limit - len(".json")), "a" * (limit + 10), f"{'d' * (limit + 1)}/run"):
        with pytest.raises(ConfigError, match="choose a(n)? (shorter )?--out") as exc:
            check_output(tmp_path / name)
        _one_line(exc)
    assert list(tmp_path.iterdir()) == []  # the probes left nothing, not even a directory
    save_results(result, tmp_path / ("a" * longest))  # the longest name allowed really saves
    assert len(list(tmp_path.iterdir())) == 2


def test_probe_leaves_no_directory_behind(tmp_path: Path) -> None:
    check_output(tmp_path / "new" / "deeper" / "run")
    assert list(tmp_path.iterdir()) == []


def test_cli_refuses_a_long_out_name_before_measuring(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("measured before checking --out")

    monkeypatch.setattr(bench, "run_bench", never)
    monkeypatch.setattr(startup, "measure_startup", never)
    out = str(tmp_path / ("a" * 250))
    for command in (TINY, ["startup", "--quick"]):
        assert main([*command, "--out", out]) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
        assert "choose an --out name of at most" in err
    assert list(tmp_path.iterdir()) == []


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


# ----------------------------------------------------------------------------------- defect 5: bounds
@pytest.mark.parametrize(
    ("field", "kwargs"),
    [
        ("hidden_size", {"hidden_size": 1_000_000}),
        ("layers", {"layers": ",".join(["sconv", "attn"] * 4500)}),
        ("repeats", {"repeats": 1_000_000_000}),
        ("warmup", {"warmup": 1_000_000_000}),
        ("profile_steps", {"profile_steps": 1_000_000}),
        ("prompt_len", {"prompt_len": 10_000_000, "max_model_len": 10_000_001}),
        ("max_model_len", {"max_model_len": 10_000_000}),
        ("num_heads", {"num_heads": 1 << 20, "hidden_size": 1 << 20}),
        ("max_model_len", {"max_model_len": "x"}),
        ("prompt_len", {"prompt_len": "8"}),
    ],
)
def test_sizes_are_bounded(field: str, kwargs: dict) -> None:
    with pytest.raises(ConfigError, match=field) as exc:
        BenchConfig.quick_preset(**kwargs)
    _one_line(exc)


def test_memory_estimate_is_bounded() -> None:
    with pytest.raises(ConfigError, match="GiB") as exc:  # each size allowed, together far too large
        BenchConfig(
            hidden_size=4096,
            layers=",".join(["attn"] * 64),
            batch_sizes=(1024,),
            prompt_len=4000,
            max_model_len=4096,
            dtype="float32",
        )
    _one_line(exc)


def test_defaults_and_quick_preset_are_within_bounds() -> None:
    assert BenchConfig().hidden_size == 1024 and BenchConfig.quick_preset().repeats == 20


# ----------------------------------------------------------------------------------- defect 7: loading
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
        ("4 rows", lambda lines: lines[:5]),
        ("twice", lambda lines: [*lines, lines[1]]),
        ("median_us", lambda lines: _cell(lines, 3, "median_us", "nan")),
        ("p90_us", lambda lines: _cell(lines, 3, "p90_us", "inf")),
        ("p10_us", lambda lines: _cell(lines, 2, "p10_us", "-4.0")),
        ("kernel_floor_us", lambda lines: _cell(lines, 2, "kernel_floor_us", "-1")),
        ("mode", lambda lines: _cell(lines, 1, "mode", "turbo")),
        ("batch_size", lambda lines: _cell(lines, 1, "batch_size", "1.5")),
        ("launches", lambda lines: _cell(lines, 1, "launches", "-3")),
    ],
)
def test_damaged_results_are_refused(tmp_path: Path, match: str, edit: Callable[[list[str]], list[str]]) -> None:
    with pytest.raises(ConfigError, match=match) as exc:
        load_results(_damaged(tmp_path, edit))
    assert "python -m cglab bench" in _one_line(exc)


def test_an_undamaged_copy_loads(tmp_path: Path) -> None:
    assert len(load_results(_damaged(tmp_path, lambda lines: lines)).rows) == 21
