"""Reading results: the tables the CLI prints, the ladder at one batch size, and the targets we set.

The targets are ours, set before measuring; they are reported as measured, met or not, never asserted
by a test (speed is a property of a machine, not of the code).
"""

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


KERNEL_SET_LABELS = {"aten": "the ops' aten bodies", "triton": "the toy's Triton kernels"}


def kernel_set(result: BenchResult) -> str:
    """The custom ops' kernels a run used. Runs recorded before ``--kernels`` existed ran the aten
    bodies, the only kernels there were, and recorded no entry."""
    return result.environment.get("kernels") or "aten"


def bench_table(result: BenchResult) -> str:
    """The rows as the CLI prints them. On the simulator the floor column is named for what it is."""
    sim = result.backend == "sim"
    floor = "op time us*" if sim else "floor us"
    header = f"  {'mode':<20}{'batch':>6}{'median us':>12}{'p10':>10}{'p90':>10}{floor:>13}{'launches':>10}"
    lines = [f"{header}{'enqueue us':>12}"]
    for r in result.rows:
        lines.append(
            f"  {r['mode']:<20}{r['batch_size']:>6}{r['median_us']:>12.1f}{r['p10_us']:>10.1f}"
            f"{r['p90_us']:>10.1f}{r['kernel_floor_us']:>13.1f}{_count(r['launches']):>10}"
            f"{r['enqueue_median_us']:>12.1f}"
        )
    if sim:
        lines.append(f"  {SIM_FLOOR_NOTE}")
    roof = result.environment.get("roofline_us")
    if roof is not None:
        lines.append(
            f"  roofline: {roof:.1f} us per step ({result.environment['weight_bytes'] / 1e6:.1f} MB of "
            f"weights at {result.environment['memory_bandwidth_gb_s']:.0f} GB/s, measured)"
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
    """One row per mode at ``batch_size``, in ladder order: latency, launches, kernels, floor, and the
    speed-up over eager (None without an eager row)."""
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
    """Each mode at ``batch_size`` in two runs side by side (latency, kernels, kernel floor and distance to
    the roofline), for the modes both have; each run names its kernel set in the header."""
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
    found = []
    compiled, eager = _medians(result, "compiled_full"), _medians(result, "none")
    for other, name, goal, up_to in (
        ("full", "compiled FULL / FULL", f"<= 0.6 at batch <= {small_batch}", small_batch),
        ("reduce_overhead", 'compiled FULL / torch.compile "reduce-overhead"', "<= 1.0 at every batch", None),
    ):
        worst = _worst(_ratios(compiled, _medians(result, other), up_to))
        if worst is not None:
            found.append(_target(name, goal, worst[1], f"worst at batch {worst[0]}"))
    first = min(compiled, default=None)
    if first in eager:
        ratio = round(eager[first] / compiled[first], 3)
        detail = f"{eager[first]:.0f} us over {compiled[first]:.0f} us"
        found.append(_target("eager / compiled FULL", f">= 8 at batch {first}", ratio, detail))
    full = [
        r for r in result.rows if r["mode"] == "full" and r["batch_size"] <= small_batch and r["kernel_floor_us"] > 0
    ]
    worst = _worst({r["batch_size"]: round(r["median_us"] / r["kernel_floor_us"], 3) for r in full})
    if worst is not None:
        found.append(
            _target(
                "FULL replay / kernel floor",
                f"<= 1.2 at batch <= {small_batch}",
                worst[1],
                f"worst at batch {worst[0]}",
            )
        )
    if result.rows and "attn_key_range" in result.rows[0]:
        limit = result.config.get("max_model_len", math.inf)
        reads_all = sorted({r["mode"] for r in result.rows if r.get("attn_key_range", 0) >= limit})
        count = sum(r.get("attn_key_range", 0) >= limit for r in result.rows)
        detail = ", ".join(reads_all) or "every row reads the live keys"
        found.append(
            Target(
                "rows whose attention reads max_model_len keys",
                "0 (live keys only, every mode)",
                count,
                not count,
                detail,
            )
        )
    if first is None:
        return found
    row = next(r for r in result.rows if (r["mode"], r["batch_size"]) == ("compiled_full", first))
    median, kernels, roof = row["median_us"], row.get("kernels", math.nan), result.environment.get("roofline_us")
    found.append(_target("compiled FULL step", f"<= 300 us at batch {first}", median, f"{median:.0f} us"))
    if not math.isnan(kernels):
        found.append(
            _target("kernels per compiled FULL step", f"<= 100 at batch {first}", kernels, f"{_count(kernels)} kernels")
        )
    if roof:
        found.append(
            _target(
                "compiled FULL / roofline", f"<= 8 at batch {first}", round(median / roof, 3), f"roofline {roof:.1f} us"
            )
        )
    before = _medians(baseline, "full").get(first) if baseline is not None else None
    if before:
        name = "compiled FULL / the FULL step before the fused kernels"
        detail = f"{median:.0f} us over {before:.0f} us"
        found.append(_target(name, f"<= 0.4 at batch {first}", round(median / before, 3), detail))
    return found


def _target(name: str, goal: str, measured: float, detail: str) -> Target:
    """A target whose ``goal`` begins with its bound, ``"<= 0.6 ..."`` or ``">= 8 ..."``."""
    sign, bound = goal.split()[:2]
    return Target(name, goal, measured, measured <= float(bound) if sign == "<=" else measured >= float(bound), detail)


def startup_targets(result: StartupResult, seconds: float = 30.0) -> list[Target]:
    """Start-up of compiled FULL_AND_PIECEWISE, compile plus capture, within ``seconds`` (if measured)."""
    try:
        row = result.row("full_and_piecewise", "compiled")
    except KeyError:
        return []
    total = round(row["compile_s"] + row["capture_s"], 3)
    detail = f"{row['graphs']} graphs; compile {row['compile_s']:.1f} s, capture {row['capture_s']:.1f} s"
    return [_target("compiled FULL_AND_PIECEWISE start-up (compile + capture)", f"<= {seconds:g} s", total, detail)]


def _medians(result: BenchResult, mode: str) -> dict[int, float]:
    return {r["batch_size"]: r["median_us"] for r in result.rows if r["mode"] == mode}


def _ratios(num: dict[int, float], den: dict[int, float], up_to: int | None) -> dict[int, float]:
    return {b: round(num[b] / den[b], 3) for b in sorted(num) if b in den and (up_to is None or b <= up_to)}


def _worst(ratios: dict[int, float]) -> tuple[int, float] | None:
    """The batch size with the largest ratio (for an upper-bound goal, the one that decides it)."""
    return max(ratios.items(), key=lambda item: item[1]) if ratios else None


def _count(value: float) -> str:
    return "?" if isinstance(value, float) and math.isnan(value) else str(int(value))
