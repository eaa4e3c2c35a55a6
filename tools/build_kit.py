"""The facilitator's kit (``make kit``): a handout, the model answers and slides, built offline into build/kit/.

    python tools/build_kit.py [--out build/kit]

- ``handout.html``: docs/facilitator/handout.md, laid out for one A4 page (print it from a browser);
- ``answers.html``: docs/facilitator/answers.md, model answers to FACILITATOR.md's questions;
- ``slides.html``: seven 16:9 slides of 1280 x 720 CSS pixels (13.3 x 7.5 inches, a projector's usual
  slide), in one file with every image embedded. The figures are drawn by the suite's own plotting code,
  from fresh runs of the toy engine on the CPU simulator (as the notebooks draw them) and from the
  recorded H200 data; every text in them is at least 12 pt at the size shown. The slides' words come
  from the handout and FACILITATOR.md, so they say what those say.

Nothing is fetched: the Markdown is rendered by mistune (installed with Jupyter's nbconvert).
"""

from __future__ import annotations

import argparse
import base64
import html
import io
import re
import sys
from dataclasses import dataclass
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
HANDOUT_CSS = """@page { size: A4; margin: 15mm; }
body { font: 11pt/1.3 Georgia, serif; max-width: 180mm; margin: 0 auto; }
h1 { font-size: 16pt; margin: 0 0 4pt; } h2 { font-size: 12.5pt; margin: 8pt 0 2pt; }
p, ol, ul { margin: 3pt 0; } li { margin: 0; }
pre { font: 8pt/1.25 Menlo, Consolas, monospace; margin: 3pt 0; padding: 3pt 5pt; background: #f4f4f4; }
code { font-family: Menlo, Consolas, monospace; font-size: 9pt; } pre code { font-size: inherit; }"""
DOC_CSS = """body { font: 12pt/1.45 system-ui, sans-serif; max-width: 46em; margin: 2em auto; padding: 0 1em; }
code { font-size: 11pt; } h2 { margin-top: 1.6em; }"""
SLIDES_CSS = """body { margin: 0; background: #333; font-family: system-ui, sans-serif; }
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


def _section(markdown: str, heading: str) -> str:
    """The text under the first heading that starts with ``heading``, up to the next heading."""
    match = re.search(rf"^#+ {re.escape(heading)}.*?\n(.*?)(?=^#|\Z)", markdown, re.MULTILINE | re.DOTALL)
    if not match:
        raise SystemExit(f"build_kit: no section '{heading}' to take the slides' words from")
    return match.group(1).strip()


def slides_html(figures: dict[str, SlideFigure]) -> str:
    handout = (KIT / "handout.md").read_text(encoding="utf-8")
    facilitator = (ROOT / "notebooks" / "FACILITATOR.md").read_text(encoding="utf-8")
    two_sentences, caveat = handout.split("**The bug in two sentences.**", 1)[1].split("\n\n", 2)[:2]
    diff = re.search(r"```diff\n(.*?)```", handout, re.DOTALL).group(1)
    questions = re.findall(
        r"^\d+\. (.*?)(?=^\d+\. |\Z)", _section(facilitator, "Questions to discuss"), re.MULTILINE | re.DOTALL
    )[:4]

    def md(text: str) -> str:
        return mistune.html(" ".join(text.split()))

    def figure_slide(title: str, name: str, caption: str) -> str:
        return f"<h2>{title}</h2>{png(figures[name])}<p class='caption'>{html.escape(caption)}</p>"

    slides = [
        f"<h1>The missing-metadata bug</h1>{md(two_sentences)}<div class='caption'>{md(caveat)}</div>",
        figure_slide(
            "Wrong numbers, and no error",
            "divergence",
            "Each decode step against the eager model. Red: graphs captured the old way; blue: the fixed "
            "way; dashed: float rounding. (04, The silent divergence)",
        ),
        figure_slide(
            "The same cut, fewer ops",
            "anatomy",
            "Compiled PIECEWISE: three graphs, attention eager between them. The old path's graphs "
            "recorded fewer ops: the stateful layers' kernels are missing. (04, The state that never changes)",
        ),
        f"<div class='side'>{png(figures['recordings'])}<div><h2>What the first piece recorded</h2>"
        + md("The short conv needs attention metadata for its conv state.")
        + md("Without it, the layer assumes a *profiling run* and returns its input unchanged.")
        + md("The old path built none at capture, so the graph recorded that no-op, and every replay repeats it.")
        + "<p class='caption'>(00b, 2 · The picture)</p></div></div>",
        f"<h2>The fix, PR #49364</h2><pre>{html.escape(diff)}</pre>"
        + md("Metadata is always built at capture: capture-safe for FULL graphs, ordinary for PIECEWISE.")
        + md("It rests on one assumption: every builder writes each step's values into the same buffers."),
        figure_slide(
            "What graphs buy",
            "ladder",
            "One decode step of an 8-layer model at batch 1, recorded on an NVIDIA H200. (05, The ladder, "
            "rung by rung)",
        ),
        "<h2>Questions to discuss</h2><ol>"
        + "".join(f"<li>{mistune.html(' '.join(q.split()))[3:-5]}</li>" for q in questions)
        + "</ol>",
    ]
    body = "".join(
        f"<section class='slide'>{content}<span class='number'>{i} / {len(slides)}</span></section>"
        for i, content in enumerate(slides, 1)
    )
    return page("cglab: the missing-metadata bug, slides", body, SLIDES_CSS, SLIDES_JS)


def page(title: str, body: str, css: str, script: str = "") -> str:
    script = f"<script>{script}</script>" if script else ""
    return (
        f"<!doctype html>\n<html lang='en'><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{css}</style></head><body>{body}{script}</body></html>\n"
    )


def markdown_page(source: Path, css: str) -> str:
    text = source.read_text(encoding="utf-8")
    title = text.splitlines()[0].lstrip("# ")
    return page(title, mistune.create_markdown(plugins=["table"])(text), css)


def build(out: Path, figures: dict[str, SlideFigure] | None = None) -> dict[str, SlideFigure]:
    """Write the kit into ``out``; return the slides' figures (drawn here unless given)."""
    figures = slide_figures() if figures is None else figures
    out.mkdir(parents=True, exist_ok=True)
    (out / "handout.html").write_text(markdown_page(KIT / "handout.md", HANDOUT_CSS), encoding="utf-8")
    (out / "answers.html").write_text(markdown_page(KIT / "answers.md", DOC_CSS), encoding="utf-8")
    (out / "slides.html").write_text(slides_html(figures), encoding="utf-8")
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "kit", help="where to write (default build/kit)")
    args = parser.parse_args(argv)
    build(args.out)
    print(f"wrote {args.out}/handout.html, answers.html and slides.html")
    return 0


if __name__ == "__main__":
    sys.exit(main())
