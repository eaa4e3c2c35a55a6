"""``python -m cglab bench`` and ``startup``: the measurement commands' options, and how they run.
The options are parsed before torch is imported, so the commands import the benchmark when they run."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import asdict, fields
from typing import Any

from cglab._arguments import PROG, add_command, int_list, name_list, print_saved
from cglab.bench.config import BenchConfig
from cglab.bench.modes import MODE_NAMES, POLICIES
from cglab.compare import dumps, exceeds
from cglab.config import DEVICES, DTYPES, PIECEWISE_FLAVORS
from cglab.errors import NotSavedError
from cglab.kernels import KERNEL_SETS


def _model_option(p: argparse.ArgumentParser, flag: str, what: str = "", **kwargs: Any) -> None:
    """``flag``, its help ``what`` and its default in ``BenchConfig`` and its quick preset: ``default 1024
    (--quick: 32)``."""
    name = flag[2:].replace("-", "_")
    full, quick = (getattr(config, name) for config in (BenchConfig, BenchConfig.quick_preset()))
    full, quick = (",".join(map(str, v)) if isinstance(v, tuple) else v for v in (full, quick))
    default = f"default {full}" if full == quick else f"default {full} (--quick: {quick})"
    p.add_argument(flag, help=what + default, **kwargs)


def _add_common_options(p: argparse.ArgumentParser, quick: str) -> None:
    """What bench and startup share: where to write, the device, the toy model's size."""
    p.add_argument("--out", required=True, help="writes OUT.csv and OUT.json")
    p.add_argument("--device", choices=DEVICES, default="cpu", help="cuda: real CUDA graphs; cpu: the simulator")
    p.add_argument("--quick", action="store_true", help=quick)
    p.add_argument("--json", action="store_true", help="print the result as JSON on the last line")
    p.add_argument("--force", action="store_true", help="overwrite OUT.csv / OUT.json if they exist")
    _model_option(p, "--layers", "layer pattern; ")
    _model_option(p, "--hidden-size", type=int)
    _model_option(p, "--num-heads", type=int)
    _model_option(p, "--dtype", choices=DTYPES)
    _model_option(p, "--max-model-len", "FULL graphs attend over this many keys; ", type=int)
    _model_option(p, "--seed", type=int)


def add_bench(sub: argparse._SubParsersAction) -> None:
    p = add_command(
        sub,
        "bench",
        "measure one decode step's latency per CUDA graph mode and batch size",
        "Measure one decode step's latency per row kind (eager, PIECEWISE, FULL, compiled PIECEWISE and "
        "FULL; on a GPU also torch.compile's reduce-overhead peer) and batch size; write OUT.csv and OUT.json "
        "(the environment). On the CPU simulator the numbers say nothing about GPU speed.",
        (f"{PROG} bench --quick --out bench-quick", "the small model, seconds on a CPU"),
        (f"{PROG} bench --quick --modes none,full --out bench-two --force", "two row kinds, replacing an older pair"),
    )
    _add_common_options(p, "a small CPU-sized run that ends in seconds")
    p.add_argument(
        "--kernels",
        choices=KERNEL_SETS,
        help="the custom ops' kernels: triton (CUDA only; the default there) or aten (their readable bodies)",
    )
    p.add_argument(
        "--fused-linear",
        action="store_true",
        default=None,
        help="every linear as one launch of cglab::fused_linear (Triton to 4 rows with --kernels triton); default off",
    )
    p.add_argument(
        "--modes",
        type=name_list(MODE_NAMES),
        help=f"row kinds from {', '.join(MODE_NAMES)}; default: all the device can run (the peer needs CUDA)",
    )
    _model_option(p, "--batch-sizes", type=int_list)
    _model_option(p, "--repeats", "timed steps per mode and batch size; ", type=int)
    _model_option(p, "--warmup", "untimed steps first; ", type=int)
    _model_option(p, "--prompt-len", "tokens each request holds before the timed step; ", type=int)
    p.set_defaults(func=_run_bench)


def add_startup(sub: argparse._SubParsersAction) -> None:
    p = add_command(
        sub,
        "startup",
        "measure compile time, warmup and capture time and capture memory of an "
        "engine start, fixed path against the legacy one",
        "Start one engine per policy, PIECEWISE flavor and capture path (fixed, legacy) and measure "
        "compile time, warmup and capture time and capture memory; write OUT.csv and OUT.json.",
        (f"{PROG} startup --quick --out startup-quick", "the small model, seconds on a CPU"),
        (f"{PROG} startup --quick --flavors breakable --out startup-breakable", "the breakable flavor only"),
    )
    _add_common_options(p, "a small CPU-sized run: FULL_AND_PIECEWISE compiled, capture sizes to 8")
    p.add_argument(
        "--policies", type=name_list(POLICIES), help=f"default {','.join(POLICIES)} (--quick: full_and_piecewise)"
    )
    p.add_argument(
        "--flavors",
        type=name_list(PIECEWISE_FLAVORS),
        help=f"default {','.join(PIECEWISE_FLAVORS)} (--quick: compiled)",
    )
    p.add_argument("--max-capture-size", type=int, help="the default ladder up to this size; default 256 (--quick: 8)")
    p.set_defaults(func=_run_startup)


def _config(args: argparse.Namespace, cls: Any) -> Any:
    """``cls`` (or its quick preset) from the options given; the others keep the config's defaults."""
    given = {f.name: getattr(args, f.name, None) for f in fields(cls) if f.name != "quick"}
    given = {n: tuple(v) if isinstance(v, list) else v for n, v in given.items() if v is not None}
    return cls.quick_preset(**given) if args.quick else cls(**given)


def _run_bench(args: argparse.Namespace) -> int:
    config = _config(args, BenchConfig)  # before torch is imported
    from cglab.bench import check_output, run_bench, save_results
    from cglab.bench.report import bench_table, breakdown_table
    from cglab.repro import tolerance

    check_output(args.out, args.force)  # before minutes of measuring, not after
    result = run_bench(config)  # progress: a bar on a terminal, else a line every 5 s
    diffs = result.environment.get("max_abs_diff_vs_eager", {})  # beyond rounding, NaN included
    off = [f"{mode} ({diff:.3g})" for mode, diff in diffs.items() if exceeds(diff, tolerance(config.dtype))]
    if off:
        print(
            f"{PROG} bench: warning: the logits of {', '.join(off)} differ from eager's beyond rounding; those "
            "rows time another computation",
            file=sys.stderr,
        )
    sim = "\n  CPU simulator of CUDA graphs: semantics only, not GPU speed" if result.backend == "sim" else ""
    return _finish(
        args,
        result,
        save_results,
        lambda: "\n".join(
            [
                f"{result.device_name}, backend {result.backend}, kernels {result.environment['kernels']}{sim}",
                bench_table(result),
                *(breakdown_table(result, *key.split("/")) for key in result.environment.get("kernel_breakdown", {})),
            ]
        ),
    )


def _run_startup(args: argparse.Namespace) -> int:
    from cglab.bench import check_output
    from cglab.bench.report import startup_table
    from cglab.bench.startup import StartupConfig, measure_startup, save_startup

    config = _config(args, StartupConfig)
    check_output(args.out, args.force)
    result = measure_startup(config)
    return _finish(
        args,
        result,
        save_startup,
        lambda: (
            f"{result.environment['device_name']}, backend {result.rows[0]['backend']}, "
            f"{len(result.config['capture_sizes'])} capture sizes (1 to {config.max_capture_size})\n"
            f"{startup_table(result)}"
        ),
    )


def _finish(args: argparse.Namespace, result: Any, save: Callable[..., Any], report: Callable[[], str]) -> int:
    """Save first (nothing may fail before), then print ``report()``, or with ``--json`` the rows and where.
    Saved at ``--out``, or elsewhere (``save_or_keep``), or at least printed: never lose the measurements."""
    from cglab.bench.files import save_or_keep

    try:
        csv_path, json_path = save_or_keep(lambda path, force: save(result, path, force), args.out, args.force)
    except NotSavedError as exc:
        if exc.kept is not None:
            raise
        print(dumps(asdict(result)))
        raise NotSavedError(f"{exc}; the measurements were printed on stdout as JSON", None) from None
    env = result.environment
    if args.json:
        summary = {"backend": env.get("backend"), "device_name": env.get("device_name"), "rows": result.rows}
        print_saved(dumps({**summary, "csv": str(csv_path), "json": str(json_path)}))
    else:
        print_saved(f"{report()}\nwrote {csv_path} and {json_path}")
    return 0


__all__ = ["add_bench", "add_startup"]
