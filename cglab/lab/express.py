"""The express path's picture (notebook 00b): the ops a compiled piece recorded with metadata and without."""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import dataclass

from matplotlib.figure import Figure

from cglab.config import CUDAGraphMode
from cglab.errors import ConfigError
from cglab.graphs.sim import SimSegment
from cglab.lab.draw import new_figure, patch_legend
from cglab.runner import ModelRunner

_KEPT, _LOST = "#4e79a7", "#e15759"


def _short(func: object) -> str:
    """``aten.index_put_.default`` -> ``"index_put_"``: the op's name without namespace or overload."""
    parts = str(func).split(".")
    return parts[1] if len(parts) >= 2 and parts[0] == "aten" else str(func)


def recorded_ops(runner: ModelRunner, piece: str = "submod_0") -> list[str]:
    """The ops compiled piece ``piece`` recorded for the first PIECEWISE descriptor, as short aten names."""
    compiled = runner.compiled_backend
    if compiled is None or not compiled.wrappers or not runner.graph_replays():
        raise ConfigError("recorded_ops needs compiled PIECEWISE graphs: build ModelRunner(config, 'piecewise')")
    desc = next(d for d in runner.graph_replays() if d.cg_mode is CUDAGraphMode.PIECEWISE)
    wrapper = compiled.wrappers.get(piece)
    if wrapper is None:
        split = any(i.submod_name == piece for i in compiled.items)
        what = "a splitting op, run eagerly: it records nothing" if split else "not a piece of this graph"
        raise ConfigError(f"{piece} is {what}; the captured pieces are {', '.join(compiled.wrappers)}")
    ops = []
    for step in wrapper.entries[desc].graph.steps:
        if not isinstance(step, SimSegment):
            raise ConfigError("only the simulator keeps the ops a graph recorded: build the runner with device='cpu'")
        ops += [_short(record[1]) for record in step._records or ()]
    return ops


@dataclass(frozen=True)
class OpRow:
    """One line of two recordings side by side: the op, and whether each recording has it there."""

    op: str
    in_first: bool
    in_second: bool


def compare_recordings(first: Sequence[str], second: Sequence[str]) -> list[OpRow]:
    """Line two op lists up in order (a diff): ops both recorded share a row, the others get one each."""
    rows = []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(a=list(first), b=list(second), autojunk=False).get_opcodes():
        rows += [OpRow(op, True, tag == "equal") for op in first[i1:i2]]
        if tag != "equal":
            rows += [OpRow(op, False, True) for op in second[j1:j2]]
    return rows


def describe_recordings(first: Sequence[str], second: Sequence[str]) -> str:
    """The two recordings (with metadata, without) as two text columns; ``---`` where one recorded nothing."""
    labels = ("with metadata", "without metadata")
    rows = compare_recordings(first, second)
    width = max([len(labels[0]), *(len(r.op) for r in rows)]) + 2
    lines = [f"  {labels[0]:<{width}}{labels[1]}"]
    for r in rows:
        left, right = (r.op if r.in_first else "---"), (r.op if r.in_second else "---")
        mark = "" if r.in_first == r.in_second else "   <- only " + (labels[0] if r.in_first else labels[1])
        lines.append(f"  {left:<{width}}{right}{mark}")
    lines.append(f"  {len(first)} ops{'':<{width - len(str(len(first))) - 4}}{len(second)} ops")
    return "\n".join(lines)


def draw_recordings(
    first: Sequence[str],
    second: Sequence[str],
    piece: str = "submod_0",
    labels: tuple[str, str] = ("with metadata (fixed)", "without metadata (legacy)"),
    note: str = "",
) -> Figure:
    """``compare_recordings`` as two columns of boxes, one per op: ops only one recording has in red."""
    rows = compare_recordings(first, second)
    fig, ax = new_figure(7, 0.24 * len(rows) + 1.3)
    for y, row in enumerate(rows):
        for x, present in ((0, row.in_first), (1, row.in_second)):
            color = "white" if not present else _LOST if row.in_first != row.in_second else _KEPT
            ax.barh(-y, 0.9, left=x + 0.05, height=0.8, color=color, edgecolor="black", hatch="" if present else "//")
            label, ink = (row.op, "white") if present else ("nothing recorded", "black")
            box = None if present else {"facecolor": "white", "edgecolor": "none", "pad": 1}
            ax.text(x + 0.5, -y, label, ha="center", va="center", fontsize=7, color=ink, bbox=box)
    for x, (label, ops) in enumerate(zip(labels, (first, second))):
        ax.text(x + 0.5, 0.8, f"{label}: {len(ops)} ops", ha="center", va="bottom", fontsize=9, weight="bold")
    ax.set(xlim=(0, 2), ylim=(-len(rows) + 0.4, 1.6))
    ax.axis("off")
    title = f"what the graph of {piece} recorded at capture, in order" + (f"\n{note}" if note else "")
    ax.set_title(title, fontsize=10)
    patch_legend(ax, {"recorded by both": _KEPT, "recorded by one only": _LOST}, "upper center", (0.5, 0.0))
    fig.tight_layout()
    return fig
