"""Recorded results are never overwritten without ``--force``, and a write never leaves a half file:
it goes to a temporary file beside the target, which is then renamed over it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from cglab import ConfigError
from cglab.bench import CSV_COLUMNS, BenchResult, load_results, save_results
from cglab.bench import files as results


@pytest.fixture
def result() -> BenchResult:
    row = {c: 1 for c in CSV_COLUMNS} | {"mode": "piecewise", "backend": "sim", "median_us": 3.0}
    return BenchResult([row], {"backend": "sim", "device_name": "CPU"}, {"layers": "sconv,attn"})


@pytest.mark.parametrize("existing", ["run.csv", "run.json"])
def test_save_refuses_to_overwrite_without_force(tmp_path: Path, result: BenchResult, existing: str) -> None:
    recorded = tmp_path / existing
    recorded.write_text("recorded on the H200")
    with pytest.raises(ConfigError, match="--force"):
        save_results(result, tmp_path / "run")
    assert sorted(p.name for p in tmp_path.iterdir()) == [existing]
    assert recorded.read_text() == "recorded on the H200"


def test_writes_go_to_a_temporary_file_then_are_renamed(tmp_path: Path, result: BenchResult,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    for suffix in (".csv", ".json"):
        (tmp_path / f"run{suffix}").write_text("old")
    renames = []
    real_replace = os.replace

    def spy(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        src, dst = Path(src), Path(dst)
        # At the rename the new bytes are complete in the temporary file and the target is untouched.
        assert src.parent == dst.parent and src != dst  # same directory: the rename is atomic
        assert dst.read_text() == "old" and src.stat().st_size > 0
        renames.append(dst.name)
        real_replace(src, dst)

    monkeypatch.setattr(results.os, "replace", spy)
    save_results(result, tmp_path / "run", force=True)
    assert sorted(renames) == ["run.csv", "run.json"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.csv", "run.json"]  # no temporary file left
    assert load_results(tmp_path / "run").rows[0]["mode"] == "piecewise"


def test_cli_refuses_to_overwrite_in_one_line(tmp_path: Path) -> None:
    recorded = tmp_path / "h200.csv"
    recorded.write_text("recorded on the H200")
    proc = subprocess.run([sys.executable, "-m", "cglab", "bench", "--quick", "--out", str(tmp_path / "h200")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert len(proc.stderr.splitlines()) == 1 and "--force" in proc.stderr
    assert recorded.read_text() == "recorded on the H200" and not (tmp_path / "h200.json").exists()
