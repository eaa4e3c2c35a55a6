"""tools/build_html.py without a network or a browser: links, the output folder, pinned downloads.

The pages themselves are read offline in Chromium by tests/test_e2e_html.py (``make test-e2e``).
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import io
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]


def load_build_html() -> Any:
    """``tools/build_html.py`` as a module (it is a script, not part of the package); the tests that use
    it skip where nbconvert is missing (a machine with torch but without Jupyter)."""
    pytest.importorskip("nbconvert", reason="make html needs nbconvert (make installs it)")
    spec = importlib.util.spec_from_file_location("build_html", ROOT / "tools" / "build_html.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def build_html() -> Any:
    return load_build_html()


def _integrity(data: bytes) -> str:
    return "sha512-" + base64.b64encode(hashlib.sha512(data).digest()).decode()


def test_links_to_notebooks_open_their_pages(build_html: Any) -> None:
    page = ('<a href="02_toy_engine.ipynb">02</a> <a href="solutions/x.ipynb#exercise-2">x</a> '
            '<a href="https://example.org/y.ipynb">y</a> <a href="notes.md">n</a>')
    assert build_html.NOTEBOOK_LINK.sub(r'href="\1.html\2"', page) == (
        '<a href="02_toy_engine.html">02</a> <a href="solutions/x.html#exercise-2">x</a> '
        '<a href="https://example.org/y.ipynb">y</a> <a href="notes.md">n</a>')


def test_an_output_folder_it_did_not_write_is_refused(build_html: Any, tmp_path: Path) -> None:
    build_html.check_out(tmp_path / "new")  # absent: fine
    (tmp_path / "empty").mkdir()
    build_html.check_out(tmp_path / "empty")
    ours = tmp_path / "ours"
    ours.mkdir()
    (ours / build_html.MARKER).write_text("")
    (ours / "old.html").write_text("")
    build_html.check_out(ours)
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "notes.txt").write_text("mine")
    with pytest.raises(build_html.BuildError, match="was not written by this tool"):
        build_html.check_out(theirs)
    assert build_html.main(["--out", str(theirs), str(ROOT / "notebooks" / "00_welcome.ipynb")]) == 2
    assert (theirs / "notes.txt").read_text() == "mine"


def test_a_download_that_does_not_match_its_pin_is_not_used(build_html: Any, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(build_html, "CACHE", tmp_path / "cache")
    package = build_html.NpmPackage("example", "1.0.0", _integrity(b"the real tarball"), ("index.js",))
    monkeypatch.setattr(build_html.urllib.request, "urlopen", lambda url, timeout: io.BytesIO(b"something else"))
    with pytest.raises(build_html.BuildError, match="does not match its pinned SHA-512"):
        build_html.fetch(package)
    assert not (tmp_path / "cache").exists()
    monkeypatch.setattr(build_html.urllib.request, "urlopen", lambda url, timeout: io.BytesIO(b"the real tarball"))
    assert build_html.fetch(package).read_bytes() == b"the real tarball"

