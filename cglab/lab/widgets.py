"""Interactive explorers: pure functions of their controls returning a figure, and ``interactive_*``
wrappers whose initial values draw the same figure where widgets do not run."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from matplotlib.figure import Figure

from cglab.bench import BenchResult
from cglab.config import ToyConfig
from cglab.errors import ConfigError
from cglab.lab.divergence import (
    LAYER_MIXES,
    cached_repro,
    case_label,
    divergence_explorer,
    interactive_divergence_explorer,
    verdict,
    verdict_table,
)
from cglab.lab.draw import DPI, draw_caches, expect
from cglab.lab.interactive import interactive
from cglab.runner import ModelRunner

__all__ = [
    "LAYER_MIXES",
    "MULTI_SELECT_HINT",
    "cached_repro",
    "case_label",
    "decode_explorer",
    "decode_scenario",
    "divergence_explorer",
    "interactive_decode_explorer",
    "interactive_divergence_explorer",
    "interactive_latency_explorer",
    "last_written_slots",
    "latency_explorer",
    "verdict",
    "verdict_table",
]

PROMPT_LENGTHS = (5, 9, 3)  # three requests of different lengths: their blocks fill at different steps


def decode_scenario(
    runner: ModelRunner, steps: int, prompt_lengths: Sequence[int] = PROMPT_LENGTHS
) -> list[torch.Tensor]:
    """Each decode step's logits after an eager prefill of one request per prompt length (eager, so every
    runner starts from identical caches)."""
    longest = max(prompt_lengths, default=0)
    room = runner.config.max_model_len - longest
    if isinstance(steps, bool) or not isinstance(steps, int) or not 0 <= steps <= room:
        raise ConfigError(
            f"the decode steps must be a whole number from 0 to {room} (max_model_len "
            f"{runner.config.max_model_len} minus the longest prompt, {longest} tokens), got {steps!r}"
        )
    vocab = runner.config.vocab_size
    for i, length in enumerate(prompt_lengths):
        runner.add_request(f"req{i}")
        runner.step({f"req{i}": [(7 * i + 3 * j + 1) % vocab for j in range(length)]}, eager=True)
    return [
        runner.step({f"req{i}": [(11 * i + 5 * step + 2) % vocab] for i in range(len(prompt_lengths))}).logits
        for step in range(steps)
    ]


def last_written_slots(runner: ModelRunner) -> list[int]:
    """The cache slot of every request's latest token."""
    return [r.slot(r.num_computed_tokens - 1, runner.config.block_size) for r in runner.requests.values()]


def decode_explorer(step: int = 4, *, device: str = "cpu") -> Figure:
    """The caches of an eager toy engine after the prefill and ``step`` decode steps."""
    runner = ModelRunner(ToyConfig(), "none", device=device)
    decode_scenario(runner, step)
    what = "the prefill" if step == 0 else f"the prefill and {step} decode step{'s' * (step != 1)}"
    title = f"after {what} (triangles: the slots the last step wrote)"
    return draw_caches(runner, last_written_slots(runner), title=title)


def latency_explorer(
    result: BenchResult, modes: Sequence[str] | None = None, batch_sizes: Sequence[int] | None = None
) -> Figure:
    """Replay latency against batch size for the chosen modes and batch sizes of a bench result (None: all
    of them); an empty choice draws only a line asking for one."""
    from cglab.lab.plots import plot_latency

    expect(
        result, BenchResult, "latency_explorer takes a BenchResult, e.g. load_results('data/...csv') or run_bench(...)"
    )
    missing = [
        what for what, chosen in (("mode", modes), ("batch size", batch_sizes)) if chosen is not None and not chosen
    ]
    if missing:
        return _message_figure(f"select at least one {' and one '.join(missing)}")
    rows = [
        r
        for r in result.rows
        if (modes is None or r["mode"] in modes) and (batch_sizes is None or r["batch_size"] in batch_sizes)
    ]
    fig = Figure(figsize=(7, 4.5), dpi=DPI, layout="constrained")
    plot_latency(BenchResult(rows, result.environment, result.config), fig.add_subplot())
    return fig


def _message_figure(message: str) -> Figure:
    """A figure of one line of text, in a frameless axes: IPython shows a figure with no axes as text only."""
    fig = Figure(figsize=(7, 0.4), dpi=DPI)
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_axis_off()
    ax.text(0.01, 0.5, message, va="center", fontsize=11)
    return fig


def interactive_decode_explorer(*, device: str = "cpu") -> Any:
    """A slider over decode steps; the caches redraw at each step."""
    import ipywidgets as widgets

    step = widgets.IntSlider(value=4, min=0, max=12, description="decode step")
    return interactive(decode_explorer, {"step": step}, device=device)


MULTI_SELECT_HINT = "Ctrl-click (Cmd-click on a Mac) picks several modes or batch sizes, Shift-click a range"


def interactive_latency_explorer(result: BenchResult) -> Any:
    """Pick the modes and batch sizes to compare; the latency plot redraws. A line above the lists says how
    to pick several (a plain click keeps one)."""
    import ipywidgets as widgets

    modes = result.modes
    batches = sorted({r["batch_size"] for r in result.rows})
    # Every option in view (up to 10 rows): the lists show 5 by default, and a mode below them goes unseen.
    controls = {
        name: widgets.SelectMultiple(
            options=options,
            value=tuple(options),
            description=name.replace("_", " "),
            rows=min(len(options), 10),
            tooltip=MULTI_SELECT_HINT,
        )
        for name, options in (("modes", modes), ("batch_sizes", batches))
    }
    return interactive(latency_explorer, controls, hint=MULTI_SELECT_HINT, result=result)
