"""``python -m cglab matrix``: the capture matrix of a layer pattern, as a table or one JSON object. The
bug zoo's kinds are registered before the pattern is checked, so ``--layers guard_49364,attn`` works."""

from __future__ import annotations

import argparse
import sys

from cglab._arguments import PROG, add_command
from cglab.compare import dumps
from cglab.config import DEVICES, ToyConfig

EXAMPLES = (
    (f"{PROG} matrix", "the default pattern through every configuration: the legacy rows show the bug"),
    (f"{PROG} matrix --layers fresh_tensor,attn --check", "a bug-zoo op: exit 1, its fixed-path rows diverge"),
)


def add_matrix(sub: argparse._SubParsersAction) -> None:
    p = add_command(
        sub,
        "matrix",
        "run a layer pattern through every capture configuration and tabulate where it diverges",
        "Run a layer pattern through FULL, FULL_DECODE_ONLY, compiled and breakable PIECEWISE and "
        "FULL_AND_PIECEWISE, on the legacy and the fixed capture path, with uniform decode, padded, chunked "
        "prefill and speculative batches; each row is judged against eager. Exit 0 when it ran; with --check, "
        "1 if a row of the fixed path diverged or failed (the legacy rows reproduce the bug on purpose); 2 "
        "for bad arguments.",
        *EXAMPLES,
    )
    p.add_argument("--layers", default="sconv,attn,compressor,attn", help="layer kinds, built in or bug zoo")
    p.add_argument("--device", choices=DEVICES, default="cpu", help="cuda: real CUDA graphs; cpu: the simulator")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--check", action="store_true", help="exit 1 if a row of the fixed capture path did not match")
    p.set_defaults(func=_run_matrix, validate=_check_matrix)


def _check_matrix(args: argparse.Namespace) -> None:
    import cglab.bug_zoo  # noqa: F401  (registers the zoo's kinds; imports torch)

    args.config = ToyConfig(layers=args.layers)


def _run_matrix(args: argparse.Namespace) -> int:
    from cglab.capture_matrix import CASES, run_capture_matrix
    from cglab.compilation import caching

    caching.install()  # the rows build dozens of equal models: one dynamo trace for them all
    done = [0]

    def progress(case: object) -> None:
        done[0] += 1
        if sys.stderr.isatty():
            print(f"\r{PROG} matrix: {done[0]}/{len(CASES)} configurations", end="", file=sys.stderr, flush=True)

    matrix = run_capture_matrix(args.config, device=args.device, progress=progress)
    if sys.stderr.isatty():
        print(file=sys.stderr)
    print(dumps(matrix.to_json()) if args.json else matrix.table())
    return 1 if args.check and matrix.failing("fixed") else 0
