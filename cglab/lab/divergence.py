"""Notebook 04's explorer: repro cases, their verdicts (one case, or a grid of them), and the divergence
picture behind ipywidgets controls, the switches that do nothing in the chosen mode disabled."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Sequence
from typing import Any

from matplotlib.figure import Figure

from cglab.compare import NON_FINITE
from cglab.compilation_config import DEFAULT_CAPTURE_SIZES, CompilationConfig
from cglab.config import PIECEWISE_FLAVORS, CUDAGraphMode, ToyConfig, parse_piecewise_flavor
from cglab.errors import ConfigError
from cglab.lab.draw import draw_divergence, expect
from cglab.lab.interactive import ControlState, interactive
from cglab.repro import ReproResult, run_repro

__all__ = [
    "CHUNKED_STEPS",
    "DIVERGENCE_MODES",
    "LAYER_MIXES",
    "PREFILL_CHUNK",
    "cached_repro",
    "case_label",
    "divergence_control_state",
    "divergence_explorer",
    "divergence_notes",
    "interactive_divergence_explorer",
    "verdict",
    "verdict_table",
]

LAYER_MIXES = ("sconv,attn,compressor,attn", "sconv,attn", "compressor,attn", "attn,attn")
DIVERGENCE_MODES = ("piecewise", "full_and_piecewise", "full_decode_only", "full", "none")
DECODE_STEPS = 16
# Chunked prefill as notebook 04 runs it: prompts enter 4 tokens a step beside the running decodes, and
# 20 steps take every prompt in, so nearly every step is a mixed batch.
PREFILL_CHUNK = 4
CHUNKED_STEPS = 20


def verdict(result: ReproResult) -> str:
    """One phrase, the same on every backend: what happened to the graph runner."""
    expect(result, ReproResult, "verdict takes a ReproResult, e.g. verdict(run_repro('piecewise'))")
    if result.error:
        return f"capture failed loudly ({result.error.split(':')[0]})"
    if result.diverged:
        return f"DIVERGED from eager ({NON_FINITE})" if result.non_finite else "DIVERGED from eager, and nothing raised"
    if result.mode != "none" and not result.replayed_graphs:
        return "no graph replayed (every step ran eagerly)"
    return "matches eager"


def case_label(mode: str, legacy: bool, flavor: str = "compiled") -> str:
    """``"PIECEWISE compiled legacy"``: a repro case as the explorers and tables name it; the flavor only
    where a PIECEWISE graph is captured (FULL-only and eager cases do not depend on it)."""
    cg_mode = CUDAGraphMode.parse(mode)
    flavor = parse_piecewise_flavor(flavor)
    if not isinstance(legacy, bool):  # "no" would read as legacy
        raise ConfigError(f"legacy must be True (the code before the fix) or False, got {legacy!r}")
    named = f" {flavor}" if CUDAGraphMode.PIECEWISE in cg_mode.runtime_modes() else ""
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
    seed: int = 0,
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
    config = ToyConfig(layers=layers, strict_layers=strict_layers, seed=seed, **model)
    run = {"batch_sizes": batch_sizes, "steps": steps, "prefill_chunk": prefill_chunk, "device": device}
    return run_repro(cc, config, max_num_reqs=max_num_reqs, **run)


_REPRO_PARAMETERS = inspect.signature(run_case)


@functools.lru_cache(maxsize=256)
def _remembered_repro(options: tuple[tuple[str, Any], ...]) -> ReproResult:
    return run_case(**dict(options))


def cached_repro(mode: str = "piecewise", **options: Any) -> ReproResult:
    """``run_case(mode, **options)``, remembered for the kernel's lifetime: the explorer and the tables ask
    for the same seeded cases again and again, and a run's torch.compile trace is slow. The result is shared:
    read it, do not change it."""
    bound = _REPRO_PARAMETERS.bind(mode, **options)
    bound.apply_defaults()  # the same case spelled with or without a default option is one case
    arguments = dict(bound.arguments)
    arguments |= arguments.pop("model")
    key = tuple(sorted((name, tuple(value) if isinstance(value, list) else value) for name, value in arguments.items()))
    for name, value in key:
        try:
            hash(value)
        except TypeError:  # a set or dict: nothing to remember it by (and run_repro wants ordered lists)
            raise ConfigError(
                f"cached_repro cannot remember {name}={value!r}: give it as a list or tuple of plain "
                "values, in the order run_repro should use, e.g. batch_sizes=[3, 1, 8]"
            ) from None
    return _remembered_repro(key)


def _divergence_runs(
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
    """The chosen case and, when it is the legacy path, the fixed path beside it, by label; where the mode
    leaves the flavor, legacy and strict switches off (``divergence_control_state``), the one run the
    mode makes, labelled by the mode alone."""
    if not isinstance(chunked_prefill, bool):
        raise ConfigError(
            f"chunked_prefill must be True (prompts {PREFILL_CHUNK} tokens a step, mixed with "
            f"decodes) or False (prompts prefilled first, then plain decode), got {chunked_prefill!r}"
        )
    if steps is None:
        steps = CHUNKED_STEPS if chunked_prefill else DECODE_STEPS
    options = {
        "piecewise_flavor": flavor,
        "layers": layers,
        "strict_layers": strict,
        "steps": steps,
        "prefill_chunk": PREFILL_CHUNK if chunked_prefill else 0,
        "device": device,
    }
    if divergence_control_state({"mode": mode})[0]:  # the switches change nothing here: one run, no switch named
        options |= {"piecewise_flavor": "compiled", "strict_layers": False}
        return {CUDAGraphMode.parse(mode).name: cached_repro(mode, legacy_skip_attn=False, **options)}
    label = f"{case_label(mode, legacy, flavor)}{' strict' if strict else ''}"
    runs = {label: cached_repro(mode, legacy_skip_attn=legacy, **options)}
    if legacy:
        runs[case_label(mode, False, flavor)] = cached_repro(mode, legacy_skip_attn=False, **options)
    return runs


def divergence_explorer(
    mode: str = "piecewise",
    legacy: bool = True,
    layers: str = LAYER_MIXES[0],
    strict: bool = False,
    *,
    chunked_prefill: bool = False,
    flavor: str = "compiled",
    device: str = "cpu",
    steps: int | None = None,
) -> Figure:
    """The repro for one choice of controls, drawn next to the fixed path. ``chunked_prefill``: prompts enter
    ``PREFILL_CHUNK`` tokens a step beside the decodes (``CHUNKED_STEPS`` steps) instead of being prefilled
    first (plain decode, ``DECODE_STEPS`` steps); ``steps`` overrides the count."""
    runs = _divergence_runs(
        mode, legacy, layers, strict, chunked_prefill=chunked_prefill, flavor=flavor, device=device, steps=steps
    )
    label, chosen = next(iter(runs.items()))
    fig = draw_divergence(runs)
    traffic = ", chunked prefill" if chunked_prefill else ""
    fig.suptitle(f"{layers}{traffic}: {label} -> {verdict(chosen)}", fontsize=11)
    fig.tight_layout()
    return fig


def divergence_notes(*args: Any, **options: Any) -> list[str]:
    """One line per run ``divergence_explorer(*args, **options)`` draws: how its steps ran (``"steps by mode:
    PIECEWISE 17, eager 2, FULL 1"``), or, where capture raised, that nothing was replayed."""
    lines = []
    for label, result in _divergence_runs(*args, **options).items():
        if result.error:
            lines.append(f"{label}: capture failed: nothing replayed ({result.error.split(':')[0]})")
        else:
            counts = ", ".join(f"{'eager' if m == 'none' else m.upper()} {n}" for m, n in result.steps_by_mode.items())
            lines.append(f"{label}: steps by mode: {counts or 'none ran'}")
    return lines


_GRAPH_SWITCHES = ("flavor", "legacy", "strict")


def divergence_control_state(values: dict[str, Any]) -> ControlState:
    """The explorer's switches that change nothing in ``values["mode"]``, and why: the flavor, the legacy
    switch and strict layers act only where PIECEWISE graphs are captured (the old code skipped metadata
    for those alone, and a strict layer fails only where it meets none)."""
    mode = CUDAGraphMode.parse(values["mode"])
    if CUDAGraphMode.PIECEWISE in mode.runtime_modes():
        if mode is CUDAGraphMode.FULL_AND_PIECEWISE:
            return (), (
                "FULL_AND_PIECEWISE: decode steps replay FULL graphs, mixed batches (chunked prefill) PIECEWISE ones"
            )
        return (), ""
    off = "flavor, legacy skip_attn and strict layers are off"
    if mode is CUDAGraphMode.NONE:
        return _GRAPH_SWITCHES, f"{off}: NONE captures no graph (eager against eager)"
    return _GRAPH_SWITCHES, (
        f"{off}: they apply to PIECEWISE graphs only, and FULL graphs got capture metadata before the fix too"
    )


Case = tuple[str, bool] | tuple[str, bool, str]


MIX_WIDTH = 16  # a layer mix wider than this wraps after a comma in verdict_table's header


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
    layer_mixes: Sequence[str], cases: Sequence[Case], *, device: str = "cpu", steps: int = 16, **repro_options: Any
) -> str:
    """A text grid: one row per case (``(mode, legacy)`` or ``(mode, legacy, flavor)``, compiled by default),
    one column per layer mix, each cell ``ok``, ``DIVERGED`` or ``FAILED`` (capture raised); ``repro_options``
    go to every ``run_repro`` call. Cases as rows and long mixes wrapped keep it about 100 characters wide:
    a notebook's output area beside JupyterLab's file browser at 1280 pixels holds 107."""
    if isinstance(layer_mixes, str) or not layer_mixes or not all(isinstance(m, str) for m in layer_mixes):
        raise ConfigError(
            f"verdict_table needs a list of layer patterns, one per column, e.g. ['sconv,attn', "
            f"'attn'], got {layer_mixes!r}"
        )
    if not cases:
        raise ConfigError(
            f"verdict_table needs a list of cases, one per row, e.g. [('piecewise', True), "
            f"('full', True)], got {cases!r}"
        )
    for case in cases:
        if not isinstance(case, tuple) or len(case) not in (2, 3):
            raise ConfigError(f"a verdict_table case is (mode, legacy) or (mode, legacy, flavor), got {case!r}")
    full_cases = [(*case, "compiled")[:3] for case in cases]
    labels = [case_label(*case) for case in full_cases]
    headers = [_wrap_mix(layers) for layers in layer_mixes]
    widths = [max(8, *map(len, h)) for h in headers]
    first = max(map(len, labels))
    rows = [
        [" " * first, *(f"{h[i]:<{w}}" if i < len(h) else " " * w for h, w in zip(headers, widths))]
        for i in range(max(map(len, headers)))
    ]
    for label, (mode, legacy, flavor) in zip(labels, full_cases):
        results = [
            cached_repro(
                mode,
                legacy_skip_attn=legacy,
                piecewise_flavor=flavor,
                layers=layers,
                steps=steps,
                device=device,
                **repro_options,
            )
            for layers in layer_mixes
        ]
        cells = ["FAILED" if r.error else "DIVERGED" if r.diverged else "ok" for r in results]
        rows.append([f"{label:<{first}}", *(f"{c:^{w}}" for c, w in zip(cells, widths))])
    return "\n".join(" | ".join(row).rstrip() for row in rows)


def interactive_divergence_explorer(*, device: str = "cpu") -> Any:
    """``divergence_explorer`` behind its controls; the plot redraws, one line per run under it. Switches
    that change nothing in the chosen mode are disabled, and a line under the controls says why."""
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
