"""``make test-gpu``: the suite on a CUDA GPU, in three parts, with one summary at the end.

1. the unit tests (their ``cuda`` halves run here; on a CPU they skip);
2. every notebook and solution, executed on the GPU in a fresh kernel and not saved (the committed
   outputs are the CPU ones that nbval checks), each timed against the one-minute budget;
3. README's ``repro`` examples with ``--device cuda --check``: each must exit as ``EXPECTED`` says,
   0 where README says it matches eager, 1 where it shows the bug or a capture that fails.

    python tools/test_gpu.py [--parts units,notebooks,repro] [--device cuda]

``--device cpu`` runs the repro part on the simulator (a check of this table, not of the GPU).
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK_BUDGET_S = 60
# README's repro examples (the arguments after `repro`) and the exit status each must give with --check.
EXPECTED = {
    "--mode piecewise --legacy-skip-attn --json": 1,  # the bug: diverges
    "--mode piecewise --json": 0,  # the fix
    "--legacy-skip-attn --piecewise-flavor breakable": 0,
    "--pre-49751-dummy-split --max-num-reqs 64 --capture-sizes 8,127": 1,  # capture fails: the revert
    "--max-num-reqs 64 --capture-sizes 8,127": 0,  # #49751's split
    "--legacy-skip-attn --layers sconv,attn --splitting-ops cglab::unified_attention,cglab::short_conv": 0,
    "--mode full_and_piecewise --legacy-skip-attn": 0,  # decodes replay FULL: the bug hidden
    "--mode full_and_piecewise --legacy-skip-attn --prefill-chunk 4 --steps 20": 1,
    "--layers linear_attn,attn --legacy-skip-attn --piecewise-flavor breakable --capture-sizes 1,2,4,8,16": 1,
    "--layers linear_attn,attn --mode full": 0,  # lowered to FULL_AND_PIECEWISE
    "--num-speculative-tokens 2 --layers attn,attn --legacy-skip-attn --check": 1,  # acceptance lost
    "--num-speculative-tokens 3 --layers attn,attn --mode full --batch-sizes 1,2,4 --frozen-step-index": 1,
    "--python-guards --check": 1,
    "--python-guards --piecewise-flavor breakable --check": 0,
}


def readme_repro_examples(readme: str) -> list[str]:
    """The arguments of every ``python -m cglab repro`` command in README's Headless section, in order."""
    section = readme.split("\n## Headless", 1)[1].split("\n## ", 1)[0]
    text = re.sub(r"\\\n\s*", " ", section)  # join continuation lines
    found = []
    for line in text.splitlines():
        match = re.match(r"\s*\S*python -m cglab repro (.*?)\s*(#.*)?$", line)
        if match and match.group(1) != "--help":
            found.append(" ".join(match.group(1).split()))
    return found


def run_units() -> tuple[bool, str]:
    workers = str(min(8, os.cpu_count() or 1))
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "tests",
        "-q",
        "-n",
        workers,
        "--dist",
        "loadscope",
        "-p",
        "no:cacheprovider",
    ]
    print("$", shlex.join(cmd), flush=True)
    run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    failures = run.stdout.split("= FAILURES =", 1)[1][:20000] if "= FAILURES =" in run.stdout else ""
    print(failures, run.stdout[-3000:], sep="\n", flush=True)
    lines = [line for line in run.stdout.splitlines() if re.search(r"\d+ (passed|failed)", line)]
    return run.returncode == 0, lines[-1].strip("= ") if lines else f"pytest exited {run.returncode}"


def run_notebooks(workers: int) -> tuple[bool, str]:
    """Each notebook in its own process; one over the budget fails the part, as a failing cell does.
    The budget counts the kernel's start and shutdown too, which execute_notebooks reports apart."""
    paths = sorted((ROOT / "notebooks").glob("*.ipynb")) + sorted((ROOT / "notebooks" / "solutions").glob("*.ipynb"))

    def one(path: Path) -> tuple[Path, int, float, str]:
        cmd = [
            sys.executable,
            str(ROOT / "tools" / "execute_notebooks.py"),
            "--use-gpu",
            "--no-save",
            "--slowest",
            "3",
            str(path),
        ]
        start = time.perf_counter()
        run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        detail = "".join(line + "\n" for line in run.stdout.splitlines() if " cell " in line or "executed " in line)
        return path, run.returncode, time.perf_counter() - start, detail + run.stderr[-3000:]

    start = time.perf_counter()
    with ThreadPoolExecutor(workers) as pool:
        results = list(pool.map(one, paths))
    wall = time.perf_counter() - start
    failed = [p for p, code, _, _ in results if code]
    slow = [p for p, code, seconds, _ in results if not code and seconds > NOTEBOOK_BUDGET_S]
    for path, code, seconds, detail in results:
        verdict = "FAILED" if code else (f"OVER the {NOTEBOOK_BUDGET_S} s budget" if path in slow else "ok")
        print(f"  {path.relative_to(ROOT)!s:<58} {seconds:6.1f} s  {verdict}", flush=True)
        # where the time went (always), and the slowest cells and the error where it matters
        shown = (
            detail
            if code or seconds > NOTEBOOK_BUDGET_S / 2
            else "".join(line + "\n" for line in detail.splitlines() if "executed " in line)
        )
        print(shown.rstrip(), flush=True)
    longest = max(seconds for _, _, seconds, _ in results)
    summary = (
        f"{len(results) - len(failed)} of {len(results)} notebooks ran, in {wall:.0f} s ({workers} at a time); "
        f"longest {longest:.0f} s, {len(slow)} over {NOTEBOOK_BUDGET_S} s"
    )
    return not failed and not slow, summary


def run_repro(device: str) -> tuple[bool, str]:
    examples = readme_repro_examples((ROOT / "README.md").read_text())
    unknown = [e for e in examples if e not in EXPECTED]
    if unknown:
        return False, f"README has repro examples with no expected outcome here: {unknown}; add them to EXPECTED"

    def one(args: str) -> subprocess.CompletedProcess[str]:
        check = [] if "--check" in args else ["--check"]
        cmd = [sys.executable, "-m", "cglab", "repro", *args.split(), "--device", device, *check]
        return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)

    with ThreadPoolExecutor(4) as pool:  # each example is a process of its own, compiling with inductor
        runs = list(pool.map(one, examples))
    wrong = []
    for args, run in zip(examples, runs):
        ok = run.returncode == EXPECTED[args]
        print(
            f"  exit {run.returncode} (expected {EXPECTED[args]}) {'ok' if ok else 'WRONG'}: repro {args}", flush=True
        )
        if not ok:
            wrong.append(args)
            print(run.stdout[-1500:], run.stderr[-1500:], sep="\n", flush=True)
    return not wrong, f"{len(examples) - len(wrong)} of {len(examples)} README repro examples exited as expected"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default="units,notebooks,repro", help="which parts, comma-separated")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help="the repro part's device")
    parser.add_argument("--notebook-workers", type=int, default=4, help="notebooks run at a time (default 4)")
    args = parser.parse_args(argv)
    parts = args.parts.split(",")
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print(
            "make test-gpu needs a CUDA GPU, and torch sees none; `make test` checks the suite on the CPU",
            file=sys.stderr,
        )
        return 2
    print(
        f"torch {torch.__version__}, CUDA {torch.version.cuda}, "
        f"{torch.cuda.get_device_name() if torch.cuda.is_available() else 'no GPU'}",
        flush=True,
    )
    summary = []
    for name, part in (
        ("units", run_units),
        ("notebooks", lambda: run_notebooks(args.notebook_workers)),
        ("repro", lambda: run_repro(args.device)),
    ):
        if name in parts:
            print(f"== {name} ==", flush=True)
            start = time.perf_counter()
            ok, line = part()
            summary.append(f"{'PASS' if ok else 'FAIL'} {name}: {line} [{time.perf_counter() - start:.0f} s]")
    print("== summary ==", *summary, sep="\n")
    return 0 if all(line.startswith("PASS") for line in summary) else 1


if __name__ == "__main__":
    sys.exit(main())
