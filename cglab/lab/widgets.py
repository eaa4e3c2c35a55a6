"""Interactive explorers for the notebooks.

Each explorer is a pure function of its controls that computes and returns a figure
(``decode_explorer``, ``divergence_explorer``, ``latency_explorer``): tests call them directly and
a notebook shows them as static figures. ``interactive_*`` wraps one in ipywidgets controls whose
initial values draw the same figure, so the notebook reads well even where widgets do not run.
"""

from __future__ import annotations

import functools
import inspect
import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch
from matplotlib.figure import Figure

from cglab.bench import BenchResult
from cglab.config import PIECEWISE_FLAVORS, CUDAGraphMode, ToyConfig, parse_piecewise_flavor
from cglab.lab.draw import DPI, draw_caches, draw_divergence
from cglab.errors import ConfigError
from cglab.repro import ReproResult, run_repro
from cglab.runner import ModelRunner

__all__ = [
    "LAYER_MIXES", "cached_repro", "case_label", "decode_explorer", "decode_scenario", "divergence_explorer",
    "interactive_decode_explorer", "interactive_divergence_explorer", "interactive_latency_explorer",
    "last_written_slots", "latency_explorer", "verdict", "verdict_table",
]

PROMPT_LENGTHS = (5, 9, 3)  # three requests of different lengths: their blocks fill at different steps
LAYER_MIXES = ("sconv,attn,compressor,attn", "sconv,attn", "compressor,attn", "attn,attn")


def decode_scenario(runner: ModelRunner, steps: int,
                    prompt_lengths: Sequence[int] = PROMPT_LENGTHS) -> list[torch.Tensor]:
    """Prefill one request per prompt length, then run ``steps`` decode steps over all of them. Returns
    each decode step's logits.

    The toy prefills eagerly so that every runner's decode steps start from identical caches. vLLM does
    not run short prefills eagerly: they go through the dispatcher like any batch (PIECEWISE graphs, or
    eager only above the capture sizes)."""
    longest = max(prompt_lengths, default=0)
    room = runner.config.max_model_len - longest
    if isinstance(steps, bool) or not isinstance(steps, int) or not 0 <= steps <= room:
        raise ConfigError(f"the decode steps must be a whole number from 0 to {room} (max_model_len "
                          f"{runner.config.max_model_len} minus the longest prompt, {longest} tokens), got {steps!r}")
    vocab = runner.config.vocab_size
    for i, length in enumerate(prompt_lengths):
        runner.add_request(f"req{i}")
        runner.step({f"req{i}": [(7 * i + 3 * j + 1) % vocab for j in range(length)]}, eager=True)
    return [runner.step({f"req{i}": [(11 * i + 5 * step + 2) % vocab] for i in range(len(prompt_lengths))}).logits
            for step in range(steps)]


def last_written_slots(runner: ModelRunner) -> list[int]:
    """The cache slot of every request's latest token."""
    bs = runner.config.block_size
    return [r.slot(r.num_computed_tokens - 1, bs)
            for r in runner.requests.values()]


def decode_explorer(step: int = 4, *, device: str = "cpu") -> Figure:
    """The caches of an eager toy engine after the prefill and ``step`` decode steps."""
    runner = ModelRunner(ToyConfig(), "none", device=device)
    decode_scenario(runner, step)
    what = "the prefill" if step == 0 else f"the prefill and {step} decode step{'s' * (step != 1)}"
    title = f"after {what} (triangles: the slots the last step wrote)"
    return draw_caches(runner, last_written_slots(runner), title=title)


def verdict(result: ReproResult) -> str:
    """One phrase, the same on every backend: what happened to the graph runner."""
    if not isinstance(result, ReproResult):
        raise ConfigError(f"verdict takes a ReproResult, e.g. verdict(run_repro('piecewise')); got "
                          f"{type(result).__name__}")
    if result.error:
        return f"capture failed loudly ({result.error.split(':')[0]})"
    if result.diverged:
        return "DIVERGED from eager, and nothing raised"
    if result.mode != "none" and not result.replayed_graphs:
        return "no graph replayed (every step ran eagerly)"
    return "matches eager"


def case_label(mode: str, legacy: bool, flavor: str = "compiled") -> str:
    """``"PIECEWISE compiled legacy"``: a repro case as the explorers and tables name it. The flavor is
    named only where a PIECEWISE graph is captured; FULL-only and eager cases do not depend on it."""
    cg_mode = CUDAGraphMode.parse(mode)
    flavor = parse_piecewise_flavor(flavor)
    if not isinstance(legacy, bool):  # "no" would read as legacy
        raise ConfigError(f"legacy must be True (the code before the fix) or False, got {legacy!r}")
    named = f" {flavor}" if CUDAGraphMode.PIECEWISE in cg_mode.runtime_modes() else ""
    return f"{cg_mode.name}{named} {'legacy' if legacy else 'fixed'}"


_REPRO_PARAMETERS = inspect.signature(run_repro)


@functools.lru_cache(maxsize=256)
def _remembered_repro(options: tuple[tuple[str, Any], ...]) -> ReproResult:
    return run_repro(**dict(options))


def cached_repro(mode: str = "piecewise", **options: Any) -> ReproResult:
    """``run_repro(mode, **options)``, remembered for the kernel's lifetime.

    The explorer and the tables ask for the same cases again and again (a control moved back, the
    fixed path drawn beside every legacy one, a table's column the explorer shows next). A repro is
    seeded, so the same options give the same result; remembering it spares the toy's torch.compile
    trace, the slow part of a run. The result is shared: read it, do not change it."""
    bound = _REPRO_PARAMETERS.bind(mode, **options)
    bound.apply_defaults()  # the same case spelled with or without a default option is one case
    arguments = dict(bound.arguments)
    arguments |= arguments.pop("config_overrides")
    key = tuple(sorted((name, tuple(value) if isinstance(value, list) else value) for name, value in arguments.items()))
    for name, value in key:
        try:
            hash(value)
        except TypeError:  # a set or dict: nothing to remember it by (and run_repro wants ordered lists)
            raise ConfigError(f"cached_repro cannot remember {name}={value!r}: give it as a list or tuple of plain "
                              "values, in the order run_repro should use, e.g. batch_sizes=[3, 1, 8]") from None
    return _remembered_repro(key)


def divergence_explorer(mode: str = "piecewise", legacy: bool = True, layers: str = LAYER_MIXES[0],
                        strict: bool = False, *, flavor: str = "compiled", device: str = "cpu",
                        steps: int = 16) -> Figure:
    """The repro for one choice of controls, drawn next to the fixed path for comparison.

    ``flavor``: how PIECEWISE graphs are captured, ``"compiled"`` (torch.compile split at attention,
    where the legacy bug lived) or ``"breakable"``."""
    chosen = cached_repro(mode, legacy_skip_attn=legacy, piecewise_flavor=flavor, layers=layers,
                          strict_layers=strict, steps=steps, device=device)
    label = f"{case_label(mode, legacy, flavor)}{' strict' if strict else ''}"
    results = {label: chosen}
    if legacy:
        results[case_label(mode, False, flavor)] = cached_repro(mode, legacy_skip_attn=False, piecewise_flavor=flavor,
                                                                layers=layers, strict_layers=strict, steps=steps,
                                                                device=device)
    fig = draw_divergence(results)
    fig.suptitle(f"{layers}: {label} -> {verdict(chosen)}", fontsize=11)
    fig.tight_layout()
    return fig


Case = tuple[str, bool] | tuple[str, bool, str]


def verdict_table(layer_mixes: Sequence[str], cases: Sequence[Case], *, device: str = "cpu", steps: int = 16,
                  **repro_options: Any) -> str:
    """A text grid: one row per layer mix, one column per case, each cell ``ok``, ``DIVERGED`` or
    ``FAILED`` (capture raised). Column headers take two lines: the mode, then flavor and path.

    A case is ``(mode, legacy)`` or ``(mode, legacy, flavor)``; the flavor defaults to ``"compiled"``.
    ``repro_options`` go to every ``run_repro`` call (``strict_attention=True``, ``splitting_ops=...``).
    """
    if isinstance(layer_mixes, str) or not layer_mixes or not all(isinstance(m, str) for m in layer_mixes):
        raise ConfigError(f"verdict_table needs a list of layer patterns, one per row, e.g. ['sconv,attn', 'attn'], "
                          f"got {layer_mixes!r}")
    if not cases:
        raise ConfigError(f"verdict_table needs a list of cases, one per column, e.g. [('piecewise', True), "
                          f"('full', True)], got {cases!r}")
    full_cases = []
    for case in cases:
        if not isinstance(case, tuple) or len(case) not in (2, 3):
            raise ConfigError(f"a verdict_table case is (mode, legacy) or (mode, legacy, flavor), got {case!r}")
        full_cases.append((case[0], case[1], case[2] if len(case) == 3 else "compiled"))
    headers = [case_label(*case).split(" ", 1) for case in full_cases]
    widths = [max(8, *map(len, h)) for h in headers]
    first = max(len(m) for m in layer_mixes)
    lines = [" " * first + " | " + " | ".join(f"{h[i]:^{w}}" for h, w in zip(headers, widths)) for i in (0, 1)]
    for layers in layer_mixes:
        cells = []
        for mode, legacy, flavor in full_cases:
            result = cached_repro(mode, legacy_skip_attn=legacy, piecewise_flavor=flavor, layers=layers,
                                  steps=steps, device=device, **repro_options)
            cells.append("FAILED" if result.error else "DIVERGED" if result.diverged else "ok")
        lines.append(f"{layers:<{first}} | " + " | ".join(f"{c:^{w}}" for c, w in zip(cells, widths)))
    return "\n".join(line.rstrip() for line in lines)


def latency_explorer(result: BenchResult, modes: Sequence[str] | None = None,
                     batch_sizes: Sequence[int] | None = None) -> Figure:
    """Replay latency against batch size for the chosen modes and batch sizes of a bench result."""
    from cglab.lab.plots import plot_latency

    if not isinstance(result, BenchResult):
        raise ConfigError(f"latency_explorer takes a BenchResult, e.g. load_results('data/...csv') or run_bench(...); "
                          f"got {type(result).__name__}")

    rows = [r for r in result.rows
            if (modes is None or r["mode"] in modes) and (batch_sizes is None or r["batch_size"] in batch_sizes)]
    fig = Figure(figsize=(7, 4.5), dpi=DPI, layout="constrained")
    plot_latency(BenchResult(rows, result.environment, result.config), fig.add_subplot())
    return fig


# ------------------------------------------------------------------ ipywidgets wrappers
# One lock for every explorer's redraw: a kernel can run widget callbacks on several threads at once,
# and neither matplotlib (its mathtext parser) nor an Output widget's capture is thread-safe.
_DRAW_LOCK = threading.Lock()


class _Redraw:
    """Redraws one output area, one draw at a time, the latest request winning.

    A request that comes while a draw runs only marks the area stale and returns; the running thread
    then draws once more with the controls' values at that moment, so bursts of changes coalesce into
    one final draw of the newest values instead of a queue of stale ones (or overlapping ones).
    """

    def __init__(self, draw: Callable[[dict[str, Any]], None], controls: dict[str, Any]) -> None:
        self._draw, self._controls = draw, controls
        self._state = threading.Lock()  # guards the two flags below
        self._stale = self._running = False

    def request(self, _change: Any = None) -> None:
        with self._state:
            self._stale = True
            if self._running:
                return  # the running draw sees the flag and draws again
            self._running = True
        try:
            while True:
                with self._state:
                    if not self._stale:
                        self._running = False
                        return
                    self._stale = False
                    values = {name: control.value for name, control in self._controls.items()}
                with _DRAW_LOCK:
                    self._draw(values)
        except BaseException:
            with self._state:
                self._running = False  # a failed draw must not wedge later redraws
            raise


def _interactive(explorer: Callable[..., Figure], controls: dict[str, Any], **fixed: Any) -> Any:
    """Controls above an output area that redraws ``explorer(**controls, **fixed)`` on every change.

    Not ``ipywidgets.interactive_output``: it draws on every callback thread at once (see ``_Redraw``).
    """
    import ipywidgets as widgets
    from IPython.display import display

    output = widgets.Output()

    def draw(values: dict[str, Any]) -> None:
        with output:  # shows an explorer's exception in the output area, as interactive_output did
            output.clear_output(wait=True)
            display(explorer(**values, **fixed))

    redraw = _Redraw(draw, controls)
    for control in controls.values():
        control.observe(redraw.request, "value")
    redraw.request()  # the initial figure
    # The row wraps: on a narrow window (a laptop, JupyterLab's file browser open) no control may end up
    # behind a horizontal scrollbar.
    row = widgets.HBox(list(controls.values()), layout=widgets.Layout(flex_flow="row wrap"))
    return widgets.VBox([row, output])


def interactive_decode_explorer(*, device: str = "cpu", max_step: int = 12) -> Any:
    """A slider over decode steps; the caches redraw at each step."""
    import ipywidgets as widgets

    step = widgets.IntSlider(value=4, min=0, max=max_step, description="decode step")
    return _interactive(decode_explorer, {"step": step}, device=device)


def interactive_divergence_explorer(*, device: str = "cpu") -> Any:
    """Mode, PIECEWISE flavor, the legacy switch, the layer mix and strict layers; the plot redraws."""
    import ipywidgets as widgets

    controls = {
        "mode": widgets.Dropdown(options=["piecewise", "full", "none"], value="piecewise", description="mode"),
        "flavor": widgets.Dropdown(options=list(PIECEWISE_FLAVORS), value="compiled", description="flavor"),
        "legacy": widgets.Checkbox(value=True, description="legacy skip_attn"),
        "layers": widgets.Dropdown(options=list(LAYER_MIXES), value=LAYER_MIXES[0], description="layers"),
        "strict": widgets.Checkbox(value=False, description="strict layers"),
    }
    return _interactive(divergence_explorer, controls, device=device)


def interactive_latency_explorer(result: BenchResult) -> Any:
    """Pick the modes and batch sizes to compare; the latency plot redraws."""
    import ipywidgets as widgets

    modes = result.modes
    batches = sorted({r["batch_size"] for r in result.rows})
    controls = {
        "modes": widgets.SelectMultiple(options=modes, value=tuple(modes), description="modes"),
        "batch_sizes": widgets.SelectMultiple(options=batches, value=tuple(batches), description="batch sizes"),
    }
    return _interactive(latency_explorer, controls, result=result)
