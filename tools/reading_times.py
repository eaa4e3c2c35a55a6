"""FACILITATOR.md's table of reading and run times, counted from the notebooks (never typed by hand).

    python tools/reading_times.py           # print the table
    python tools/reading_times.py --write   # put it into notebooks/FACILITATOR.md, between its markers

Words are those of each notebook's markdown cells (headings, prose, tables; not code or outputs), split at
white space. Reading minutes are words over a reading rate: 200 words a minute for a first-language reader,
120 for a second-language one (100-130 is typical). Run times are the ones 00 welcome's map states.
``tests/test_kit.py`` fails when the table in FACILITATOR.md differs from this one.

The Chinese edition's FACILITATOR.md (``make zh``) has a table of its own, made by ``chinese_block`` from the
Chinese notebooks: 汉字 (CJK ideographs) at ``ZH_RATE`` characters a minute, plus Latin tokens (English
words, numbers, identifiers; link targets are not read) at the second-language rate of 120 words a minute.
``ZH_RATE`` is the mean of native Chinese readers aged 18-35 in the International Reading Speed Texts
(IReST) study, read aloud; silent reading is faster, so the minutes err long.
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
# Characters a minute, native Chinese readers aged 18-35, read aloud: Trauzettel-Klosinski S, Dietz K, and
# the IReST Study Group (2012), "Standardized Assessment of Reading Performance: The New International Reading
# Speed Texts IReST", Investigative Ophthalmology & Visual Science 53(9):5452-5461, Table 2 (Chinese: 255 ± 29
# characters, 158 words a minute).
ZH_RATE = 255
ZH_SOURCE = (
    "Trauzettel-Klosinski & Dietz（2012），*Standardized Assessment of Reading Performance: The New International "
    "Reading Speed Texts IReST*，Investigative Ophthalmology & Visual Science 53(9):5452-5461，"
    "[doi:10.1167/iovs.11-8284](https://doi.org/10.1167/iovs.11-8284)"
)
ZH_BEGIN = "<!-- reading-times: made by make zh (tools/reading_times.py, chinese_block); do not edit by hand -->"
HANZI = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")
LATIN = re.compile(r"[A-Za-z0-9]+(?:[._'’-][A-Za-z0-9]+)*")
LINK_TARGET = re.compile(r"\]\([^)\s]*\)")


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


def chinese_counts(text: str) -> tuple[int, int]:
    """(汉字, Latin tokens) in Markdown ``text``; link targets are not read, so not counted."""
    text = LINK_TARGET.sub("]", text)
    return len(HANZI.findall(text)), len(LATIN.findall(text))


def chinese_minutes(counts: tuple[int, int]) -> float:
    return counts[0] / ZH_RATE + counts[1] / RATES[1]


def _markdown_cells(notebook: dict) -> list[dict]:
    return [c for c in notebook["cells"] if c["cell_type"] == "markdown"]


def _session_part(english: dict, chinese: dict) -> tuple[list[str], list[str]]:
    """The 60-minute session's part of the Chinese 04 (``FIRST_HALF``, found in the English by cell id, since the
    Chinese cells keep the English ids), as texts, and the Chinese headings in it."""
    ids = [c["id"] for c in _markdown_cells(english)]
    texts = ["".join(c["source"]) for c in _markdown_cells(english)]
    first = next((i for i, t in enumerate(texts) if FIRST_HALF[0] in t), None)
    last = next((i for i, t in enumerate(texts) if first is not None and i > first and FIRST_HALF[1] in t), None)
    if first is None or last is None:
        raise SystemExit(f"reading_times: notebook 04 has no '{FIRST_HALF[0]}' followed by '{FIRST_HALF[1]}'")
    by_id = {c["id"]: "".join(c["source"]) for c in _markdown_cells(chinese)}
    part, marker = [by_id[i] for i in ids[first:last] if i in by_id], FIRST_HALF[0].split(" ", 1)[0] + " "
    if part:  # the first cell from its heading on, as the English count starts there
        part[0] = part[0][part[0].find(marker) :] if marker in part[0] else part[0]
    headings = [line.lstrip("#").strip() for t in part for line in t.splitlines() if line.startswith(marker)]
    return part, headings


def chinese_table(notebooks: list[tuple[str, str]]) -> str:
    """The reading-time table of the Chinese notebooks, given as (English source, translated notebook JSON)."""
    known = suite_map()
    rows, total = [], (0, 0)
    for source, text in notebooks:
        english = json.loads((ROOT / source).read_text(encoding="utf-8"))
        chinese = json.loads(text)
        title = next(("".join(c["source"]).split("\n", 1)[0] for c in _markdown_cells(chinese)), "")
        name = title.lstrip("#").strip().split("：", 1)[0]
        number = Path(source).name.split("_", 1)[0]
        name = name if name.startswith(number) else f"{number} · {name}"
        code = {c["id"] for c in chinese["cells"] if c["cell_type"] == "code"}
        run = known.get(Path(source).name, ("", ""))[1]
        whole = code == {c["id"] for c in english["cells"] if c["cell_type"] == "code"}
        run = run if code and whole else f"≤ {run}" if code else "–"
        counts = chinese_counts("\n".join("".join(c["source"]) for c in _markdown_cells(chinese)))
        rows.append((name, counts, run))
        total = (total[0] + counts[0], total[1] + counts[1])
        if Path(source).name == "04_missing_metadata_bug.ipynb":
            part, headings = _session_part(english, chinese)
            label = f"04，*{headings[0]}* 至 *{headings[-1]}*（60 分钟版）" if headings else "04（60 分钟版）"
            rows.append((label, chinese_counts("\n".join(part)), run))
    rows.append((f"全部 {len(notebooks)} 个", total, ""))
    lines = [
        f"| 中文 notebook | 汉字 | 拉丁词 | 阅读时间（每分钟 {ZH_RATE} 字、{RATES[1]} 词） | 运行（2 核 CPU） |",
        "|---|---|---|---|---|",
    ]
    lines += [f"| {n} | {c[0]:,} | {c[1]:,} | {chinese_minutes(c):.1f} 分钟 | {r} |" for n, c, r in rows]
    return "\n".join(lines)


def chinese_block(notebooks: list[tuple[str, str]]) -> str:
    """The Chinese FACILITATOR.md's reading-time table between its markers, with its rates and their source."""
    note = (
        f"中文 notebook 的阅读时间按 markdown cell 计：汉字按每分钟 {ZH_RATE} 字，拉丁词（英文词、数字、标识符；"
        f"链接地址不计）按每分钟 {RATES[1]} 词，与上文第二语言读者的速度相同。{ZH_RATE} 字出自 IReST 研究中以中文为"
        f"母语的 18-35 岁读者的平均速度（朗读；默读更快，所以这里的时间偏长）：{ZH_SOURCE}，表 2。"
        "“≤”：中文版只含英文 notebook 的一部分代码，运行时间不超过整本的。"
    )
    return f"{ZH_BEGIN}\n{chinese_table(notebooks)}\n\n{note}\n{END}"


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
