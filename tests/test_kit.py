"""The facilitator's kit (issue 35): it builds offline, the slides' figures are readable on a projector,
the handout fits one A4 page, its code and checkpoints are the suite's own, the model answers cover every
question and point at sections that exist, and FACILITATOR.md's word counts are the notebooks' own. The
Chinese pages (build/kit/zh/, issue 41) are built by the same code from the Chinese edition's files, and the
Chinese FACILITATOR.md counts the Chinese notebooks' 汉字 and Latin tokens at a stated rate."""

from __future__ import annotations

import importlib.util
import json
import math
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.text import Text
from prose import sentences

ROOT = Path(__file__).resolve().parents[1]
KIT = ROOT / "docs" / "facilitator"
FACILITATOR = ROOT / "notebooks" / "FACILITATOR.md"
LINKED_DOCS = [ROOT / "README.md", FACILITATOR, KIT / "answers.md", KIT / "handout.md", ROOT / "docs" / "LAPTOPS.md"]


def _tool(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


build_kit, reading_times = _tool("build_kit"), _tool("reading_times")


@pytest.fixture(scope="module")
def kit(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("kit")
    return out, build_kit.build(out)


# --- the slides ----------------------------------------------------------------------------------------


PAGES = ("slides.html", "handout.html", "answers.html")
by_language = pytest.mark.parametrize("lang", build_kit.LANGUAGES, ids=lambda lang: lang.code)


@by_language
def test_the_kit_builds_offline(kit: tuple[Path, dict], lang) -> None:
    out, _ = kit
    pages = {name: (out / lang.folder / name).read_text(encoding="utf-8") for name in PAGES}
    for name, page in pages.items():
        # Nothing loads from anywhere: no stylesheet, script or font by address, every image embedded.
        loads = re.findall(
            r"<link\b|@import|@font-face|url\(|<script[^>]*\bsrc=|<img(?![^>]*src=\"data:image/png;base64,)", page
        )
        assert not loads, f"{lang.folder}/{name} loads something from elsewhere: {loads}"
        assert f"<html lang='{lang.code}'>" in page
    assert 6 <= pages["slides.html"].count("<section class='slide'>") <= 8


def test_the_chinese_pages_say_what_the_chinese_edition_says(kit: tuple[Path, dict]) -> None:
    out, _ = kit
    english, chinese = ((out / folder / "slides.html").read_text(encoding="utf-8") for folder in ("", "zh"))
    assert chinese.count("<section class='slide'>") == english.count("<section class='slide'>")
    assert chinese.count("<img ") == english.count("<img ")  # the same figures, drawn once
    handout = (ROOT / "notebooks" / "zh" / "handout.md").read_text(encoding="utf-8")
    facilitator = (ROOT / "notebooks" / "zh" / "FACILITATOR.md").read_text(encoding="utf-8")
    lead = re.search(r"^\*\*[^*]+\*\* ([^\n]{12})", handout, re.MULTILINE).group(1)  # the bug in two sentences
    first_question = re.search(r"^## 讨论题\n.*?^1\. (\S{10})", facilitator, re.MULTILINE | re.DOTALL).group(1)
    for text in (lead, first_question):
        assert text in chinese, f"the Chinese slides lack {text!r} of the Chinese edition"
    for name in ("handout.html", "answers.html"):
        page = (out / "zh" / name).read_text(encoding="utf-8")
        assert len(re.findall(r"[\u4e00-\u9fff]", page)) > 300, f"zh/{name} is hardly Chinese"
    # Every section a slide names is the Chinese notebook's heading where there is one, else the English one's.
    refs = re.findall(r"（(0[0-6]b?)，<em>([^<]+)</em>(，英文版)?）", chinese)
    assert len(refs) >= 4
    for notebook, section, english_only in refs:
        zh = ROOT / "notebooks" / "zh" / next((ROOT / "notebooks").glob(f"{notebook}_*.ipynb")).name
        assert bool(english_only) == (not zh.exists()), f"({notebook}, {section}): the Chinese notebook has it"
        headings = [h.lstrip("#").strip() for h in (_headings(notebook) if english_only else _headings_of(zh))]
        assert any(h.startswith(section) for h in headings), f"the Chinese slides name ({notebook}, {section})"


def test_chinese_text_falls_back_to_cjk_fonts_the_machine_has() -> None:
    """No web font: each family lists a Latin face, the CJK faces of macOS, Windows and Linux, then the generic
    family; and the handout's line is as tall as the English one's, so the page budget below holds for both."""
    fonts = build_kit.CHINESE_FONTS
    for family, generic in (("serif", "serif"), ("sans", "sans-serif"), ("mono", "monospace")):
        faces = [face.strip().strip('"') for face in fonts[family].split(",")]
        assert faces[-1] == generic and {"PingFang SC", "Microsoft YaHei", "Noto Sans CJK SC"} <= set(faces)
    lines = [float(f["size"].removesuffix("pt")) * float(f["leading"]) for f in (build_kit.ENGLISH_FONTS, fonts)]
    assert lines[0] == pytest.approx(lines[1], abs=0.05)


def _shown_points(figure, shown_width: float) -> list[tuple[float, str]]:
    """Every visible text of ``figure`` and its size in points when the figure is shown ``shown_width`` wide."""
    FigureCanvasAgg(figure).draw()
    scale = shown_width / figure.get_figwidth()
    return [
        (t.get_fontsize() * scale, t.get_text())
        for t in figure.findobj(Text)
        if t.get_visible() and t.get_text().strip()
    ]


def test_slide_figures_have_12pt_text_at_the_size_shown(kit: tuple[Path, dict]) -> None:
    out, figures = kit
    slides = (out / "slides.html").read_text(encoding="utf-8")
    shown = [(int(w), float(i)) for w, i in re.findall(r'width="(\d+)" data-shown-inches="([\d.]+)"', slides)]
    assert len(shown) == len(figures) >= 4
    # The page shows each image at the width the figure was fitted to (96 CSS pixels an inch).
    assert sorted(i for _, i in shown) == sorted(round(f.shown_width, 3) for f in figures.values())
    assert all(width == round(inches * 96) for width, inches in shown)
    small = {name: sorted(_shown_points(f.figure, f.shown_width))[:2] for name, f in figures.items()}
    small = {name: texts for name, texts in small.items() if texts[0][0] < 12 - 1e-6}
    assert not small, f"text under 12 pt at the size shown: {small}"


def test_slide_text_is_12pt_or_more() -> None:
    """1280 x 720 CSS pixels is a 13.3 x 7.5 inch slide, so 16 px is 12 pt."""
    sizes = [float(px) for px in re.findall(r"font-size:\s*([\d.]+)px", build_kit.SLIDES_CSS)]
    assert sizes and min(sizes) >= 16


# --- the handout -----------------------------------------------------------------------------------------

# The handout's page (build_kit.HANDOUT_CSS): A4, 15 mm margins, so 267 mm of height and 180 mm of width.
# Body text 11 pt at line height 1.3 is 14.3 pt, 5.04 mm a line: 52 lines fill the page. A heading (16 or
# 12.5 pt, with its margins) counts 2 lines, a code line (8 pt x 1.25 = 3.5 mm) 0.7, the gap after a block
# 0.3. Prose wraps at 85 characters a line: 180 mm holds about 95 of a serif text at 11 pt (half an em a
# character on average), so 85 errs on the long side. Code must fit 100 characters (8 pt monospace, 0.6 em:
# 106 in 180 mm). The budget keeps 2 lines of the 52 spare.
A4_LINES, PROSE_CHARS, CODE_CHARS = 50, 85, 100


def printed_lines(markdown: str) -> float:
    """How many body-text lines ``markdown`` fills on the handout's page, by the budget above."""
    lines, in_code = 0.0, False
    for raw in markdown.splitlines():
        if raw.startswith("```"):
            in_code = not in_code
            lines += 0.3 if not in_code else 0
        elif in_code:
            assert len(raw) <= CODE_CHARS, f"a code line wider than the page: {raw!r}"
            lines += 0.7
        elif raw.startswith("#"):
            lines += 2
        elif not raw.strip():
            lines += 0.3
    prose = re.sub(r"^#.*$", "", re.sub(r"```.*?```", "", markdown, flags=re.DOTALL), flags=re.MULTILINE)
    for block in re.split(r"\n\s*\n", prose):
        for item in re.split(r"\n(?=\s*(?:[-*]|\d+\.)\s)", block.strip()):
            text = re.sub(r"\[([^\]]*)\]\([^)]*\)|[*`]", r"\1", " ".join(item.split()))
            lines += math.ceil(len(text) / PROSE_CHARS) if text else 0
    return lines


@by_language
def test_the_handout_fits_one_a4_page(lang) -> None:
    """A Chinese character is one em wide, a Latin one half an em: each counts as two (10.5 against 11 pt)."""
    lines = printed_lines(re.sub(r"[\u3000-\u9fff\uff00-\uffef]", "xx", lang.handout.read_text(encoding="utf-8")))
    assert lines <= A4_LINES, (
        f"{lang.handout.name} ({lang.code}) fills {lines:.1f} lines of the {A4_LINES} one A4 page holds: shorten it"
    )


def test_the_page_budget_counts_wrapped_prose_code_and_headings() -> None:
    text = "# Title\n\n" + "word " * 34 + "\n\n- one\n- two\n\n```\ncode\ncode\n```\n"
    assert printed_lines(text) == pytest.approx(2 + 0.3 * 3 + 2 + 1 + 1 + 0.7 * 2 + 0.3)  # 169 characters: 2 lines


def _outputs_text() -> str:
    """Everything the committed notebooks show: their outputs and their markdown."""
    texts = []
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
            texts.append("".join(cell["source"]) if cell["cell_type"] == "markdown" else "")
            for output in cell.get("outputs", []):
                texts += [output.get("text", ""), output.get("evalue", ""), output.get("ename", "")]
                texts += [v if isinstance(v, str) else "".join(v) for v in output.get("data", {}).values()]
    return "\n".join(t if isinstance(t, str) else "".join(t) for t in texts)


def test_the_handouts_checkpoints_are_what_the_notebooks_show() -> None:
    handout = (KIT / "handout.md").read_text(encoding="utf-8")
    shown = _outputs_text()
    quoted = re.findall(r"`([^`]+)`", handout.split("## Checkpoints", 1)[1])
    missing = [q for q in quoted if q not in shown]
    assert quoted and not missing, f"the handout's checkpoints quote what no committed notebook shows: {missing}"


def test_the_handouts_six_line_fix_is_the_code() -> None:
    diff = re.search(r"```diff\n(.*?)```", (KIT / "handout.md").read_text(encoding="utf-8"), re.DOTALL).group(1)
    changed = [line[1:].strip() for line in diff.splitlines() if line[:1] in "+-"]
    # A call wrapped over lines reads as one line; "..." stands for arguments left out.
    source = re.sub(r"([(,])\s*\n\s*", r"\1 ", (ROOT / "cglab" / "cudagraph_utils.py").read_text(encoding="utf-8"))
    stale = [line for line in changed if not re.search("[^()\n]*?".join(map(re.escape, line.split("..."))), source)]
    assert len(changed) == 6 and not stale, f"the handout's fix is not cglab's code: {stale}"


# --- answers, references and links --------------------------------------------------------------------------

# "04, *The loud variant*", "**00 welcome**, *Your environment*", "04 ..., from *Two ways ...*".
SECTION_REF = re.compile(r"(?<![\w#-])(0[0-6]b?)(?: [\w -]{0,40}?)?(?:\*\*)?,?\s(?:from |up to )?\*([^*]+)\*")


def section_references(markdown: str) -> list[tuple[str, str]]:
    """(notebook, section) for each section a text names, the section's line breaks undone."""
    return [(number, " ".join(section.split())) for number, section in SECTION_REF.findall(markdown)]


def _headings(number: str) -> list[str]:
    return _headings_of(next((ROOT / "notebooks").glob(f"{number}_*.ipynb")))


def _headings_of(path: Path) -> list[str]:
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    return [
        line
        for cell in cells
        if cell["cell_type"] == "markdown"
        for line in "".join(cell["source"]).splitlines()
        if line.startswith("#")
    ]


@pytest.mark.parametrize("doc", [FACILITATOR, KIT / "answers.md", KIT / "handout.md"], ids=lambda p: p.name)
def test_every_section_a_doc_names_exists(doc: Path) -> None:
    refs = section_references(doc.read_text(encoding="utf-8"))
    stale = sorted({(n, s) for n, s in refs if not any(s in h for h in _headings(n))})
    assert refs and not stale, f"{doc.name} names sections the notebooks lack (notebook, section): {stale}"


def test_section_references_are_read_with_their_notebook() -> None:
    text = "(04, *The loud variant*; 01, *Static buffers*) **00 welcome**, *Your environment*, 00b, *2 · The picture*"
    assert section_references(text) == [
        ("04", "The loud variant"),
        ("01", "Static buffers"),
        ("00", "Your environment"),
        ("00b", "2 · The picture"),
    ]


@pytest.mark.parametrize("doc", LINKED_DOCS, ids=lambda p: p.name)
def test_relative_links_resolve(doc: Path) -> None:
    links = re.findall(r"\]\(([^)\s#]+)(?:#[^)]*)?\)", doc.read_text(encoding="utf-8"))
    broken = [link for link in links if "://" not in link and not (doc.parent / link).exists()]
    assert not broken, f"{doc.name}: links to nothing: {broken}"


def test_every_question_has_a_model_answer_of_three_to_six_sentences() -> None:
    questions = re.findall(
        r"^(\d+)\. ",
        FACILITATOR.read_text(encoding="utf-8").split("## Questions to discuss")[1].split("\n## ")[0],
        re.MULTILINE,
    )
    answers = re.split(r"^## (\d+)\. .*$", (KIT / "answers.md").read_text(encoding="utf-8"), flags=re.MULTILINE)[1:]
    numbers, bodies = answers[0::2], answers[1::2]
    assert numbers == questions, f"FACILITATOR asks {questions}, answers.md answers {numbers}"
    for number, body in zip(numbers, bodies):
        count = len(sentences(body.strip()))
        assert 3 <= count <= 6, f"answer {number} has {count} sentences"
        assert section_references(body), f"answer {number} points at no notebook section"


def test_facilitators_word_counts_are_the_notebooks_own() -> None:
    text = FACILITATOR.read_text(encoding="utf-8")
    assert text == reading_times.with_table(text), (
        "FACILITATOR.md's reading-time table is stale: run .venv/bin/python tools/reading_times.py --write"
    )


def test_chinese_reading_counts_hanzi_and_latin_tokens() -> None:
    text = "CUDA 图的 `copy_` 和 FULL_AND_PIECEWISE，见 [04 的修复](../04_missing_metadata_bug.ipynb#The-fix)、0.25。"
    # 汉字: 图 的 和 见 的 修 复 (7); Latin tokens: CUDA, copy_ as copy, FULL_AND_PIECEWISE, 04, 0.25 (5), no link target
    assert reading_times.chinese_counts(text) == (7, 5)


def test_chinese_reading_minutes_use_the_stated_rates() -> None:
    """255 汉字 and 120 Latin tokens (the title's 3 and "00b" among them) are a minute each; no code, no run time."""
    cell = {
        "cell_type": "markdown",
        "id": "x",
        "metadata": {},
        "source": "# 00b · 试读：一\n\n" + "汉" * 252 + " w" * 119,
    }
    notebook = json.dumps({"cells": [cell]})
    table = reading_times.chinese_table([("notebooks/00b_express.ipynb", notebook)])
    assert "| 00b · 试读 | 255 | 120 | 2.0 分钟 | – |" in table.splitlines()
    assert reading_times.ZH_RATE == 255 and reading_times.RATES[1] == 120


def test_the_chinese_facilitator_states_its_rates_and_their_source() -> None:
    text = (ROOT / "notebooks" / "zh" / "FACILITATOR.md").read_text(encoding="utf-8")
    block = text.split(reading_times.ZH_BEGIN, 1)[1].split(reading_times.END, 1)[0]
    assert "| 中文 notebook | 汉字 | 拉丁词 |" in block and "60 分钟版" in block
    for stated in (f"汉字按每分钟 {reading_times.ZH_RATE} 字", f"每分钟 {reading_times.RATES[1]} 词", "IReST"):
        assert stated in block, f"the Chinese reading times do not state {stated!r}"
    assert "https://doi.org/10.1167/iovs.11-8284" in block
