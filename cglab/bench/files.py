"""Benchmark results on disk: ``PATH.csv`` (one row per mode and batch size) and ``PATH.json``
(the environment and the config that produced them).

A pair is written whole or not at all, and a pair is read back only if it is complete and sane:
a plot of a cut-short or edited CSV would silently tell the wrong story.
"""

from __future__ import annotations

import contextlib
import csv
import errno
import io
import json
import math
import os
import secrets
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from cglab._interrupt import termination_deferred
from cglab.bench.modes import MODE_NAMES
from cglab.compare import dumps
from cglab.errors import ConfigError, NotSavedError

__all__ = [
    "CSV_COLUMNS",
    "EXTRA_COLUMNS",
    "FORMAT",
    "BenchResult",
    "check_output",
    "load_results",
    "read_pair",
    "result_paths",
    "save_or_keep",
    "save_pair",
    "save_results",
]

CSV_COLUMNS = ("mode", "batch_size", "median_us", "p10_us", "p90_us", "kernel_floor_us", "launches", "backend")
EXTRA_COLUMNS = (
    "host_median_us",
    "host_p10_us",
    "host_p90_us",
    "enqueue_median_us",
    "kernel_span_us",
    "kernels",
    "counted_launches",
    "graph_segments",
    "eager_breaks",
    "attn_key_range",
    "repeats",
)
_INT_COLUMNS = frozenset(
    {
        "batch_size",
        "launches",
        "kernels",
        "counted_launches",
        "graph_segments",
        "eager_breaks",
        "attn_key_range",
        "repeats",
    }
)
_STR_COLUMNS = frozenset({"mode", "backend"})
# Timed in every row; kernel_floor_us and kernel_span_us may be nan (the profiler saw no GPU work).
_MEASURED = frozenset(
    {"median_us", "p10_us", "p90_us", "host_median_us", "host_p10_us", "host_p90_us", "enqueue_median_us"}
)
# Counts that may be unknown: the peer's structure is torch's, and only a GPU profiler sees its launches.
_MAYBE_UNCOUNTED = frozenset({"launches", *EXTRA_COLUMNS})
# /2 added the compiled rows, the peer and the roofline; /1 files (three modes) still read.
FORMAT = "cglab-bench/2"
T = TypeVar("T")
_READABLE_FORMATS = ("cglab-bench/1", FORMAT)


@dataclass
class BenchResult:
    """Rows (dicts keyed by ``CSV_COLUMNS`` then ``EXTRA_COLUMNS``), the environment and the config."""

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
        """Batch sizes and one column's values for ``mode``, in batch-size order."""
        rows = sorted((r for r in self.rows if r["mode"] == mode), key=lambda r: r["batch_size"])
        return [r["batch_size"] for r in rows], [float(r[column]) for r in rows]

    def summary(self) -> dict[str, Any]:
        return {"backend": self.backend, "device_name": self.device_name, "rows": self.rows}


# ----------------------------------------------------------------------------------- writing
def result_paths(path: str | os.PathLike[str]) -> tuple[Path, Path]:
    """``PATH`` (with or without ``.csv`` / ``.json``) -> (``PATH.csv``, ``PATH.json``)."""
    text = os.fspath(path)
    base = Path(text)
    # "", ".", ".." and "dir/" name a directory, not a file to put beside it.
    if not text.strip() or text.endswith(("/", os.sep)) or base.name in ("", ".", ".."):
        raise ConfigError(f"--out must name a file such as results/run (it writes run.csv and run.json), got {text!r}")
    if base.suffix in (".csv", ".json"):
        base = base.with_suffix("")
    return base.with_name(base.name + ".csv"), base.with_name(base.name + ".json")


def check_output(path: str | os.PathLike[str], force: bool = False) -> None:
    """Refuse, before any work, a destination that ``save_results`` could not write, or would
    overwrite without ``force``: better now than after minutes of measuring."""
    targets = result_paths(path)
    try:
        _check_targets(targets, force)
        _probe(targets)
    except OSError as exc:
        raise ConfigError(_refusal(exc, targets)) from None


def _check_targets(targets: tuple[Path, Path], force: bool) -> None:
    for target in targets:
        if target.is_dir():  # os.replace cannot put a file over a directory, forced or not
            raise ConfigError(f"{target} is a directory; choose another --out path")
    existing = [p for p in targets if p.exists()]
    if existing and not force:
        raise ConfigError(
            f"{existing[0]} already exists; pass --force (force=True in Python) to overwrite it, "
            "or choose another --out path"
        )
    ancestor = _nearest_existing(targets[0].parent)  # save_pair creates the missing directories below it
    if not ancestor.is_dir():
        raise ConfigError(f"{ancestor} is a file, not a directory; choose an --out path under a directory")


def _probe(targets: tuple[Path, Path]) -> None:
    """Write and remove, in each target's own directory, a scratch file named as ``save_pair`` names
    its own: a real write, since permission bits alone miss read-only mounts, ACLs and root, and
    the real name, since a short probe name passes where the save's longer one is refused."""
    folder = targets[0].parent
    missing = [p for p in (folder, *folder.parents) if not p.exists()]
    made: list[Path] = []
    try:
        for directory in reversed(missing):
            try:
                directory.mkdir()
            except FileExistsError:  # made meanwhile by someone else: not ours to remove
                continue
            made.append(directory)
        for target in targets:
            _write_temp(target, "").unlink()
    finally:
        for directory in reversed(made):  # leave the tree as it was; the save makes them again
            with contextlib.suppress(OSError):
                directory.rmdir()


def _refusal(exc: OSError, targets: tuple[Path, Path]) -> str:
    """One line for a destination the file system refuses, naming what to shorten or change."""
    ancestor = _nearest_existing(targets[0].parent)
    if exc.errno != errno.ENAMETOOLONG:
        return f"cannot write in {ancestor} ({exc.strerror or exc}); choose another --out path"
    limit = _name_max(ancestor)
    folder_name = max(targets[0].parent.parts, key=len, default="")
    if len(folder_name) > limit:
        return (
            f"--out has a directory name of {len(folder_name)} characters ({folder_name[:16]}...), over the "
            f"{limit} this file system allows; choose a shorter --out path"
        )
    scratch = len(_scratch_path(targets[1], "tmp").name)  # the longest name the save writes
    base = len(targets[0].name) - len(".csv")
    if scratch > limit:
        return (
            f"--out's file name has {base} characters, and the temporary files saving writes beside it would "
            f"have {scratch}, over the {limit} this file system allows; choose an --out name of at most "
            f"{limit - (scratch - base)} characters"
        )
    return "--out is too long a path for this file system; choose a shorter --out path"


def _nearest_existing(folder: Path) -> Path:
    """``folder`` or its closest ancestor that exists (a name too long to look up counts as missing)."""
    for candidate in (folder, *folder.parents):
        with contextlib.suppress(OSError):
            if candidate.exists():
                return candidate
    return folder


def _name_max(folder: Path) -> int:
    with contextlib.suppress(OSError, ValueError, AttributeError):  # no pathconf (Windows), or no such name
        return os.pathconf(folder, "PC_NAME_MAX")
    return 255


def save_results(result: BenchResult, path: str | os.PathLike[str], force: bool = False) -> tuple[Path, Path]:
    """Write a benchmark result as ``PATH.csv`` and ``PATH.json`` (see ``save_pair``)."""
    columns = [*CSV_COLUMNS, *(c for c in EXTRA_COLUMNS if any(c in r for r in result.rows))]
    sidecar = {"format": FORMAT, "environment": result.environment, "config": result.config, "columns": columns}
    return save_pair(path, result.rows, columns, sidecar, force)


@termination_deferred()
def save_pair(
    path: str | os.PathLike[str],
    rows: list[dict[str, Any]],
    columns: list[str],
    sidecar: dict[str, Any],
    force: bool = False,
) -> tuple[Path, Path]:
    """Write ``rows`` as ``PATH.csv`` and ``sidecar`` as ``PATH.json``, as a pair: both go to temporary
    files beside their targets, and are renamed over them (``os.replace``) only once both are written.

    If the second rename fails (or Ctrl-C), the first is undone (the old file comes back from a hard-link
    backup), so the pair on disk is either the old one or the new one, and no temporary file stays.
    SIGTERM and SIGHUP wait for the save to end.
    """
    check_output(path, force)
    targets = result_paths(path)
    targets[0].parent.mkdir(parents=True, exist_ok=True)
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({c: _format(row.get(c, math.nan)) for c in columns})
    temps: list[Path] = []
    backups: dict[Path, Path] = {}
    placed: list[Path] = []
    try:
        for target, text in zip(targets, (buffer.getvalue(), dumps(sidecar, indent=2) + "\n")):
            temps.append(_write_temp(target, text))
        for target in targets:
            if target.exists():
                backups[target] = _backup(target)
        for temp, target in zip(temps, targets):
            os.replace(temp, target)
            placed.append(target)
    except BaseException:
        for target in placed:  # undo: the old file back, or no new file without its partner
            if target in backups:
                os.replace(backups.pop(target), target)
            else:
                target.unlink(missing_ok=True)
        raise
    finally:
        for leftover in (*temps, *backups.values()):
            leftover.unlink(missing_ok=True)
    return targets


def save_or_keep(
    save: Callable[[str | os.PathLike[str], bool], tuple[Path, Path]], path: str | os.PathLike[str], force: bool = False
) -> tuple[Path, Path]:
    """``save(path, force)``, and if that fails (disk full, a folder gone, a file that appeared
    meanwhile), the same result under a new name: first beside ``path``, then in the temporary
    folder, never over an existing file. Then ``NotSavedError`` says where it was kept, so that a
    finished measurement is never lost to its last step."""
    try:
        return save(path, force)  # as given: a Path would drop the "/" of "dir/", which names no file
    except (OSError, ConfigError) as exc:
        reason = _reason(exc)
    targets = result_paths(path)
    name = f"{targets[0].stem[:64]}-unsaved-{time.strftime('%Y%m%d-%H%M%S')}"
    failures = []
    for folder in dict.fromkeys((targets[0].parent, Path(tempfile.gettempdir()))):
        try:
            kept = save(_unused(folder / name), False)
        except (OSError, ConfigError) as exc:
            failures.append(f"{folder}: {_reason(exc)}")
            continue
        raise NotSavedError(
            f"could not write {targets[0]} and {targets[1].name} ({reason}), so the measurements "
            f"were kept in {kept[0]} and {kept[1].name}; once the cause is fixed, rename them to "
            f"{targets[0].name} and {targets[1].name}",
            kept,
        )
    raise NotSavedError(
        f"could not write {targets[0]} and {targets[1].name} ({reason}), nor a copy "
        f"({'; '.join(failures)}): free some space or choose another --out path",
        None,
    )


def _reason(exc: OSError | ConfigError) -> str:
    """The OS's words, or a refusal without its advice for an --out path."""
    return getattr(exc, "strerror", None) or str(exc).split(";")[0]


def _unused(base: Path) -> Path:
    """``base``, or ``base-2``, ``base-3``...: the first whose pair names no existing file."""
    candidate, number = base, 1
    while any(p.exists() for p in result_paths(candidate)):
        number += 1
        candidate = base.with_name(f"{base.name}-{number}")
    return candidate


def _scratch_path(target: Path, kind: str) -> Path:
    """A new hidden name beside ``target`` for a temporary file (``tmp``) or a backup (``bak``): both
    are ``.NAME.<8 hex digits>.KIND``, so ``check_output`` probes the length every scratch name has."""
    return target.with_name(f".{target.name}.{secrets.token_hex(4)}.{kind}")


def _write_temp(target: Path, text: str) -> Path:
    """``text`` in a new file beside ``target``, flushed to disk, with the mode a plain ``open`` gives."""
    temp = _scratch_path(target, "tmp")
    # O_EXCL: never into an existing file. 0o666 less the umask, as open() gives: results are meant
    # to be shared like any file the user writes.
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    return temp


def _backup(target: Path) -> Path:
    """A second name for ``target``'s current contents, to restore it if the pair cannot be placed."""
    backup = _scratch_path(target, "bak")
    try:
        os.link(target, backup)  # instant, and no second copy of the bytes
    except OSError:  # file systems without hard links
        shutil.copy2(target, backup)
    return backup


def _format(value: Any) -> str:
    return ("nan" if math.isnan(value) else f"{value:.3f}") if isinstance(value, float) else str(value)


# ----------------------------------------------------------------------------------- reading
def load_results(path: str | os.PathLike[str]) -> BenchResult:
    """Read ``PATH.csv`` and ``PATH.json`` back (``PATH`` with or without either suffix).

    A damaged pair is refused: no rows, missing or repeated (mode, batch size) rows against the
    JSON's config, unknown modes, fractional counts, non-finite or negative timings.
    """

    def parse(lines: list[dict[str | None, str | None]], sidecar: dict[str, Any]) -> BenchResult:
        rows = [_parse_row(line, row) for line, row in enumerate(lines, start=2)]
        result = BenchResult(rows, dict(sidecar["environment"]), dict(sidecar["config"]))
        _check_rows(result)
        return result

    return read_pair(path, CSV_COLUMNS, _READABLE_FORMATS, "benchmark results", "python -m cglab bench", parse)


def read_pair(
    path: str | os.PathLike[str],
    columns: Sequence[str],
    formats: tuple[str, ...],
    what: str,
    command: str,
    parse: Callable[[list[dict[str | None, str | None]], dict[str, Any]], T],
) -> T:
    """``parse(csv rows as text, sidecar)`` of the pair at ``path``. A CSV without ``columns``, a sidecar
    of another format, or anything ``parse`` rejects (ValueError, KeyError, TypeError) becomes one
    ConfigError saying how to make the pair again with ``command``."""
    csv_path, json_path = result_paths(path)
    base = csv_path.with_suffix("")
    for p in (csv_path, json_path):
        if not p.is_file():
            raise ConfigError(f"no {what} at {p}; check the path, or make them with `{command} --out {base}`")
    try:
        with open(csv_path, encoding="utf-8", newline="") as f:
            reader = csv.DictReader(f)
            missing = [c for c in columns if c not in (reader.fieldnames or [])]
            if missing:
                raise ValueError(f"missing column(s) {', '.join(missing)}")
            lines = list(reader)
        sidecar = json.loads(json_path.read_text(encoding="utf-8"))
        if not isinstance(sidecar, dict) or sidecar.get("format") not in formats:
            raise ValueError(f"{json_path.name} is not a {formats[-1]} sidecar")
        return parse(lines, sidecar)
    except (ValueError, KeyError, TypeError, csv.Error) as exc:
        raise ConfigError(
            f"{base} is not a usable cglab result: {exc}; re-record it with `{command} --out {base}`"
        ) from None


def _parse_row(line: int, row: dict[str | None, str | None]) -> dict[str, Any]:
    try:
        return {k: _parse(k, v) for k, v in row.items()}
    except ValueError as exc:
        raise ValueError(f"line {line}: {exc}") from None


def _parse(column: str | None, text: str | None) -> Any:
    if column is None or text is None:
        raise ValueError("a row has a different number of fields than the header")
    if column in _STR_COLUMNS:
        return text
    if column not in _INT_COLUMNS and column not in CSV_COLUMNS and column not in EXTRA_COLUMNS:
        try:  # a column added by a later version: keep it, typed if it is a number
            return float(text)
        except ValueError:
            return text
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{column} {text!r} is not a number") from None
    if column in _INT_COLUMNS:
        if math.isnan(value) and column in _MAYBE_UNCOUNTED:
            return value  # not counted for this row (or a column other rows have)
        if not value.is_integer() or value < 0:  # int(1.5) would silently read 1
            raise ValueError(f"{column} must be a whole number >= 0, got {text!r}")
        return int(value)
    if math.isnan(value) and column not in _MEASURED:
        return value  # not measured (the profiler saw no GPU work)
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{column} must be a finite time >= 0, got {text!r}")
    return value


def _check_rows(result: BenchResult) -> None:
    """Every row a known mode and batch size, once; exactly the rows the JSON's config measured."""
    if not result.rows:
        raise ValueError("the CSV has no rows, only a header")
    seen: set[tuple[str, int]] = set()
    for line, row in enumerate(result.rows, start=2):
        key = (row["mode"], row["batch_size"])
        if key[0] not in MODE_NAMES:
            raise ValueError(f"line {line}: unknown mode {key[0]!r} (expected one of {', '.join(MODE_NAMES)})")
        if key[1] < 1:
            raise ValueError(f"line {line}: batch_size must be >= 1, got {key[1]}")
        if key in seen:
            raise ValueError(f"line {line}: {key[0]} batch {key[1]} appears twice")
        seen.add(key)
    modes, sizes = result.config.get("modes"), result.config.get("batch_sizes")
    if isinstance(modes, list) and isinstance(sizes, list):  # the sidecar knows what was measured
        expected = {(m, b) for m in modes for b in sizes}
        if seen != expected:
            absent = sorted(expected - seen)
            detail = f"; missing {absent[0][0]} batch {absent[0][1]}" if absent else "; rows outside the config"
            raise ValueError(
                f"the CSV has {len(seen)} rows but the JSON's config measured {len(expected)} "
                f"({len(modes)} modes x {len(sizes)} batch sizes){detail}"
            )
