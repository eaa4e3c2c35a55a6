"""The browser test's excuse for jupyter_server's kernel-list race: given only where the log proves it."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

pytest.importorskip("psutil", reason="the browser test's helpers need psutil (make installs it)")
from lab_server import KERNEL_LIST_RACE, SERVER_ERROR_IN_PAGE, LabServer, excuse_kernel_list_races

RACE = f"""[E 2026-12-01 14:50:16.321 ServerApp] Uncaught exception GET /api/kernels?1796136616178 (127.0.0.1)
    traitlets.traitlets.TraitError: The {KERNEL_LIST_RACE} None.
[E 2026-12-01 14:50:16.400 ServerApp] 500 GET /api/kernels?1796136616178 (abc@127.0.0.1) 123.63ms
"""
OTHER_500 = "[E 2026-12-01 14:51:00.000 ServerApp] 500 GET /api/contents/notebooks (abc@127.0.0.1) 2.00ms\n"


@dataclass
class Run:
    problems: list[str] = field(default_factory=list)


def _server(tmp_path: Path, log: str) -> LabServer:
    (tmp_path / "jupyterlab.log").write_text(log)
    return LabServer(tmp_path, tmp_path, log=tmp_path / "jupyterlab.log")


@pytest.mark.parametrize(("log", "races"), [("", 0), (RACE, 1), (RACE + RACE, 2), (RACE + OTHER_500, 0)])
def test_only_a_log_of_nothing_but_the_race_excuses(tmp_path: Path, log: str, races: int) -> None:
    assert _server(tmp_path, log).kernel_list_races() == races


def test_each_race_excuses_one_report_and_no_other_problem(tmp_path: Path) -> None:
    runs = [Run([SERVER_ERROR_IN_PAGE, "cell 3 (1 / 0) raised ZeroDivisionError"]), Run([SERVER_ERROR_IN_PAGE])]
    assert excuse_kernel_list_races(runs, _server(tmp_path, RACE)) == 1
    assert [run.problems for run in runs] == [["cell 3 (1 / 0) raised ZeroDivisionError"], [SERVER_ERROR_IN_PAGE]]
