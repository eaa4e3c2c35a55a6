"""Which builders can build a PIECEWISE capture batch's metadata before vLLM PR #49364 (breakable PIECEWISE:
``for_capture=True``) and after it (``False``), by ``can_build_metadata``, the rule the builders apply."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from matplotlib.colors import to_rgb
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from cglab.config import check_int, check_sizes, dummy_query_lens
from cglab.cudagraph_support import AttentionCGSupport, can_build_metadata
from cglab.lab.draw import DPI

__all__ = ["CaptureBatchSupport", "capture_support", "draw_capture_support"]

# cglab.lab.draw's colours: a request's green, the red of what goes wrong, the grey of plain facts (no verdict)
_CAN, _CANNOT, _INFO = to_rgb("#59a14f"), (0.85, 0.1, 0.1), (0.9, 0.9, 0.9)
_FOR_CAPTURE = (True, False)  # breakable PIECEWISE before and after PR #49364


@dataclass(frozen=True)
class CaptureBatchSupport:
    """One capture size: its dummy batch and, per support level, whether a builder of that level can build
    its metadata before the fix (``old``) and after it (``fixed``)."""

    num_tokens: int
    query_lens: tuple[int, ...]
    old: dict[AttentionCGSupport, bool]
    fixed: dict[AttentionCGSupport, bool]

    @property
    def decode_shaped(self) -> bool:
        return all(q == 1 for q in self.query_lens)

    def describe_batch(self) -> str:
        """``"8 reqs x 2 tokens"``, ``"2 x 1 + 2 x 2 tokens"`` (the dummy split: the longer requests last)."""
        first, last, n = self.query_lens[0], self.query_lens[-1], len(self.query_lens)
        if first == last:
            return f"{n} req{'s' if n > 1 else ''} x {first} token{'s' if first > 1 else ''}"
        longer = self.query_lens.count(last)
        return f"{n - longer} x {first} + {longer} x {last} tokens"


def capture_support(max_num_reqs: int, capture_sizes: Sequence[int]) -> list[CaptureBatchSupport]:
    """The rows of ``draw_capture_support``, smallest capture size first."""
    check_int("max_num_reqs", max_num_reqs)
    rows = []
    for size in sorted(set(check_sizes("capture size", capture_sizes, example="(1, 2, 4, 8)"))):
        query_lens = tuple(dummy_query_lens(min(size, max_num_reqs), size))
        shape = {"num_reqs": len(query_lens), "num_tokens": size, "max_query_len": max(query_lens)}
        old, fixed = (
            {s: can_build_metadata(s, **shape, for_capture=f) for s in AttentionCGSupport} for f in _FOR_CAPTURE
        )
        rows.append(CaptureBatchSupport(size, query_lens, old, fixed))
    return rows


def _level_label(level: AttentionCGSupport) -> str:
    return level.name.replace("UNIFORM_SINGLE_TOKEN_DECODE", "UNIFORM_SINGLE_\nTOKEN_DECODE").replace(
        "UNIFORM_BATCH", "UNIFORM_\nBATCH"
    )


def draw_capture_support(max_num_reqs: int, capture_sizes: Sequence[int]) -> Figure:
    """One row per capture size: the dummy batch breakable PIECEWISE captures on, ``for_capture`` before
    and after vLLM PR #49364, and for each ``AttentionCGSupport`` level whether a builder of that level
    can build the metadata (green) or fails at capture (red)."""
    rows = capture_support(max_num_reqs, capture_sizes)
    levels = list(AttentionCGSupport)
    columns = 3 + 2 * len(levels)  # batch, old for_capture, old levels, fixed for_capture, fixed levels
    image = np.ones((len(rows), columns, 3))
    old_start, fixed_start = 2, 3 + len(levels)
    fig = Figure(figsize=(12.5, 0.5 * len(rows) + 2.6), dpi=DPI)
    ax = fig.add_subplot()
    for y, row in enumerate(rows):
        cells = [(0, f"{row.describe_batch()}\n({'decode' if row.decode_shaped else 'prefill'}-shaped)", _INFO)]
        for start, for_capture, verdicts in zip((old_start, fixed_start), _FOR_CAPTURE, (row.old, row.fixed)):
            cells.append((start - 1, f"for_capture=\n{for_capture}", _INFO))
            cells += [
                (start + i, "can" if verdicts[level] else "fails", _CAN if verdicts[level] else _CANNOT)
                for i, level in enumerate(levels)
            ]
        for x, text, color in cells:
            image[y, x] = color
            ax.text(x, y, text, ha="center", va="center", fontsize=7.5, color="black" if color == _INFO else "white")
    ax.imshow(image, aspect="auto", interpolation="nearest")
    for x in range(columns + 1):
        ax.axvline(x - 0.5, color="white", lw=2)
    for x in (old_start - 1, fixed_start - 1):  # the two halves: before the fix, after it
        ax.axvline(x - 0.5, color="black", lw=1.5)
    for y in range(len(rows) + 1):
        ax.axhline(y - 0.5, color="white", lw=2)
    ax.set_yticks(range(len(rows)), [f"{r.num_tokens} token{'s' if r.num_tokens > 1 else ''}" for r in rows])
    ax.set_ylabel("capture size")
    labels = ["dummy batch", "before #49364", *map(_level_label, levels), "after #49364", *map(_level_label, levels)]
    ax.set_xticks(range(columns), labels, fontsize=7.5)
    ax.xaxis.tick_top()
    ax.tick_params(length=0)
    ax.set_title(
        f"breakable PIECEWISE capture, max_num_reqs={max_num_reqs}: can a builder of each "
        "cudagraph_support level build the metadata?",
        pad=12,
    )
    ax.legend(
        handles=[
            Patch(color=_CAN, label="can build it"),
            Patch(color=_CANNOT, label="fails at capture (MetadataBuildError)"),
        ],
        loc="upper center",
        bbox_to_anchor=(0.5, -0.02),
        ncol=2,
        fontsize="small",
        frameon=False,
    )
    fig.tight_layout()
    return fig
