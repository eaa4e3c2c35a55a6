"""The notebooks' explorers: pure functions of their controls returning a figure; ``interactive_*`` wrap them."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Sequence
from typing import Any

import torch
from matplotlib.figure import Figure

from cglab.bench import BenchResult
from cglab.compare import NON_FINITE
from cglab.compilation_config import DEFAULT_CAPTURE_SIZES, CompilationConfig
from cglab.config import PIECEWISE_FLAVORS, CUDAGraphMode, ToyConfig, parse_piecewise_flavor
from cglab.lab.draw import DPI, draw_caches, draw_divergence
from cglab.lab.interactive import ControlState, interactive
from cglab.repro import ReproResult, run_repro
from cglab.runner import ModelRunner

PROMPT_LENGTHS = (5, 9, 3)  # three requests of different lengths: their blocks fill at different steps
LAYER_MIXES = ("sconv,attn,compressor,attn", "sconv,attn", "compressor,attn", "attn,attn")
DIVERGENCE_MODES = ("piecewise", "full_and_piecewise", "full_decode_only", "full", "none")
DECODE_STEPS = 16
# Chunked prefill as notebook 04 runs it: prompts enter 4 tokens a step beside the running decodes, and
# 20 steps take every prompt in, so nearly every step is a mixed batch.
PREFILL_CHUNK = 4
CHUNKED_STEPS = 20
MIX_WIDTH = 16  # a layer mix wider than this wraps after a comma in verdict_table's header
MULTI_SELECT_HINT = "Ctrl-click (Cmd-click on a Mac) picks several modes or batch sizes, Shift-click a range"
_GRAPH_SWITCHES = ("flavor", "legacy", "strict")

# ------------------------------------------------------------ the caches as decode goes on (notebook 02)


def decode_scenario(
    runner: ModelRunner, steps: int, prompt_lengths: Sequence[int] = PROMPT_LENGTHS
) -> list[torch.Tensor]:
    """Each decode step's logits after an eager prefill (identical caches in every runner), one per request."""
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


def interactive_decode_explorer(*, device: str = "cpu") -> Any:
    """A slider over decode steps; the caches redraw at each step."""
    import ipywidgets as widgets

    step = widgets.IntSlider(value=4, min=0, max=12, description="decode step")
    return interactive(decode_explorer, {"step": step}, device=device)


# ------------------------------------------------------------ the bug against eager (notebook 04)


def verdict(result: ReproResult) -> str:
    """One phrase, the same on every backend: what happened to the graph runner."""
    if result.error:
        return f"capture failed loudly ({result.error.split(':')[0]})"
    if result.diverged:
        return f"DIVERGED from eager ({NON_FINITE})" if result.non_finite else "DIVERGED from eager, and nothing raised"
    if result.mode != "none" and not result.replayed_graphs:
        return "no graph replayed (every step ran eagerly)"
    return "matches eager"


def case_label(mode: str, legacy: bool, flavor: str = "compiled") -> str:
    """``"PIECEWISE compiled legacy"``: a repro case's name; the flavor only where PIECEWISE graphs are captured."""
    cg_mode = CUDAGraphMode.parse(mode)
    named = f" {parse_piecewise_flavor(flavor)}" if CUDAGraphMode.PIECEWISE in cg_mode.runtime_modes() else ""
    return f"{cg_mode.name}{named} {'legacy' if legacy else 'fixed'}"


def run_case(
    mode: str = "piecewise",
    *,
    legacy_skip_attn: bool = False,
    piecewise_flavor: str = "compiled",
    splitting_ops: tuple[str, ...] | None = None,
    capture_sizes: tuple[int, ...] = DEFAULT_CAPTURE_SIZES,
    pre_49751_dummy_split: bool = False,
    layers: str = LAYER_MIXES[0],
    strict_layers: bool = False,
    batch_sizes: tuple[int, ...] = (3, 1, 8),
    steps: int = DECODE_STEPS,
    prefill_chunk: int = 0,
    max_num_reqs: int | None = None,
    device: str = "cpu",
    **model: Any,
) -> ReproResult:
    """``run_repro`` of one case, named by the switches the explorers and tables set; ``model``: other
    ``ToyConfig`` fields, such as ``hidden_size=64``."""
    cc = CompilationConfig(
        mode,
        capture_sizes,
        use_breakable_cg=piecewise_flavor == "breakable",
        splitting_ops=splitting_ops,
        legacy_skip_attn=legacy_skip_attn,
        pre_49751_dummy_split=pre_49751_dummy_split,
    )
    config = ToyConfig(layers=layers, strict_layers=strict_layers, **model)
    run = {"batch_sizes": batch_sizes, "steps": steps, "prefill_chunk": prefill_chunk, "device": device}
    return run_repro(cc, config, max_num_reqs=max_num_reqs, **run)


_REPRO_PARAMETERS = inspect.signature(run_case)


@functools.lru_cache(maxsize=256)
def _remembered_repro(options: tuple[tuple[str, Any], ...]) -> ReproResult:
    return run_case(**dict(options))


def cached_repro(mode: str = "piecewise", **options: Any) -> ReproResult:
    """``run_case(mode, **options)``, remembered for the kernel's lifetime (the explorer and the tables ask for
    the same seeded cases again and again); the result is shared: read it, do not change it."""
    bound = _REPRO_PARAMETERS.bind(mode, **options)
    bound.apply_defaults()  # the same case spelled with or without a default option is one case
    arguments = dict(bound.arguments)
    arguments |= arguments.pop("model")
    return _remembered_repro(tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in arguments.items())))


def divergence_runs(
    mode: str = "piecewise",
    legacy: bool = True,
    layers: str = LAYER_MIXES[0],
    strict: bool = False,
    *,
    chunked_prefill: bool = False,
    flavor: str = "compiled",
    device: str = "cpu",
    steps: int | None = None,
) -> dict[str, ReproResult]:
    """The explorer's runs by label: the chosen case and, for the legacy path, the fixed one beside it (one run,
    named by its mode, where ``divergence_control_state`` turns the switches off)."""
    steps = steps or (CHUNKED_STEPS if chunked_prefill else DECODE_STEPS)
    chunk = PREFILL_CHUNK if chunked_prefill else 0
    options: dict[str, Any] = {"layers": layers, "steps": steps, "prefill_chunk": chunk, "device": device}
    if divergence_control_state({"mode": mode})[0]:  # the switches change nothing here: one run, no switch named
        return {CUDAGraphMode.parse(mode).name: cached_repro(mode, **options)}
    options |= {"piecewise_flavor": flavor, "strict_layers": strict}
    label = f"{case_label(mode, legacy, flavor)}{' strict' if strict else ''}"
    runs = {label: cached_repro(mode, legacy_skip_attn=legacy, **options)}
    if legacy:
        runs[case_label(mode, False, flavor)] = cached_repro(mode, legacy_skip_attn=False, **options)
    return runs


def divergence_explorer(*controls: Any, **options: Any) -> Figure:
    """``divergence_runs(*controls, **options)`` drawn, titled with the chosen case's verdict."""
    runs = divergence_runs(*controls, **options)
    label, chosen = next(iter(runs.items()))
    fig = draw_divergence(runs)
    traffic = ", chunked prefill" if chosen.prefill_chunk else ""
    fig.suptitle(f"{chosen.layers}{traffic}: {label} -> {verdict(chosen)}", fontsize=11)
    fig.tight_layout()
    return fig


def divergence_notes(*controls: Any, **options: Any) -> list[str]:
    """One line per run of ``divergence_runs(*controls, **options)``: how its steps ran, or that capture failed."""
    lines = []
    for label, result in divergence_runs(*controls, **options).items():
        if result.error:
            lines.append(f"{label}: capture failed: nothing replayed ({result.error.split(':')[0]})")
        else:
            counts = ", ".join(f"{'eager' if m == 'none' else m.upper()} {n}" for m, n in result.steps_by_mode.items())
            lines.append(f"{label}: steps by mode: {counts or 'none ran'}")
    return lines


def divergence_control_state(values: dict[str, Any]) -> ControlState:
    """The switches that change nothing in ``values["mode"]`` (they act on PIECEWISE graphs only), and why."""
    mode = CUDAGraphMode.parse(values["mode"])
    if mode is CUDAGraphMode.FULL_AND_PIECEWISE:
        return (), "FULL_AND_PIECEWISE: decode steps replay FULL graphs, mixed batches (chunked prefill) PIECEWISE ones"
    if CUDAGraphMode.PIECEWISE in mode.runtime_modes():
        return (), ""
    off = "flavor, legacy skip_attn and strict layers are off"
    if mode is CUDAGraphMode.NONE:
        return _GRAPH_SWITCHES, f"{off}: NONE captures no graph (eager against eager)"
    return _GRAPH_SWITCHES, (
        f"{off}: they apply to PIECEWISE graphs only, and FULL graphs got capture metadata before the fix too"
    )


def _wrap_mix(layers: str) -> list[str]:
    """``layers`` as header lines of at most ``MIX_WIDTH`` characters (and the comma), cut after a comma."""
    lines: list[str] = []
    for part in layers.split(","):
        if lines and len(lines[-1]) + 1 + len(part) <= MIX_WIDTH:
            lines[-1] += "," + part
        else:
            lines[-1:] = [f"{lines[-1]},"] if lines else []
            lines.append(part)
    return lines


def verdict_table(
    layer_mixes: Sequence[str],
    cases: Sequence[tuple[str, bool] | tuple[str, bool, str]],
    *,
    device: str = "cpu",
    steps: int = 16,
    **repro_options: Any,
) -> str:
    """One row per case (``(mode, legacy[, flavor])``), one column per layer mix: ``ok``, ``DIVERGED``, ``FAILED``."""
    # Long mixes wrap, to keep within the 107 characters of a notebook's output beside JupyterLab's files.
    full_cases = [(*case, "compiled")[:3] for case in cases]
    labels = [case_label(*case) for case in full_cases]
    headers = [_wrap_mix(layers) for layers in layer_mixes]
    widths = [max(8, *map(len, h)) for h in headers]
    first = max(map(len, labels))
    rows = [
        [" " * first, *(f"{h[i]:<{w}}" if i < len(h) else " " * w for h, w in zip(headers, widths))]
        for i in range(max(map(len, headers)))
    ]
    options = {"steps": steps, "device": device, **repro_options}
    for label, (mode, legacy, flavor) in zip(labels, full_cases):
        cells = [f"{label:<{first}}"]
        for layers, width in zip(layer_mixes, widths):
            r = cached_repro(mode, legacy_skip_attn=legacy, piecewise_flavor=flavor, layers=layers, **options)
            cells.append(f"{'FAILED' if r.error else 'DIVERGED' if r.diverged else 'ok':^{width}}")
        rows.append(cells)
    return "\n".join(" | ".join(row).rstrip() for row in rows)


def interactive_divergence_explorer(*, device: str = "cpu") -> Any:
    """``divergence_explorer`` behind its controls; switches that change nothing in the mode are disabled."""
    import ipywidgets as widgets

    controls = {
        "mode": widgets.Dropdown(options=list(DIVERGENCE_MODES), value="piecewise", description="mode"),
        "flavor": widgets.Dropdown(options=list(PIECEWISE_FLAVORS), value="compiled", description="flavor"),
        "legacy": widgets.Checkbox(value=True, description="legacy skip_attn"),
        "layers": widgets.Dropdown(options=list(LAYER_MIXES), value=LAYER_MIXES[0], description="layers"),
        "strict": widgets.Checkbox(value=False, description="strict layers"),
        "chunked_prefill": widgets.Checkbox(value=False, description="chunked prefill"),
    }
    return interactive(
        divergence_explorer, controls, state=divergence_control_state, notes=divergence_notes, device=device
    )


# ------------------------------------------------------------ replay latency (notebook 05)


def latency_explorer(
    result: BenchResult, modes: Sequence[str] | None = None, batch_sizes: Sequence[int] | None = None
) -> Figure:
    """Replay latency against batch size for the chosen modes and batch sizes (None: all)."""
    from cglab.lab.plots import plot_latency

    chosen = {"mode": modes, "batch size": batch_sizes}
    missing = [what for what, picked in chosen.items() if picked is not None and not picked]
    if missing:  # a line asking for one, in frameless axes: IPython shows a figure with no axes as text only
        fig = Figure(figsize=(7, 0.4), dpi=DPI)
        ax = fig.add_axes((0, 0, 1, 1))
        ax.set_axis_off()
        ax.text(0.01, 0.5, f"select at least one {' and one '.join(missing)}", va="center", fontsize=11)
        return fig
    rows = [
        r
        for r in result.rows
        if (modes is None or r["mode"] in modes) and (batch_sizes is None or r["batch_size"] in batch_sizes)
    ]
    fig = Figure(figsize=(7, 4.5), dpi=DPI, layout="constrained")
    plot_latency(BenchResult(rows, result.environment, result.config), fig.add_subplot())
    return fig


def interactive_latency_explorer(result: BenchResult) -> Any:
    """Pick the modes and batch sizes to compare; a line above the lists says how to pick several."""
    import ipywidgets as widgets

    options = {"modes": result.modes, "batch_sizes": sorted({r["batch_size"] for r in result.rows})}
    # Every option in view (up to 10 rows): the lists show 5 by default, and a mode below them goes unseen.
    select = functools.partial(widgets.SelectMultiple, tooltip=MULTI_SELECT_HINT)
    controls = {
        name: select(options=values, value=tuple(values), description=name.replace("_", " "), rows=min(len(values), 10))
        for name, values in options.items()
    }
    return interactive(latency_explorer, controls, hint=MULTI_SELECT_HINT, result=result)
