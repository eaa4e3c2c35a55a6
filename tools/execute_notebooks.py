"""Execute notebooks in place, each in a fresh kernel on the CPU, and save their outputs.

    python tools/execute_notebooks.py notebooks/*.ipynb notebooks/solutions/*.ipynb

Each notebook runs with its own folder as the working directory. A cell that raises fails the run
(and nothing is saved for that notebook) unless the cell is tagged ``raises-exception``, so a
deliberate error is always marked as one. ``--use-gpu --no-save --slowest 5`` checks the suite on a
GPU and names the cells that took longest.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from datetime import datetime
from pathlib import Path
from queue import Empty
from typing import Any

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

# A cell that shows an ipywidget can leave its execute reply unseen on the shell channel until the
# wait times out (nbclient issue #312): seen on a GPU box as ~120 s stalls, the cell timeout, after the
# last (widget) cell of notebooks 04 and 05. Waiting in one-second slices looks at the socket again
# each second, so a message that has arrived is taken within a second.
_SLICE_S = 1.0


def _wait_in_slices(channel: Any) -> None:
    """Make ``channel.get_msg(timeout)`` wait as before, but in slices of at most ``_SLICE_S``."""
    get_msg = channel.get_msg

    async def sliced(timeout: float | None = None) -> dict[str, Any]:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = _SLICE_S if deadline is None else max(0.0, min(_SLICE_S, deadline - time.monotonic()))
            try:
                return await get_msg(timeout=left)
            except Empty:
                if deadline is not None and time.monotonic() >= deadline:
                    raise

    channel.get_msg = sliced


def execute(path: Path, timeout: int, save: bool = True, slowest: int = 0) -> dict[str, float]:
    """Run ``path`` top to bottom in a new kernel and write it back; return where the seconds went:
    ``start`` (kernel start until it answers), ``cells`` (first cell sent until last reply),
    ``shutdown`` (last reply until the kernel is gone) and ``total``.
    ``slowest``: print that many of the slowest cells, with their seconds and first line."""
    notebook = nbformat.read(path, as_version=4)
    stamps: dict[str, float] = {}

    def mark(name: str, first: bool = False):
        def hook(**_: object) -> None:
            if not (first and name in stamps):
                stamps[name] = time.perf_counter()

        return hook

    def on_ready(**_: object) -> None:
        mark("ready")()
        for channel in (client.kc.shell_channel, client.kc.iopub_channel):
            _wait_in_slices(channel)

    client = NotebookClient(
        notebook,
        timeout=timeout,
        kernel_name="python3",
        allow_errors=False,
        record_timing=slowest > 0,
        resources={"metadata": {"path": str(path.parent)}},
        on_notebook_start=on_ready,
        on_cell_start=mark("first_cell", first=True),
        on_cell_executed=mark("last_reply"),
        on_notebook_complete=mark("gone"),
    )
    start = time.perf_counter()
    client.execute()
    end = time.perf_counter()
    if slowest:
        _print_slowest(path, notebook, slowest)
    if save:
        nbformat.write(notebook, path)
    ready, first, last = (stamps.get(k, end) for k in ("ready", "first_cell", "last_reply"))
    return {
        "start": ready - start,
        "cells": last - first,
        "shutdown": stamps.get("gone", end) - last,
        "total": end - start,
    }


def _print_slowest(path: Path, notebook: nbformat.NotebookNode, count: int) -> None:
    """The ``count`` slowest cells, timed from the kernel's busy to its idle (outputs included), and the
    time between cells (the client's own), so that every second of ``cells`` is accounted for."""
    timed, previous_idle, between = [], None, 0.0
    for index, cell in enumerate(notebook.cells):
        stamps = cell.metadata.pop("execution", None)  # the saved notebook keeps no timing
        if cell.cell_type != "code" or not stamps or "iopub.status.idle" not in stamps:
            continue
        busy, idle = (
            datetime.fromisoformat(stamps[k].replace("Z", "+00:00")) for k in ("iopub.status.busy", "iopub.status.idle")
        )
        if previous_idle is not None:
            between += (busy - previous_idle).total_seconds()
        previous_idle = idle
        first = next((line for line in cell.source.splitlines() if line.strip()), "")
        timed.append(((idle - busy).total_seconds(), index, first))
    for seconds, index, first in sorted(timed, reverse=True)[:count]:
        print(f"  {path.name} cell {index}: {seconds:.1f} s  {first[:70]}")
    print(f"  {path.name} cell total {sum(t for t, _, _ in timed):.1f} s, between cells {between:.1f} s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="+", type=Path)
    parser.add_argument("--timeout", type=int, default=120, help="seconds allowed per cell (default 120)")
    parser.add_argument(
        "--use-gpu",
        action="store_true",
        help="run on a visible GPU (real CUDA graphs); to check the suite there, not to commit",
    )
    parser.add_argument("--no-save", action="store_true", help="run only: leave the files as they are")
    parser.add_argument("--slowest", type=int, default=0, metavar="N", help="print the N slowest cells of each")
    args = parser.parse_args(argv)
    if not args.use_gpu:
        # The saved outputs are the CPU ones, even on a machine with a GPU: they are what nbval checks.
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    failed = []
    for path in args.notebooks:
        try:
            seconds = execute(path, args.timeout, save=not args.no_save, slowest=args.slowest)
        except CellExecutionError as exc:
            print(
                f"FAILED {path}: an untagged cell raised (tag it raises-exception if that is the lesson)\n{exc}",
                file=sys.stderr,
            )
            failed.append(path)
            continue
        print(
            f"executed {path} in {seconds['total']:.1f} s (kernel start {seconds['start']:.1f} s, "
            f"cells {seconds['cells']:.1f} s, shutdown {seconds['shutdown']:.1f} s)"
        )
    if failed:
        print(f"{len(failed)} notebook(s) failed: {', '.join(map(str, failed))}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
