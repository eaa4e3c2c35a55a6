"""The system Chromium that the browser tests drive through Playwright.

Playwright's own browser download is not used (CI machines may not reach its servers): the tests
take Chromium from the system (Debian: ``apt-get install chromium``) or from ``CHROMIUM``, and skip,
saying why, when there is none or the ``playwright`` package is missing.
"""

from __future__ import annotations

import importlib.util
import os
import shutil

import pytest

CHROMIUM = os.environ.get("CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
# Without the background-networking flags Chromium keeps reaching out (updates, sync, field trials),
# which a closed network answers with refused connections and slow starts.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def skip_without_chromium() -> None:
    """Skip the calling test module when the browser or Playwright is missing; fail it when
    ``CHROMIUM`` names something that is not a program (a typo should not pass as a skip)."""
    if CHROMIUM is not None and not (os.path.isfile(CHROMIUM) and os.access(CHROMIUM, os.X_OK)):
        pytest.fail(f"CHROMIUM={CHROMIUM} is not an executable file", pytrace=False)
    if CHROMIUM is None:
        pytest.skip(
            "no Chromium: install it (Debian: apt-get install chromium) or set CHROMIUM", allow_module_level=True
        )
    if importlib.util.find_spec("playwright") is None:
        pytest.skip("needs the playwright package (pip install -e '.[dev]')", allow_module_level=True)
