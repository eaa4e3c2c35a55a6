"""The sync of the Chinese edition's PO files (``tools/translations.py update``), which loses no translation.

Each English unit (a markdown cell, or a block of a Markdown file) inherits one old entry, tried in this order:

1. the entry with its msgctxt (the same cell id, the same text): kept as it is;
2. an entry with the same English text, found by the hash its msgctxt stores (a cell whose id changed, a
   paragraph that moved, an obsolete entry whose English came back): its translation is still right, so it
   is kept, flags and all, under the new msgctxt;
3. in a notebook, the entry with the cell's id; in a Markdown file, the entry in its place when the old and
   new sequences of hashes are aligned: the English changed, so its translation is kept as a start, marked
   fuzzy, with the English it translates recorded as the previous msgid (``#| msgid``).

An old entry that no unit inherits stays in the file as obsolete (``#~``), never dropped: a deleted cell's
translation is there when the cell returns (rule 2), or for a translator to copy by hand.
"""

from __future__ import annotations

import difflib
import hashlib
from pathlib import Path
from typing import Protocol

import polib

HASH_DIGITS = 12
WRAP = 100


class Unit(Protocol):
    text: str
    where: str  # the PO comment's place: "cell 9763bb44", "line 12 ('...')"
    key: str  # the cell id; "" for a block of a Markdown file

    @property
    def context(self) -> str: ...

    @property
    def named(self) -> str: ...


def text_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:HASH_DIGITS]


def load_catalog(path: Path) -> polib.POFile:
    if path.exists():
        return polib.pofile(str(path), wrapwidth=WRAP)
    catalog = polib.POFile(wrapwidth=WRAP)
    catalog.metadata = {
        "Project-Id-Version": "cglab",
        "Language": "zh_CN",
        "MIME-Version": "1.0",
        "Content-Type": "text/plain; charset=UTF-8",
        "Content-Transfer-Encoding": "8bit",
    }
    return catalog


def live(catalog: polib.POFile) -> list[polib.POEntry]:
    return [e for e in catalog if not e.obsolete]


def _key(entry: polib.POEntry) -> str:
    """The cell id an entry's msgctxt records ("" for a block of a Markdown file)."""
    parts = entry.msgctxt.split()
    return parts[0] if len(parts) == 2 else ""


def _rank(entry: polib.POEntry) -> tuple[bool, bool, bool]:
    """Which of several entries with one English text to inherit: a live, current, translated one first."""
    return entry.obsolete, "fuzzy" in entry.flags, not entry.msgstr


def inherited(units: list[Unit], catalog: polib.POFile, by_key: bool) -> list[polib.POEntry | None]:
    """The old entry each unit inherits, by the rules of this module's docstring (``None``: a new entry)."""
    by_context, by_text = {}, {}
    for entry in sorted(catalog, key=_rank):
        by_context.setdefault(entry.msgctxt, entry)
        if entry.msgctxt.split()[-1] == text_hash(entry.msgid):
            by_text.setdefault(entry.msgid, entry)
    found = [by_context.get(u.context) or by_text.get(u.text) for u in units]
    taken = {id(e) for e in found if e is not None}
    entries = [e for e in live(catalog) if id(e) not in taken]  # rule 3 takes what rules 1 and 2 left
    if by_key:
        old = {_key(e): e for e in entries}
        return [e if e is not None else old.get(u.key) for u, e in zip(units, found)]
    everything = live(catalog)
    hashes, contexts = [e.msgctxt for e in everything], [u.context for u in units]
    for tag, a0, a1, b0, b1 in difflib.SequenceMatcher(None, hashes, contexts, False).get_opcodes():
        if tag == "replace":
            for offset in range(min(a1 - a0, b1 - b0)):
                entry = everything[a0 + offset]
                if found[b0 + offset] is None and id(entry) not in taken:
                    found[b0 + offset] = entry
    return found


def sync(catalog: polib.POFile, units: list[Unit], by_key: bool, header: str, po: str, source: str) -> list[str]:
    """Bring ``catalog`` in line with ``units``, in place; one line per entry added, kept under a new msgctxt,
    marked fuzzy or made obsolete (``po`` and ``source`` name the files in those lines and the comments)."""
    notes, fresh, seen, olds = [], [], set(), inherited(units, catalog, by_key)
    for unit, old in zip(units, olds):
        if unit.context in seen:
            continue  # the same text twice in one file: one entry serves both
        seen.add(unit.context)
        entry = polib.POEntry(msgctxt=unit.context, msgid=unit.text, msgstr="", comment=f"{source}, {unit.where}")
        if old is not None and old.msgid == unit.text:
            entry.msgstr, entry.flags, entry.previous_msgid = old.msgstr, list(old.flags), old.previous_msgid
            if old.msgctxt != unit.context:
                notes.append(f"{po}: kept, the same English under a new msgctxt (was {old.msgctxt}): {unit.named}")
        elif old is not None and old.msgstr:
            entry.msgstr, entry.flags = old.msgstr, ["fuzzy"]
            # The English the translation translates: an entry already fuzzy keeps the one it recorded.
            entry.previous_msgid = old.previous_msgid if "fuzzy" in old.flags and old.previous_msgid else old.msgid
            notes.append(f"{po}: fuzzy, the English changed: {unit.named}")
        else:
            notes.append(f"{po}: new, to translate: {unit.named}")
        fresh.append(entry)
    used = {(e.msgctxt, e.msgid) for e in fresh + [e for e in olds if e is not None]}
    for old in catalog:
        if (old.msgctxt, old.msgid) in used:
            continue
        used.add((old.msgctxt, old.msgid))
        if not old.obsolete:
            notes.append(f"{po}: obsolete, kept as #~ (its English is gone): {old.msgctxt}")
        old.obsolete = True
        fresh.append(old)
    catalog[:] = fresh
    catalog.header = header
    return notes
