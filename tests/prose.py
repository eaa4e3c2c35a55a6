"""Prose helpers the tests share: a reader's sentences in Markdown."""

from __future__ import annotations

import re


def sentences(markdown: str) -> list[str]:
    """The sentences of ``markdown``: headings, list items and table rows end one; inside a block, a
    sentence ends at ``.``, ``!`` or ``?`` before a space (a closing bracket or emphasis may follow).
    A link counts as its text; colons and semicolons end nothing."""
    text = re.sub(r"```.*?```", " ", markdown, flags=re.DOTALL)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    blocks = re.split(r"\n\s*\n|\n(?=\s*(?:[-*]|\d+\.|#+|\|)\s)", text)
    found = []
    for block in blocks:
        block = re.sub(r"^\s*(?:[-*]|\d+\.|#+)\s+", "", " ".join(block.split()))
        found += [s.strip() for s in re.findall(r".+?(?:[.!?][)*\"'_]*(?=\s|$)|$)", block) if s.strip()]
    return found
