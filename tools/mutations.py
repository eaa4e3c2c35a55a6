"""Would the unit tests notice? Apply plausible one-line bugs to cglab, one at a time, and run the tests.

    .venv/bin/python tools/mutations.py                 # every mutation (several minutes on 2 cores)
    .venv/bin/python tools/mutations.py --list          # each bug, and the tests meant to catch it
    .venv/bin/python tools/mutations.py NAME [NAME...]  # only these (a prefix of the name is enough)

Each mutation, an entry of ``tools/mutations.toml``, is a text edit (an ``old`` string that must occur
exactly once in its file, and its replacement), made in a scratch copy of the tree (``.venv``, ``.git``,
caches and ``build/`` left behind, so the checkout itself is never touched). Then the mutation's own
test files run there, ``pytest -q -x -p no:cacheprovider``, with the copy first on ``PYTHONPATH`` and
``OMP_NUM_THREADS=1``. A failing test means the bug was caught; a green run means it SURVIVED. First
the same test files run on the unchanged copy: a test that fails without any bug would catch
everything and prove nothing (``--no-baseline`` skips that).

Prints one line per mutation, ``caught`` with the first test that failed, or ``SURVIVED``; exits 1
if any survived (or an edit no longer applies: after a refactor, update its ``old`` string). Run it
after changing the code the mutations touch. It is not part of ``make test``.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    raise SystemExit(
        "tools/mutations.py reads tools/mutations.toml with tomllib: run it with Python 3.11 or newer "
        "(the venv's, .venv/bin/python, is one where make setup found it)"
    ) from None

ROOT = Path(__file__).resolve().parents[1]
IGNORED = shutil.ignore_patterns(
    ".venv", ".git", ".cache", "build", "__pycache__", ".hypothesis", ".ipynb_checkpoints", "*.egg-info"
)
CATALOGUE = Path(__file__).with_name("mutations.toml")  # the bugs: name, file, old and new text, tests
TIMEOUT_S = 900  # a mutation whose tests hang this long counts as caught (it did not pass)


@dataclass(frozen=True)
class Mutation:
    name: str
    what: str  # the bug, in words
    path: str
    old: str
    new: str
    tests: tuple[str, ...]  # test files, the one expected to catch it first


def load_mutations(path: Path = CATALOGUE) -> list[Mutation]:
    """The catalogue, in its order (the planted bugs are data: one table each, in TOML)."""
    with path.open("rb") as file:
        return [Mutation(**{**entry, "tests": tuple(entry["tests"])}) for entry in tomllib.load(file)["mutation"]]


MUTATIONS = load_mutations()


def scratch_copy(destination: Path) -> Path:
    tree = destination / "tree"
    shutil.copytree(ROOT, tree, ignore=IGNORED)
    return tree


def environment(tree: Path) -> dict[str, str]:
    # The copy first; then any PYTHONPATH the caller set (e.g. a Triton installed outside the venv).
    path = os.pathsep.join(p for p in (str(tree), os.environ.get("PYTHONPATH", "")) if p)
    env = {
        **os.environ,
        "PYTHONPATH": path,
        "OMP_NUM_THREADS": "1",
        "MPLBACKEND": "Agg",
        # No bytecode: a mutated file and its original can share size and mtime, and a stale .pyc
        # would run the wrong one.
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    env.pop("PYTHONPYCACHEPREFIX", None)
    return env


def run_tests(tree: Path, files: tuple[str, ...]) -> tuple[bool, str, float]:
    """(passed, the first failing test or a reason, seconds)."""
    command = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-rfE", *files]
    start = time.perf_counter()
    try:
        done = subprocess.run(
            command, cwd=tree, env=environment(tree), capture_output=True, text=True, timeout=TIMEOUT_S
        )
    except subprocess.TimeoutExpired:
        return False, f"timed out after {TIMEOUT_S} s", time.perf_counter() - start
    seconds = time.perf_counter() - start
    if done.returncode == 0:
        return True, "", seconds
    output = done.stdout + done.stderr
    failed = re.search(r"^(?:FAILED|ERROR) (.+?)(?: - |$)", output, re.MULTILINE)  # "FAILED <test id> - <why>"
    if failed:
        return False, failed.group(1), seconds
    last = next((line for line in reversed(output.splitlines()) if line.strip()), f"exit {done.returncode}")
    return False, last.strip(), seconds


def apply(tree: Path, mutation: Mutation) -> str:
    """Edit the copy; returns the original text, to put back."""
    path = tree / mutation.path
    original = path.read_text()
    count = original.count(mutation.old)
    if count != 1:
        raise LookupError(
            f"{mutation.name}: its old text occurs {count} times in {mutation.path}, not once; "
            "update the mutation after the refactor"
        )
    path.write_text(original.replace(mutation.old, mutation.new))
    return original


def check_import(tree: Path) -> None:
    """The tests must import the copy's cglab, not an installed one."""
    done = subprocess.run(
        [sys.executable, "-c", "import cglab; print(cglab.__file__)"],
        cwd=tree,
        env=environment(tree),
        capture_output=True,
        text=True,
        check=True,
    )
    if not Path(done.stdout.strip()).is_relative_to(tree):
        raise SystemExit(f"the tests would import {done.stdout.strip()}, not the scratch copy's cglab")


def select(names: list[str]) -> list[Mutation]:
    if not names:
        return MUTATIONS
    chosen = [m for m in MUTATIONS if any(m.name.startswith(n) for n in names)]
    unknown = [n for n in names if not any(m.name.startswith(n) for m in MUTATIONS)]
    if unknown:
        raise SystemExit(f"no mutation named {', '.join(unknown)}; see --list")
    return chosen


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="mutations to run (a prefix of the name is enough)")
    parser.add_argument("--list", action="store_true", help="list the mutations and exit")
    parser.add_argument("--no-baseline", action="store_true", help="skip the run of the unchanged tree")
    args = parser.parse_args(argv)
    mutations = select(args.names)
    if args.list:
        for m in mutations:
            print(f"{m.name:32} {m.path:34} {m.what}\n{'':32} tests: {' '.join(m.tests)}")
        return 0
    width = max(len(m.name) for m in mutations)
    with tempfile.TemporaryDirectory(prefix="cglab-mutations-") as scratch:
        tree = scratch_copy(Path(scratch))
        check_import(tree)
        if not args.no_baseline:
            files = tuple(dict.fromkeys(f for m in mutations for f in m.tests))
            passed, failure, seconds = run_tests(tree, files)
            if not passed:
                print(f"baseline: the unchanged tree fails {failure}; fix that first", file=sys.stderr)
                return 2
            print(f"baseline: {len(files)} test files pass on the unchanged tree ({seconds:.0f} s)", flush=True)
        survived = []
        for m in mutations:
            try:
                original = apply(tree, m)
            except LookupError as exc:
                print(f"{m.name:{width}}  NOT APPLIED  {exc}", flush=True)
                survived.append(m.name)
                continue
            try:
                passed, failure, seconds = run_tests(tree, m.tests)
            finally:
                (tree / m.path).write_text(original)
            if passed:
                survived.append(m.name)
                print(f"{m.name:{width}}  SURVIVED  ({seconds:.0f} s)  {m.what}", flush=True)
            else:
                print(f"{m.name:{width}}  caught    ({seconds:.0f} s)  by {failure}", flush=True)
    print(
        f"{len(mutations) - len(survived)} of {len(mutations)} caught"
        + (f"; survived or not applied: {', '.join(survived)}" if survived else "")
    )
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())
