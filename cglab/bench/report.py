"""Reading results: the tables the CLI prints, the ladder at one batch size, and our targets, set before
measuring and reported as measured, never asserted by a test (speed belongs to a machine, not the code)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from cglab.bench.files import BenchResult
from cglab.bench.modes import BENCH_MODES
from cglab.bench.startup import StartupResult

__all__ = [
    "KERNEL_SET_LABELS",
    "SIM_FLOOR_NOTE",
    "Target",
    "bench_table",
    "breakdown_table",
    "kernel_set",
    "kernel_sets_table",
    "ladder",
    "startup_table",
    "startup_targets",
    "targets",
]

SIM_FLOOR_NOTE = (
    "* op time: the summed CPU time of the aten ops, measured under the profiler, whose tracing slows "
    "every op. The simulator has no GPU kernels, so this is no kernel floor and may exceed the median."
)


_BEFORE_FUSED = "compiled FULL / the FULL step before the fused kernels"
KERNEL_SET_LABELS = {"aten": "the ops' aten bodies", "triton": "the toy's Triton kernels"}


def kernel_set(result: BenchResult) -> str:
    """The custom ops' kernels a run used (runs recorded before ``--kernels`` ran the aten bodies)."""
    return result.environment.get("kernels") or "aten"


def bench_table(result: BenchResult) -> str:
    """The rows as the CLI prints them (the simulator's floor named for what it is), each with its median over
    the peer's, its weights streamed in GB/s and that as % of the measured copy bandwidth."""
    sim = result.backend == "sim"
    env = result.environment
    floor = "op time us*" if sim else "floor us"
    peer = _column(result, "reduce_overhead")
    header = f"  {'mode':<20}{'batch':>6}{'median us':>12}{'p10':>10}{'p90':>10}{floor:>13}{'launches':>10}"
    lines = [f"{header}{'enqueue us':>12}{'/ peer':>8}{'GB/s':>8}{'% bw':>7}"]
    for r in result.rows:
        ratio = f"{r['median_us'] / peer[r['batch_size']]:>8.2f}" if r["batch_size"] in peer else f"{'-':>8}"
        gb_s = env.get("weight_bytes", math.nan) / r["median_us"] / 1e3
        lines.append(
            f"  {r['mode']:<20}{r['batch_size']:>6}{r['median_us']:>12.1f}{r['p10_us']:>10.1f}"
            f"{r['p90_us']:>10.1f}{r['kernel_floor_us']:>13.1f}{_count(r['launches']):>10}"
            f"{r['enqueue_median_us']:>12.1f}{ratio}{gb_s:>8.0f}"
            f"{100 * gb_s / env.get('memory_bandwidth_gb_s', math.nan):>7.1f}"
        )
    if sim:
        lines.append(f"  {SIM_FLOOR_NOTE}")
    roof = env.get("roofline_us")
    if roof is not None:
        lines.append(
            f"  roofline: {roof:.1f} us per step ({env['weight_bytes'] / 1e6:.1f} MB of "
            f"weights at {env['memory_bandwidth_gb_s']:.0f} GB/s, measured)"
        )
    return "\n".join(lines)


def breakdown_table(result: BenchResult, mode: str, batch_size: int | str) -> str:
    """One replay's kernels by category (``environment["kernel_breakdown"]``) and its idle gaps."""
    found = result.environment.get("kernel_breakdown", {}).get(f"{mode}/{batch_size}")
    if found is None:
        return f"  {mode} at batch {batch_size}: no kernel breakdown recorded"
    lines = [f"  {mode}, batch {batch_size}: {'category':<16}{'nodes':>6}{'us':>9}{'MB':>8}{'GB/s':>8}"]
    for name, c in sorted(found["categories"].items(), key=lambda item: -item[1]["us"]):
        mb = "-" if c["bytes"] is None else f"{c['bytes'] / 1e6:.1f}"
        gb_s = "-" if c["gb_s"] is None else f"{c['gb_s']:.0f}"
        lines.append(f"  {'':<{len(mode) + 12}}{name:<16}{c['nodes']:>6}{c['us']:>9.1f}{mb:>8}{gb_s:>8}")
    lines.append(
        f"  replay span {found['span_us']:.1f} us, idle {found['idle_us']:.1f} us over {found['gaps']} gaps "
        f"({found['mean_gap_us']:.2f} us each)"
    )
    return "\n".join(lines)


def startup_table(result: StartupResult) -> str:
    header = f"  {'policy':<20}{'flavor':<11}{'path':<8}{'graphs':>7}{'compile s':>11}{'capture s':>11}"
    lines = [f"{header}{'startup s':>11}{'memory MiB':>12}"]
    for r in result.rows:
        lines.append(
            f"  {r['policy']:<20}{r['flavor']:<11}{r['path']:<8}{r['graphs']:>7}{r['compile_s']:>11.2f}"
            f"{r['capture_s']:>11.2f}{r['startup_s']:>11.2f}{r['memory_mib']:>12.1f}"
        )
    lines.append(
        "  capture s: warmups and captures of every graph, without the compile; startup s: building the "
        "engine, all included"
    )
    return "\n".join(lines)


def ladder(result: BenchResult, batch_size: int) -> list[dict[str, Any]]:
    """One row per mode at ``batch_size``, in ladder order, with its speed-up over eager (None without one)."""
    rows = {r["mode"]: r for r in result.rows if r["batch_size"] == batch_size}
    eager = rows.get("none")
    return [
        {
            "mode": mode,
            "label": BENCH_MODES[mode].label,
            "median_us": r["median_us"],
            "launches": r["launches"],
            "kernels": r.get("kernels", math.nan),
            "kernel_floor_us": r["kernel_floor_us"],
            "speedup_over_eager": None if eager is None else round(eager["median_us"] / r["median_us"], 3),
        }
        for mode, r in ((m, rows[m]) for m in result.modes if m in rows)
    ]


def kernel_sets_table(before: BenchResult, after: BenchResult, batch_size: int) -> str:
    """Each mode both runs have at ``batch_size``, side by side: latency, kernels, floor, times the roofline."""
    a, b = ({r["mode"]: r for r in ladder(res, batch_size)} for res in (before, after))
    names = [kernel_set(res) for res in (before, after)]
    roofs = [res.environment.get("roofline_us") or math.nan for res in (before, after)]
    lines = [
        f"  batch {batch_size}: {names[0]} -> {names[1]}",
        f"  {'mode':<20}{'median us':>16}{'kernels':>12}{'floor us':>14}{'x roofline':>12}",
    ]
    for mode in (m for m in a if m in b):
        x, y = a[mode], b[mode]
        lines.append(
            f"  {mode:<20}{x['median_us']:>7.0f} -> {y['median_us']:<5.0f}"
            f"{_count(x['kernels']):>5} -> {_count(y['kernels']):<4}{x['kernel_floor_us']:>6.0f} -> "
            f"{y['kernel_floor_us']:<5.0f}{x['median_us'] / roofs[0]:>5.0f} -> "
            f"{y['median_us'] / roofs[1]:.0f}"
        )
    return "\n".join(lines)


@dataclass(frozen=True)
class Target:
    """A goal set before measuring, and what was measured."""

    name: str
    goal: str
    measured: float
    met: bool
    detail: str

    def __str__(self) -> str:
        return f"{'met' if self.met else 'MISSED'}: {self.name} {self.measured:.3g} (goal {self.goal}; {self.detail})"


def targets(result: BenchResult, small_batch: int = 16, baseline: BenchResult | None = None) -> list[Target]:
    """The latency targets, from whichever of their modes the result has. ``baseline``: a run from before
    the fused kernels, whose FULL step the compiled FULL step is held against."""
    compiled, full, eager = (_column(result, mode) for mode in ("compiled_full", "full", "none"))
    floor = {b: f for b, f in _column(result, "full", "kernel_floor_us").items() if f > 0}
    first = min(compiled, default=None)
    small = f"at batch <= {small_batch}"
    peer = 'compiled FULL / torch.compile "reduce-overhead"'
    found = [
        _worst("compiled FULL / FULL", f"<= 0.6 {small}", compiled, full, small_batch),
        _worst(peer, "<= 1.0 at every batch", compiled, _column(result, "reduce_overhead")),
    ]
    if first is not None:
        e, c = eager.get(first, math.nan), compiled[first]
        found.append(_target("eager / compiled FULL", f">= 8 at batch {first}", e / c, f"{e:.0f} us over {c:.0f} us"))
    found.append(_worst("FULL replay / kernel floor", f"<= 1.2 {small}", full, floor, small_batch))
    if result.rows and "attn_key_range" in result.rows[0]:
        limit = result.config.get("max_model_len", math.inf)
        reads_all = [r["mode"] for r in result.rows if r["attn_key_range"] >= limit]
        detail = ", ".join(sorted(set(reads_all))) or "every row reads the live keys"
        name, goal = "rows whose attention reads max_model_len keys", "0 (live keys only, every mode)"
        found.append(Target(name, goal, len(reads_all), not reads_all, detail))
    if first is not None:
        median = compiled[first]
        kernels = next(r for r in result.rows if (r["mode"], r["batch_size"]) == ("compiled_full", first)).get(
            "kernels"
        )
        roof = result.environment.get("roofline_us") or math.nan
        before = _column(baseline, "full").get(first, math.nan) if baseline is not None else math.nan
        at, by_peer = f"at batch {first}", median / _column(result, "reduce_overhead").get(first, math.nan)
        step = 170 if "H100" in result.environment.get("device_name", "") else 150  # an H100 streams slower
        found += [
            _target("compiled FULL step", f"<= {step} us {at}", median, f"{median:.0f} us"),
            _target("kernels per compiled FULL step", f"<= 48 {at}", kernels, f"{_count(kernels)} kernels"),
            _target("compiled FULL / roofline", f"<= 8 {at}", median / roof, f"roofline {roof:.1f} us"),
            _target(f"compiled FULL, batch {first} / 8", "<= 1.0", median / compiled.get(8, math.nan), "no slower"),
            _target(f"{peer} {at}", f"<= 0.45 {at}", by_peer, f"the peer's {median / by_peer:.0f} us"),
            _target(_BEFORE_FUSED, f"<= 0.4 {at}", median / before, f"{median:.0f} us over {before:.0f} us"),
        ]
    return [t for t in found if t is not None]


def _target(name: str, goal: str, measured: float | None, detail: str) -> Target | None:
    """A target whose ``goal`` begins with its bound, ``"<= 0.6 ..."`` or ``">= 8 ..."``; None if not measured."""
    if measured is None or math.isnan(measured):
        return None
    sign, bound = goal.split()[:2]
    measured = round(measured, 3)
    return Target(name, goal, measured, measured <= float(bound) if sign == "<=" else measured >= float(bound), detail)


def startup_targets(result: StartupResult, seconds: float = 30.0) -> list[Target]:
    """Start-up of compiled FULL_AND_PIECEWISE, compile plus capture, within ``seconds`` (if measured)."""
    try:
        row = result.row("full_and_piecewise", "compiled")
    except KeyError:
        return []
    total = row["compile_s"] + row["capture_s"]
    detail = f"{row['graphs']} graphs; compile {row['compile_s']:.1f} s, capture {row['capture_s']:.1f} s"
    found = _target("compiled FULL_AND_PIECEWISE start-up (compile + capture)", f"<= {seconds:g} s", total, detail)
    return [found] if found is not None else []


def _column(result: BenchResult, mode: str, column: str = "median_us") -> dict[int, float]:
    return {r["batch_size"]: r[column] for r in result.rows if r["mode"] == mode}


def _worst(
    name: str, goal: str, num: dict[int, float], den: dict[int, float], up_to: int | None = None
) -> Target | None:
    """The target decided by the batch size with the largest ratio ``num / den`` (the goals are upper bounds)."""
    ratios = {b: round(num[b] / den[b], 3) for b in sorted(num) if b in den and (up_to is None or b <= up_to)}
    if not ratios:
        return None
    batch, worst = max(ratios.items(), key=lambda item: item[1])
    return _target(name, goal, worst, f"worst at batch {batch}")


def _count(value: float) -> str:
    return "?" if isinstance(value, float) and math.isnan(value) else str(int(value))
