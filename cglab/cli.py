"""``python -m cglab``: the headless entry points (``repro``, ``bench``, ``startup``; more register here).

Arguments are parsed and checked before torch is imported (seconds): a typo is refused at once. So
this module, and everything it imports at the top, stays free of torch; the commands import the
engine when they run.
"""

from __future__ import annotations

import argparse
import os
import sys
import textwrap
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import NoReturn

from cglab import _interrupt
from cglab.compare import dumps
from cglab.config import (
    DEVICES,
    LAYER_KINDS,
    OP_OF_KIND,
    PIECEWISE_FLAVORS,
    CUDAGraphMode,
)
from cglab.errors import CglabError, ConfigError, NotSavedError

PROG = "python -m cglab"


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """argparse's own "(default: ...)" after each option's help, and the examples kept as written.
    Options whose default is None work theirs out from other options: their help says how."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        return action.help if action.default is None else super()._get_help_string(action)


class _Parser(argparse.ArgumentParser):
    """Bad arguments get one line naming the argument, not a usage dump or a traceback."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        kwargs.setdefault("formatter_class", _HelpFormatter)
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def _help_text(description: str, examples: Sequence[tuple[str, str]]) -> dict[str, str]:
    """``description`` filled to the help's width by hand (the formatter keeps text as written, for the
    examples) and an epilog of example command lines, each with what it shows (a shell comment, so the
    block pastes)."""
    return {
        "description": textwrap.fill(" ".join(description.split()), width=88),
        "epilog": "examples:\n" + "\n".join(f"  {command}\n      # {why}" for command, why in examples),
    }


def add_command(
    sub: argparse._SubParsersAction, name: str, summary: str, description: str, *examples: tuple[str, str]
) -> argparse.ArgumentParser:
    """The parser of subcommand ``name``: ``summary`` in the command list, the rest in its --help."""
    return sub.add_parser(name, help=summary, **_help_text(description, examples))


def _items(text: str) -> list[str]:
    """``"a, b"`` -> ``["a", "b"]``. An empty item (``"1,,2"``) is a typo, not a separator: refused."""
    items = [part.strip() for part in text.split(",")]
    if any(items) and not all(items):
        raise argparse.ArgumentTypeError(
            f"{text!r} has an empty item (two commas in a row, or one at an end); remove it"
        )
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


REPRO_EXAMPLES = (
    (f"{PROG} repro --legacy-skip-attn", "the bug: compiled PIECEWISE diverges from eager, and nothing raises"),
    (f"{PROG} repro --check", "the fix: matches eager, exit 0"),
    (
        f"{PROG} repro --num-speculative-tokens 2 --layers attn,attn --legacy-skip-attn",
        "a broken drafter: its caches diverge, the outputs stay exact, the acceptance rate drops",
    ),
    (
        f"{PROG} repro --mode full_and_piecewise --legacy-skip-attn --prefill-chunk 4 --steps 20 --json",
        "vLLM's default policy: mixed batches replay PIECEWISE graphs and diverge",
    ),
)


def _add_repro(sub: argparse._SubParsersAction) -> None:
    p = add_command(
        sub,
        "repro",
        "run the toy engine against an eager reference and report divergence",
        "Run the toy engine with graphs against an eager reference on identical weights and requests, "
        "and report what diverged. Exit 0 when the run completed, even if it diverged; with --check, 1 "
        "if it diverged or failed; 2 for bad arguments.",
        *REPRO_EXAMPLES,
    )
    p.add_argument(
        "--mode",
        type=str.lower,
        choices=[m.value for m in CUDAGraphMode],
        default="piecewise",
        help="a runtime mode or a policy (case does not matter)",
    )
    p.add_argument(
        "--piecewise-flavor",
        choices=list(PIECEWISE_FLAVORS),
        help="compiled (the default): torch.compile split at --splitting-ops, as vLLM; breakable: one "
        "capture split at the eager breaks. Under FULL: whether the graph records the compiled model",
    )
    p.add_argument(
        "--splitting-ops",
        help=f"ops compiled PIECEWISE splits at (default: the attention ops); from {', '.join(OP_OF_KIND.values())}",
    )
    p.add_argument(
        "--legacy-skip-attn", action="store_true", help="capture with the code from before vLLM PR #49364 (the bug)"
    )
    p.add_argument(
        "--layers",
        default="sconv,attn,compressor,attn",
        help=f"layer pattern, comma-separated kinds from {', '.join(LAYER_KINDS)} (e.g. linear_attn,attn)",
    )
    p.add_argument("--strict-layers", action="store_true", help="stateful layers without the None guard")
    p.add_argument(
        "--python-guards",
        action="store_true",
        help="the stateful layers' None guard in plain Python in forward (Inkling's style), not in "
        "their custom op: torch.compile decides it once, when it traces the profiling run",
    )
    p.add_argument(
        "--pre-49751-dummy-split",
        action="store_true",
        help="split the capture batch as before vLLM PR #49751 (the whole remainder to the last request, "
        "which may exceed max_model_len): attention reads past its block-table row, the revert of "
        "#49364",
    )
    p.add_argument(
        "--capture-sizes",
        type=int_list,
        help="tokens per graph (default 1,2,4,8; with K speculative tokens, K+1 times those); as in "
        "vLLM's model runner v2, FULL uniform-decode graphs round them up to multiples of K+1",
    )
    p.add_argument("--batch-sizes", type=int_list, default="3,1,8", help="decode batch sizes, cycled")
    p.add_argument(
        "--max-num-reqs",
        type=int,
        metavar="N",
        help="the engine's request limit, at least the largest batch size (default: that size); a capture "
        "size above it makes a prefill-shaped capture batch",
    )
    p.add_argument(
        "--steps", type=int, default=16, help="steps after the eager prefill; with --prefill-chunk, all steps"
    )
    p.add_argument(
        "--prefill-chunk",
        type=int,
        default=0,
        help="0: prefill eagerly first; N: prompts enter the engine N tokens a step, mixed with decodes",
    )
    p.add_argument(
        "--uniform-decode-by-shape",
        action="store_true",
        help="classify uniform decode by batch shape alone, as vLLM did before PR #51865",
    )
    p.add_argument(
        "--num-speculative-tokens",
        type=int,
        default=0,
        metavar="K",
        help="speculative decoding: K drafts per step from an "
        "EAGLE-style drafter, verified greedily; reports acceptance_rate and reference_acceptance_rate "
        "(the same drafter run eagerly)",
    )
    p.add_argument(
        "--draft-layers",
        type=name_list(LAYER_KINDS),
        help="the drafter's decoder layers after its fusion conv (default: attn)",
    )
    p.add_argument(
        "--frozen-step-index",
        action="store_true",
        help="the draft step index as a Python int frozen at capture (an analogue of vLLM PR #48892, a "
        "PIECEWISE matter there)",
    )
    p.add_argument("--seed", type=int, default=0, help="weights and prompts")
    p.add_argument("--device", choices=DEVICES, default="cpu", help="cuda: real CUDA graphs; cpu: the simulator")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument(
        "--check",
        action="store_true",
        help="exit 1 if replay diverged from eager, the acceptance rate fell below the reference's, or an "
        "error occurred",
    )
    p.set_defaults(func=_run_repro, validate=_check_repro_switches)


def _run_repro(args: argparse.Namespace) -> int:
    from cglab.repro import run_repro
    from cglab.repro_report import LEGACY_NOTE, legacy_switch_idle, no_graph_replayed, print_repro
    from cglab.spec_decode import DEFAULT_DRAFT_LAYERS, run_spec_repro

    common = {
        "legacy_skip_attn": args.legacy_skip_attn,
        "piecewise_flavor": args.piecewise_flavor or "compiled",
        "splitting_ops": args.splitting_ops,
        "layers": args.layers,
        "strict_layers": args.strict_layers,
        "python_guards": args.python_guards,
        "pre_49751_dummy_split": args.pre_49751_dummy_split,
        "capture_sizes": args.capture_sizes,
        "batch_sizes": args.batch_sizes,
        "max_num_reqs": args.max_num_reqs,
        "steps": args.steps,
        "uniform_decode_by_shape": args.uniform_decode_by_shape,
        "seed": args.seed,
        "device": args.device,
    }
    with _steps_bar(args.steps) as progress:
        if args.num_speculative_tokens == 0:
            result = run_repro(args.mode, prefill_chunk=args.prefill_chunk, progress=progress, **common)
        else:
            result = run_spec_repro(
                args.mode,
                num_speculative_tokens=args.num_speculative_tokens,
                draft_layers=args.draft_layers or DEFAULT_DRAFT_LAYERS,
                frozen_step_index=args.frozen_step_index,
                progress=progress,
                **common,
            )
    if legacy_switch_idle(result):
        _warn(LEGACY_NOTE)
    # An all-eager run in a graph mode compared eager with eager: with --check, that is no pass.
    no_graphs = no_graph_replayed(result)
    failed = result.diverged or result.lost_acceptance or result.error or no_graphs
    status = 1 if args.check and failed else 0
    if args.json:
        print(dumps(result.to_json()))
    else:
        print_repro(result, python_guards=args.python_guards, frozen_step_index=args.frozen_step_index)
    return status


BAR_DELAY_S = 2.0  # a run shorter than this shows no bar


@contextmanager
def _steps_bar(steps: int) -> Iterator[Callable[[], object] | None]:
    """In a terminal, a bar of the steps on stderr once a run lasts ``BAR_DELAY_S``: a long run (thousands
    of steps, hundreds of requests) says how far it got. Elsewhere (a log, a pipe) nothing, as in bench."""
    if not sys.stderr.isatty():
        yield None
        return
    from tqdm.auto import tqdm

    with tqdm(total=steps, desc="repro", unit="step", delay=BAR_DELAY_S, file=sys.stderr, leave=False) as bar:
        yield bar.update


# Switches that change only how graphs are captured or replayed; --mode none captures none.
_GRAPH_SWITCHES = {
    "legacy_skip_attn": "--legacy-skip-attn",
    "piecewise_flavor": "--piecewise-flavor",
    "splitting_ops": "--splitting-ops",
    "capture_sizes": "--capture-sizes",
    "strict_layers": "--strict-layers",
    "python_guards": "--python-guards",
    "pre_49751_dummy_split": "--pre-49751-dummy-split",
    "uniform_decode_by_shape": "--uniform-decode-by-shape",
    "frozen_step_index": "--frozen-step-index",
}


def _check_repro_switches(args: argparse.Namespace) -> None:
    """Before any work: refuse switches that contradict each other; for switches that would change nothing
    in the chosen mode, one warning line on stderr each (``_idle_switches``), and the run goes on."""
    for flags, why in _idle_switches(args):
        _warn(f"{' and '.join(flags)} change{'s' * (len(flags) == 1)} nothing {why}")
    if args.piecewise_flavor == "breakable":
        args.splitting_ops = None  # the engine refuses splitting ops for a split it does not make
    if args.num_speculative_tokens and args.prefill_chunk:
        raise ConfigError(
            "--prefill-chunk does not combine with --num-speculative-tokens: speculative steps here "
            "follow an eager prefill; drop one of the two"
        )


def _warn(text: str) -> None:
    """One warning line on stderr, after what stdout holds so far: a notebook shows the two in order."""
    sys.stdout.flush()
    print(f"{PROG} repro: warning: {text}", file=sys.stderr, flush=True)


def _idle_switches(args: argparse.Namespace) -> list[tuple[list[str], str]]:
    """The switches given that change nothing here, grouped by the reason (each switch named once)."""

    def given(*names: str) -> list[str]:
        return [f"--{n.replace('_', '-')}" for n in names if getattr(args, n) not in (None, False)]

    k = args.num_speculative_tokens
    groups = [
        (
            given("draft_layers", "frozen_step_index") if k == 0 else [],
            "without --num-speculative-tokens K: there is no drafter",
        ),
        (
            [f for n, f in _GRAPH_SWITCHES.items() if getattr(args, n) not in (None, False)]
            if args.mode == "none"
            else [],
            "under --mode none: it captures no graph (the run compares eager with eager)",
        ),
        (
            given("splitting_ops", "python_guards") if args.piecewise_flavor == "breakable" else [],
            "with --piecewise-flavor breakable: nothing is compiled, the graphs break at attention",
        ),
        (given("frozen_step_index") if k == 1 else [], "with one speculative token: no draft decode step"),
    ]
    named: set[str] = set()
    idle = []
    for flags, why in groups:
        flags = [f for f in flags if f not in named]
        named.update(flags)
        if flags:
            idle.append((flags, why))
    return idle


def name_list(valid: Sequence[str]) -> Callable[[str], list[str]]:
    """An argparse type for ``"a,b"`` -> ``["a", "b"]``, each name one of ``valid``."""

    def parse(text: str) -> list[str]:
        names = [name.lower() for name in _items(text)]
        if not names or any(n not in valid for n in names):
            raise argparse.ArgumentTypeError(f"expected comma-separated names from {', '.join(valid)}; got {text!r}")
        return names

    return parse


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=PROG,
        **_help_text(
            "cglab: CUDA graph capture, the toy engine. A command's --help shows options, defaults and examples.",
            [
                REPRO_EXAMPLES[0],
                (f"{PROG} bench --quick --out bench-quick", "replay latency per mode and batch size, seconds on a CPU"),
                (f"{PROG} repro --help", "every repro option"),
            ],
        ),
    )
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    _add_repro(sub)
    from cglab.bench.cli import add_bench, add_startup  # here: that module takes its helpers from this one

    add_bench(sub)
    add_startup(sub)
    return parser


def _import_torch(device: str) -> None:
    """Import torch, the seconds of start-up that come after the checks; then hand Ctrl-C to ``main``.
    Before that, ``_interrupt`` ends the process at a Ctrl-C: an interrupted torch import can fail oddly."""
    import torch

    if device == "cpu":
        torch.set_num_threads(1)  # the toy's tensors are tiny: more threads only compete for the cores
    _interrupt.keyboard_interrupt_from_here()


def print_saved(text: str) -> None:
    """Print the report of a result already saved in files: if the reader of stdout went away (``| true``,
    ``| head``), only this report is lost, so that is no error."""
    try:
        print(text, flush=True)
    except BrokenPipeError:
        _stdout_to_devnull()


def _stdout_to_devnull() -> None:
    """Point a closed stdout at the null device: Python's flush at exit must not fail a second time."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def _out_of_memory(exc: BaseException) -> bool:
    """The host's or the device's memory ran out (torch's error only if torch got imported)."""
    torch = sys.modules.get("torch")
    return isinstance(exc, MemoryError) or (torch is not None and isinstance(exc, torch.OutOfMemoryError))


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command: its exit status, or one line on stderr and 2 (bad values), 1 (the file system
    failed; a finished result is kept, see ``_save``) or 130 (Ctrl-C), never a traceback."""
    prog, status = PROG, 2
    try:
        parser = build_parser()
        args = parser.parse_args(argv)  # bad arguments: one line and exit 2, before torch
        prog = f"{parser.prog} {args.command}"
        if getattr(args, "validate", None) is not None:
            args.validate(args)
        _import_torch(args.device)
        status = args.func(args)
        sys.stdout.flush()  # a stdout closed early fails here, where the clause below tells it from a disk
        return status
    except KeyboardInterrupt:  # at any step, the parser's imports included
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # before OSError: the reader of stdout went away, the disk is fine
        _stdout_to_devnull()
        status, message = 1, "stdout was closed (its reader went away) before the result was printed in full"
    except OSError as exc:  # before the CglabError clause: a NotSavedError is both
        status = 1
        message = str(exc) if isinstance(exc, NotSavedError) else f"{exc}; check the disk and the path, then run again"
    except CglabError as exc:  # bad values that only the engine can judge (sizes, devices, capacity)
        message = str(exc)
    except (MemoryError, RuntimeError) as exc:
        if not _out_of_memory(exc):
            raise
        message = "out of memory; use fewer or smaller batch sizes, capture sizes or steps"
    print(f"{prog}: error: {' '.join(message.split())}", file=sys.stderr)
    return status


__all__ = ["PROG", "add_command", "build_parser", "int_list", "main", "name_list", "print_saved"]
