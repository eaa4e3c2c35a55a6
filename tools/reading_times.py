"""FACILITATOR.md's table of reading and run times, counted from the notebooks (never typed by hand).

    python tools/reading_times.py           # print the table
    python tools/reading_times.py --write   # put it into notebooks/FACILITATOR.md, between its markers

Words are those of each notebook's markdown cells (headings, prose, tables; not code or outputs), split at
white space. Reading minutes are words over a reading rate: 200 words a minute for a first-language reader,
120 for a second-language one (100-130 is typical). Run times are the ones 00 welcome's map states.
``tests/test_kit.py`` fails when the table in FACILITATOR.md differs from this one.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
FACILITATOR = NOTEBOOKS / "FACILITATOR.md"
BEGIN = "<!-- reading-times: made by tools/reading_times.py --write; do not edit by hand -->"
END = "<!-- /reading-times -->"
RATES = (200, 120)  # words a minute: first-language, second-language readers
# The 60-minute session reads 04 from this heading up to the first optional deep dive after The fix.
FIRST_HALF = ("## Two ways to capture PIECEWISE", "**Optional deep dive.**")


def markdown(path: Path) -> str:
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    return "\n".join("".join(cell["source"]) for cell in cells if cell["cell_type"] == "markdown")


def suite_map() -> dict[str, tuple[str, str]]:
    """{notebook file: (its name, its run time)} from 00 welcome's map ("20 s (GPU: 30 s)" -> "20 s")."""
    rows = re.findall(
        r"^\| \[([^\]]*)\]\(([\w.]+\.ipynb)\)[^\n]*\| ([\d.]+ (?:s|min))[^|\n]*\|$",
        markdown(NOTEBOOKS / "00_welcome.ipynb"),
        re.MULTILINE,
    )
    return {path: (name, run) for name, path, run in rows}


def first_half_of_04() -> str:
    text = markdown(NOTEBOOKS / "04_missing_metadata_bug.ipynb")
    start = text.find(FIRST_HALF[0])
    end = text.find(FIRST_HALF[1], start)
    if start < 0 or end < 0:
        raise SystemExit(
            f"reading_times: notebook 04 has no '{FIRST_HALF[0]}' followed by '{FIRST_HALF[1]}'; "
            "update FIRST_HALF in tools/reading_times.py"
        )
    return text[start:end]


def table() -> str:
    known = suite_map()
    paths = sorted(NOTEBOOKS.glob("*.ipynb"))
    if missing := [p.name for p in paths if p.name not in known]:
        raise SystemExit(f"reading_times: 00 welcome's map gives no run time for {missing}")
    rows = [(*known[p.name][:1], len(markdown(p).split()), known[p.name][1]) for p in paths]
    total = sum(words for _, words, _ in rows)
    rows += [
        (
            "04, *Two ways to capture PIECEWISE* to *The fix* (60-minute session)",
            len(first_half_of_04().split()),
            known["04_missing_metadata_bug.ipynb"][1],
        ),
        (f"all {len(paths)}", total, ""),
    ]
    lines = [
        "| notebook | markdown words | reading at 200 words/min | at 120 words/min | run (2-core CPU) |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| {name} | {words:,} | {words / RATES[0]:.1f} min | {words / RATES[1]:.1f} min | {run} |"
        for name, words, run in rows
    ]
    return "\n".join(lines)


def with_table(text: str) -> str:
    """``text`` with the table between the markers replaced by today's."""
    if BEGIN not in text or END not in text:
        raise SystemExit(f"reading_times: {FACILITATOR.name} lacks the markers {BEGIN!r} ... {END!r}")
    head, rest = text.split(BEGIN, 1)
    return f"{head}{BEGIN}\n{table()}\n{END}{rest.split(END, 1)[1]}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="rewrite the table in notebooks/FACILITATOR.md")
    args = parser.parse_args(argv)
    if args.write:
        FACILITATOR.write_text(with_table(FACILITATOR.read_text(encoding="utf-8")), encoding="utf-8")
        print(f"updated {FACILITATOR.relative_to(ROOT)}")
    else:
        print(table())
    return 0


if __name__ == "__main__":
    sys.exit(main())
