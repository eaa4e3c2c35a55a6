"""The facilitator's kit (``make kit``): a handout, the model answers and slides, built offline into build/kit/,
and the same three pages in Chinese into build/kit/zh/.

    python tools/build_kit.py [--out build/kit]

- ``handout.html``: docs/facilitator/handout.md, laid out for one A4 page (print it from a browser);
- ``answers.html``: docs/facilitator/answers.md, model answers to FACILITATOR.md's questions;
- ``slides.html``: seven 16:9 slides of 1280 x 720 CSS pixels (13.3 x 7.5 inches, a projector's usual
  slide), in one file with every image embedded. The figures are drawn by the suite's own plotting code,
  from fresh runs of the toy engine on the CPU simulator (as the notebooks draw them) and from the
  recorded H200 data; every text in them is at least 12 pt at the size shown. The slides' words come
  from the handout and FACILITATOR.md, so they say what those say.

Each ``Language`` names its sources (the Chinese: notebooks/zh/handout.md, answers.md and FACILITATOR.md, made by
``make zh``), its fonts and the slides' own titles and captions; one code path builds every language's pages from
one drawing of the figures. The figures' labels stay English (no CJK font is assumed): the Chinese captions say
what they mean. Nothing is fetched: the Markdown is rendered by mistune (installed with Jupyter's nbconvert), and
the fonts are the reader's own, named in an order that falls back well (a Latin face first, then the CJK faces of
macOS, Windows and Linux, then the generic family, which the page's ``lang`` steers to Simplified Chinese forms).
"""

from __future__ import annotations

import argparse
import base64
import html
import io
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files, not windows: chosen before anything imports pyplot

import matplotlib.pyplot as plt  # noqa: E402
import mistune  # noqa: E402
from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.layout_engine import ConstrainedLayoutEngine  # noqa: E402
from matplotlib.text import Text  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
KIT = ROOT / "docs" / "facilitator"
CSS_PX_PER_INCH = 96  # CSS's definition; a 1280 x 720 slide is then 13.3 x 7.5 inches
MIN_PT = 12.0  # the smallest text on a projected slide, at the size shown

# One A4 page: 15 mm margins, body text 11 pt, code 8 pt (tests/test_kit.py budgets the handout's lines by these).
# The fonts and the body text's size come from the language (``Language.fonts``, set as CSS variables).
HANDOUT_CSS = """@page { size: A4; margin: 15mm; }
body { font-family: var(--serif); font-size: var(--size); line-height: var(--leading); max-width: 180mm;
  margin: 0 auto; }
h1 { font-size: 16pt; margin: 0 0 4pt; } h2 { font-size: 12.5pt; margin: 8pt 0 2pt; }
p, ol, ul { margin: 3pt 0; } li { margin: 0; }
pre { font: 8pt/1.25 var(--mono); margin: 3pt 0; padding: 3pt 5pt; background: #f4f4f4; }
code { font-family: var(--mono); font-size: 9pt; } pre code { font-size: inherit; }"""
DOC_CSS = """body { font: 12pt/1.45 var(--sans); max-width: 46em; margin: 2em auto; padding: 0 1em; }
code { font-size: 11pt; } h2 { margin-top: 1.6em; }"""
SLIDES_CSS = """body { margin: 0; background: #333; font-family: var(--sans); }
.slide { width: 1280px; height: 720px; box-sizing: border-box; margin: 24px auto; padding: 36px 56px;
  background: #fff; position: relative; overflow: hidden; }
h1 { font-size: 48px; margin: 120px 0 24px; } h2 { font-size: 36px; margin: 0 0 14px; }
p, li { font-size: 26px; line-height: 1.35; } .caption, .caption p { font-size: 20px; color: #444; margin: 8px 0 0; }
pre { font-size: 21px; background: #f4f4f4; padding: 12px 16px; }
.side { display: flex; gap: 28px; align-items: flex-start; } .side p { font-size: 24px; }
.number { position: absolute; right: 28px; bottom: 14px; font-size: 16px; color: #777; }
@media print { @page { size: 1280px 720px; margin: 0; } body { background: #fff; }
  .slide { margin: 0; break-after: page; } }"""
# Arrow keys, space and Page Up/Down step through the slides; the page zooms the slides to the window.
SLIDES_JS = """const slides = [...document.querySelectorAll('.slide')]; let current = 0;
function fit() { document.body.style.zoom = Math.min(innerWidth / 1300, innerHeight / 740); }
function go(step) { current = Math.max(0, Math.min(slides.length - 1, current + step));
  slides[current].scrollIntoView(); }
addEventListener('resize', fit); fit();
addEventListener('keydown', e => { if (['ArrowRight', 'ArrowDown', 'PageDown', ' '].includes(e.key)) { go(1); }
  else if (['ArrowLeft', 'ArrowUp', 'PageUp'].includes(e.key)) { go(-1); } else { return; } e.preventDefault(); });"""


@dataclass
class SlideFigure:
    """A figure and the width, in inches, at which a slide shows it."""

    figure: Figure
    shown_width: float

    @property
    def scale(self) -> float:
        return self.shown_width / self.figure.get_figwidth()


def visible_texts(figure: Figure) -> list[Text]:
    """Every text a reader sees in ``figure``, tick labels included (laid out by a draw first)."""
    FigureCanvasAgg(figure).draw()
    return [t for t in figure.findobj(Text) if t.get_visible() and t.get_text().strip()]


def for_projection(figure: Figure, box: tuple[float, float]) -> SlideFigure:
    """Fit ``figure`` into a box of (width, height) inches and raise every text to ``MIN_PT`` at that size."""
    shown = SlideFigure(
        figure, figure.get_figwidth() * min(box[0] / figure.get_figwidth(), box[1] / figure.get_figheight())
    )
    floor = MIN_PT / shown.scale
    for ax in figure.axes:  # ticks through tick_params, so that ticks made at the next draw follow
        for axis, labels in (("x", ax.get_xticklabels()), ("y", ax.get_yticklabels())):
            if labels and min(t.get_fontsize() for t in labels) < floor:
                ax.tick_params(axis=axis, labelsize=floor)
    for text in visible_texts(figure):
        text.set_fontsize(max(text.get_fontsize(), floor))
    if not isinstance(figure.get_layout_engine(), ConstrainedLayoutEngine):  # lay it out again with the new sizes
        figure.tight_layout()
    return shown


def png(slide_figure: SlideFigure) -> str:
    """An <img> of the figure, embedded, at its shown size (rendered at twice that, for sharp projectors)."""
    buffer = io.BytesIO()
    dpi = 2 * CSS_PX_PER_INCH * slide_figure.scale
    slide_figure.figure.savefig(buffer, format="png", dpi=dpi, metadata={"Software": None})
    width = round(slide_figure.shown_width * CSS_PX_PER_INCH)
    return (
        f'<img src="data:image/png;base64,{base64.b64encode(buffer.getvalue()).decode()}" width="{width}" '
        f'data-shown-inches="{slide_figure.shown_width:.3f}" alt="">'
    )


def slide_figures() -> dict[str, SlideFigure]:
    """The slides' figures, drawn as the notebooks draw them, then fitted for projection."""
    from cglab import CompilationConfig, ModelRunner, ToyConfig, run_repro
    from cglab.bench import load_results
    from cglab.lab.anatomy import graph_pieces
    from cglab.lab.draw import draw_divergence, draw_graph_anatomy
    from cglab.lab.express import draw_recordings, recorded_ops
    from cglab.lab.notebook import setup_notebook
    from cglab.lab.plots import plot_ladder

    device = setup_notebook("cpu")  # one thread, the simulator: what the committed notebooks show
    runs = {
        f"{path} capture path": run_repro(CompilationConfig("piecewise", legacy_skip_attn=legacy), device=device)
        for path, legacy in (("old", True), ("fixed", False))
    }
    one_size = {
        legacy: ModelRunner(ToyConfig(), CompilationConfig("piecewise", (4,), legacy_skip_attn=legacy), device=device)
        for legacy in (False, True)
    }
    ladder = plot_ladder(load_results(ROOT / "data" / "h200_ladder_8x1024_bf16"), 1).figure
    plt.close(ladder)
    divergence = draw_divergence(runs)
    divergence.axes[0].xaxis.set_major_locator(MaxNLocator(integer=True))  # decode steps are whole numbers
    full, side = (12.1, 5.1), (7.0, 6.7)  # a slide's figure box under a heading and a caption; beside text
    return {
        "divergence": for_projection(divergence, full),
        "anatomy": for_projection(
            draw_graph_anatomy({"fixed": graph_pieces(one_size[False]), "old path": graph_pieces(one_size[True])}), full
        ),
        "recordings": for_projection(
            draw_recordings(
                recorded_ops(one_size[False]),
                recorded_ops(one_size[True]),
                labels=("with metadata", "without"),
                note="red: the short conv's kernel",
            ),
            side,
        ),
        "ladder": for_projection(ladder, full),
    }


ENGLISH_FONTS = {
    "serif": "Georgia, serif",
    "sans": "system-ui, sans-serif",
    "mono": "Menlo, Consolas, monospace",
    "size": "11pt",
    "leading": "1.3",
}
# Latin text keeps the English faces; each Chinese character falls through to the first CJK face the machine has
# (macOS, Windows, then Linux's Noto/Source Han and WenQuanYi). The handout's body is 10.5 pt (五号, the usual
# size of Chinese documents) at 1.36: the same 14.3 pt line as the English, so one page holds the same lines.
CJK_SANS = '"PingFang SC", "Hiragino Sans GB", "Microsoft YaHei", "Noto Sans CJK SC", "Source Han Sans SC", "WenQuanYi Micro Hei"'
CHINESE_FONTS = {
    "serif": f'Georgia, "Songti SC", STSong, SimSun, "Noto Serif CJK SC", "Source Han Serif SC", {CJK_SANS}, serif',
    "sans": f"system-ui, -apple-system, {CJK_SANS}, sans-serif",
    "mono": f'Menlo, Consolas, "Noto Sans Mono CJK SC", {CJK_SANS}, monospace',
    "size": "10.5pt",
    "leading": "1.36",
}


@dataclass(frozen=True)
class Language:
    """One language of the kit: its sources, where its pages go, its fonts and the slides' own words."""

    code: str  # the pages' lang attribute
    folder: str  # under the kit's folder ("" for the English)
    handout: Path
    answers: Path
    facilitator: Path
    questions: str  # FACILITATOR.md's heading over the questions to discuss
    fonts: dict[str, str]
    words: dict[str, str] = field(repr=False)

    def ref(self, notebook: str, heading: str) -> str:
        """A section named as the reader's notebook titles it: " (04, *The silent divergence*)"; in Chinese,
        the heading of the Chinese notebook where one exists, found by the English cell's id (less a time in
        brackets where ``heading`` leaves the English one's out)."""
        if self.folder == "":
            return f" ({notebook}, *{heading}*)"
        path = next((ROOT / "notebooks").glob(f"{notebook}_*.ipynb"))
        chinese = ROOT / "notebooks" / self.folder / path.name
        cells = json.loads(chinese.read_text(encoding="utf-8"))["cells"] if chinese.exists() else []
        by_id = {c["id"]: "".join(c["source"]).splitlines() for c in cells if c["cell_type"] == "markdown"}
        for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
            lines = [line for line in "".join(cell["source"]).splitlines() if line.startswith("#")]
            theirs = [line for line in by_id.get(cell["id"], []) if line.startswith("#")]
            at = next((i for i, line in enumerate(lines) if line.lstrip("#").strip().startswith(heading)), None)
            if at is not None and len(theirs) == len(lines):
                name = theirs[at].lstrip("#").strip()
                if lines[at].lstrip("#").strip() != heading:
                    name = re.sub(r"\s*[（(][^（()）]*[）)]$", "", name)
                return f"（{notebook}，*{name}*）"
        return f"（{notebook}，*{heading}*，英文版）"


ENGLISH_WORDS = {
    "page": "cglab: the missing-metadata bug, slides",
    "title": "The missing-metadata bug",
    "divergence": "Wrong numbers, and no error",
    "divergence_caption": "Each decode step against the eager model. Red: graphs captured the old way; blue: the "
    "fixed way; dashed: float rounding.",
    "anatomy": "The same cut, fewer ops",
    "anatomy_caption": "Compiled PIECEWISE: three graphs, attention eager between them. The old path's graphs "
    "recorded fewer ops: the stateful layers' kernels are missing.",
    "recordings": "What the first piece recorded",
    "recordings_text": "The short conv needs attention metadata for its conv state.\n"
    "Without it, the layer assumes a *profiling run* and returns its input unchanged.\n"
    "The old path built none at capture, so the graph recorded that no-op, and every replay repeats it.",
    "fix": "The fix, PR #49364",
    "ladder": "What graphs buy",
    "ladder_caption": "One decode step of an 8-layer model at batch 1, recorded on an NVIDIA H200.",
    "questions": "Questions to discuss",
}
# The Chinese slides' own words, in the terms of the Chinese glossary (图 for CUDA graphs only; a picture is a
# 图表); they name the figures' English labels.
CHINESE_WORDS = {
    "page": "cglab：缺失元数据的 bug（幻灯片）",
    "title": "缺失元数据的 bug",
    "divergence": "数值错了，却没有报错",
    "divergence_caption": "每个 decode step 与 eager 模型的差值（decode step：第几步；max |replay - eager|：最大误差）。"
    "红色（old capture path）：按旧方式捕获的图；蓝色（fixed capture path）：按修复后的方式；虚线（tolerance）：浮点舍入。",
    "anatomy": "同样的切分，更少的算子",
    "anatomy_caption": "Compiled PIECEWISE：三个子图，注意力在它们之间以 eager 方式运行。旧路径（old path）的子图"
    "录下的算子更少：有状态层的 kernel 不见了。",
    "recordings": "第一个子图录下了什么",
    "recordings_text": "短卷积需要注意力元数据来读写它的卷积状态。\n"
    "没有元数据时，这一层以为是一次 *profiling run*，把输入原样返回。\n"
    "旧路径在捕获时不构建元数据，于是图录下了这个空操作，之后每次重放都重复它。\n"
    "图表中 with metadata 为有元数据，without 为没有；红色（red）是短卷积的 kernel。",
    "fix": "修复：PR #49364",
    "ladder": "CUDA 图带来了什么",
    "ladder_caption": "8 层模型在 batch 1 时一个 decode step 的耗时，在 NVIDIA H200 上录得。",
    "questions": "讨论题",
}
ENGLISH = Language(
    "en", "", KIT / "handout.md", KIT / "answers.md", ROOT / "notebooks" / "FACILITATOR.md",
    "Questions to discuss", ENGLISH_FONTS, ENGLISH_WORDS,
)  # fmt: skip
CHINESE = Language(
    "zh-CN", "zh", ROOT / "notebooks/zh/handout.md", ROOT / "notebooks/zh/answers.md",
    ROOT / "notebooks/zh/FACILITATOR.md", "讨论题", CHINESE_FONTS, CHINESE_WORDS,
)  # fmt: skip
LANGUAGES = (ENGLISH, CHINESE)


def _section(markdown: str, heading: str) -> str:
    """The text under the first heading that starts with ``heading``, up to the next heading."""
    match = re.search(rf"^#+ {re.escape(heading)}.*?\n(.*?)(?=^#|\Z)", markdown, re.MULTILINE | re.DOTALL)
    if not match:
        raise SystemExit(f"build_kit: no section '{heading}' to take the slides' words from")
    return match.group(1).strip()


def slides_html(figures: dict[str, SlideFigure], lang: Language = ENGLISH) -> str:
    handout, words = lang.handout.read_text(encoding="utf-8"), lang.words
    paragraphs = handout.split("\n\n")
    lead = next(i for i, p in enumerate(paragraphs) if p.startswith("**"))  # "**The bug in two sentences.** ..."
    two_sentences, caveat = re.sub(r"^\*\*[^*]+\*\*\s*", "", paragraphs[lead]), paragraphs[lead + 1]
    diff, after = re.search(r"```diff\n(.*?)```\n\n(.*?)(?:\n\n|\Z)", handout, re.DOTALL).groups()
    questions = re.findall(
        r"^\d+\. (.*?)(?=^\d+\. |\Z)",
        _section(lang.facilitator.read_text(encoding="utf-8"), lang.questions),
        re.MULTILINE | re.DOTALL,
    )[:4]

    def md(text: str) -> str:
        return mistune.html(" ".join(text.split()))

    def figure_slide(name: str, ref: tuple[str, str]) -> str:
        caption = md(words[name + "_caption"] + lang.ref(*ref))
        return f"<h2>{words[name]}</h2>{png(figures[name])}<div class='caption'>{caption}</div>"

    slides = [
        f"<h1>{words['title']}</h1>{md(two_sentences)}<div class='caption'>{md(caveat)}</div>",
        figure_slide("divergence", ("04", "The silent divergence")),
        figure_slide("anatomy", ("04", "The state that never changes")),
        f"<div class='side'>{png(figures['recordings'])}<div><h2>{words['recordings']}</h2>"
        + "".join(md(line) for line in words["recordings_text"].splitlines())
        + f"<div class='caption'>{md(lang.ref('00b', '2 · The picture'))}</div></div></div>",
        f"<h2>{words['fix']}</h2><pre>{html.escape(diff)}</pre>{md(after)}",
        figure_slide("ladder", ("05", "The ladder, rung by rung")),
        f"<h2>{words['questions']}</h2><ol>"
        + "".join(f"<li>{mistune.html(' '.join(q.split()))[3:-5]}</li>" for q in questions)
        + "</ol>",
    ]
    body = "".join(
        f"<section class='slide'>{content}<span class='number'>{i} / {len(slides)}</span></section>"
        for i, content in enumerate(slides, 1)
    )
    return page(words["page"], body, SLIDES_CSS, lang, SLIDES_JS)


def page(title: str, body: str, css: str, lang: Language, script: str = "") -> str:
    script = f"<script>{script}</script>" if script else ""
    fonts = ":root { " + " ".join(f"--{name}: {value};" for name, value in lang.fonts.items()) + " }\n"
    return (
        f"<!doctype html>\n<html lang='{lang.code}'><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{fonts}{css}</style></head><body>{body}{script}</body></html>\n"
    )


def markdown_page(source: Path, css: str, lang: Language) -> str:
    text = source.read_text(encoding="utf-8")
    title = text.splitlines()[0].lstrip("# ")
    return page(title, mistune.create_markdown(plugins=["table"])(text), css, lang)


def build(out: Path, figures: dict[str, SlideFigure] | None = None) -> dict[str, SlideFigure]:
    """Write the kit into ``out``, each language's pages into its folder; return the slides' figures (drawn
    here once, for every language, unless given)."""
    figures = slide_figures() if figures is None else figures
    for lang in LANGUAGES:
        folder = out / lang.folder
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "handout.html").write_text(markdown_page(lang.handout, HANDOUT_CSS, lang), encoding="utf-8")
        (folder / "answers.html").write_text(markdown_page(lang.answers, DOC_CSS, lang), encoding="utf-8")
        (folder / "slides.html").write_text(slides_html(figures, lang), encoding="utf-8")
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "kit", help="where to write (default build/kit)")
    args = parser.parse_args(argv)
    build(args.out)
    print(f"wrote {args.out}/handout.html, answers.html and slides.html, and the Chinese ones in {args.out}/zh/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
