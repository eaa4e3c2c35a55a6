"""``python -m cglab``: the headless commands. Arguments are checked before the seconds of importing torch, so
this module and its imports stay torch-free: a typo is refused at once, the commands import the engine."""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

from cglab import _interrupt
from cglab._arguments import PROG, Parser, add_command, counts, help_text, int_list, name_list, stdout_to_devnull
from cglab.bench.cli import add_bench, add_startup
from cglab.compare import dumps
from cglab.compilation_config import DEFAULT_CAPTURE_SIZES, UNIFORM_DECODE_RULES, CompilationConfig, SpeculativeConfig
from cglab.config import DEVICES, PIECEWISE_FLAVORS, CUDAGraphMode, ToyConfig
from cglab.errors import CglabError, ConfigError, NotSavedError
from cglab.layer_registry import get_layer_kind, layer_kinds
from cglab.matrix_cli import add_matrix

OPS = ", ".join(get_layer_kind(k).op for k in layer_kinds())

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
    arg, switch = p.add_argument, functools.partial(p.add_argument, action="store_true")
    modes = [m.value for m in CUDAGraphMode]
    arg("--mode", type=str.lower, choices=modes, default="piecewise", help="a runtime mode or a policy")
    arg(
        "--piecewise-flavor",
        choices=PIECEWISE_FLAVORS,
        help="compiled (default): torch.compile split at --splitting-ops, as vLLM; breakable: one capture cut",
    )
    arg("--splitting-ops", help=f"ops compiled PIECEWISE splits at (default: attention); from {OPS}")
    switch("--legacy-skip-attn", help="capture as before vLLM PR #49364 (the bug)")
    arg("--layers", default="sconv,attn,compressor,attn", help=f"layer kinds from {', '.join(layer_kinds())}")
    switch("--strict-layers", help="stateful layers without the None guard")
    switch("--python-guards", help="the None guard in plain Python (Inkling, DeepSeek V4): traced once by dynamo")
    switch("--pre-49751-dummy-split", help="the capture split before vLLM PR #49751 (its crash got #49364 reverted)")
    arg(
        "--capture-sizes",
        type=int_list,
        help="tokens per graph (default 1,2,4,8; with K drafts, the toy's default is K+1 times those); as in "
        "model runner v2 (vLLM PR #45953), PIECEWISE keeps the sizes, FULL decode graphs round up to K+1",
    )
    arg("--batch-sizes", type=int_list, default="3,1,8", help="decode batch sizes, cycled")
    arg("--max-num-reqs", type=counts(1), metavar="N", help="request limit (default: the largest batch)")
    arg("--steps", type=counts(1), default=16, help="steps after the eager prefill (or all, when chunked)")
    arg("--prefill-chunk", type=counts(0), default=0, help="N: prompts enter N tokens a step, with decodes")
    arg(
        "--uniform-decode-rule",
        choices=UNIFORM_DECODE_RULES,
        help="which batches take decode graphs: current (default), vLLM today; 51865, PR #51865's; shape, before",
    )
    arg("--num-speculative-tokens", type=counts(0), default=0, metavar="K", help="drafts a step (greedy)")
    arg("--draft-layers", type=name_list(layer_kinds()), help="the drafter's layers (default: attn)")
    switch("--frozen-step-index", help="the draft step index as a Python int, frozen at capture (vLLM #48892)")
    arg("--seed", type=int, default=0, help="weights and prompts")
    arg("--device", choices=DEVICES, default="cpu", help="cuda: real CUDA graphs; cpu: the simulator")
    switch("--json", help="print one JSON object")
    switch("--check", help="exit 1 if it diverged, lost acceptance or failed")
    p.set_defaults(func=_run_repro, validate=_check_repro)


def _run_repro(args: argparse.Namespace) -> int:
    from cglab.repro import run_repro
    from cglab.repro_report import LEGACY_NOTE, legacy_switch_idle, no_graph_replayed, print_repro
    from cglab.spec_decode import DEFAULT_DRAFT_LAYERS, draft_layer_pairs, run_spec_repro

    run = {"batch_sizes": args.batch_sizes, "steps": args.steps, "max_num_reqs": args.max_num_reqs}
    with _steps_bar(args.steps) as progress:
        run |= {"device": args.device, "progress": progress}
        if args.speculative_config is None:
            result = run_repro(args.compilation_config, args.config, prefill_chunk=args.prefill_chunk, **run)
        else:
            pairs = tuple(draft_layer_pairs(args.draft_layers or DEFAULT_DRAFT_LAYERS))
            spec = dataclasses.replace(args.speculative_config, draft_layers=pairs)
            result = run_spec_repro(
                args.compilation_config, spec, args.config, frozen_step_index=args.frozen_step_index, **run
            )
    if legacy_switch_idle(result):
        _warn(LEGACY_NOTE)
    # An all-eager run in a graph mode compared eager with eager: with --check, that is no pass.
    failed = result.diverged or result.lost_acceptance or result.error or no_graph_replayed(result)
    if args.json:
        print(dumps(result.to_json()))
    else:
        print_repro(result, python_guards=args.python_guards, frozen_step_index=args.frozen_step_index)
    if (result.error or "").startswith("KeyboardInterrupt"):  # Ctrl-C: the steps so far are printed
        raise KeyboardInterrupt
    return 1 if args.check and failed else 0


BAR_DELAY_S = 2.0  # a run shorter than this shows no bar
LOG_EVERY_S: float | None = 5.0  # without a terminal: a line this often (None: none)


@contextmanager
def _steps_bar(steps: int) -> Iterator[Callable[[], object] | None]:
    """A bar on a terminal's stderr; in a log, a line every ``LOG_EVERY_S`` from a thread (start-up calls nothing)."""
    if sys.stderr.isatty():
        from tqdm.auto import tqdm

        with tqdm(total=steps, desc="repro", unit="step", delay=BAR_DELAY_S, file=sys.stderr, leave=False) as bar:
            yield bar.update
        return
    done, start, stop = [0, 0.0], time.monotonic(), threading.Event()

    def report() -> None:
        while LOG_EVERY_S and not stop.wait(LOG_EVERY_S):
            (n, first), now = done, time.monotonic()
            left = f"about {(now - first) / n * (steps - n):,.0f} s left" if n > 1 else "starting up"
            print(f"{PROG} repro: {n:,} of {steps:,} steps after {now - start:,.0f} s, {left}", file=sys.stderr)

    threading.Thread(target=report, daemon=True).start()
    try:
        yield lambda: done.__setitem__(slice(None), [done[0] + 1, done[1] or time.monotonic()])
    finally:
        stop.set()


# Switches that change only how graphs are captured or replayed; --mode none captures none.
_GRAPH_SWITCHES = "legacy_skip_attn piecewise_flavor splitting_ops capture_sizes strict_layers python_guards".split()
_GRAPH_SWITCHES += ["pre_49751_dummy_split", "uniform_decode_rule", "frozen_step_index"]


def _check_repro(args: argparse.Namespace) -> None:
    """Before torch: warn once about each switch that changes nothing here (the run goes on), refuse
    contradictions, and build the configs, which check the rest."""
    k, named, eager = args.num_speculative_tokens, set(), args.mode == "none"
    for names, idle, why in (
        (("draft_layers", "frozen_step_index"), k == 0, "without --num-speculative-tokens K: there is no drafter"),
        (_GRAPH_SWITCHES, eager, "under --mode none: it captures no graph (the run compares eager with eager)"),
        (
            ("splitting_ops", "python_guards"),
            args.piecewise_flavor == "breakable",
            "with --piecewise-flavor breakable: nothing is compiled, the graphs break at attention",
        ),
        (("frozen_step_index",), k == 1, "with one speculative token: no draft decode step"),
    ):
        flags = [f"--{n.replace('_', '-')}" for n in names if idle and getattr(args, n) not in (None, False)]
        named.update(flags := [f for f in flags if f not in named])
        if flags:
            _warn(f"{' and '.join(flags)} change{'s' * (len(flags) == 1)} nothing {why}")
    if k and args.prefill_chunk:
        raise ConfigError(
            "--prefill-chunk does not combine with --num-speculative-tokens: speculative steps here "
            "follow an eager prefill; drop one of the two"
        )
    if (args.max_num_reqs or max(args.batch_sizes)) < max(args.batch_sizes):
        raise ConfigError(
            f"--max-num-reqs {args.max_num_reqs} is below the largest batch size ({max(args.batch_sizes)}): a "
            "step must fit the engine; raise it or use smaller batch sizes"
        )
    breakable = args.piecewise_flavor == "breakable"
    args.compilation_config = CompilationConfig(
        args.mode,
        args.capture_sizes or tuple(s * (k + 1) for s in DEFAULT_CAPTURE_SIZES),
        use_breakable_cg=breakable,
        splitting_ops=None if breakable else args.splitting_ops,  # breakable graphs split at no op
        legacy_skip_attn=args.legacy_skip_attn,
        uniform_decode_rule=args.uniform_decode_rule or "current",
        pre_49751_dummy_split=args.pre_49751_dummy_split,
    )
    args.config = ToyConfig(
        layers=args.layers, strict_layers=args.strict_layers, python_guards=args.python_guards, seed=args.seed
    )
    args.speculative_config = SpeculativeConfig(k) if k else None


def _warn(text: str) -> None:
    """One warning line on stderr, after what stdout holds so far: a notebook shows the two in order."""
    sys.stdout.flush()
    print(f"{PROG} repro: warning: {text}", file=sys.stderr, flush=True)


def build_parser() -> argparse.ArgumentParser:
    about = "cglab: CUDA graph capture, the toy engine. A command's --help shows options, defaults and examples."
    bench = (f"{PROG} bench --quick --out bench-quick", "replay latency per mode and batch size, seconds on a CPU")
    examples = [REPRO_EXAMPLES[0], bench, (f"{PROG} repro --help", "every repro option")]
    parser = Parser(prog=PROG, **help_text(about, examples))
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for add in (_add_repro, add_bench, add_startup, add_matrix):
        add(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """One command's exit status, or one line on stderr and 2 (bad values), 1 (files, stdout) or 130 (Ctrl-C)."""
    prog, status = PROG, 2
    if sys.stderr is None:  # closed (`2>&-`, as under cron): print() would write to stdout instead
        sys.stderr = open(os.devnull, "w")  # noqa: SIM115  (for the life of the process)
    try:
        parser = build_parser()
        args = parser.parse_args(argv)  # bad arguments: one line and exit 2, before torch
        prog = f"{parser.prog} {args.command}"
        if getattr(args, "validate", None) is not None:
            args.validate(args)
        import torch  # the seconds of start-up that come after the checks

        if args.device == "cpu":
            torch.set_num_threads(1)  # the toy's tensors are tiny: more threads only compete for the cores
        # Until here a Ctrl-C ends the process at once (an interrupted torch import can fail oddly); from here
        # it is Python's KeyboardInterrupt again, for the clause below.
        if signal.getsignal(signal.SIGINT) is _interrupt.end_at_once:
            signal.signal(signal.SIGINT, signal.default_int_handler)
        status = args.func(args)
        sys.stdout.flush()  # a stdout closed early fails here, where the clause below tells it from a disk
        return status
    except KeyboardInterrupt:  # at any step, the parser's imports included
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # before OSError: the reader of stdout went away, the disk is fine
        stdout_to_devnull()
        status, message = 1, "stdout was closed (its reader went away) before the result was printed in full"
    except OSError as exc:  # before the CglabError clause: a NotSavedError is both
        status = 1
        message = str(exc) if isinstance(exc, NotSavedError) else f"{exc}; check the disk and the path, then run again"
    except ModuleNotFoundError as exc:  # a Python outside the venv, such as a bare `python` in a terminal
        message = f"{sys.executable} has no {exc.name}; use the venv's Python: .venv/bin/python -m cglab (make setup)"
    except CglabError as exc:  # bad values that only the engine can judge (sizes, devices, capacity)
        message = str(exc)
    except (MemoryError, RuntimeError) as exc:  # torch's OutOfMemoryError is a RuntimeError
        if not isinstance(exc, (MemoryError, getattr(sys.modules.get("torch"), "OutOfMemoryError", MemoryError))):
            raise
        message = "out of memory; use fewer or smaller batch sizes, capture sizes or steps"
    print(f"{prog}: error: {' '.join(message.split())}", file=sys.stderr)
    return status


__all__ = ["PROG", "build_parser", "main"]
