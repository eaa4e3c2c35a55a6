"""``python -m cglab``: the headless entry points (``repro`` now; more subcommands register here)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import NoReturn

from cglab.errors import CglabError


class _Parser(argparse.ArgumentParser):
    """Bad arguments get one line naming the argument, not a usage dump or a traceback."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def int_list(text: str) -> list[int]:
    """``"1,2,4"`` -> ``[1, 2, 4]`` (argparse type: its error message names the argument)."""
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated positive integers, got {text!r}") from None
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected comma-separated positive integers, got {text!r}")
    return values


def _add_repro(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("repro", help="run the toy engine against an eager reference and report divergence")
    p.add_argument("--mode", choices=["none", "piecewise", "full"], default="piecewise")
    p.add_argument("--legacy-skip-attn", action="store_true",
                   help="capture with the code from before vLLM PR #49364 (the bug)")
    p.add_argument("--layers", default="sconv,attn,compressor,attn", help="layer pattern, e.g. sconv,attn")
    p.add_argument("--strict-layers", action="store_true", help="stateful layers without the None guard")
    p.add_argument("--capture-sizes", type=int_list, default=[1, 2, 4, 8])
    p.add_argument("--batch-sizes", type=int_list, default=[3, 1, 8], help="decode batch sizes, cycled")
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=_run_repro)


def _run_repro(args: argparse.Namespace) -> int:
    from cglab.repro import run_repro

    result = run_repro(args.mode, legacy_skip_attn=args.legacy_skip_attn, layers=args.layers,
                       strict_layers=args.strict_layers, capture_sizes=args.capture_sizes,
                       batch_sizes=args.batch_sizes, steps=args.steps, seed=args.seed, device=args.device)
    if args.json:
        print(json.dumps(result.to_json()))
        return 0
    legacy = " with the legacy skip_attn path" if result.legacy_skip_attn else ""
    print(f"mode {result.mode.upper()}{legacy}, layers {result.layers}, backend {result.backend}")
    if result.backend == "sim":
        print("  (backend 'sim' is the CPU simulator of CUDA graphs: faithful semantics, no GPU speed-up)")
    print(f"  captured sizes: {result.captured_sizes or 'none'}")
    if result.error:
        print(f"  ERROR: {result.error}")
    if result.max_abs_diff is not None:
        verdict = "DIVERGED from eager" if result.diverged else "matches eager"
        print(f"  {result.steps} decode steps: max |replay - eager| = {result.max_abs_diff:.3g}, "
              f"caches diverged: {result.state_diverged} -> {verdict}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m cglab", description="cglab: CUDA graph capture, the toy engine")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    _add_repro(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except CglabError as exc:  # bad values that only the engine can judge (sizes, devices, capacity)
        print(f"{parser.prog} {args.command}: error: {exc}", file=sys.stderr)
        return 2


__all__ = ["build_parser", "main"]
