"""Every input runs in time and memory proportional to what it asks, or is refused in one line before
anything is allocated; no run is silent; a fault never hides what was saved.

The refusals run under a guarded allocator: a tensor above ``GUARD_BYTES`` fails the test, so a refusal
that comes after allocating what it refuses cannot pass.
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

from cglab import bench, cli
from cglab.bench import CSV_COLUMNS, BenchResult, load_results, save_results
from cglab.cli import main
from cglab.compilation_config import CompilationConfig
from cglab.config import ToyConfig
from cglab.model import ToyTransformer
from cglab.repro import repro_config, run_repro

GUARD_BYTES = 2**30
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def guarded_allocator(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch's factory functions refuse a tensor above ``GUARD_BYTES`` (8 bytes an element: an upper bound)."""
    for name in ("empty", "zeros", "full", "ones", "randn", "randint", "cat"):
        real = getattr(torch, name)

        def guarded(*args: object, real: Callable[..., torch.Tensor] = real, name: str = name, **kwargs: object):
            if name == "cat":
                dims = [sum(t.shape[0] for t in args[0]), *args[0][0].shape[1:]] if args[0] else [0]
            elif name == "randint":
                dims = args[-1] if args and isinstance(args[-1], (tuple, list)) else kwargs.get("size", ())
            else:
                dims = args[0] if args and isinstance(args[0], (tuple, list, torch.Size)) else args
            assert 8 * math.prod(int(d) for d in dims) <= GUARD_BYTES, f"torch.{name}{tuple(dims)} before refusing"
            return real(*args, **kwargs)

        monkeypatch.setattr(torch, name, guarded)


# The table: (argv, exit status, fragments of the one line). Each is refused within seconds.
REFUSED = {
    "a billion steps": (["repro", "--steps", "1000000000"], ["steps 1,000,000,000: needs", "largest steps that fits"]),
    "1e20 steps": (["repro", "--steps", str(10**20)], ["beyond the 64-bit integer range", "largest steps that fits"]),
    "a huge batch": (["repro", "--batch-sizes", "100000000", "--steps", "1"], ["batch size 100,000,000: needs"]),
    "a trillion requests": (
        ["repro", "--max-num-reqs", "1000000000000", "--steps", "1"],
        ["max_num_reqs 1,000,000,000,000: needs", "the largest max_num_reqs that fits is"],
    ),
    "a huge capture size": (
        ["repro", "--capture-sizes", "1,2,100000000", "--steps", "2"],
        [
            "capture size 100,000,000: puts 12,500,000 tokens in one request",
            "the largest capture size that fits is 384",
        ],
    ),
    "a capture size the run's length cannot hold": (
        ["repro", "--capture-sizes", "385", "--steps", "2"],
        ["capture size 385: puts 49 tokens", "the largest capture size that fits is 384"],
    ),
    "a huge hidden size": (
        ["bench", "--quick", "--hidden-size", "100000", "--force", "--out"],
        ["hidden_size 100,000: needs", "the largest hidden_size that fits is"],
    ),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_what_cannot_fit_is_refused_in_one_line_before_allocating(
    case: str, capsys: pytest.CaptureFixture[str], tmp_path: Path, guarded_allocator: None
) -> None:
    argv, fragments = REFUSED[case]
    assert main([*argv, *([str(tmp_path / "run")] if argv[-1] == "--out" else [])]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1 and err.startswith(f"python -m cglab {argv[0]}: error: ")
    assert all(f in err for f in fragments), err
    assert "raise" not in err  # no advice about options the command line does not have


def test_the_largest_value_named_fits() -> None:
    """The refusal's number is the boundary: one step fewer than refused runs its checks through."""
    with pytest.raises(Exception, match="the largest capture size that fits is 384"):
        run_repro(CompilationConfig("piecewise", (385,)), steps=2)
    assert run_repro(CompilationConfig("piecewise", (384,)), steps=2, batch_sizes=(8,)).error is None


@pytest.mark.parametrize(
    ("out", "why"), [("/proc/none/run", "No such file or directory"), ("file/run", "a file, not a folder")]
)
def test_bench_checks_its_destination_before_measuring(
    out: str, why: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "file").write_text("a regular file")
    monkeypatch.setattr(bench, "run_bench", lambda *a, **k: pytest.fail("measured before checking --out"))
    assert main(["bench", "--quick", "--out", out]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and f"cannot write in {Path(out).parent} ({why})" in err


# -- no run is silent -----------------------------------------------------------------------------------


def test_without_a_terminal_a_run_prints_progress_lines(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(cli, "LOG_EVERY_S", 0.01)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False)
    assert main(["repro", "--steps", "40", "--batch-sizes", "1", "--mode", "none", "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["steps"] == 40
    lines = err.splitlines()
    assert lines and all(line.startswith("python -m cglab repro: ") and " of 40 steps after " in line for line in lines)


def test_ctrl_c_stops_a_run_with_what_it_had(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    @contextmanager
    def interrupted_at_step_3(steps: int) -> Iterator[Callable[[], None]]:
        done = []

        def tick() -> None:
            done.append(1)
            if len(done) == 3:
                raise KeyboardInterrupt

        yield tick

    monkeypatch.setattr(cli, "_steps_bar", interrupted_at_step_3)
    assert main(["repro", "--steps", "10", "--json"]) == 130
    out, err = capsys.readouterr()
    result = json.loads(out)
    assert result["error"] == "KeyboardInterrupt: after 3 steps" and sum(result["steps_by_mode"].values()) == 3
    assert result["state_diverged"] is False  # the caches were compared after the third step
    assert err == "python -m cglab repro: interrupted\n"


def test_with_stderr_closed_a_run_still_prints_its_json() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "cglab", "repro", "--steps", "2", "--mode", "none", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=lambda: os.close(2),
        cwd=ROOT,
    )
    assert proc.returncode == 0 and json.loads(proc.stdout)["steps"] == 2


# -- faults stay honest ----------------------------------------------------------------------------------

CANNED_BENCH = """
import runpy, sys
import cglab.bench
from cglab.bench import BenchResult, CSV_COLUMNS

row = {c: 1 for c in CSV_COLUMNS} | {"mode": "full", "backend": "sim", "median_us": 2.5}
cglab.bench.run_bench = lambda *args, **kwargs: BenchResult([row], {"backend": "sim", "kernels": "aten"}, {})
sys.argv = ["-m", *sys.argv[1:]]
runpy._run_module_as_main("cglab")
"""


def test_a_stdout_error_after_the_save_says_the_files_are_saved(tmp_path: Path) -> None:
    with open("/dev/full", "w") as full:
        proc = subprocess.run(
            [sys.executable, "-c", CANNED_BENCH, "bench", "--quick", "--json", "--out", str(tmp_path / "run")],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            timeout=300,
        )
    assert proc.returncode == 1 and proc.stderr.startswith("python -m cglab bench: error: the files are saved")
    assert len(proc.stderr.splitlines()) == 1 and load_results(tmp_path / "run").rows[0]["median_us"] == 2.5


def test_saves_of_one_destination_take_turns(tmp_path: Path) -> None:
    row = {c: 1 for c in CSV_COLUMNS} | {"mode": "full", "backend": "sim", "median_us": 2.5}
    result = BenchResult([row], {"backend": "sim"}, {})
    fd = os.open(tmp_path, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)  # another save holds the folder
    saving = threading.Thread(target=save_results, args=(result, tmp_path / "run"))
    saving.start()
    time.sleep(0.5)
    assert not (tmp_path / "run.csv").exists()  # waiting for its turn
    os.close(fd)
    saving.join(timeout=30)
    assert load_results(tmp_path / "run").rows[0]["median_us"] == 2.5


def test_a_sidecar_without_its_environment_is_refused(tmp_path: Path) -> None:
    row = {c: 1 for c in CSV_COLUMNS} | {"mode": "full", "backend": "sim"}
    save_results(BenchResult([row], {"backend": "sim"}, {}), tmp_path / "run")
    sidecar = json.loads((tmp_path / "run.json").read_text())
    del sidecar["environment"]
    (tmp_path / "run.json").write_text(json.dumps(sidecar))
    with pytest.raises(ValueError, match="run.json has no environment object; re-record it"):
        load_results(tmp_path / "run")


# -- the model ----------------------------------------------------------------------------------------


def test_the_same_seed_gives_the_same_model_whatever_the_run_length() -> None:
    short, long = (repro_config(ToyConfig(), CompilationConfig(), [3], steps) for steps in (8, 64))
    assert short.max_model_len < long.max_model_len
    a, b = (ToyTransformer(config).state_dict() for config in (short, long))
    for name, tensor in a.items():
        rows = min(tensor.shape[0], b[name].shape[0]) if tensor.dim() else None
        assert torch.equal(tensor[:rows], b[name][:rows]), name
