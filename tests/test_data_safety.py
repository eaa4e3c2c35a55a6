"""Recorded results are never overwritten without ``--force``, and a write never leaves a half file:
it goes to a temporary file beside the target, which is then renamed over it. A run whose final
save fails keeps its measurements under a new name and says where, in one line; a Ctrl-C at any
point is one line and exit status 130."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from cglab import ConfigError, bench, cli
from cglab.bench import CSV_COLUMNS, BenchResult, load_results, save_results, startup
from cglab.bench import files as results
from cglab.bench.startup import STARTUP_COLUMNS, StartupResult, load_startup
from cglab.cli import main

PACKAGE = Path(cli.__file__).parent
STAMP = "20250101-120000"
TINY = ["--quick", "--device", "cpu", "--modes", "none", "--batch-sizes", "1", "--repeats", "5", "--warmup", "1"]


@pytest.fixture
def result() -> BenchResult:
    row = {c: 1 for c in CSV_COLUMNS} | {"mode": "piecewise", "backend": "sim", "median_us": 3.0}
    return BenchResult([row], {"backend": "sim", "device_name": "CPU"}, {"modes": ["piecewise"], "batch_sizes": [1]})


@pytest.mark.parametrize("existing", ["run.csv", "run.json"])
def test_save_refuses_to_overwrite_without_force(tmp_path: Path, result: BenchResult, existing: str) -> None:
    recorded = tmp_path / existing
    recorded.write_text("recorded on the H200")
    with pytest.raises(ConfigError, match="--force"):
        save_results(result, tmp_path / "run")
    assert sorted(p.name for p in tmp_path.iterdir()) == [existing]
    assert recorded.read_text() == "recorded on the H200"


def test_writes_go_to_a_temporary_file_then_are_renamed(
    tmp_path: Path, result: BenchResult, monkeypatch: pytest.MonkeyPatch
) -> None:
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


def test_cli_refuses_to_overwrite_in_one_line(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """In this process (the Ctrl-C tests below run ``python -m cglab bench`` over a recorded pair and check
    its stderr whole): one line, before any measuring."""
    recorded = tmp_path / "h200.csv"
    recorded.write_text("recorded on the H200")
    assert main(["bench", "--quick", "--out", str(tmp_path / "h200")]) != 0
    out, err = capfd.readouterr()
    assert "Traceback" not in err and len(err.splitlines()) == 1 and "--force" in err and out == ""
    assert recorded.read_text() == "recorded on the H200" and not (tmp_path / "h200.json").exists()


# ----------------------------------------------------------------------------------- a failing final save
@pytest.fixture
def temp_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The temporary folder the last fallback goes to, inside the test's own folder; a fixed time stamp."""
    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    monkeypatch.setattr(results.time, "strftime", lambda fmt: STAMP)
    return folder


def _fail_replacing(monkeypatch: pytest.MonkeyPatch, *names: str) -> None:
    """Moving a file into place under one of ``names`` fails as a full disk does (others work)."""
    real_replace = results.os.replace

    def replace(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        if Path(dst).name in names:
            raise OSError(28, "No space left on device", str(dst))
        real_replace(src, dst)

    monkeypatch.setattr(results.os, "replace", replace)


def _canned(monkeypatch: pytest.MonkeyPatch, command: str) -> list[dict]:
    """``command``'s measurement replaced by a known result (the save is what is tested); its rows."""
    if command == "bench":
        row = {c: 1 for c in CSV_COLUMNS} | {"mode": "full", "backend": "sim", "median_us": 2.5}
        canned = BenchResult([row], {"backend": "sim", "device_name": "CPU"}, {"modes": ["full"], "batch_sizes": [1]})
        monkeypatch.setattr(bench, "run_bench", lambda *args, **kwargs: canned)
    else:
        row = dict(zip(STARTUP_COLUMNS, ["full", "compiled", "fixed", "sim", 4, 1.0, 0.5, 2.0, 3.0]))
        canned = StartupResult([row], {"device_name": "CPU"}, {"capture_sizes": [1, 2]})
        monkeypatch.setattr(startup, "measure_startup", lambda config: canned)
    return canned.rows


def _one_line_error(err: str) -> str:
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    return err


def test_measurements_are_kept_beside_the_target_when_the_final_save_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, temp_folder: Path
) -> None:
    """A real (tiny) bench over a recorded pair, with --force: the disk fills up at the save. The old
    pair stays, the new measurements go beside it under a new name, and one line says where."""
    for suffix in (".csv", ".json"):
        (tmp_path / f"run{suffix}").write_text(f"recorded on the H200 {suffix}")
    _fail_replacing(monkeypatch, "run.json")
    assert main(["bench", *TINY, "--force", "--out", str(tmp_path / "run")]) == 1
    err = _one_line_error(capsys.readouterr().err)
    kept = tmp_path / f"run-unsaved-{STAMP}"
    assert "No space left on device" in err and f"kept in {kept}.csv and {kept.name}.json" in err
    assert "rename them to run.csv and run.json" in err
    assert [(r["mode"], r["batch_size"]) for r in load_results(kept).rows] == [("none", 1)]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "run-unsaved-20250101-120000.csv",
        "run-unsaved-20250101-120000.json",
        "run.csv",
        "run.json",
        "tmp",
    ]  # no temporary file left
    assert (tmp_path / "run.csv").read_text() == "recorded on the H200 .csv"
    assert (tmp_path / "run.json").read_text() == "recorded on the H200 .json"


@pytest.mark.parametrize("command", ["bench", "startup"])
def test_kept_measurements_never_overwrite_a_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, temp_folder: Path, command: str
) -> None:
    """The fallback beside the target fails too (its name is taken, then the disk is full there): the
    measurements go to the temporary folder, and the file that held the name is untouched."""
    rows = _canned(monkeypatch, command)
    taken = tmp_path / f"run-unsaved-{STAMP}.json"
    taken.write_text("someone else's")
    _fail_replacing(monkeypatch, "run.json", f"run-unsaved-{STAMP}-2.json")
    assert main([command, "--quick", "--out", str(tmp_path / "run")]) == 1
    err = _one_line_error(capsys.readouterr().err)
    kept = temp_folder / f"run-unsaved-{STAMP}"
    assert f"kept in {kept}.csv" in err
    load = load_results if command == "bench" else load_startup
    assert load(kept).rows == rows
    assert taken.read_text() == "someone else's"
    assert sorted(p.name for p in tmp_path.iterdir()) == [taken.name, "tmp"]


def test_a_result_that_appeared_during_the_run_is_not_overwritten(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, temp_folder: Path
) -> None:
    """Another run wrote OUT meanwhile: without --force, the save refuses it, and keeps this run's beside it."""
    rows = _canned(monkeypatch, "bench")
    other = tmp_path / "run.csv"

    def measure_while_another_run_saves(*args: object, **kwargs: object) -> BenchResult:
        other.write_text("the other run's")
        return BenchResult(rows, {"backend": "sim"}, {"modes": ["full"], "batch_sizes": [1]})

    monkeypatch.setattr(bench, "run_bench", measure_while_another_run_saves)
    assert main(["bench", "--quick", "--out", str(tmp_path / "run")]) == 1
    err = _one_line_error(capsys.readouterr().err)
    assert "already exists" in err and f"kept in {tmp_path / f'run-unsaved-{STAMP}'}.csv" in err
    assert other.read_text() == "the other run's"
    assert load_results(tmp_path / f"run-unsaved-{STAMP}").rows == rows


@pytest.mark.parametrize("command", ["bench", "startup"])
def test_measurements_are_printed_when_nothing_can_be_written(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    temp_folder: Path,
    json_replace_fails: None,
    monkeypatch: pytest.MonkeyPatch,
    command: str,
) -> None:
    rows = _canned(monkeypatch, command)
    assert main([command, "--quick", "--out", str(tmp_path / "run")]) == 1
    out, err = capsys.readouterr()
    _one_line_error(err)
    assert "nor a copy" in err and "printed on stdout as JSON" in err
    assert json.loads(out)["rows"] == rows
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tmp"] and list(temp_folder.iterdir()) == []


def test_a_file_system_error_during_the_run_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def full(*args: object, **kwargs: object) -> None:
        raise OSError(28, "No space left on device", "/tmp/torchinductor")

    monkeypatch.setattr(bench, "run_bench", full)
    assert main(["bench", "--quick", "--out", str(tmp_path / "run")]) == 1
    assert "No space left on device" in _one_line_error(capsys.readouterr().err)


# ----------------------------------------------------------------------------------- Ctrl-C
# Each child starts with Ctrl-C's default action: a shell that runs a job in the background (`make test &`)
# ignores SIGINT for it, the children would inherit that, and no Ctrl-C could ever arrive.
CTRL_C_ACTIVE = {"preexec_fn": lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)}
# `python -m cglab`, exactly as Python runs it (runpy; argv[0] reads "-m" while the package imports),
# with a Ctrl-C arriving when torch starts to be imported: seconds before main() runs.
INTERRUPTED_IMPORT = """
import os, runpy, signal, sys

class CtrlC:
    def find_spec(self, name, path=None, target=None):
        if name == "torch":
            os.kill(os.getpid(), signal.SIGINT)

sys.meta_path.insert(0, CtrlC())
sys.argv = ["-m", *sys.argv[1:]]
runpy._run_module_as_main("cglab")
"""


def test_ctrl_c_while_importing_torch_is_one_line(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", INTERRUPTED_IMPORT, "bench", "--quick", "--out", str(tmp_path / "r")],
        capture_output=True,
        text=True,
        timeout=60,
        **CTRL_C_ACTIVE,
    )
    assert (proc.returncode, proc.stderr, proc.stdout) == (130, "python -m cglab: interrupted\n", "")


def test_a_real_early_ctrl_c_is_one_line(tmp_path: Path) -> None:
    """SIGINT half a second in: Python is long started and still importing (seconds); nothing is written."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "cglab", "bench", "--quick", "--out", str(tmp_path / "run")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **CTRL_C_ACTIVE,
    )
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "Traceback" not in err, err
    assert len(err.splitlines()) == 1 and err.endswith(": interrupted\n") and out == ""
    assert list(tmp_path.iterdir()) == []


# `python -m cglab bench` over a recorded pair, with a Ctrl-C between the two renames of the save
# (the measurement is canned: the save is what is tested). The first rename must be undone.
INTERRUPTED_SAVE = """
import os, runpy, signal, sys

sys.argv = ["-m", *sys.argv[1:]]
import cglab.bench
from cglab.bench import BenchResult, CSV_COLUMNS

row = {c: 1 for c in CSV_COLUMNS} | {"mode": "full", "backend": "sim", "median_us": 2.5}
cglab.bench.run_bench = lambda *args, **kwargs: BenchResult([row], {"backend": "sim"}, {"modes": ["full"], "batch_sizes": [1]})
real_replace = os.replace

def replace(src, dst):
    if str(dst).endswith(".json"):
        os.kill(os.getpid(), signal.SIGINT)
    real_replace(src, dst)

os.replace = replace
runpy._run_module_as_main("cglab")
"""


# The same Ctrl-C just after the CSV's rename: without the renames deferring it, the CSV would stay new.
AFTER_THE_CSV = INTERRUPTED_SAVE.replace(
    """    if str(dst).endswith(".json"):
        os.kill(os.getpid(), signal.SIGINT)
    real_replace(src, dst)""",
    """    real_replace(src, dst)
    if str(dst).endswith(".csv"):
        os.kill(os.getpid(), signal.SIGINT)""",
)


@pytest.mark.parametrize("script", [INTERRUPTED_SAVE, AFTER_THE_CSV], ids=["before-the-json", "after-the-csv"])
def test_ctrl_c_during_the_save_of_python_m_cglab_keeps_the_old_pair(tmp_path: Path, script: str) -> None:
    assert script.count("os.kill") == 1
    for suffix in (".csv", ".json"):
        (tmp_path / f"run{suffix}").write_text(f"recorded {suffix}")
    proc = subprocess.run(
        [sys.executable, "-c", script, "bench", "--quick", "--force", "--out", str(tmp_path / "run")],
        capture_output=True,
        text=True,
        timeout=120,
        **CTRL_C_ACTIVE,
    )
    assert (proc.returncode, proc.stderr) == (130, "python -m cglab bench: interrupted\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.csv", "run.json"]
    assert [(tmp_path / name).read_text() for name in ("run.csv", "run.json")] == ["recorded .csv", "recorded .json"]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_sigterm_or_sighup_during_the_save_waits_for_it_to_end(tmp_path: Path, signum: int) -> None:
    """The same signal between the two renames would kill the process there (a new CSV beside the old JSON,
    hidden backups left over): it waits until the new pair is in place, then ends the process as usual."""
    for suffix in (".csv", ".json"):
        (tmp_path / f"run{suffix}").write_text(f"recorded {suffix}")
    script = INTERRUPTED_SAVE.replace("signal.SIGINT", f"signal.{signal.Signals(signum).name}")
    proc = subprocess.run(
        [sys.executable, "-c", script, "bench", "--quick", "--force", "--out", str(tmp_path / "run")],
        capture_output=True,
        text=True,
        timeout=120,
        # The signal's default action in the child, whatever this process inherited: under nohup SIGHUP is
        # ignored, and an ignored signal after the save would end nothing.
        preexec_fn=lambda: signal.signal(signum, signal.SIG_DFL),
    )
    assert (proc.returncode, proc.stderr) == (-signum, "")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.csv", "run.json"]  # no hidden leftovers
    assert load_results(tmp_path / "run").rows[0]["median_us"] == 2.5  # the new pair, both halves


# After main() returns, a KeyboardInterrupt in the interpreter's teardown (here an atexit callback)
# would print "Exception ignored" and a traceback; __main__ makes that Ctrl-C end the process by the signal.
# cglab.cli is stubbed so that no torch is imported: only __main__'s own lines run.
INTERRUPTED_TEARDOWN = """
import atexit, os, runpy, signal, sys, time, types

cli = types.ModuleType("cglab.cli")
cli.main = lambda: print("wrote run.csv and run.json") or 0
sys.modules["cglab"] = types.ModuleType("cglab")
sys.modules["cglab.cli"] = cli
atexit.register(lambda: (os.kill(os.getpid(), signal.SIGINT), time.sleep(5)))
runpy.run_path(sys.argv[1], run_name="__main__")
"""


def test_ctrl_c_in_the_teardown_ends_at_once_and_keeps_the_output() -> None:
    buffered = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # stdout to a pipe, as usual
    proc = subprocess.run(
        [sys.executable, "-c", INTERRUPTED_TEARDOWN, str(PACKAGE / "__main__.py")],
        capture_output=True,
        text=True,
        timeout=30,
        env=buffered,
    )
    assert (proc.returncode, proc.stderr) == (-signal.SIGINT, "")  # the shell reports 130
    assert proc.stdout == "wrote run.csv and run.json\n"  # flushed before the signal could end it


@pytest.mark.parametrize("where", ["parser", "measuring", "saving"])
def test_ctrl_c_in_main_is_one_line_and_loses_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    for suffix in (".csv", ".json"):
        (tmp_path / f"run{suffix}").write_text(f"recorded {suffix}")

    def ctrl_c(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    if where == "parser":  # the subcommands' modules import as the parser is built
        monkeypatch.setattr(cli, "build_parser", ctrl_c)
    elif where == "measuring":
        monkeypatch.setattr(bench, "run_bench", ctrl_c)
    else:  # between the two renames of the pair: the first is undone
        _canned(monkeypatch, "bench")
        real_replace = results.os.replace
        monkeypatch.setattr(
            results.os, "replace", lambda src, dst: ctrl_c() if str(dst).endswith(".json") else real_replace(src, dst)
        )
    try:
        status = main(["bench", "--quick", "--force", "--out", str(tmp_path / "run")])
    except KeyboardInterrupt:  # let through, it would stop the whole test session
        pytest.fail("main() let the KeyboardInterrupt through")
    err = capsys.readouterr().err
    assert status == 130
    assert err == ("python -m cglab: interrupted\n" if where == "parser" else "python -m cglab bench: interrupted\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.csv", "run.json"]
    assert [(tmp_path / name).read_text() for name in ("run.csv", "run.json")] == ["recorded .csv", "recorded .json"]
