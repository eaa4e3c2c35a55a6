"""Would the unit tests notice? Apply plausible one-line bugs to cglab, one at a time, and run the tests.

    .venv/bin/python tools/mutations.py                 # every mutation (several minutes on 2 cores)
    .venv/bin/python tools/mutations.py --list          # each bug, and the tests meant to catch it
    .venv/bin/python tools/mutations.py NAME [NAME...]  # only these (a prefix of the name is enough)

Each mutation is a text edit (an ``old`` string that must occur exactly once in its file, and its
replacement), made in a scratch copy of the tree (``.venv``, ``.git``, caches and ``build/`` left
behind, so the checkout itself is never touched). Then the mutation's own test files run there,
``pytest -q -x -p no:cacheprovider``, with the copy first on ``PYTHONPATH`` and ``OMP_NUM_THREADS=1``.
A failing test means the bug was caught; a green run means it SURVIVED. First the same test files
run on the unchanged copy: a test that fails without any bug would catch everything and prove
nothing (``--no-baseline`` skips that).

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

ROOT = Path(__file__).resolve().parents[1]
IGNORED = shutil.ignore_patterns(".venv", ".git", ".cache", "build", "__pycache__", ".hypothesis",
                                 ".ipynb_checkpoints", "*.egg-info")
TIMEOUT_S = 900  # a mutation whose tests hang this long counts as caught (it did not pass)


@dataclass(frozen=True)
class Mutation:
    name: str
    what: str  # the bug, in words
    path: str
    old: str
    new: str
    tests: tuple[str, ...]  # test files, the one expected to catch it first


MUTATIONS = [
    # ---------------------------------------------------------------- capture
    Mutation("warmup-metadata-reused", "the warmup's metadata is reused for capture (vLLM #42444)",
             "cglab/cudagraph_utils.py",
             "        if not (piecewise and self.shared_warmup):\n"
             "            forward_fn = create_forward_fn(desc, warmup=False)",
             "        if False:\n"
             "            forward_fn = create_forward_fn(desc, warmup=False)",
             ("tests/test_lazy_metadata.py",)),
    Mutation("compiled-piecewise-no-warmup", "compiled PIECEWISE capture without its warmup run",
             "cglab/cudagraph_utils.py",
             "        with self.backend.warmup_context():\n            forward_fn(CUDAGraphMode.NONE)\n",
             "        if not piecewise:\n            with self.backend.warmup_context():\n"
             "                forward_fn(CUDAGraphMode.NONE)\n",
             ("tests/test_lazy_metadata.py",)),
    Mutation("legacy-never-skips", "the legacy path builds metadata for compiled PIECEWISE too (no bug to see)",
             "cglab/cudagraph_utils.py", "skip_attn=piecewise and not use_breakable_cg)", "skip_attn=False)",
             ("tests/test_bug_and_fix.py",)),
    Mutation("fix-builds-capture-metadata", "the fix gives PIECEWISE capture-safe metadata (for_capture=True)",
             "cglab/cudagraph_utils.py", "full_cudagraph=desc.cg_mode is CUDAGraphMode.FULL)[0]", "full_cudagraph=True)[0]",
             ("tests/test_linear_attn.py",)),
    Mutation("manager-address-check-off", "the manager's address check never runs",
             "cglab/cudagraph_utils.py", "_check_addresses(desc, self.addresses[desc], reads, source)", "pass",
             ("tests/test_address_guard.py",)),
    Mutation("capture-order-smallest-first", "graphs captured smallest first",
             "cglab/batch.py", "key=lambda d: -d.num_tokens)", "key=lambda d: d.num_tokens)",
             ("tests/test_dispatch.py",)),
    # ---------------------------------------------------------------- compilation
    Mutation("token-dim-static", "the token dimension not marked dynamic: one static trace for every size",
             "cglab/compilation/wrapper.py",
             "        for tensor in inputs:\n            torch._dynamo.mark_dynamic(tensor, 0)\n", "",
             ("tests/test_compiled_piecewise.py",)),
    Mutation("wrapper-address-check-off", "the piece wrapper's own address check replaced by `if False:`",
             "cglab/compilation/cuda_graph.py", "        if self.check_addresses:\n            self._check(",
             "        if False:\n            self._check(", ("tests/test_compiled_piecewise.py",)),
    Mutation("wrapper-captures-while-serving", "a piece wrapper captures a new graph in the middle of serving",
             "cglab/compilation/cuda_graph.py", "        if not _CAPTURING_ENABLED.get():", "        if False:",
             ("tests/test_compiled_piecewise.py",)),
    # ---------------------------------------------------------------- metadata, buffers, batches
    Mutation("real-tokens-off-by-one", "`_real_tokens` counts the first padding row as real",
             "cglab/metadata.py", "< common.num_actual_tokens", "<= common.num_actual_tokens",
             ("tests/test_buffers_metadata.py", "tests/test_bug_and_fix.py")),
    Mutation("compressor-dummy-emits", "the compressor lets dummy (padding-slot) tokens emit entries",
             "cglab/metadata.py", "completes = (common.slot_mapping >= 0) & (position >= 0)",
             "completes = (position >= 0)", ("tests/test_buffers_metadata.py", "tests/test_bug_and_fix.py")),
    Mutation("compressor-group-off-by-one", "a compressor group completes one token early",
             "cglab/metadata.py", "((position + 1) % ratio == 0)", "(position % ratio == 0)",
             ("tests/test_buffers_metadata.py",)),
    Mutation("builder-allocates", "builders return fresh tensors instead of views of their buffers",
             "cglab/metadata.py", "        return getattr(self, name)[:num_tokens]\n",
             "        return torch.empty_like(getattr(self, name)[:num_tokens])\n",
             ("tests/test_buffers_metadata.py",)),
    Mutation("dummy-slots-real", "the dummy capture batch gets real slot 0 instead of PAD_SLOT_ID",
             "cglab/buffers.py", "self.slot_mapping[:num_tokens].fill_(PAD_SLOT_ID)",
             "self.slot_mapping[:num_tokens].fill_(0)", ("tests/test_bug_and_fix.py",)),
    Mutation("dummy-remainder-on-last", "the dummy batch puts the whole remainder on its last request (#49751)",
             "cglab/config.py", "    return [base] * (num_reqs - extra) + [base + 1] * extra",
             "    return [base] * (num_reqs - 1) + [base + extra]", ("tests/test_buffers_metadata.py",)),
    Mutation("piecewise-pads-requests", "PIECEWISE graphs pad requests too (vLLM #49302)",
             "cglab/batch.py", "descs.append(BatchExecutionDescriptor(mixed, size, None))",
             "descs.append(BatchExecutionDescriptor(mixed, size, min(size, self.max_num_reqs)))",
             ("tests/test_dispatch.py",)),
    Mutation("prefill-chunk-is-decode", "a prompt chunk shaped like decode takes a decode graph (vLLM #51865)",
             "cglab/runner.py", "has_prefill = not self.compilation_config.uniform_decode_by_shape and any(",
             "has_prefill = False and any(", ("tests/test_dispatch.py",)),
    Mutation("step-logits-padded", "a step hands back its padding rows' logits too",
             "cglab/runner.py", "logits = self.execute(prepared)[: prepared.num_tokens].clone()",
             "logits = self.execute(prepared).clone()", ("tests/test_step_outputs.py",)),
    # ---------------------------------------------------------------- layers
    Mutation("compressor-profiling-copies", "the compressor's profiling branch copies its input instead of zeros",
             "cglab/layers/compressor.py", "        output.zero_()\n        return",
             "        output.copy_(kv)\n        return", ("tests/test_step_outputs.py",)),
    Mutation("sconv-profiling-zeros", "the short conv's profiling branch returns zeros instead of its input",
             "cglab/layers/sconv.py", "        output.copy_(x)\n        return",
             "        output.zero_()\n        return", ("tests/test_step_outputs.py",)),
    # ---------------------------------------------------------------- Triton kernels (their tests need triton
    # importable: on a GPU machine, or installed for the interpreter; without it they skip and these survive)
    Mutation("triton-attention-key-off-by-one", "the Triton attention's key loop stops one key short (no own key)",
             "cglab/kernels/attention.py", "tl.minimum(position + 1, seq_len)", "tl.minimum(position, seq_len)",
             ("tests/test_triton_kernels.py",)),
    Mutation("triton-sconv-writes-pad-slots", "the Triton short conv stores padding rows at slot -1",
             "cglab/kernels/sconv.py", "    if slot >= 0:  # a padding row", "    if slot >= -1:  # a padding row",
             ("tests/test_triton_kernels.py",)),
    Mutation("triton-compressor-writes-pad-slots", "the Triton compressor writes entries of tokens that complete "
             "no group at slot -1", "cglab/kernels/compressor.py", "    if entry_slot >= 0:",
             "    if entry_slot >= -1:", ("tests/test_triton_kernels.py",)),
    # ---------------------------------------------------------------- the verdict path
    Mutation("tolerance-loosened", "the comparison tolerance loosened 1000x",
             "cglab/repro.py", 'return 1e-4 if dtype == "float32"', 'return 1e-1 if dtype == "float32"',
             ("tests/test_verdicts.py",)),
    Mutation("tolerance-ignored", "the logits verdict compares with a constant, not the result's tolerance",
             "cglab/repro.py", "self.max_abs_diff > self.tolerance", "self.max_abs_diff > 1e-4",
             ("tests/test_verdicts.py",)),
    Mutation("state-tolerance-loosened", "the cache verdict compares with 1000x the tolerance",
             "cglab/repro.py", "any(d > result.tolerance for d", "any(d > 1000 * result.tolerance for d",
             ("tests/test_verdicts.py",)),
    Mutation("max-abs-diff-last-step", "`max_abs_diff` takes the last step's difference only",
             "cglab/repro.py", "max(result.step_diffs) if", "result.step_diffs[-1] if",
             ("tests/test_verdicts.py",)),
    Mutation("diverged-ignores-state", '"diverged" ignores `state_diverged`',
             "cglab/repro.py", "return (bool(self.state_diverged) or self.outputs_identical",
             "return (self.outputs_identical", ("tests/test_verdicts.py",)),
    Mutation("prefill-chunk-budget", "the `--prefill-chunk` budget ignores the decode tokens",
             "cglab/repro.py", "config.max_num_batched_tokens - max(batch_sizes), \" (what a step",
             "config.max_num_batched_tokens, \" (what a step", ("tests/test_chunked_prefill.py",)),
    Mutation("acceptance-over-requests", "acceptance rate over proposals (requests), not drafted tokens",
             "cglab/spec_decode/repro.py", "verified = sum(sum(step.num_drafts) for step in steps)",
             "verified = sum(len(step.num_drafts) for step in steps)", ("tests/test_verdicts.py",)),
    Mutation("lost-acceptance-at-equal", "an acceptance rate equal to the eager drafter's counts as lost",
             "cglab/repro.py", "self.acceptance_rate < self.reference_acceptance_rate",
             "self.acceptance_rate <= self.reference_acceptance_rate", ("tests/test_verdicts.py",)),
    Mutation("check-ignores-lost-acceptance", "`--check` ignores a lost acceptance rate",
             "cglab/cli.py", "failed = result.diverged or result.lost_acceptance or", "failed = result.diverged or",
             ("tests/test_verdicts.py",)),
    Mutation("check-ignores-error", "`--check` passes a run that failed with an error",
             "cglab/cli.py", "or result.error or no_graphs", "or no_graphs", ("tests/test_verdicts.py",)),
    Mutation("check-ignores-no-graphs", "`--check` passes a run in which no graph replayed",
             "cglab/cli.py", "or result.error or no_graphs", "or result.error", ("tests/test_verdicts.py",)),
    # ---------------------------------------------------------------- speculative decoding
    Mutation("spec-sizes-rounded-down", "speculative capture sizes rounded down instead of up",
             "cglab/config.py", "(-(-s // multiple) * multiple for s in capture_sizes)",
             "(max(multiple, s // multiple * multiple) for s in capture_sizes)", ("tests/test_spec_decode.py",)),
    Mutation("greedy-verify-accepts-mismatch", "greedy verification accepts one draft past the first mismatch",
             "cglab/spec_decode/rejection_sampler.py", "        accepted.append(n)\n",
             "        accepted.append(min(n + 1, drafts))\n", ("tests/test_spec_decode.py",)),
    # ---------------------------------------------------------------- bench
    Mutation("bench-drops-eager-launches", "eager-break launches dropped from PIECEWISE's launch count",
             "cglab/bench/run.py", "return len(segments) + eager_ops, sum(s.num_ops for s in segments) + eager_ops,",
             "return len(segments), sum(s.num_ops for s in segments) + eager_ops,", ("tests/test_bench_launches.py",)),
    Mutation("bench-follows-the-lessons-compiler", "the bench compiles as $CGLAB_COMPILE_BACKEND says, not as vLLM",
             "cglab/bench/run.py", "backend=bench_compiler(device.type), check_addresses=False)",
             'backend="auto", check_addresses=False)', ("tests/test_notebook_setup.py",)),
    # ---------------------------------------------------------------- the notebooks' first cell
    Mutation("setup-keeps-the-threads", "setup_notebook leaves torch's thread count as it found it",
             "cglab/lab/notebook.py", "    torch.set_num_threads(1)\n", "", ("tests/test_notebook_setup.py",)),
    Mutation("auto-ignores-the-environment", "compile_backend='auto' ignores $CGLAB_COMPILE_BACKEND",
             "cglab/compilation/backends.py", "return chosen or (", "return (", ("tests/test_notebook_setup.py",)),
]


def scratch_copy(destination: Path) -> Path:
    tree = destination / "tree"
    shutil.copytree(ROOT, tree, ignore=IGNORED)
    return tree


def environment(tree: Path) -> dict[str, str]:
    # The copy first; then any PYTHONPATH the caller set (e.g. a Triton installed outside the venv).
    path = os.pathsep.join(p for p in (str(tree), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg",
           # No bytecode: a mutated file and its original can share size and mtime, and a stale .pyc
           # would run the wrong one.
           "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("PYTHONPYCACHEPREFIX", None)
    return env


def run_tests(tree: Path, files: tuple[str, ...]) -> tuple[bool, str, float]:
    """(passed, the first failing test or a reason, seconds)."""
    command = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-rfE", *files]
    start = time.perf_counter()
    try:
        done = subprocess.run(command, cwd=tree, env=environment(tree), capture_output=True, text=True,
                              timeout=TIMEOUT_S)
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
        raise LookupError(f"{mutation.name}: its old text occurs {count} times in {mutation.path}, not once; "
                          "update the mutation after the refactor")
    path.write_text(original.replace(mutation.old, mutation.new))
    return original


def check_import(tree: Path) -> None:
    """The tests must import the copy's cglab, not an installed one."""
    done = subprocess.run([sys.executable, "-c", "import cglab; print(cglab.__file__)"], cwd=tree,
                          env=environment(tree), capture_output=True, text=True, check=True)
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
    print(f"{len(mutations) - len(survived)} of {len(mutations)} caught"
          + (f"; survived or not applied: {', '.join(survived)}" if survived else ""))
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())
