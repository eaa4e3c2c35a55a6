"""``python -m cglab``: the headless entry points (``repro``, ``bench``, ``startup``; more register here)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import torch

from cglab.config import LAYER_KINDS, MAX_LAYERS, MAX_SPECULATIVE_TOKENS, OP_OF_KIND, PIECEWISE_FLAVORS, CUDAGraphMode
from cglab.errors import CglabError, ConfigError, NotSavedError

if TYPE_CHECKING:
    from cglab.repro import ReproResult


class _Parser(argparse.ArgumentParser):
    """Bad arguments get one line naming the argument, not a usage dump or a traceback."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def _items(text: str) -> list[str]:
    """``"a, b"`` -> ``["a", "b"]``. An empty item (``"1,,2"``) is a typo, not a separator: refused."""
    items = [part.strip() for part in text.split(",")]
    if any(items) and not all(items):
        raise argparse.ArgumentTypeError(f"{text!r} has an empty item (two commas in a row, or one at an end); "
                                         "remove it")
    return [item for item in items if item]


def int_list(text: str) -> list[int]:
    """``"1,2,4"`` -> ``[1, 2, 4]`` (argparse type: its error message names the argument)."""
    try:
        values = [int(part) for part in _items(text)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated positive integers, got {text!r}") from None
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected comma-separated positive integers, got {text!r}")
    return values


def _add_repro(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("repro", help="run the toy engine against an eager reference and report divergence")
    p.add_argument("--mode", type=str.lower, choices=[m.value for m in CUDAGraphMode], default="piecewise",
                   help="a runtime mode or a policy (case does not matter)")
    p.add_argument("--piecewise-flavor", choices=list(PIECEWISE_FLAVORS),
                   help="compiled (the default): torch.compile split at --splitting-ops, as vLLM; breakable: one "
                        "capture split at the eager breaks. Under FULL: whether the graph records the compiled model")
    p.add_argument("--splitting-ops", help=f"ops compiled PIECEWISE splits at (default: the attention op); "
                                           f"from {', '.join(OP_OF_KIND.values())}")
    p.add_argument("--legacy-skip-attn", action="store_true",
                   help="capture with the code from before vLLM PR #49364 (the bug)")
    p.add_argument("--layers", default="sconv,attn,compressor,attn",
                   help=f"layer pattern, comma-separated kinds from {', '.join(LAYER_KINDS)} (e.g. linear_attn,attn), "
                        f"at most {MAX_LAYERS} layers")
    p.add_argument("--strict-layers", action="store_true", help="stateful layers without the None guard")
    p.add_argument("--python-guards", action="store_true",
                   help="the stateful layers' None guard in plain Python in forward (as Inkling and DeepSeek V4), "
                        "not in their custom op: torch.compile decides it once, when it traces the profiling run")
    p.add_argument("--strict-attention", action="store_true",
                   help="the toy's stand-in for the crash behind the revert of #49364: an attention kernel that "
                        "refuses the dummy capture batch")
    p.add_argument("--capture-sizes", type=int_list,
                   help="tokens per graph (default 1,2,4,8; with K speculative tokens, K+1 times those, and given "
                        "sizes are rounded to multiples of K+1)")
    p.add_argument("--batch-sizes", type=int_list, default=[3, 1, 8], help="decode batch sizes, cycled")
    p.add_argument("--max-num-reqs", type=int, metavar="N",
                   help="the engine's request limit, at least the largest batch size (default: that size); a capture "
                        "size above it makes a prefill-shaped capture batch")
    p.add_argument("--steps", type=int, default=16,
                   help="steps after the eager prefill; with --prefill-chunk, all steps")
    p.add_argument("--prefill-chunk", type=int, default=0,
                   help="0: prefill eagerly first; N: prompts enter the engine N tokens a step, mixed with decodes")
    p.add_argument("--uniform-decode-by-shape", action="store_true",
                   help="classify uniform decode by batch shape alone, as vLLM did before PR #51865")
    p.add_argument("--num-speculative-tokens", type=int, default=0, metavar="K",
                   help=f"speculative decoding: K drafts per step (at most {MAX_SPECULATIVE_TOKENS}) from an "
                        "EAGLE-style drafter, verified greedily; reports acceptance_rate and reference_acceptance_rate "
                        "(the same drafter run eagerly)")
    p.add_argument("--draft-layers", help="the drafter's decoder layers after its fusion conv (default attn)")
    p.add_argument("--frozen-step-index", action="store_true",
                   help="the draft step index as a Python int frozen at capture (an analogue of vLLM PR #48892, a "
                        "PIECEWISE matter there)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--check", action="store_true",
                   help="exit 1 if replay diverged from eager, the acceptance rate fell below the reference's, or an "
                        "error occurred")
    p.set_defaults(func=_run_repro)


def _run_repro(args: argparse.Namespace) -> int:
    from cglab.repro import run_repro
    from cglab.spec_decode import DEFAULT_DRAFT_LAYERS, run_spec_repro

    _check_repro_switches(args)
    common = {"legacy_skip_attn": args.legacy_skip_attn, "piecewise_flavor": args.piecewise_flavor or "compiled",
              "splitting_ops": args.splitting_ops, "layers": args.layers, "strict_layers": args.strict_layers,
              "python_guards": args.python_guards, "strict_attention": args.strict_attention,
              "capture_sizes": args.capture_sizes, "batch_sizes": args.batch_sizes, "max_num_reqs": args.max_num_reqs,
              "steps": args.steps,
              "uniform_decode_by_shape": args.uniform_decode_by_shape, "seed": args.seed, "device": args.device}
    if args.num_speculative_tokens == 0:
        result = run_repro(args.mode, prefill_chunk=args.prefill_chunk, **common)
    else:
        result = run_spec_repro(args.mode, num_speculative_tokens=args.num_speculative_tokens,
                                draft_layers=args.draft_layers or DEFAULT_DRAFT_LAYERS,
                                frozen_step_index=args.frozen_step_index, **common)
    # An all-eager run in a graph mode compared eager with eager: with --check, that is no pass.
    no_graphs = result.mode != "none" and result.error is None and not result.replayed_graphs
    failed = result.diverged or result.lost_acceptance or result.error or no_graphs
    status = 1 if args.check and failed else 0
    if args.json:
        print(json.dumps(result.to_json()))
        return status
    legacy = " with the legacy skip_attn path" if result.legacy_skip_attn else ""
    flavor = f" ({result.piecewise_flavor})" if "piecewise" in result.mode else ""
    guards = ", guards in plain Python" if args.python_guards else ""
    print(f"mode {result.mode.upper()}{flavor}{legacy}, layers {result.layers}{guards}, backend {result.backend}")
    if result.backend == "sim":
        print("  (backend 'sim' is the CPU simulator of CUDA graphs: faithful semantics, no GPU speed-up)")
    if result.cudagraph_mode_note:
        print(f"  {result.cudagraph_mode_note}")
    if result.legacy_skip_attn and CUDAGraphMode.PIECEWISE not in CUDAGraphMode(result.cudagraph_mode).runtime_modes():
        print("  --legacy-skip-attn changes nothing here: this policy captures no PIECEWISE graph, and FULL graphs got "
              "capture metadata before the fix too")
    print(f"  captured sizes: {result.captured_sizes or 'none'}")
    if result.error:
        print(f"  ERROR: {result.error}")
    if result.max_abs_diff is not None:
        verdict = ("DIVERGED from eager" if result.diverged else
                   "NO GRAPH REPLAYED (every step ran eagerly)" if no_graphs else "matches eager")
        what = (f"steps (prompts in chunks of {result.prefill_chunk})" if result.prefill_chunk
                else "speculative steps" if result.num_speculative_tokens else "decode steps")
        print(f"  {result.steps} {what}, ran as {result.steps_by_mode}: max |replay - eager|: "
              f"{result.max_abs_diff_text}, caches diverged: {result.state_diverged} -> {verdict}")
        if no_graphs:
            print("  no batch fitted a captured graph, so this run says nothing about graphs: use --batch-sizes "
                  "within --capture-sizes (and, for full_decode_only, decode steps)")
    if result.acceptance_rate is not None:
        _print_acceptance(result)
    return status


# Switches that change only how graphs are captured or replayed; --mode none captures none.
_GRAPH_SWITCHES = {"legacy_skip_attn": "--legacy-skip-attn", "piecewise_flavor": "--piecewise-flavor",
                   "splitting_ops": "--splitting-ops", "capture_sizes": "--capture-sizes",
                   "strict_layers": "--strict-layers", "python_guards": "--python-guards",
                   "strict_attention": "--strict-attention", "uniform_decode_by_shape": "--uniform-decode-by-shape",
                   "frozen_step_index": "--frozen-step-index"}


def _check_repro_switches(args: argparse.Namespace) -> None:
    """Refuse, before any work, switches that contradict each other or would change nothing."""
    if args.mode == "none":
        given = [flag for name, flag in _GRAPH_SWITCHES.items() if getattr(args, name) not in (None, False)]
        if given:
            raise ConfigError(f"--mode none captures no graph, so {' and '.join(given)} would change nothing (the "
                              f"run compares eager with eager): drop {'them' if len(given) > 1 else 'it'}, or choose "
                              "a graph mode such as --mode piecewise")
    if args.num_speculative_tokens == 0 and (args.draft_layers is not None or args.frozen_step_index):
        raise ConfigError("--draft-layers and --frozen-step-index describe the drafter: add "
                          "--num-speculative-tokens K (K >= 1)")
    if args.num_speculative_tokens and args.prefill_chunk:
        raise ConfigError("--prefill-chunk does not combine with --num-speculative-tokens: speculative steps here "
                          "follow an eager prefill; drop one of the two")


def _name_list(valid: Sequence[str]) -> Callable[[str], list[str]]:
    """An argparse type for ``"a,b"`` -> ``["a", "b"]``, each name one of ``valid``."""
    def parse(text: str) -> list[str]:
        names = [name.lower() for name in _items(text)]
        if not names or any(n not in valid for n in names):
            raise argparse.ArgumentTypeError(f"expected comma-separated names from {', '.join(valid)}; got {text!r}")
        return names

    return parse


def _print_acceptance(result: ReproResult) -> None:
    from cglab.spec_decode import summarize_spec

    print(f"  {result.num_speculative_tokens} speculative tokens, drafts ran as {result.draft_steps_by_mode}")
    for line in summarize_spec(result).splitlines():
        print(f"  {line}")


def _add_bench(sub: argparse._SubParsersAction) -> None:
    from cglab.bench.modes import MODE_NAMES

    p = sub.add_parser("bench", help="measure one decode step's latency per CUDA graph mode and batch size")
    p.add_argument("--out", required=True, help="writes OUT.csv and OUT.json")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--quick", action="store_true", help="a small CPU-sized run that ends in seconds")
    p.add_argument("--modes", type=_name_list(MODE_NAMES),
                   help="default: every mode the device can run (reduce_overhead needs a GPU)")
    p.add_argument("--batch-sizes", type=int_list, help="default 1,2,4,...,256 (--quick: 1,2,4,8)")
    p.add_argument("--layers", help="layer pattern; default sconv,attn,compressor,attn twice")
    p.add_argument("--hidden-size", type=int)
    p.add_argument("--num-heads", type=int)
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--repeats", type=int, help="timed steps per mode and batch size")
    p.add_argument("--warmup", type=int, help="untimed steps first")
    p.add_argument("--prompt-len", type=int, help="tokens each request holds before the timed step")
    p.add_argument("--max-model-len", type=int, help="FULL graphs attend over this many keys")
    p.add_argument("--seed", type=int)
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

    given = _config_from(args, ("modes", "batch_sizes", "layers", "hidden_size", "num_heads", "dtype", "repeats",
                                "warmup", "prompt_len", "max_model_len", "seed"))
    config = BenchConfig.quick_preset(**given) if args.quick else BenchConfig(**given)
    check_output(args.out, args.force)  # before minutes of measuring, not after
    result = run_bench(config, progress=sys.stderr.isatty())
    csv_path, json_path = _save(lambda path, force: save_results(result, path, force), args, asdict(result))
    if args.json:
        print(json.dumps({**result.summary(), "csv": str(csv_path), "json": str(json_path)}))
        return 0
    print(f"{result.device_name}, backend {result.backend}")
    if result.backend == "sim":
        print("  CPU simulator of CUDA graphs: semantics only, not GPU speed")
    print(bench_table(result))
    print(f"wrote {csv_path} and {json_path}")
    return 0


def _add_startup(sub: argparse._SubParsersAction) -> None:
    from cglab.bench.startup import POLICIES

    p = sub.add_parser("startup", help="measure compile time, warmup and capture time and capture memory of an "
                                       "engine start, fixed path against the legacy one")
    p.add_argument("--out", required=True, help="writes OUT.csv and OUT.json")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--quick", action="store_true", help="a small CPU-sized run: FULL_AND_PIECEWISE compiled, "
                                                        "capture sizes to 8")
    p.add_argument("--policies", type=_name_list(POLICIES), help=f"default {','.join(POLICIES)}")
    p.add_argument("--flavors", type=_name_list(PIECEWISE_FLAVORS), help="default compiled,breakable")
    p.add_argument("--max-capture-size", type=int, help="the default ladder up to this size (default 256)")
    p.add_argument("--layers", help="layer pattern; default sconv,attn,compressor,attn twice")
    p.add_argument("--hidden-size", type=int)
    p.add_argument("--num-heads", type=int)
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--max-model-len", type=int)
    p.add_argument("--seed", type=int)
    p.add_argument("--json", action="store_true", help="print the rows as JSON on the last line")
    p.add_argument("--force", action="store_true", help="overwrite OUT.csv / OUT.json if they exist")
    p.set_defaults(func=_run_startup)


def _run_startup(args: argparse.Namespace) -> int:
    from cglab.bench import check_output
    from cglab.bench.report import startup_table
    from cglab.bench.startup import StartupConfig, measure_startup, save_startup

    given = _config_from(args, ("policies", "flavors", "max_capture_size", "layers", "hidden_size", "num_heads",
                                "dtype", "max_model_len", "seed"))
    config = StartupConfig.quick_preset(**given) if args.quick else StartupConfig(**given)
    check_output(args.out, args.force)
    result = measure_startup(config)
    csv_path, json_path = _save(lambda path, force: save_startup(result, path, force), args, asdict(result))
    if args.json:
        print(json.dumps({"rows": result.rows, "csv": str(csv_path), "json": str(json_path)}))
        return 0
    print(f"{result.environment['device_name']}, backend {result.rows[0]['backend']}, "
          f"{len(result.config['capture_sizes'])} capture sizes (1 to {config.max_capture_size})")
    print(startup_table(result))
    print(f"wrote {csv_path} and {json_path}")
    return 0


def _save(save: Callable[[str | Path, bool], tuple[Path, Path]], args: argparse.Namespace,
          everything: dict[str, object]) -> tuple[Path, Path]:
    """Save at ``--out``; if the file system refuses, keep the result elsewhere (``save_or_keep``), or
    at least print it: minutes of measuring must not be lost to their last step."""
    from cglab.bench.files import save_or_keep

    try:
        return save_or_keep(save, args.out, args.force)
    except NotSavedError as exc:
        if exc.kept is not None:
            raise
        print(json.dumps(everything))
        raise NotSavedError(f"{exc}; the measurements were printed on stdout as JSON", None) from None


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m cglab", description="cglab: CUDA graph capture, the toy engine")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    _add_repro(sub)
    _add_bench(sub)
    _add_startup(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command: its exit status, or one line on stderr and 2 (bad values), 1 (the file system
    failed; a finished result is kept, see ``_save``) or 130 (Ctrl-C), never a traceback."""
    prog, status = "python -m cglab", 2
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        prog = f"{parser.prog} {args.command}"
        if args.device == "cpu":
            torch.set_num_threads(1)  # the toy's tensors are tiny: more threads only compete for the cores
        return args.func(args)
    except KeyboardInterrupt:  # at any step, the parser's imports included
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except OSError as exc:  # before the CglabError clause: a NotSavedError is both
        status = 1
        message = str(exc) if isinstance(exc, NotSavedError) else f"{exc}; check the disk and the path, then run again"
    except CglabError as exc:  # bad values that only the engine can judge (sizes, devices, capacity)
        message = str(exc)
    except (MemoryError, torch.OutOfMemoryError):
        message = "out of memory; use fewer or smaller batch sizes, capture sizes or steps"
    print(f"{prog}: error: {' '.join(message.split())}", file=sys.stderr)
    return status


__all__ = ["build_parser", "main"]
