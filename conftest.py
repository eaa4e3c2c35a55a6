"""Makes a plain ``pytest --nbval notebooks`` check the notebooks as ``make test`` does.

nbval compares every saved output with a fresh run. Two settings belong to the suite, not to the
command line: the sanitize file (addresses, durations and rounding noise are run-to-run noise) and the
kernel (this Python, where cglab is installed, not whatever the notebook's metadata names).
"""

from __future__ import annotations

from pathlib import Path

import pytest


def pytest_configure(config: pytest.Config) -> None:
    option = config.option
    if not (getattr(option, "nbval", False) or getattr(option, "nbval_lax", False)):
        return  # nbval absent (a plain GPU image) or not asked for
    if option.nbval_sanitize_with is None:
        option.nbval_sanitize_with = str(Path(__file__).parent / "tests" / "nbval_sanitize.cfg")
    if not option.nbval_kernel_name:  # a kernel named on the command line wins
        option.nbval_current_env = True


# The Chinese edition's notebooks are generated from the English ones, code cells and outputs copied
# (tools/translations.py): `pytest --nbval notebooks` checks that code once, as `make test` does.
collect_ignore_glob = ["notebooks/zh/*"]
