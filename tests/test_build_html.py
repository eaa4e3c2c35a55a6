"""tools/build_html.py without a network or a browser: links, the output folder, pinned downloads,
which version of a notebook a page is built from, and the banner over every widget.

The pages themselves are read offline in Chromium by tests/test_e2e_html.py (``make test-e2e``).
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import io
import shutil
import subprocess
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
    page = (
        '<a href="02_toy_engine.ipynb">02</a> <a href="solutions/x.ipynb#exercise-2">x</a> '
        '<a href="https://example.org/y.ipynb">y</a> <a href="notes.md">n</a>'
    )
    assert build_html.NOTEBOOK_LINK.sub(r'href="\1.html\2"', page) == (
        '<a href="02_toy_engine.html">02</a> <a href="solutions/x.html#exercise-2">x</a> '
        '<a href="https://example.org/y.ipynb">y</a> <a href="notes.md">n</a>'
    )


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


def test_a_download_that_does_not_match_its_pin_is_not_used(
    build_html: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(build_html, "CACHE", tmp_path / "cache")
    package = build_html.NpmPackage("example", "1.0.0", _integrity(b"the real tarball"), ("index.js",))
    monkeypatch.setattr(build_html.urllib.request, "urlopen", lambda url, timeout: io.BytesIO(b"something else"))
    with pytest.raises(build_html.BuildError, match="does not match its pinned SHA-512"):
        build_html.fetch(package)
    assert not (tmp_path / "cache").exists()
    monkeypatch.setattr(build_html.urllib.request, "urlopen", lambda url, timeout: io.BytesIO(b"the real tarball"))
    assert build_html.fetch(package).read_bytes() == b"the real tarball"


WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def _git(repo: Path, *args: str) -> None:
    subprocess.run(
        [
            "git",
            "-C",
            str(repo),
            "-c",
            "user.name=cglab tests",
            "-c",
            "user.email=tests@cglab.invalid",
            "-c",
            "commit.gpgsign=false",
            *args,
        ],
        check=True,
        capture_output=True,
    )


def _notebook(path: Path, heading: str) -> None:
    nbformat = pytest.importorskip("nbformat")
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell(f"# {heading}\n\nSome prose.")])
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(notebook, path)


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """A git checkout whose one committed notebook was then changed on disk, beside one never committed."""
    if shutil.which("git") is None:
        pytest.skip("needs git")
    repo = tmp_path / "repo"
    _notebook(repo / "notebooks" / "01_first.ipynb", "As committed")
    _git(repo, "init", "-q")
    _git(repo, "add", "notebooks/01_first.ipynb")
    _git(repo, "commit", "-q", "-m", "the first notebook")
    _notebook(repo / "notebooks" / "01_first.ipynb", "Changed by Run All")
    _notebook(repo / "notebooks" / "02_new.ipynb", "Not committed yet")
    return repo


def test_make_html_builds_the_committed_notebooks_unless_asked(
    build_html: Any, checkout: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    first, new = checkout / "notebooks" / "01_first.ipynb", checkout / "notebooks" / "02_new.ipynb"
    sources, notes = build_html.select_sources([first, new])  # the default: HEAD
    assert [s.path for s in sources] == [first]
    assert sources[0].notebook.cells[0].source.startswith("# As committed")
    assert len(notes) == 1 and "02_new.ipynb is not committed" in notes[0]
    on_disk, notes = build_html.select_sources([first, new], "worktree")
    assert [s.notebook.cells[0].source.splitlines()[0] for s in on_disk] == [
        "# Changed by Run All",
        "# Not committed yet",
    ]
    assert notes == []

    monkeypatch.setattr(build_html, "copy_assets", lambda static: static.mkdir(parents=True))  # no download
    out = tmp_path / "html"
    assert build_html.main(["--out", str(out), str(first), str(new)]) == 0  # as make html runs it
    page = (out / "01_first.html").read_text()
    assert "As committed" in page and "Changed by Run All" not in page
    assert not (out / "02_new.html").exists()
    assert "as committed (commit " in (out / "index.html").read_text()
    assert "02_new.ipynb is not committed" in capsys.readouterr().err

    assert build_html.main(["--from", "worktree", "--out", str(out), str(first), str(new)]) == 0
    assert "Changed by Run All" in (out / "01_first.html").read_text()
    assert (out / "02_new.html").exists()


def test_outside_a_git_checkout_the_files_on_disk_are_built(build_html: Any, tmp_path: Path) -> None:
    if (
        shutil.which("git") is not None
        and subprocess.run(["git", "-C", str(tmp_path), "rev-parse"], check=False, capture_output=True).returncode == 0
    ):
        pytest.skip("the temporary folder is inside a git checkout here")
    loose = tmp_path / "loose" / "notes.ipynb"
    _notebook(loose, "A notebook from an archive")
    sources, notes = build_html.select_sources([loose])
    assert sources[0].notebook.cells[0].source.startswith("# A notebook from an archive")
    assert len(notes) == 1 and "not in a git checkout" in notes[0]


def test_every_saved_widget_shows_the_saved_state_banner_once(build_html: Any, tmp_path: Path) -> None:
    notebooks = sorted((ROOT / "notebooks").rglob("*.ipynb"))
    counts = {}
    for path in notebooks:
        notebook = build_html.nbformat.read(path, as_version=4)
        saved = sum(
            WIDGET_VIEW in output.get("data", {})
            for cell in notebook.cells
            if cell.cell_type == "code"
            for output in cell.outputs
        )
        if saved or path.name.startswith("00_"):  # the pages with widgets, and one without
            page = tmp_path / path.relative_to(ROOT).with_suffix(".html")
            build_html.convert(notebook, path.stem, page, tmp_path)
            html = page.read_text()
            views = html.count(f'<script type="{WIDGET_VIEW}">')
            counts[path.name] = (saved, views, html.count(build_html.WIDGET_BANNER))
            # the banner sits above its widget: first in the box whose script the widget manager renders
            for box in build_html.WIDGET_BOX.finditer(html):
                assert html.startswith(build_html.WIDGET_BANNER, box.end()), path.name
    assert sum(saved for saved, _, _ in counts.values()) > 0, "no notebook saved a widget: nothing was checked"
    assert all(saved == views == banners for saved, views, banners in counts.values()), counts
    assert "run <code>make lab</code> to explore" in build_html.WIDGET_BANNER


def test_the_chinese_pages_are_marked_chinese_and_listed_apart(build_html: Any, tmp_path: Path) -> None:
    nbformat = pytest.importorskip("nbformat")
    pages = []
    for relative in ("notebooks/00b_express.ipynb", "notebooks/zh/00b_express.ipynb"):
        page = tmp_path / Path(relative).relative_to("notebooks").with_suffix(".html")
        title = build_html.convert(nbformat.read(ROOT / relative, as_version=4), page.stem, page, tmp_path)
        pages.append((page, title))
    english, chinese = (page.read_text(encoding="utf-8") for page, _ in pages)
    assert '<html lang="en">' in english and '<html lang="zh">' in chinese
    assert 'href="../00_welcome.html"' in chinese and 'href="00_glossary.html"' in chinese  # links open pages
    build_html.write_index(tmp_path, pages)
    index = (tmp_path / "index.html").read_text(encoding="utf-8")
    assert (
        index.index("<h2>Notebooks</h2>") < index.index("00b_express.html") < index.index("<h2>简体中文 (Chinese)</h2>")
    )
    assert index.index("<h2>简体中文 (Chinese)</h2>") < index.index('href="zh/00b_express.html">00b · 快速路径')
