"""Static HTML of the executed suite, readable without a kernel or a network (``make html``).

    python tools/build_html.py --out build/html notebooks/*.ipynb notebooks/solutions/*.ipynb

Each notebook (they are committed executed) becomes one page with its outputs and plots; its widgets
render from the state saved in the notebook, through the Jupyter widgets HTML manager. nbconvert's
pages would load that manager, RequireJS and MathJax from CDNs; here the manager and RequireJS come
from the npm registry once, checked against pinned SHA-512 sums, are cached in
``.cache/html-assets/`` and copied into ``OUT/_static/``, and MathJax is left out (no notebook writes
TeX; the build names any that does). Links between notebooks point at their pages; ``index.html``
lists them all.
"""

from __future__ import annotations

import argparse
import base64
import fnmatch
import hashlib
import html
import os
import re
import shutil
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
    NpmPackage("@jupyter-widgets/html-manager", "1.0.15",
               "sha512-5thBIV6ymNgmPVOHvzx+gGy8ZSKmSazhtGw4/c4xJDVzRhG9PTeQsRjF3FUTopvFi//SABeNz1yp47bCrJ3CQA==",
               ("dist/embed-amd.js", "dist/*.woff2", "dist/*.woff")),
    NpmPackage("requirejs", "2.3.7",
               "sha512-DouTG8T1WanGok6Qjg2SXuCMzszOo0eHeH9hDZ5Y4x8Je+9JB38HdTLT4/VA8OaUhBa0JPVHJ0pyBkM1z+pDsw==",
               ("require.js",)),
)

# nbconvert's lab page without the two scripts that would come from a CDN: MathJax (no notebook writes
# TeX) and mermaid (no notebook draws a diagram). The widget manager and RequireJS URLs are options.
# The page sets no font around the widgets, so their labels would show in the browser's serif default.
TEMPLATE = """{%- extends 'lab/index.html.j2' -%}
{%- block html_head_js_mathjax -%}{%- endblock html_head_js_mathjax -%}
{%- block html_head_js_mermaidjs -%}{%- endblock html_head_js_mermaidjs -%}
{%- block html_head_css -%}<style>.jupyter-widgets { font-family: var(--jp-ui-font-family); }</style>
{%- endblock html_head_css -%}
"""
TEX = re.compile(r"\$[^$\n]+\$|\\\(|\\\[")
# A relative link to a notebook (no scheme), maybe with an anchor: it should open the notebook's page.
NOTEBOOK_LINK = re.compile(r'href="(?![a-z][a-z0-9+.-]*:)([^"#]+)\.ipynb(#[^"]*)?"')


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
        raise BuildError(f"cannot download {package.url} ({error}); the pages need it once, then it is cached "
                         f"in {CACHE.relative_to(ROOT)}/") from error
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
            members = [m for m in tar.getmembers() if m.isfile() and any(
                fnmatch.fnmatch(m.name, f"package/{pattern}") for pattern in package.files)]
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


def convert(path: Path, page: Path, out: Path) -> str:
    """Write ``path``'s page to ``page``; return the notebook's title."""
    notebook = nbformat.read(path, as_version=4)
    static = os.path.relpath(out / STATIC, page.parent)
    exporter = HTMLExporter(template_name="lab", template_file="offline.html.j2",
                            extra_loaders=[DictLoader({"offline.html.j2": TEMPLATE})],
                            require_js_url=f"{static}/require.js", widget_renderer_url=f"{static}/embed-amd.js")
    body, _ = exporter.from_notebook_node(notebook, resources={"metadata": {"name": title_of(notebook, path.stem)}})
    page.parent.mkdir(parents=True, exist_ok=True)
    page.write_text(NOTEBOOK_LINK.sub(r'href="\1.html\2"', body), encoding="utf-8")
    return title_of(notebook, path.stem)


def write_index(out: Path, pages: list[tuple[Path, str]]) -> None:
    """``index.html``: every page, in the order given, solutions in a list of their own."""
    sections: dict[str, list[str]] = {}
    for page, title in pages:
        link = page.relative_to(out).as_posix()
        section = "Solutions" if "solutions" in Path(link).parts else "Notebooks"
        sections.setdefault(section, []).append(f'<li><a href="{html.escape(link)}">{html.escape(title)}</a></li>')
    body = "".join(f"<h2>{name}</h2><ul>{''.join(items)}</ul>" for name, items in sections.items())
    (out / "index.html").write_text(
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>cglab: the notebook suite</title>'
        "<style>body{font-family:sans-serif;max-width:50em;margin:2em auto;line-height:1.5}</style></head>"
        f"<body><h1>cglab: CUDA graphs in LLM inference</h1><p>The executed notebooks, readable without a kernel."
        f"</p>{body}</body></html>\n", encoding="utf-8")


def check_out(out: Path) -> None:
    """Refuse an output folder with files this tool did not write: the build replaces the folder."""
    if out.exists() and (not out.is_dir() or any(out.iterdir()) and not (out / MARKER).exists()):
        raise BuildError(f"{out} exists and was not written by this tool: choose another --out, or remove it")


def build(notebooks: list[Path], out: Path) -> list[Path]:
    """Write every notebook's page, the index and the assets under ``out``; return the pages."""
    base = Path(os.path.commonpath([p.resolve().parent for p in notebooks]))
    check_out(out)
    if out.exists():
        shutil.rmtree(out)  # a page whose notebook was deleted must not linger
    out.mkdir(parents=True, exist_ok=True)
    (out / MARKER).write_text("written by tools/build_html.py; the next build replaces this folder\n")
    copy_assets(out / STATIC)
    pages = []
    for path in notebooks:
        page = out / path.resolve().relative_to(base).with_suffix(".html")
        pages.append((page, convert(path, page, out)))
    write_index(out, pages)
    return [page for page, _ in pages]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "html", help="output folder (default build/html)")
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
    try:
        pages = build(args.notebooks, args.out)
    except BuildError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    with_tex = [str(p) for p in args.notebooks
                if any(TEX.search(c.source) for c in nbformat.read(p, as_version=4).cells if c.cell_type == "markdown")]
    if with_tex:
        print(f"warning: TeX in {', '.join(with_tex)} shows as source: the pages load no MathJax", file=sys.stderr)
    print(f"wrote {len(pages)} pages and index.html to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
