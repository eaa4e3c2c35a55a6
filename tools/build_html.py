"""Static HTML of the executed suite, readable without a kernel or a network (``make html``).

    python tools/build_html.py [--from head|worktree] --out build/html notebooks/*.ipynb notebooks/solutions/*.ipynb

Each notebook (they are committed executed) becomes one page with its outputs and plots; its widgets
render from the state saved in the notebook, through the Jupyter widgets HTML manager, under a one-line
banner saying that they show saved state and need a kernel to redraw. By default a notebook's page is
built from its last committed version (``git show HEAD:...``), not from the file on disk: Run All in
JupyterLab rewrites the notebooks in the working tree, and the pages should show what the suite ships.
``--from worktree`` builds the files as they are on disk (outside a git checkout that is all there is). nbconvert's
pages would load that manager, RequireJS and MathJax from CDNs; here the manager and RequireJS come
from the npm registry once, checked against pinned SHA-512 sums, are cached in
``.cache/html-assets/`` and copied into ``OUT/_static/``, and MathJax is left out (no notebook writes
TeX; the build names any that does). Links between notebooks point at their pages; ``index.html``
lists them all. The Chinese edition's pages (notebooks/zh/) are marked ``lang="zh"``, so browsers pick
Chinese fonts, and get a list of their own in the index.
"""

from __future__ import annotations

import argparse
import base64
import fnmatch
import functools
import hashlib
import html
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import nbformat
from jinja2 import DictLoader
from nbconvert import HTMLExporter

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / ".cache" / "html-assets"
REGISTRY = os.environ.get("NPM_CONFIG_REGISTRY", "https://registry.npmjs.org").rstrip("/")
STATIC = "_static"
MARKER = ".cglab-html"  # in every output folder this tool wrote, so it replaces only its own
HEAD, WORKTREE = "head", "worktree"  # where a notebook's content comes from: the last commit, or the disk


@dataclass(frozen=True)
class NpmPackage:
    """A pinned npm tarball and the files the pages need from it (globs inside ``package/``)."""

    name: str
    version: str
    integrity: str  # the registry's dist.integrity: "sha512-" and the base64 digest of the tarball
    files: tuple[str, ...]

    @property
    def url(self) -> str:
        return f"{REGISTRY}/{self.name}/-/{self.name.split('/')[-1]}-{self.version}.tgz"


# html-manager 1.0.x renders the widget state ipywidgets 8 saves. Its fonts (Font Awesome, for icon
# widgets) sit beside embed-amd.js, which finds them relative to its own URL; browsers take woff2/woff.
PACKAGES = (
    NpmPackage(
        "@jupyter-widgets/html-manager",
        "1.0.15",
        "sha512-5thBIV6ymNgmPVOHvzx+gGy8ZSKmSazhtGw4/c4xJDVzRhG9PTeQsRjF3FUTopvFi//SABeNz1yp47bCrJ3CQA==",
        ("dist/embed-amd.js", "dist/*.woff2", "dist/*.woff"),
    ),
    NpmPackage(
        "requirejs",
        "2.3.7",
        "sha512-DouTG8T1WanGok6Qjg2SXuCMzszOo0eHeH9hDZ5Y4x8Je+9JB38HdTLT4/VA8OaUhBa0JPVHJ0pyBkM1z+pDsw==",
        ("require.js",),
    ),
)

# Over every widget of a page: the page holds the widgets' saved state, and no kernel to redraw them.
WIDGET_BANNER = (
    '<p class="cglab-saved-state">Saved state only: the controls move but the plot will not redraw '
    "without a kernel; run <code>make lab</code> to explore.</p>"
)
BANNER_STYLE = (
    ".cglab-saved-state { margin: 0 0 0.4em; padding: 0.2em 0.6em; border-left: 3px solid #f0ad4e; "
    "background: #fdf6e3; color: #555; font-size: 0.9em; }"
)

# nbconvert's lab page without the two scripts that would come from a CDN: MathJax (no notebook writes
# TeX) and mermaid (no notebook draws a diagram). The widget manager and RequireJS URLs are options.
# The page sets no font around the widgets, so their labels would show in the browser's serif default.
TEMPLATE = """{%- extends 'lab/index.html.j2' -%}
{%- block html_head_js_mathjax -%}{%- endblock html_head_js_mathjax -%}
{%- block html_head_js_mermaidjs -%}{%- endblock html_head_js_mermaidjs -%}
{%- block html_head_css -%}<style>.jupyter-widgets { font-family: var(--jp-ui-font-family); }
BANNER_STYLE</style>
{%- endblock html_head_css -%}
""".replace("BANNER_STYLE", BANNER_STYLE)
TEX = re.compile(r"\$[^$\n]+\$|\\\(|\\\[")
# A relative link to a notebook (no scheme), maybe with an anchor: it should open the notebook's page.
NOTEBOOK_LINK = re.compile(r'href="(?![a-z][a-z0-9+.-]*:)([^"#]+)\.ipynb(#[^"]*)?"')
# The box nbconvert's lab template puts each widget view in; the banner goes first inside it, so the
# rendered widget (inserted beside the view's script) sits under it.
WIDGET_BOX = re.compile(r'<div [^>]*\bclass="jupyter-widgets jp-OutputArea-output[^"]*"[^>]*>')


# A first folder under notebooks/ whose pages are in another language: its ISO 639-1 code and its index heading.
LANGUAGES = {"zh": ("zh", "简体中文 (Chinese)")}


class BuildError(Exception):
    """What went wrong, in one line the user can act on."""


def _digest_ok(data: bytes, integrity: str) -> bool:
    algorithm, _, expected = integrity.partition("-")
    return base64.b64encode(hashlib.new(algorithm, data).digest()).decode() == expected


def fetch(package: NpmPackage) -> Path:
    """The package's tarball in the cache, downloaded and checked the first time."""
    target = CACHE / f"{package.name.replace('/', '+')}-{package.version}.tgz"
    if target.exists() and _digest_ok(target.read_bytes(), package.integrity):
        return target
    try:
        with urllib.request.urlopen(package.url, timeout=60) as response:
            data = response.read()
    except OSError as error:
        raise BuildError(
            f"cannot download {package.url} ({error}); the pages need it once, then it is cached "
            f"in {CACHE.relative_to(ROOT)}/"
        ) from error
    if not _digest_ok(data, package.integrity):
        raise BuildError(f"{package.url} does not match its pinned SHA-512; not using it")
    CACHE.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=CACHE, delete=False) as partial:
        partial.write(data)
    os.replace(partial.name, target)  # whole or not at all: a second build never sees half a file
    return target


def copy_assets(static: Path) -> None:
    """Extract the files the pages load into ``static``."""
    static.mkdir(parents=True, exist_ok=True)
    for package in PACKAGES:
        with tarfile.open(fetch(package)) as tar:
            members = [
                m
                for m in tar.getmembers()
                if m.isfile() and any(fnmatch.fnmatch(m.name, f"package/{pattern}") for pattern in package.files)
            ]
            for pattern in package.files:
                if not any(fnmatch.fnmatch(m.name, f"package/{pattern}") for m in members):
                    raise BuildError(f"{package.name} {package.version} has no {pattern}")
            for member in members:
                source = tar.extractfile(member)
                assert source is not None  # a regular file, checked above
                (static / Path(member.name).name).write_bytes(source.read())


def title_of(notebook: nbformat.NotebookNode, fallback: str) -> str:
    """The first markdown heading, without its hashes."""
    for cell in notebook.cells:
        if cell.cell_type == "markdown":
            for line in cell.source.splitlines():
                if line.startswith("#"):
                    return line.lstrip("#").strip()
    return fallback


@dataclass(frozen=True)
class Source:
    """One notebook to build: its path in the working tree and the content chosen for its page."""

    path: Path
    notebook: nbformat.NotebookNode


def _git(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(["git", "-C", str(folder), *args], check=False, capture_output=True, encoding="utf-8")
    except FileNotFoundError as error:  # no git at all: as outside a checkout
        return subprocess.CompletedProcess(error.filename or "git", 127, "", str(error))


def committed_text(path: Path) -> str | None:
    """``path`` as the last commit (HEAD) of its git checkout holds it; None where HEAD has no such file.
    Raises ``BuildError`` where ``path`` is not in a git checkout (or there is no git)."""
    folder = path.resolve().parent
    if _git(folder, "rev-parse", "--show-toplevel").returncode != 0:
        raise BuildError(f"{path} is not in a git checkout, so there is no committed version to build")
    shown = _git(folder, "show", f"HEAD:./{path.name}")
    return shown.stdout if shown.returncode == 0 else None


def select_sources(paths: list[Path], source: str = HEAD) -> tuple[list[Source], list[str]]:
    """The content each page is built from, and one line per notebook that could not be built as asked.

    ``source="head"``: the last committed version of each notebook, whatever the working tree holds
    (Run All rewrites the files); a notebook HEAD does not have is left out, and named. Outside a git
    checkout every notebook is read from disk, and that is said once. ``source="worktree"``: the files."""
    if source not in (HEAD, WORKTREE):
        raise BuildError(f"source is {HEAD!r} (the last commit) or {WORKTREE!r} (the files on disk), got {source!r}")
    sources, notes = [], []
    for path in paths:
        if source == WORKTREE:
            sources.append(Source(path, nbformat.read(path, as_version=4)))
            continue
        try:
            text = committed_text(path)
        except BuildError as error:
            if not notes or "not in a git checkout" not in notes[0]:
                notes.insert(0, f"{error}: built from the files on disk")
            sources.append(Source(path, nbformat.read(path, as_version=4)))
            continue
        if text is None:
            notes.append(f"{path} is not committed: left out (--from worktree, or make html FROM=worktree, builds it)")
            continue
        sources.append(Source(path, nbformat.reads(text, as_version=4)))
    return sources, notes


def describe_source(paths: list[Path], source: str) -> str:
    """Where the pages' content came from, for the index: the commit, or the working tree."""
    if source == HEAD and paths:
        commit = _git(paths[0].resolve().parent, "rev-parse", "--short", "HEAD")
        if commit.returncode == 0:
            return f"as committed (commit {commit.stdout.strip()})"
    return "as they are in the working tree"


def add_banners(body: str) -> str:
    """``body`` with ``WIDGET_BANNER`` at the top of every widget's box."""
    return WIDGET_BOX.sub(lambda match: match.group(0) + WIDGET_BANNER, body)


@functools.lru_cache
def exporter_for(static: str, language: str) -> HTMLExporter:
    """The exporter for pages that reach the assets at ``static``: one per folder and language, since each
    exporter compiles its templates again (a third of a page's time)."""
    return HTMLExporter(
        template_name="lab",
        template_file="offline.html.j2",
        language_code=language,
        extra_loaders=[DictLoader({"offline.html.j2": TEMPLATE})],
        require_js_url=f"{static}/require.js",
        widget_renderer_url=f"{static}/embed-amd.js",
    )


def convert(notebook: nbformat.NotebookNode, name: str, page: Path, out: Path) -> str:
    """Write ``notebook``'s page to ``page``; return the notebook's title (``name`` where it has none)."""
    static = os.path.relpath(out / STATIC, page.parent)
    exporter = exporter_for(static, LANGUAGES.get(page.relative_to(out).parts[0], ("en",))[0])
    body, _ = exporter.from_notebook_node(notebook, resources={"metadata": {"name": title_of(notebook, name)}})
    page.parent.mkdir(parents=True, exist_ok=True)
    page.write_text(add_banners(NOTEBOOK_LINK.sub(r'href="\1.html\2"', body)), encoding="utf-8")
    return title_of(notebook, name)


def write_index(out: Path, pages: list[tuple[Path, str]], provenance: str = "") -> None:
    """``index.html``: every page, in the order given; solutions and each language in a list of their own."""
    sections: dict[str, list[str]] = {}
    for page, title in pages:
        link = page.relative_to(out).as_posix()
        first = Path(link).parts[0]
        section = "Solutions" if first == "solutions" else LANGUAGES[first][1] if first in LANGUAGES else "Notebooks"
        sections.setdefault(section, []).append(f'<li><a href="{html.escape(link)}">{html.escape(title)}</a></li>')
    body = "".join(f"<h2>{name}</h2><ul>{''.join(items)}</ul>" for name, items in sections.items())
    (out / "index.html").write_text(
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>cglab: the notebook suite</title>'
        "<style>body{font-family:sans-serif;max-width:50em;margin:2em auto;line-height:1.5}</style></head>"
        f"<body><h1>cglab: CUDA graphs in LLM inference</h1><p>The executed notebooks{provenance}, readable "
        f"without a kernel.</p>{body}</body></html>\n",
        encoding="utf-8",
    )


def check_out(out: Path) -> None:
    """Refuse an output folder with files this tool did not write: the build replaces the folder."""
    if out.exists() and (not out.is_dir() or any(out.iterdir()) and not (out / MARKER).exists()):
        raise BuildError(f"{out} exists and was not written by this tool: choose another --out, or remove it")


def build(notebooks: list[Path] | list[Source], out: Path, provenance: str = "") -> list[Path]:
    """Write every notebook's page, the index and the assets under ``out``; return the pages.

    ``notebooks``: paths, built as they are on disk, or the ``Source`` list ``select_sources`` chose."""
    sources = [n if isinstance(n, Source) else Source(n, nbformat.read(n, as_version=4)) for n in notebooks]
    base = Path(os.path.commonpath([s.path.resolve().parent for s in sources]))
    check_out(out)
    if out.exists():
        shutil.rmtree(out)  # a page whose notebook was deleted must not linger
    out.mkdir(parents=True, exist_ok=True)
    (out / MARKER).write_text("written by tools/build_html.py; the next build replaces this folder\n")
    copy_assets(out / STATIC)
    pages = []
    for source in sources:
        page = out / source.path.resolve().relative_to(base).with_suffix(".html")
        pages.append((page, convert(source.notebook, source.path.stem, page, out)))
    write_index(out, pages, f" {provenance}" if provenance else "")
    return [page for page, _ in pages]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "html", help="output folder (default build/html)")
    parser.add_argument(
        "--from",
        dest="source",
        choices=(HEAD, WORKTREE),
        default=HEAD,
        help="build each notebook as last committed (head, the default) or as it is on disk (worktree)",
    )
    args = parser.parse_args(argv)
    missing = [str(p) for p in args.notebooks if not p.is_file()]
    if missing:
        print(f"error: no such notebook: {', '.join(missing)}", file=sys.stderr)
        return 2
    try:
        check_out(args.out)
    except BuildError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    sources, notes = select_sources(args.notebooks, args.source)
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    if not sources:
        print("error: no notebook left to build", file=sys.stderr)
        return 1
    try:
        pages = build(sources, args.out, describe_source(args.notebooks, args.source))
    except BuildError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    with_tex = [
        str(s.path) for s in sources if any(TEX.search(c.source) for c in s.notebook.cells if c.cell_type == "markdown")
    ]
    if with_tex:
        print(f"warning: TeX in {', '.join(with_tex)} shows as source: the pages load no MathJax", file=sys.stderr)
    print(
        f"wrote {len(pages)} pages and index.html to {args.out}, from the notebooks "
        f"{describe_source(args.notebooks, args.source)}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
