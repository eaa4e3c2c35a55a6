"""``python -m cglab bench`` and ``startup``: the measurement commands' options, and how they run.

The options are parsed before torch is imported (``cglab.cli``), so this module imports no torch
at the top: the commands import the benchmark when they run.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path

from cglab._arguments import PROG, add_command, int_list, name_list, print_saved
from cglab.bench.config import BenchConfig
from cglab.bench.modes import MODE_NAMES, POLICIES
from cglab.compare import dumps, exceeds
from cglab.config import DEVICES, DTYPES, PIECEWISE_FLAVORS
from cglab.errors import NotSavedError
from cglab.kernels import KERNEL_SETS


def _model_defaults(name: str) -> str:
    """``"default 1024 (--quick: 32)"``: the benchmark's model, which bench and startup both start from
    (``BenchConfig``; its quick preset with ``--quick``), for the help of an option that overrides it."""
    full, quick = (getattr(config, name) for config in (BenchConfig, BenchConfig.quick_preset()))
    full, quick = (",".join(map(str, v)) if isinstance(v, tuple) else v for v in (full, quick))
    return f"default {full}" if full == quick else f"default {full} (--quick: {quick})"


def _add_model_options(p: argparse.ArgumentParser) -> None:
    """The toy model's size, shared by bench and startup."""
    p.add_argument("--layers", help=f"layer pattern; {_model_defaults('layers')}")
    p.add_argument("--hidden-size", type=int, help=_model_defaults("hidden_size"))
    p.add_argument("--num-heads", type=int, help=_model_defaults("num_heads"))
    p.add_argument("--dtype", choices=DTYPES, help=_model_defaults("dtype"))
    p.add_argument(
        "--max-model-len", type=int, help=f"FULL graphs attend over this many keys; {_model_defaults('max_model_len')}"
    )
    p.add_argument("--seed", type=int, help=_model_defaults("seed"))


def add_bench(sub: argparse._SubParsersAction) -> None:
    p = add_command(
        sub,
        "bench",
        "measure one decode step's latency per CUDA graph mode and batch size",
        "Measure one decode step's latency per row kind (eager, PIECEWISE, FULL, compiled, torch's "
        "reduce-overhead) and batch size; write OUT.csv and OUT.json (the environment). On the CPU "
        "simulator the numbers say nothing about GPU speed.",
        (f"{PROG} bench --quick --out bench-quick", "the small model, seconds on a CPU"),
        (
            f"{PROG} bench --quick --modes none,full --batch-sizes 1,8 --out bench-two --force",
            "two row kinds at two batch sizes, overwriting an earlier pair",
        ),
        (f"{PROG} bench --device cuda --out bench-gpu", "the whole ladder on a GPU (minutes)"),
    )
    p.add_argument("--out", required=True, help="writes OUT.csv and OUT.json")
    p.add_argument("--device", choices=DEVICES, default="cpu", help="cuda: real CUDA graphs; cpu: the simulator")
    p.add_argument("--quick", action="store_true", help="a small CPU-sized run that ends in seconds")
    p.add_argument(
        "--kernels",
        choices=KERNEL_SETS,
        help="the custom ops' kernels: triton (the toy's Triton kernels, CUDA only) or aten (their "
        "readable bodies); default triton on CUDA when triton imports, else aten",
    )
    p.add_argument(
        "--modes",
        type=name_list(MODE_NAMES),
        help=f"row kinds from {', '.join(MODE_NAMES)}; default: every one the device can run "
        "(reduce_overhead needs a GPU)",
    )
    p.add_argument("--batch-sizes", type=int_list, help=_model_defaults("batch_sizes"))
    _add_model_options(p)
    p.add_argument("--repeats", type=int, help=f"timed steps per mode and batch size; {_model_defaults('repeats')}")
    p.add_argument("--warmup", type=int, help=f"untimed steps first; {_model_defaults('warmup')}")
    p.add_argument(
        "--prompt-len",
        type=int,
        help=f"tokens each request holds before the timed step; {_model_defaults('prompt_len')}",
    )
    p.add_argument("--json", action="store_true", help="print the result summary as JSON on the last line")
    p.add_argument("--force", action="store_true", help="overwrite OUT.csv / OUT.json if they exist")
    p.set_defaults(func=_run_bench)


def _config_from(args: argparse.Namespace, names: Sequence[str]) -> dict[str, object]:
    """The options given on the command line (the rest keep the config's defaults); lists as tuples."""
    given = {n: getattr(args, n) for n in names if getattr(args, n) is not None}
    return {n: tuple(v) if isinstance(v, list) else v for n, v in given.items()} | {"device": args.device}


def _run_bench(args: argparse.Namespace) -> int:
    from cglab.bench import BenchConfig, check_output, run_bench, save_results
    from cglab.bench.report import bench_table

    given = _config_from(
        args,
        (
            "kernels",
            "modes",
            "batch_sizes",
            "layers",
            "hidden_size",
            "num_heads",
            "dtype",
            "repeats",
            "warmup",
            "prompt_len",
            "max_model_len",
            "seed",
        ),
    )
    config = BenchConfig.quick_preset(**given) if args.quick else BenchConfig(**given)
    check_output(args.out, args.force)  # before minutes of measuring, not after
    result = run_bench(config, progress=sys.stderr.isatty())
    csv_path, json_path = _save(lambda path, force: save_results(result, path, force), args, asdict(result))
    _warn_if_off(result.environment.get("max_abs_diff_vs_eager", {}), config.dtype)
    if args.json:
        print_saved(dumps({**result.summary(), "csv": str(csv_path), "json": str(json_path)}))
        return 0
    sim = "\n  CPU simulator of CUDA graphs: semantics only, not GPU speed" if result.backend == "sim" else ""
    print_saved(
        f"{result.device_name}, backend {result.backend}, kernels {result.environment['kernels']}{sim}\n"
        f"{bench_table(result)}\nwrote {csv_path} and {json_path}"
    )
    return 0


def _warn_if_off(diffs: dict[str, float], dtype: str) -> None:
    """One line on stderr if a row's logits differ from eager's beyond rounding (NaN included): such a
    row times another computation, not a faster way to run the same step."""
    from cglab.repro import tolerance

    off = [f"{mode} ({diff:.3g})" for mode, diff in diffs.items() if exceeds(diff, tolerance(dtype))]
    if off:
        print(
            f"{PROG} bench: warning: the logits of {', '.join(off)} differ from eager's beyond rounding; those "
            "rows time another computation",
            file=sys.stderr,
        )


def add_startup(sub: argparse._SubParsersAction) -> None:
    p = add_command(
        sub,
        "startup",
        "measure compile time, warmup and capture time and capture memory of an "
        "engine start, fixed path against the legacy one",
        "Start one engine per policy, PIECEWISE flavor and capture path (fixed, legacy) and measure "
        "compile time, warmup and capture time and capture memory; write OUT.csv and OUT.json.",
        (f"{PROG} startup --quick --out startup-quick", "the small model, seconds on a CPU"),
        (
            f"{PROG} startup --quick --flavors breakable --out startup-breakable --force",
            "the breakable flavor only, overwriting an earlier pair",
        ),
        (
            f"{PROG} startup --device cuda --policies full_and_piecewise --out startup-gpu",
            "vLLM's default policy on a GPU, both flavors",
        ),
    )
    p.add_argument("--out", required=True, help="writes OUT.csv and OUT.json")
    p.add_argument("--device", choices=DEVICES, default="cpu", help="cuda: real CUDA graphs; cpu: the simulator")
    p.add_argument(
        "--quick", action="store_true", help="a small CPU-sized run: FULL_AND_PIECEWISE compiled, capture sizes to 8"
    )
    p.add_argument(
        "--policies", type=name_list(POLICIES), help=f"default {','.join(POLICIES)} (--quick: full_and_piecewise)"
    )
    p.add_argument(
        "--flavors",
        type=name_list(PIECEWISE_FLAVORS),
        help=f"default {','.join(PIECEWISE_FLAVORS)} (--quick: compiled)",
    )
    p.add_argument("--max-capture-size", type=int, help="the default ladder up to this size; default 256 (--quick: 8)")
    _add_model_options(p)
    p.add_argument("--json", action="store_true", help="print the rows as JSON on the last line")
    p.add_argument("--force", action="store_true", help="overwrite OUT.csv / OUT.json if they exist")
    p.set_defaults(func=_run_startup)


def _run_startup(args: argparse.Namespace) -> int:
    from cglab.bench import check_output
    from cglab.bench.report import startup_table
    from cglab.bench.startup import StartupConfig, measure_startup, save_startup

    given = _config_from(
        args,
        (
            "policies",
            "flavors",
            "max_capture_size",
            "layers",
            "hidden_size",
            "num_heads",
            "dtype",
            "max_model_len",
            "seed",
        ),
    )
    config = StartupConfig.quick_preset(**given) if args.quick else StartupConfig(**given)
    check_output(args.out, args.force)
    result = measure_startup(config)
    csv_path, json_path = _save(lambda path, force: save_startup(result, path, force), args, asdict(result))
    if args.json:
        print_saved(dumps({"rows": result.rows, "csv": str(csv_path), "json": str(json_path)}))
        return 0
    print_saved(
        f"{result.environment['device_name']}, backend {result.rows[0]['backend']}, "
        f"{len(result.config['capture_sizes'])} capture sizes (1 to {config.max_capture_size})\n"
        f"{startup_table(result)}\nwrote {csv_path} and {json_path}"
    )
    return 0


def _save(
    save: Callable[[str | Path, bool], tuple[Path, Path]], args: argparse.Namespace, everything: dict[str, object]
) -> tuple[Path, Path]:
    """Save at ``--out``; if the file system refuses, keep the result elsewhere (``save_or_keep``), or
    at least print it: minutes of measuring must not be lost to their last step."""
    from cglab.bench.files import save_or_keep

    try:
        return save_or_keep(save, args.out, args.force)
    except NotSavedError as exc:
        if exc.kept is not None:
            raise
        print(dumps(everything))
        raise NotSavedError(f"{exc}; the measurements were printed on stdout as JSON", None) from None


__all__ = ["add_bench", "add_startup"]
