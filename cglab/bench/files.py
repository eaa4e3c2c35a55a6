"""Results on disk: ``PATH.csv`` (one row per measurement) and ``PATH.json`` (the format, the environment
and the config). Nothing is written over a result without ``force``; a pair that cannot be saved where
asked is kept under another name (``save_or_keep``)."""

from __future__ import annotations

import csv
import json
import math
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cglab._interrupt import termination_deferred

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None  # type: ignore[assignment]
from cglab.bench.modes import MODE_NAMES
from cglab.compare import dumps
from cglab.errors import ConfigError, NotSavedError

__all__ = [
    "CSV_COLUMNS",
    "EXTRA_COLUMNS",
    "BenchResult",
    "check_output",
    "load_results",
    "save_or_keep",
    "save_results",
]

CSV_COLUMNS = ("mode", "batch_size", "median_us", "p10_us", "p90_us", "kernel_floor_us", "launches", "backend")
EXTRA_COLUMNS = (
    "enqueue_median_us",
    "kernels",
    "counted_launches",
    "graph_segments",
    "eager_breaks",
    "attn_key_range",
    "repeats",
)
_TEXT = frozenset({"mode", "backend", "policy", "flavor", "path"})
_WHOLE = frozenset({"batch_size", "launches", "graphs", *EXTRA_COLUMNS[1:]})  # the counts
# /2 added the compiled rows, the peer and the roofline; /1 files (three modes) still read.
FORMAT = "cglab-bench/2"


@dataclass
class BenchResult:
    rows: list[dict[str, Any]]
    environment: dict[str, Any]
    config: dict[str, Any]

    @property
    def backend(self) -> str:
        return str(self.environment.get("backend", "unknown"))

    @property
    def device_name(self) -> str:
        return str(self.environment.get("device_name", "unknown device"))

    @property
    def modes(self) -> list[str]:
        present = {r["mode"] for r in self.rows}
        return [m for m in MODE_NAMES if m in present]

    def series(self, mode: str, column: str) -> tuple[list[int], list[float]]:
        rows = sorted((r for r in self.rows if r["mode"] == mode), key=lambda r: r["batch_size"])
        return [r["batch_size"] for r in rows], [float(r[column]) for r in rows]


def result_paths(path: str | os.PathLike[str]) -> tuple[Path, Path]:
    """``PATH`` (with or without ``.csv`` / ``.json``) -> (``PATH.csv``, ``PATH.json``)."""
    base = Path(path)
    if base.name in ("", ".", ".."):
        raise ConfigError(f"--out must name a file such as results/run (it writes run.csv and run.json), got {path!r}")
    if base.suffix in (".csv", ".json"):
        base = base.with_suffix("")
    return base.with_name(base.name + ".csv"), base.with_name(base.name + ".json")


def check_output(path: str | os.PathLike[str], force: bool = False) -> tuple[Path, Path]:
    """The pair's paths; a ConfigError if their folder cannot be written, or one exists and ``force`` is off."""
    paths = result_paths(path)
    try:  # the folder made, and a file written in it, before minutes of measuring
        paths[0].parent.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=paths[0].parent).close()
    except OSError as exc:
        why = "a file, not a folder" if isinstance(exc, FileExistsError) else exc.strerror or exc
        raise ConfigError(f"cannot write in {paths[0].parent} ({why}); choose another --out path") from None
    existing = [p for p in paths if p.exists()]
    if existing and not force:
        raise ConfigError(
            f"{existing[0]} already exists; pass --force (force=True in Python) to overwrite it, "
            "or choose another --out path"
        )
    return paths


def save_results(result: BenchResult, path: str | os.PathLike[str], force: bool = False) -> tuple[Path, Path]:
    """Write a benchmark result as ``PATH.csv`` and ``PATH.json`` (see ``save_pair``)."""
    columns = [*CSV_COLUMNS, *(c for c in EXTRA_COLUMNS if any(c in r for r in result.rows))]
    return save_pair(path, FORMAT, result, columns, force)


@termination_deferred()
def save_pair(
    path: str | os.PathLike[str], form: str, result: Any, columns: list[str], force: bool
) -> tuple[Path, Path]:
    """Write ``result.rows`` as ``PATH.csv`` and the format, environment and config as ``PATH.json``, whole
    or not at all: each goes to a temporary file beside its target and is renamed over it once both are
    written; if the second rename fails, the first target gets its old bytes back. Saves into one folder
    take turns (a lock); SIGTERM and SIGHUP wait for the save, Ctrl-C for the renames."""
    sidecar = {"format": form, "environment": result.environment, "config": result.config, "columns": columns}
    with _locked(check_output(path, force)[0].parent):
        targets = check_output(path, force)  # again: another save may have written the pair meanwhile
        old = {t: t.read_bytes() for t in targets if t.is_file()}
        temps = [t.with_name(f".{t.name}.{os.getpid()}.tmp") for t in targets]
        placed: list[Path] = []
        try:
            with open(temps[0], "x", encoding="utf-8", newline="") as f:  # "x": never into an existing file
                writer = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore", lineterminator="\n")
                writer.writeheader()
                writer.writerows({c: _format(row.get(c, math.nan)) for c in columns} for row in result.rows)
            with open(temps[1], "x", encoding="utf-8") as f:
                f.write(dumps(sidecar, indent=2) + "\n")
            with termination_deferred(("SIGINT",)):  # an interrupt between the renames would leave a mix
                for temp, target in zip(temps, targets):
                    os.replace(temp, target)
                    placed.append(target)
        except BaseException:
            with termination_deferred(("SIGINT",)):
                for target in placed:  # its old bytes back, or gone if it was new
                    target.write_bytes(old[target]) if target in old else target.unlink()
            raise
        finally:
            for temp in temps:
                temp.unlink(missing_ok=True)
    return targets


@contextmanager
def _locked(folder: Path) -> Iterator[None]:
    """An exclusive lock on ``folder``, held until the block ends (none where there is no fcntl: Windows)."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX) if fcntl else None
        yield
    finally:
        os.close(fd)


def save_or_keep(
    save: Callable[[str | os.PathLike[str], bool], tuple[Path, Path]], path: str | os.PathLike[str], force: bool = False
) -> tuple[Path, Path]:
    """``save(path, force)``; if that fails (a full disk, a result that appeared meanwhile), the same save as
    ``NAME-unsaved-DATE-TIME`` beside ``path``, else in the temporary folder, and a ``NotSavedError``
    that says where: a finished measurement is never lost to its last step."""
    try:
        return save(path, force)
    except (OSError, ConfigError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc).split(";")[0]
    targets = result_paths(path)
    name = f"{targets[0].stem}-unsaved-{time.strftime('%Y%m%d-%H%M%S')}"
    for folder in (targets[0].parent, Path(tempfile.gettempdir())):
        try:
            kept = save(folder / name, False)
        except (OSError, ConfigError):
            continue
        raise NotSavedError(
            f"could not write {targets[0]} and {targets[1].name} ({reason}), so the measurements were kept in "
            f"{kept[0]} and {kept[1].name}; once the cause is fixed, rename them to {targets[0].name} and "
            f"{targets[1].name}",
            kept,
        )
    raise NotSavedError(
        f"could not write {targets[0]} and {targets[1].name} ({reason}), nor a copy beside it or in "
        f"{tempfile.gettempdir()}: free some space or choose another --out path",
        None,
    )


def _format(value: Any) -> str:
    return ("nan" if math.isnan(value) else f"{value:.3f}") if isinstance(value, float) else str(value)


def load_results(path: str | os.PathLike[str]) -> BenchResult:
    """Read ``PATH.csv`` and ``PATH.json`` back (``PATH`` with or without either suffix)."""
    rows, sidecar = read_pair(path, CSV_COLUMNS, ("cglab-bench/1", FORMAT), "python -m cglab bench")
    return BenchResult(rows, sidecar["environment"], sidecar["config"])


def read_pair(
    path: str | os.PathLike[str], columns: tuple[str, ...], formats: tuple[str, ...], command: str
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The rows (numbers parsed) and the sidecar of the pair at ``path``. A missing file or column or
    another format is one ConfigError that says how to record it again with ``command``."""
    csv_path, json_path = result_paths(path)
    base = csv_path.with_suffix("")
    for p in (csv_path, json_path):
        if not p.is_file():
            raise ConfigError(f"no results at {p}; check the path, or record them with `{command} --out {base}`")
    try:
        with open(csv_path, encoding="utf-8", newline="") as f:
            reader = csv.DictReader(f)
            missing = [c for c in columns if c not in (reader.fieldnames or [])]
            if missing:
                raise ValueError(f"missing column(s) {', '.join(missing)}")
            rows = [_parse_row(line, row) for line, row in enumerate(reader, start=2)]
        sidecar = json.loads(json_path.read_text(encoding="utf-8"))
        if not isinstance(sidecar, dict) or sidecar.get("format") not in formats:
            raise ValueError(f"{json_path.name} is not a {formats[-1]} sidecar")
        missing = [key for key in ("environment", "config") if not isinstance(sidecar.get(key), dict)]
        if missing:
            raise ValueError(f"{json_path.name} has no {' or '.join(missing)} object")
        if not rows:
            raise ValueError("the CSV has no rows, only a header")
        return rows, sidecar
    except (ValueError, KeyError, TypeError, csv.Error) as exc:
        raise ConfigError(f"{base} is not a usable result: {exc}; re-record it with `{command} --out {base}`") from None


def _parse_row(line: int, row: dict[str | None, str | None]) -> dict[str, Any]:
    if None in row or None in row.values():
        raise ValueError(f"line {line}: a row has a different number of fields than the header")
    return {column: text if column in _TEXT else _number(column, float(text)) for column, text in row.items()}


def _number(column: str, value: float) -> float | int:
    """A count as an int; nan stays (a count nobody could take, as the peer's structure)."""
    return int(value) if column in _WHOLE and math.isfinite(value) else value
