"""Links between the Chinese edition and the English files: the anchors headings get, and the check that
every anchor a translation links to names a heading of its file."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Protocol

ROOT = Path(__file__).resolve().parents[1]


class Translated(Protocol):
    target: str
    po: str


INLINE = re.compile(r"\[([^\]]*)\]\([^)]*\)|[*`]")  # a link (kept: its text) or an emphasis or code mark (dropped)


def anchor(heading: str) -> str:
    """The anchor JupyterLab and nbconvert give a heading: its text as shown, spaces as dashes."""
    return INLINE.sub(r"\1", heading.lstrip("#").strip()).replace(" ", "-")


def markdown_anchor(heading: str) -> str:
    """The anchor a Markdown file's heading gets on a code host: lower case, punctuation dropped, dashes."""
    return re.sub(r"[^\w\- ]", "", INLINE.sub(r"\1", heading.lstrip("#").strip()).lower()).replace(" ", "-")


ANCHORED = re.compile(r"\]\(([^)\s#:]+)#([^)\s]+)\)")  # a relative link with an anchor: (path, anchor)


def heading_anchors(path: Path) -> set[str]:
    """The anchors of ``path``'s headings: a notebook's as JupyterLab makes them, a Markdown file's as a code
    host does."""
    if path.suffix == ".ipynb":
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        lines = [line for c in cells if c["cell_type"] == "markdown" for line in "".join(c["source"]).splitlines()]
        return {anchor(line) for line in lines if line.startswith("#")}
    lines = path.read_text(encoding="utf-8").splitlines()
    return {markdown_anchor(line) for line in lines if line.startswith("#")}


def anchor_problems(text: str, doc: Translated, root: Path = ROOT) -> list[str]:
    """The relative links of ``doc``'s translation whose anchor names no heading of the file they lead to."""
    problems, folder = [], (root / doc.target).parent
    for link, section in dict.fromkeys(ANCHORED.findall(text)):
        path = Path(os.path.normpath(folder / link))
        if path.suffix in (".ipynb", ".md") and path.is_file() and section not in heading_anchors(path):
            problems.append(
                f"{doc.target}: the link {link}#{section} names no heading of {path.relative_to(root).as_posix()}; "
                f"correct it in {doc.po} (or, for the generated note, the heading in DOCUMENTS)"
            )
    return problems
