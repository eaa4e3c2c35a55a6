"""The Chinese edition (简体中文) of the 60-minute path, generated from the English files and gettext PO files.

    python tools/translations.py           # write notebooks/zh/ from the English files and notebooks/zh/po/ (make zh)
    python tools/translations.py update    # after an English edit: sync the PO files; changed entries turn fuzzy
    python tools/translations.py check     # name every stale, fuzzy or missing translation, stale file or broken
                                           # anchor; exit 1 if there is one, else print one OK line (make zh-check)

``DOCUMENTS`` lists what is translated. A notebook's code cells, their outputs and its metadata are copied
from the English notebook, so nothing is run twice and no output is copied by hand; each markdown cell is
one PO entry. A Markdown file is cut into headings, paragraphs, list items and table rows, one entry each;
code blocks and table rules are copied as they are, and the English reading-time table gives way to one made
for the Chinese text (tools/reading_times.py, ``chinese_block``). An entry's msgctxt
records what it translates: the English cell's id (notebooks only) and the first 12 hex digits of the
SHA-256 of the English text, which is its msgid. After an English edit, ``update`` keeps the old
translation but marks it fuzzy, with the old English as its previous msgid (``#| msgid``), and ``check``
fails until a translator revises it and removes the flag; a cell whose id changed keeps its translation, and
an entry whose English is gone stays as obsolete (tools/translation_sync.py). Relative links are rewritten
for the new folder; a link to a translated file leads to its translation, and a link's anchor must name a
heading of the file it leads to. Only nbformat, polib and the standard library are imported (with the two
sibling modules): ``make zh-check`` runs without torch.
"""

from __future__ import annotations

import argparse
import copy
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import nbformat
import polib

if str(Path(__file__).resolve().parent) not in sys.path:  # its sibling modules, also when loaded by path (tests)
    sys.path.append(str(Path(__file__).resolve().parent))
import reading_times  # noqa: E402
from translation_links import anchor, anchor_problems  # noqa: E402
from translation_sync import HASH_DIGITS, live, load_catalog, sync, text_hash  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
ZH = "notebooks/zh"
FIX = (
    "run `.venv/bin/python tools/translations.py update`, translate the entries it marks fuzzy or leaves "
    "empty in {po}, then `make zh`"
)


@dataclass(frozen=True)
class Document:
    """One English file and its translation. Notebooks can be cut: from the cell that starts with ``first``
    up to, not including, the cell that starts with ``until`` (``None``: to the end; ``""``: one cell)."""

    source: str
    target: str
    first: str = ""
    until: str | None = None

    @property
    def po(self) -> str:
        return f"{ZH}/po/{Path(self.target).stem}.po"

    @property
    def is_notebook(self) -> bool:
        return self.source.endswith(".ipynb")


DOCUMENTS = (
    Document("notebooks/00b_express.ipynb", f"{ZH}/00b_express.ipynb"),
    Document(
        "notebooks/04_missing_metadata_bug.ipynb",
        f"{ZH}/04_missing_metadata_bug.ipynb",
        until="**Optional deep dive.**",  # through The fix: the 60-minute session's part (tools/reading_times.py)
    ),
    Document("notebooks/00_welcome.ipynb", f"{ZH}/00_glossary.ipynb", first="## Glossary", until=""),
    # Checkpoint 1: from the setup cell (Your environment needs its DEVICE) through A first look at the bug.
    Document("notebooks/00_welcome.ipynb", f"{ZH}/00_welcome.ipynb", first="%matplotlib inline"),
    Document("notebooks/FACILITATOR.md", f"{ZH}/FACILITATOR.md"),
    Document("docs/facilitator/answers.md", f"{ZH}/answers.md"),
    Document("docs/facilitator/handout.md", f"{ZH}/handout.md"),
)
# What the generator adds itself: a pointer to the English original under the first cell or heading, and,
# where a notebook is cut, where the rest is.
ORIGINAL = "*英文原版：[{name}]({link})。{extra}*"
NOTEBOOK_EXTRA = "代码和输出与英文版相同。"
REST = "**中文版到此为止。** 从 *{heading}* 起的各节见英文原版：[{name}]({link}#{anchor})。"


@dataclass(frozen=True)
class Unit:
    """A piece of an English file: a markdown cell, or a block of a Markdown file."""

    text: str
    where: str  # for messages: "cell 9763bb44", "line 12"
    key: str = ""  # the cell id; blocks of a Markdown file have none
    translatable: bool = True

    @property
    def context(self) -> str:
        """The msgctxt of its PO entry: the cell id and the hash of the English text."""
        return f"{self.key} {text_hash(self.text)}".strip()

    @property
    def named(self) -> str:
        """How messages name it: a cell by its id and its heading or first words (a block's ``where`` quotes it)."""
        if not self.key:
            return self.where
        first = self.text.strip().split("\n", 1)[0]
        words = self.text.split()
        name = first.lstrip("#").strip() if first.startswith("#") else " ".join(words[:8]) + "…" * (len(words) > 8)
        return f"{self.where} ({name!r})"


# --- cutting the English files into units ----------------------------------------------------------------------

ITEM = re.compile(r"(?:[-*]|\d+\.) ")
RULE = re.compile(r"[\s|:-]+")  # a table's rule row
TABLE_BEGIN, TABLE_END = "<!-- reading-times", "<!-- /reading-times -->"  # tools/reading_times.py's table


def markdown_units(text: str) -> list[Unit]:
    """``text`` as units, which ``"\\n".join`` puts back together exactly."""
    lines, units, i = text.split("\n"), [], 0
    while i < len(lines):
        line, start = lines[i], i
        i += 1
        if line.startswith("```") or line.startswith(TABLE_BEGIN):
            end = "```" if line.startswith("```") else TABLE_END
            while i < len(lines) and not lines[i].startswith(end):
                i += 1
            i += 1
        elif line.strip() and not line.startswith(("#", "|")):  # a paragraph or list item and its continuation
            while (
                i < len(lines)
                and lines[i].strip()
                and not ITEM.match(lines[i])
                and not lines[i].startswith(("#", "|", "```", "<!--"))
            ):
                i += 1
        block = "\n".join(lines[start:i])
        translatable = (
            bool(re.search(r"[A-Za-z]", block)) and not block.startswith(("```", "<!--")) and not RULE.fullmatch(block)
        )
        units.append(Unit(block, f"line {start + 1} ({block.strip()[:40]!r})", translatable=translatable))
    return units


def cells_in_scope(notebook: nbformat.NotebookNode, doc: Document) -> list[nbformat.NotebookNode]:
    cells = notebook.cells
    start = next((i for i, c in enumerate(cells) if c.source.startswith(doc.first)), None)
    if start is None:
        raise SystemExit(f"translations: {doc.source} has no cell starting with {doc.first!r}; update DOCUMENTS")
    if doc.until is None:
        return cells[start:]
    if doc.until == "":
        return cells[start : start + 1]
    stop = next((i for i in range(start + 1, len(cells)) if cells[i].source.startswith(doc.until)), None)
    if stop is None:
        raise SystemExit(f"translations: {doc.source} has no cell starting with {doc.until!r}; update DOCUMENTS")
    return cells[start:stop]


def english_units(doc: Document) -> list[Unit]:
    """The units of ``doc``'s English file that a translator translates, in order."""
    if doc.is_notebook:
        notebook = nbformat.read(ROOT / doc.source, as_version=4)
        return [
            Unit(c.source, f"cell {c.id}", key=c.id) for c in cells_in_scope(notebook, doc) if c.cell_type == "markdown"
        ]
    return [u for u in markdown_units((ROOT / doc.source).read_text(encoding="utf-8")) if u.translatable]


# --- the PO files ------------------------------------------------------------------------------------------------


def _header(doc: Document) -> str:
    key = "the English cell id, then " if doc.is_notebook else ""
    return (
        f"Chinese (Simplified) translation of {doc.source}.\n"
        f"msgctxt: {key}the first {HASH_DIGITS} hex digits of the SHA-256 of the English text (msgid).\n"
        "Write links as the English does, relative to the English file: make zh rewrites them.\n"
        "After an English edit: .venv/bin/python tools/translations.py update, revise the fuzzy entries, "
        "then make zh."
    )


def update(doc: Document) -> list[str]:
    """Bring ``doc``'s PO file in line with the English (tools/translation_sync.py); return one line per entry
    added, kept under a new msgctxt, marked fuzzy or made obsolete."""
    catalog = load_catalog(ROOT / doc.po)
    notes = sync(catalog, english_units(doc), doc.is_notebook, _header(doc), doc.po, doc.source)
    (ROOT / doc.po).parent.mkdir(parents=True, exist_ok=True)
    catalog.save(str(ROOT / doc.po))
    return notes


# --- the translated files -------------------------------------------------------------------------------------

LINK = re.compile(r"(\]\()([^)\s]+)(\))")
CODE_SPAN = re.compile(r"`[^`\n]+`")
URL = re.compile(r"\]\(([^)\s]+)\)")
MARKER = re.compile(r"#+ |(?:[-*]|\d+\.) |\|")


def _translations() -> dict[tuple[str, str], str]:
    """{(English file, anchor): its translation}; anchor "" for a whole file, the heading's for a cut-out cell."""
    return {(d.source, anchor(d.first) if d.first else ""): d.target for d in DOCUMENTS}


def relink(text: str, doc: Document) -> str:
    """``text``'s relative links, written from ``doc.source``'s folder, as seen from ``doc.target``'s;
    one to a translated file (or section) leads to the translation."""
    translated, source_dir, target_dir = _translations(), Path(doc.source).parent, (ROOT / doc.target).parent

    def fix(match: re.Match[str]) -> str:
        link = match.group(2)
        if re.match(r"[a-z][a-z0-9+.-]*:|#", link):
            return match.group(0)
        path, _, section = link.partition("#")
        english = Path(os.path.normpath(source_dir / path)).as_posix()
        if (english, section) in translated:
            new, section = translated[english, section], ""
        else:
            new = translated.get((english, ""), english)
        relative = Path(os.path.relpath(ROOT / new, target_dir)).as_posix()
        return f"{match.group(1)}{relative}{'#' + section if section else ''}{match.group(3)}"

    return LINK.sub(fix, text)


def lint(english: str, chinese: str) -> list[str]:
    """What a translation lost: its Markdown marker (heading, list item, table row), a code span, a link."""
    problems = []
    marker = MARKER.match(english)
    if marker and not chinese.startswith(marker.group()):
        problems.append(f"does not start with {marker.group()!r} as the English does")
    lost = [s for s in CODE_SPAN.findall(english) if s not in chinese]
    lost += [f"link ({u})" for u in URL.findall(english) if f"]({u.partition('#')[0]}" not in chinese]
    if lost:
        problems.append(f"lost {', '.join(dict.fromkeys(lost))}")
    return problems


def translate(unit: Unit, catalog: polib.POFile, doc: Document) -> tuple[str, list[str]]:
    """The translation of ``unit`` and the problems with it; the English text where there is none fit to use."""
    entry = catalog.find(unit.text, msgctxt=unit.context)
    fix = FIX.format(po=doc.po)
    if entry is None:
        before = unit.key and any(e.msgctxt.split()[0] == unit.key for e in live(catalog))
        reason = "changed since it was translated" if before else "is new, or changed since it was translated"
        return unit.text, [f"{doc.source} {unit.named}: {reason}; {fix}"]
    if "fuzzy" in entry.flags:
        return unit.text, [
            f"{doc.source} {unit.named}: its translation is marked fuzzy (the English changed); "
            f"revise it in {doc.po}, remove the fuzzy flag, then `make zh`"
        ]
    if not entry.msgstr.strip():
        return unit.text, [f"{doc.source} {unit.named}: not translated yet; {fix}"]
    return entry.msgstr, [f"{doc.po}, {unit.named}: the translation {p}" for p in lint(unit.text, entry.msgstr)]


def _heading(cells: list[nbformat.NotebookNode], index: int, step: int) -> str:
    """The heading a cut at ``cells[index]`` links to: the cell's own, else the nearest one in ``step``'s
    direction (a cut may start at a code cell or end at a bold line, which have no anchor)."""
    for cell in cells[index::step]:
        line = cell.source.lstrip().split("\n", 1)[0]
        if cell.cell_type == "markdown" and line.startswith("#"):
            return line
    return ""


def _note(doc: Document, heading: str = "") -> str:
    link = Path(os.path.relpath(ROOT / doc.source, (ROOT / doc.target).parent)).as_posix()
    section = f"#{anchor(heading)}" if heading else ""
    return ORIGINAL.format(
        name=Path(doc.source).name, link=link + section, extra=NOTEBOOK_EXTRA if doc.is_notebook else ""
    )


def build_notebook(doc: Document, catalog: polib.POFile) -> tuple[str, list[str]]:
    notebook = nbformat.read(ROOT / doc.source, as_version=4)
    cells, problems = [], []
    for cell in cells_in_scope(notebook, doc):
        cell = copy.deepcopy(cell)
        if cell.cell_type == "markdown":
            text, found = translate(Unit(cell.source, f"cell {cell.id}", key=cell.id), catalog, doc)
            cell.source, problems = relink(text, doc), problems + found
        cells.append(cell)
    index = {cell.id: i for i, cell in enumerate(notebook.cells)}
    first, last = index[cells[0].id], index[cells[-1].id]
    first = _heading(notebook.cells, first, 1) if doc.first else ""
    under = next(i for i, cell in enumerate(cells) if cell.cell_type == "markdown") + 1  # the first heading
    cells.insert(under, nbformat.v4.new_markdown_cell(_note(doc, first), id="zh-original"))
    if doc.until:
        link = Path(os.path.relpath(ROOT / doc.source, (ROOT / doc.target).parent)).as_posix()
        section = anchor(_heading(notebook.cells, last + 1, -1))
        rest = REST.format(heading=doc.until.strip("#* "), name=Path(doc.source).name, link=link, anchor=section)
        cells.append(nbformat.v4.new_markdown_cell(rest, id="zh-rest"))
    widget_view = "application/vnd.jupyter.widget-view+json"
    if not any(widget_view in o.get("data", {}) for c in cells if c.cell_type == "code" for o in c.outputs):
        notebook.metadata.pop("widgets", None)  # the saved state of widgets this part does not show
    notebook.cells = cells
    return nbformat.writes(notebook) + "\n", problems


def build_markdown(doc: Document, catalog: polib.POFile) -> tuple[str, list[str]]:
    parts, problems = [], []
    for unit in markdown_units((ROOT / doc.source).read_text(encoding="utf-8")):
        text = unit.text
        if text.startswith(TABLE_BEGIN):  # the English reading times: the Chinese text's own instead
            text = reading_times.chinese_block([(d.source, build(d)[0]) for d in DOCUMENTS if d.is_notebook])
        elif unit.translatable:
            text, found = translate(unit, catalog, doc)
            problems += found
        parts.append(relink(text, doc))
        if len(parts) == 1:
            parts += ["", _note(doc)]
    return "\n".join(parts), problems


def build(doc: Document) -> tuple[str, list[str]]:
    """The text of ``doc``'s translation as the English and the PO file make it now, and the problems found."""
    catalog = load_catalog(ROOT / doc.po)
    text, problems = (build_notebook if doc.is_notebook else build_markdown)(doc, catalog)
    return text, problems + anchor_problems(text, doc, ROOT)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "command",
        nargs="?",
        choices=("build", "update", "check"),
        default="build",
        help="build (default): write the translations; update: sync the PO files; check: report only",
    )
    args = parser.parse_args(argv)
    problems = []
    for doc in DOCUMENTS:
        if args.command == "update":
            print("\n".join(update(doc)) or f"{doc.po}: up to date")
            continue
        text, found = build(doc)
        problems += found
        target = ROOT / doc.target
        if args.command == "build":
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text, encoding="utf-8")
        elif not target.exists() or target.read_text(encoding="utf-8") != text:
            problems.append(f"{doc.target} is not what the English and {doc.po} make now: run `make zh`")
    for problem in problems:
        print(problem, file=sys.stderr)
    if args.command == "check" and not problems:
        print(
            f"translations OK: the {len(DOCUMENTS)} files in {ZH}/ are what the English and their PO files make, "
            "every entry translated and current, every link's anchor a heading"
        )
    if args.command == "build":
        print(
            f"wrote {len(DOCUMENTS)} files to {ZH}/"
            + (
                f"; English left where a translation is missing or stale ({len(problems)} problems above)"
                if problems
                else ""
            )
        )
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
