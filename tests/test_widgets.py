"""The notebooks' explorers and pictures, called directly (no display, Agg backend)."""

from __future__ import annotations

import base64
import functools
import re
import threading
import time

import matplotlib

matplotlib.use("Agg")

import pytest
import torch
from matplotlib.figure import Figure

from cglab import ConfigError, CudagraphDispatcher, CUDAGraphMode, ModelRunner, ReproResult, ToyConfig, run_repro
from cglab.bench import BenchConfig, run_bench
from cglab.compilation_config import CompilationConfig
from cglab.lab import widgets
from cglab.lab.anatomy import graph_pieces
from cglab.lab.describe import describe_environment, describe_requests, describe_step
from cglab.lab.draw import DPI, draw_caches, draw_divergence, draw_graph_anatomy, draw_padding
from cglab.lab.interactive import STILL_LINE, interactive, still_html
from cglab.lab.widgets import (
    CHUNKED_STEPS,
    MULTI_SELECT_HINT,
    PREFILL_CHUNK,
    cached_repro,
    case_label,
    decode_explorer,
    decode_scenario,
    divergence_control_state,
    divergence_explorer,
    divergence_notes,
    interactive_decode_explorer,
    interactive_divergence_explorer,
    interactive_latency_explorer,
    last_written_slots,
    latency_explorer,
    verdict,
    verdict_table,
)

# A cheap run that still pads (3 tokens in a 4-token graph; FULL pads a request too) and replays a graph in every
# step of a mode that captures one: one captured size instead of four, for tests whose claims hold for any run.
ONE_PADDED_BATCH = {"batch_sizes": (3,), "capture_sizes": (4,), "max_num_reqs": 4}


@pytest.fixture
def run_case_calls(monkeypatch: pytest.MonkeyPatch) -> list[dict]:
    """The options of every ``run_case`` call that the explorers make while the test runs, their memory empty
    for the test (its misses are those calls); each result comes from the module's memory: run once."""
    calls: list[dict] = []
    shared = widgets._remembered_repro

    def run(options: tuple) -> ReproResult:
        calls.append(dict(options))
        return shared(options)

    monkeypatch.setattr(widgets, "_remembered_repro", functools.lru_cache(maxsize=256)(run))
    return calls


def _cell_colors(fig: Figure) -> torch.Tensor:
    """The RGB image of the caches picture: [caches, slots, 3]."""
    return torch.as_tensor(fig.axes[0].images[0].get_array())


def test_decode_scenario_is_deterministic_and_marks_the_last_slots():
    first, second = ModelRunner(ToyConfig(), "none"), ModelRunner(ToyConfig(), "none")
    a, b = decode_scenario(first, 3), decode_scenario(second, 3)
    assert len(a) == 3 and all(torch.equal(x, y) for x, y in zip(a, b))
    assert last_written_slots(first) == first.block_tables.slot_mapping[:3].tolist()


def test_decode_explorer_draws_every_cache_with_no_missing_write():
    fig = decode_explorer(4)
    assert isinstance(fig, Figure) and fig.axes[0].get_title().startswith("after the prefill and 4 decode steps")
    image = _cell_colors(fig)
    assert image.shape[0] == 5  # conv_state, two KV caches, state cache, compressed cache
    missing = torch.tensor([0.85, 0.1, 0.1], dtype=image.dtype)
    assert not (image == missing).all(-1).any()  # eager runs write every slot they reach


def test_caches_picture_shows_the_legacy_bug_as_missing_writes():
    runner = ModelRunner(ToyConfig(), CompilationConfig("piecewise", legacy_skip_attn=True))
    decode_scenario(runner, 4)
    image = _cell_colors(draw_caches(runner, last_written_slots(runner)))
    missing = (image == torch.tensor([0.85, 0.1, 0.1], dtype=image.dtype)).all(-1).any(-1)
    names = list(runner.state_tensors())
    assert dict(zip(names, missing.tolist())) == {
        "layers.0.sconv.conv_state": True,
        "layers.1.attn.kv_cache": False,
        "layers.2.compressor.state_cache": True,
        "layers.2.compressor.compressed_cache": True,
        "layers.3.attn.kv_cache": False,
    }


def test_divergence_explorer_titles_its_verdict():
    fig = divergence_explorer("piecewise", legacy=True, steps=4)
    assert (
        fig._suptitle.get_text() == "sconv,attn,compressor,attn: PIECEWISE compiled legacy -> "
        "DIVERGED from eager, and nothing raised"
    )
    assert [t.get_text() for t in fig.axes[0].get_legend().get_texts()][:2] == [
        "PIECEWISE compiled legacy",
        "PIECEWISE compiled fixed",
    ]


def test_the_explorer_names_only_the_switches_that_act_in_its_mode():
    """Under FULL the flavor, legacy and strict switches are off: one run, named by its mode alone."""
    fig = divergence_explorer("full", legacy=True, strict=True, flavor="breakable", steps=4)
    assert fig._suptitle.get_text() == "sconv,attn,compressor,attn: FULL -> matches eager"
    assert [t.get_text() for t in fig.axes[0].get_legend().get_texts()] == ["FULL", "tolerance (rounding)"]
    assert divergence_notes("none", legacy=True, strict=True, steps=3) == ["NONE: steps by mode: eager 3"]
    assert divergence_notes("full_decode_only", legacy=True, steps=3) == ["FULL_DECODE_ONLY: steps by mode: FULL 3"]


def test_the_step_axis_has_whole_steps_only():
    fig = divergence_explorer("none", chunked_prefill=True)  # 20 steps: matplotlib would tick 2.5, 5.0, ...
    fig.canvas.draw()
    assert all(t.get_text().isdigit() for t in fig.axes[0].get_xticklabels())


def test_divergence_explorer_takes_the_flavor():
    """Breakable PIECEWISE got capture metadata before the fix: no divergence, even with strict layers."""
    fig = divergence_explorer("piecewise", legacy=True, strict=True, flavor="breakable", steps=4)
    assert fig._suptitle.get_text().endswith("PIECEWISE breakable legacy strict -> matches eager")
    with pytest.raises(ConfigError, match="unknown PIECEWISE flavor 'fused'"):
        divergence_explorer("piecewise", flavor="fused", steps=2)


def test_divergence_explorer_with_strict_layers_reports_the_loud_failure():
    fig = divergence_explorer("piecewise", legacy=True, strict=True, steps=4)
    assert "capture failed loudly (MissingMetadataError)" in fig._suptitle.get_text()


def test_case_label_names_the_flavor_only_where_piecewise_is_captured():
    assert case_label("piecewise", True) == "PIECEWISE compiled legacy"
    assert case_label("piecewise", False, "breakable") == "PIECEWISE breakable fixed"
    assert case_label("full_and_piecewise", False, "breakable") == "FULL_AND_PIECEWISE breakable fixed"
    assert case_label("full", True, "breakable") == "FULL legacy"
    assert case_label("none", False) == "NONE fixed"


def _table_cells(table: str) -> list[list[str]]:
    return [[c.strip() for c in line.split("|")] for line in table.splitlines()]


def test_verdicts_and_table():
    assert verdict(run_repro(CompilationConfig("piecewise", legacy_skip_attn=True), steps=4)).startswith("DIVERGED")
    assert verdict(run_repro("piecewise", steps=4)) == "matches eager"
    table = verdict_table(
        ["sconv,attn", "attn"], [("piecewise", True), ("piecewise", True, "breakable"), ("full", True)], steps=4
    )
    assert _table_cells(table) == [
        ["", "sconv,attn", "attn"],
        ["PIECEWISE compiled legacy", "DIVERGED", "ok"],
        ["PIECEWISE breakable legacy", "ok", "ok"],
        ["FULL legacy", "ok", "ok"],
    ]


def test_verdict_table_wraps_long_layer_mixes_to_stay_narrow():
    """Notebook 04's widest table, its cases as rows: under the 107 characters of a notebook's output area
    beside JupyterLab's file browser at 1280 pixels; the four-layer mix wraps after a comma."""
    cases = [
        ("full_and_piecewise", True, "compiled"),
        ("full_and_piecewise", True, "breakable"),
        ("full_and_piecewise", False, "compiled"),
        ("full", True),
        ("full_decode_only", True),
    ]
    table = verdict_table(widgets.LAYER_MIXES, cases, steps=3, **ONE_PADDED_BATCH)
    assert _table_cells(table)[:2] == [
        ["", "sconv,attn,", "sconv,attn", "compressor,attn", "attn,attn"],
        ["", "compressor,attn", "", "", ""],
    ]
    assert max(map(len, table.splitlines())) <= 100


def test_explorer_and_tables_run_each_case_once(run_case_calls: list[dict]):
    """One run per distinct case, however it is spelled: the explorer's fixed path, a table's cell and a
    call naming a default option are the same case; another option is another case."""
    runs = run_case_calls
    divergence_explorer("piecewise", legacy=True, layers="sconv,attn", steps=3)  # legacy and fixed: two runs
    verdict_table(["sconv,attn"], [("piecewise", True), ("piecewise", False)], steps=3)  # both remembered
    assert cached_repro("piecewise", layers="sconv,attn", steps=3, legacy_skip_attn=False) is cached_repro(
        layers="sconv,attn", steps=3
    )
    assert len(runs) == 2 and [r["legacy_skip_attn"] for r in runs] == [True, False]
    cached_repro("piecewise", layers="sconv,attn", steps=3, splitting_ops=["cglab::unified_attention"])
    cached_repro("piecewise", layers="sconv,attn", steps=3, hidden_size=64)  # a ToyConfig override
    assert len(runs) == 4 and runs[-1]["hidden_size"] == 64


def test_verdict_table_passes_options_and_marks_failed_captures():
    """The revert in one row: the split before #49751 fails compiled capture under the fix, not under legacy."""
    table = verdict_table(
        ["attn,attn"],
        [("piecewise", False), ("piecewise", True), ("full", False)],
        steps=3,
        pre_49751_dummy_split=True,
        max_num_reqs=64,
        capture_sizes=(8, 127),
    )
    assert [row[1] for row in _table_cells(table)[1:]] == ["FAILED", "ok", "ok"]


def test_pictures_of_graphs_and_padding():
    runner = ModelRunner(ToyConfig(), CompilationConfig("full_and_piecewise", (4,)))
    graphs = {str(d): graph_pieces(runner, d) for d in runner.graph_replays()}
    assert len(draw_graph_anatomy(graphs).axes) == 1
    dispatcher = CudagraphDispatcher(CUDAGraphMode.FULL_AND_PIECEWISE, (1, 2, 4, 8), max_num_reqs=8)
    assert len(draw_padding(dispatcher, 10).axes[0].lines) == 3  # two modes and the no-padding line
    fig = draw_divergence({"a": run_repro(CompilationConfig("piecewise", legacy_skip_attn=True), steps=3)})
    assert len(fig.axes) == 2


def test_a_failed_capture_is_drawn_as_a_failure_not_as_data():
    failed = run_repro(CompilationConfig("piecewise", legacy_skip_attn=True), ToyConfig(strict_layers=True), steps=3)
    fixed = run_repro("piecewise", ToyConfig(strict_layers=True), steps=3)
    assert failed.error and not fixed.error
    steps_ax, state_ax = draw_divergence({"legacy": failed, "fixed": fixed}).axes
    assert [line.get_label() for line in steps_ax.lines if len(line.get_xdata())] == ["fixed", "tolerance (rounding)"]
    assert len(state_ax.patches) == len(fixed.state_diffs)  # the fixed run's bars only
    assert state_ax.get_title(loc="right") == "legacy:\ncapture failed (MissingMetadataError), no caches to compare"


def test_text_pictures():
    runner = ModelRunner(ToyConfig(), "full_and_piecewise")
    decode_scenario(runner, 0)
    assert describe_requests(runner).splitlines()[0] == "req0:  5 tokens in blocks 0 (slots 0-3), 1 (slots 4-7)"
    text = describe_step(runner.prepare_step({"req0": [1], "req1": [1], "req2": [1]}))
    assert text.splitlines() == [
        "FULL(tokens=4, reqs=4, uniform=1): 3 real token(s) in 3 request(s)",
        "  query_start_loc [0, 1, 2, 3, 3]",
        "  seq_lens        [6, 10, 4, 0]",
        "  slot_mapping    [5, 17, 23, -1]",
    ]
    assert "graph backend: sim" in describe_environment("cpu")


@pytest.fixture(scope="module")
def bench_result():
    return run_bench(
        BenchConfig.quick_preset(batch_sizes=(1, 2), repeats=5, profile_steps=1, modes=("none", "piecewise", "full")),
        progress=False,
    )


def test_latency_explorer_filters_modes_and_batches(bench_result):
    fig = latency_explorer(bench_result, modes=("full",), batch_sizes=(2,))
    (ax,) = fig.axes
    full, roofline = ax.lines  # the chosen mode, then the physical limit the run measured
    assert full.get_label() == "FULL" and roofline.get_label().startswith("roofline")
    assert list(full.get_xdata()) == [2]


def _parts(widget):
    """An explorer's rows by kind: the controls' row, the other HTML lines above and under it, the output."""
    ipywidgets = pytest.importorskip("ipywidgets", reason="the widget wrappers need ipywidgets (make installs it)")
    rows = [c for c in widget.children if isinstance(c, ipywidgets.HBox)]
    lines = [c for c in widget.children if isinstance(c, ipywidgets.HTML)]
    assert len(rows) == 1 and isinstance(widget.children[-1], ipywidgets.Output)
    return rows[0], lines, widget.children[-1]


def _controls(widget) -> dict:
    return {c.description: c for c in _parts(widget)[0].children}


def test_interactive_wrappers_build_widgets(bench_result):
    ipywidgets = pytest.importorskip("ipywidgets", reason="the widget wrappers need ipywidgets (make installs it)")
    for widget in (
        interactive_decode_explorer(),
        interactive_divergence_explorer(),
        interactive_latency_explorer(bench_result),
    ):
        assert isinstance(widget, ipywidgets.VBox)
        row, _, _ = _parts(widget)
        assert row.children


def test_an_explorer_displays_its_still_beside_the_widget(bench_result):
    """Where JupyterLab will not draw the widget (an untrusted notebook), it shows the bundle's HTML: one
    line saying to run the cell above the latest figure, a PNG; text-only viewers get the line."""
    for widget in (interactive_decode_explorer(), interactive_latency_explorer(bench_result)):
        bundle = widget._repr_mimebundle_()
        assert bundle["application/vnd.jupyter.widget-view+json"]["model_id"] == widget.model_id
        assert bundle["text/plain"] == STILL_LINE
        line, image = re.fullmatch(
            r'<p><b>(.*)</b></p><img src="data:image/png;base64,([^"]+)" alt="[^"]+">', bundle["text/html"]
        ).groups()
        assert line == STILL_LINE and base64.b64decode(image).startswith(b"\x89PNG")
    assert still_html(None) == f"<p><b>{STILL_LINE}</b></p>"  # a first draw that raised: the line alone


def test_divergence_widget_offers_the_flavor_the_policy_and_chunked_prefill():
    ipywidgets = pytest.importorskip("ipywidgets", reason="the widget wrappers need ipywidgets (make installs it)")
    controls = _controls(interactive_divergence_explorer())
    assert list(controls) == ["mode", "flavor", "legacy skip_attn", "layers", "strict layers", "chunked prefill"]
    flavor, mode, chunked = controls["flavor"], controls["mode"], controls["chunked prefill"]
    assert isinstance(flavor, ipywidgets.Dropdown)
    assert list(flavor.options) == ["compiled", "breakable"] and flavor.value == "compiled"
    assert list(mode.options) == ["piecewise", "full_and_piecewise", "full_decode_only", "full", "none"]
    assert mode.value == "piecewise"
    assert isinstance(chunked, ipywidgets.Checkbox) and chunked.value is False


_OFF = "flavor, legacy skip_attn and strict layers are off"
CONTROL_STATES = {
    "piecewise": ((), ""),
    "full_and_piecewise": (
        (),
        ("FULL_AND_PIECEWISE: decode steps replay FULL graphs, mixed batches (chunked prefill) PIECEWISE ones"),
    ),
    **{
        mode: (
            ("flavor", "legacy", "strict"),
            (f"{_OFF}: they apply to PIECEWISE graphs only, and FULL graphs got capture metadata before the fix too"),
        )
        for mode in ("full_decode_only", "full")
    },
    "none": (("flavor", "legacy", "strict"), f"{_OFF}: NONE captures no graph (eager against eager)"),
}


@pytest.mark.parametrize("mode", list(CONTROL_STATES))
def test_divergence_controls_that_do_nothing_in_the_mode_are_disabled(mode: str):
    assert divergence_control_state({"mode": mode}) == CONTROL_STATES[mode]


def test_the_disabled_switches_really_change_nothing_in_their_modes():
    """What justifies disabling them: under FULL and NONE every flavor, legacy and strict setting runs the
    very same steps, with the very same differences from eager."""
    for mode in ("full_decode_only", "full", "none"):
        runs = {
            (flavor, legacy, strict): cached_repro(
                mode,
                piecewise_flavor=flavor,
                legacy_skip_attn=legacy,
                strict_layers=strict,
                steps=3,
                **ONE_PADDED_BATCH,
            )
            for flavor in ("compiled", "breakable")
            for legacy in (False, True)
            for strict in (False, True)
        }
        seen = {
            (r.error, tuple(r.step_modes), tuple(r.step_diffs), tuple(sorted(r.state_diffs.items())))
            for r in runs.values()
        }
        assert len(seen) == 1, mode
    # ... and they do change something where PIECEWISE graphs are captured
    assert cached_repro("piecewise", legacy_skip_attn=True, steps=3, **ONE_PADDED_BATCH).diverged
    breakable = cached_repro(
        "piecewise", legacy_skip_attn=True, piecewise_flavor="breakable", steps=3, **ONE_PADDED_BATCH
    )
    assert not breakable.diverged
    assert cached_repro("piecewise", legacy_skip_attn=True, strict_layers=True, steps=3, **ONE_PADDED_BATCH).error


def test_the_divergence_widget_disables_its_switches_as_the_mode_changes(capsys):
    widget = interactive_divergence_explorer()
    controls = _controls(widget)
    _, (status,), _ = _parts(widget)
    names = {"flavor": "flavor", "legacy": "legacy skip_attn", "strict": "strict layers"}
    for mode in ("full", "full_decode_only", "none", "full_and_piecewise", "piecewise"):
        controls["mode"].value = mode
        disabled, why = CONTROL_STATES[mode]
        assert {d for d, c in controls.items() if c.disabled} == {names[n] for n in disabled}, mode
        assert status.value == (f"<small>{why}</small>" if why else ""), mode


def test_the_policy_and_chunked_prefill_reach_run_repro(run_case_calls: list[dict], capsys):
    runs = run_case_calls
    controls = _controls(interactive_divergence_explorer())
    assert [(r["mode"], r["legacy_skip_attn"], r["prefill_chunk"], r["steps"]) for r in runs] == [
        ("piecewise", True, 0, 16),
        ("piecewise", False, 0, 16),
    ]
    runs.clear()
    controls["mode"].value = "full_and_piecewise"
    controls["chunked prefill"].value = True
    assert [(r["mode"], r["legacy_skip_attn"], r["prefill_chunk"], r["steps"]) for r in runs] == [
        ("full_and_piecewise", True, 0, 16),
        ("full_and_piecewise", False, 0, 16),
        ("full_and_piecewise", True, PREFILL_CHUNK, CHUNKED_STEPS),
        ("full_and_piecewise", False, PREFILL_CHUNK, CHUNKED_STEPS),
    ]
    assert (PREFILL_CHUNK, CHUNKED_STEPS) == (4, 20)  # notebook 04's chunked-prefill runs


def test_full_and_piecewise_hides_the_legacy_bug_from_decodes_and_chunked_prefill_exposes_it(capsys):
    """The lesson of the policy, as the explorer draws it: plain decode replays FULL graphs only and
    matches eager on the legacy path; chunked prefill replays the compiled PIECEWISE pieces and diverges."""
    decode = divergence_explorer("full_and_piecewise", legacy=True)
    chunked = divergence_explorer("full_and_piecewise", legacy=True, chunked_prefill=True)
    assert decode._suptitle.get_text() == (
        "sconv,attn,compressor,attn: FULL_AND_PIECEWISE compiled legacy -> matches eager"
    )
    assert chunked._suptitle.get_text() == (
        "sconv,attn,compressor,attn, chunked prefill: FULL_AND_PIECEWISE "
        "compiled legacy -> DIVERGED from eager, and nothing raised"
    )
    assert divergence_notes("full_and_piecewise", legacy=True) == [
        "FULL_AND_PIECEWISE compiled legacy: steps by mode: FULL 16",
        "FULL_AND_PIECEWISE compiled fixed: steps by mode: FULL 16",
    ]
    assert (
        divergence_notes("full_and_piecewise", legacy=True, chunked_prefill=True)[0]
        == "FULL_AND_PIECEWISE compiled legacy: steps by mode: PIECEWISE 17, eager 2, FULL 1"
    )


def test_a_failed_capture_says_nothing_was_replayed(capsys):
    assert divergence_notes("piecewise", legacy=True, strict=True, steps=4) == [
        "PIECEWISE compiled legacy strict: capture failed: nothing replayed (MissingMetadataError)",
        "PIECEWISE compiled fixed: steps by mode: PIECEWISE 4",
    ]
    controls = _controls(interactive_divergence_explorer())  # the explorer prints the notes under its plot
    capsys.readouterr()
    controls["strict layers"].value = True
    printed = capsys.readouterr().out
    assert "PIECEWISE compiled legacy strict: capture failed: nothing replayed (MissingMetadataError)\n" in printed


def test_latency_explorer_asks_for_a_choice_instead_of_drawing_empty_axes(bench_result):
    for modes, batch_sizes, message in [
        ((), None, "select at least one mode"),
        (None, [], "select at least one batch size"),
        ([], (), "select at least one mode and one batch size"),
    ]:
        fig = latency_explorer(bench_result, modes=modes, batch_sizes=batch_sizes)
        (ax,) = fig.axes  # one, drawn without frame or ticks: a figure without axes would show as text only
        assert not ax.axison and not ax.lines and [t.get_text() for t in ax.texts] == [message]
    assert len(latency_explorer(bench_result, modes=["full"]).axes) == 1


def test_latency_widget_says_how_to_pick_several(bench_result, capsys):
    widget = interactive_latency_explorer(bench_result)
    _, (hint,), _ = _parts(widget)
    assert hint.value == f"<small>{MULTI_SELECT_HINT}</small>" and widget.children[0] is hint  # above the lists
    assert "Ctrl-click" in MULTI_SELECT_HINT and "Shift-click" in MULTI_SELECT_HINT
    controls = _controls(widget)
    assert [c.tooltip for c in controls.values()] == [MULTI_SELECT_HINT] * 2
    assert [c.rows for c in controls.values()] == [len(c.options) for c in controls.values()]  # none hidden
    controls["modes"].value = ()
    assert "Figure(700x40)" in capsys.readouterr().out  # the one-line message, not the 700x450 plot


class _SlowExplorer:
    """A fake explorer that takes a while to draw and records overlapping draws."""

    def __init__(self, block_on: int | None = None) -> None:
        self.drawn: list[int] = []
        self.overlaps = 0
        self._active = 0
        self._lock = threading.Lock()
        self.block_on, self.blocked, self.release = block_on, threading.Event(), threading.Event()

    def __call__(self, step: int) -> Figure:
        with self._lock:
            self._active += 1
            self.overlaps += self._active > 1
        if step == self.block_on:
            self.blocked.set()
            self.release.wait(timeout=10)
        time.sleep(0.005)
        with self._lock:
            self._active -= 1
            self.drawn.append(step)
        return Figure()


def test_overlapping_changes_from_two_threads_draw_one_at_a_time_and_the_last_value_wins(capsys):
    ipywidgets = pytest.importorskip("ipywidgets", reason="the widget wrappers need ipywidgets (make installs it)")
    slider = ipywidgets.IntSlider(value=0, min=0, max=1000)
    explorer = _SlowExplorer()
    interactive(explorer, {"step": slider})
    barrier, errors = threading.Barrier(2, timeout=10), []

    def change(values: range) -> None:
        try:
            barrier.wait()
            for value in values:
                slider.value = value
        except BaseException as e:
            errors.append(e)

    threads = [
        threading.Thread(target=change, args=(range(1, 300, 2),)),
        threading.Thread(target=change, args=(range(2, 300, 2),)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors and explorer.overlaps == 0
    assert explorer.drawn[-1] == slider.value  # every change has been drawn or coalesced into the last draw


def test_a_change_during_a_redraw_is_coalesced_into_the_newest_value(capsys):
    ipywidgets = pytest.importorskip("ipywidgets", reason="the widget wrappers need ipywidgets (make installs it)")
    slider = ipywidgets.IntSlider(value=0, min=0, max=10)
    explorer = _SlowExplorer(block_on=1)
    interactive(explorer, {"step": slider})
    drawing = threading.Thread(target=setattr, args=(slider, "value", 1))
    drawing.start()
    assert explorer.blocked.wait(timeout=10)
    for value in (2, 3, 4):  # requested while step 1 draws: each returns at once, marking the area stale
        slider.value = value
    explorer.release.set()
    drawing.join(timeout=10)
    assert explorer.drawn == [0, 1, 4] and explorer.overlaps == 0


def test_the_decode_explorer_keeps_its_text_legible_at_its_last_step():
    """Wider than the output area beside the file browser (848 pixels), JupyterLab would shrink the figure,
    its text with it: at the slider's last step the caches span 15 blocks."""
    assert decode_explorer(12).get_size_inches()[0] * DPI <= 840
