"""The CLI's JSON contract (DESIGN.md): keys, order and exit codes that headless users rely on; its help,
its checks before torch, and the words of its verdicts."""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
from dataclasses import replace

import pytest
import torch

from cglab import ReproResult
from cglab.cli import build_parser, main
from cglab.repro import divergence_verdict
from cglab.repro_report import repro_header, repro_verdict
from cglab.spec_decode.repro import summarize_spec

KEYS = [
    "mode",
    "piecewise_flavor",
    "legacy_skip_attn",
    "layers",
    "backend",
    "steps",
    "prefill_chunk",
    "cudagraph_mode",
    "captured_sizes",
    "steps_by_mode",
    "max_abs_diff",
    "state_diverged",
    "error",
]


def _repro_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    assert main(["repro", "--json", "--steps", "4", "--batch-sizes", "3,1", *argv]) == 0
    return json.loads(capsys.readouterr().out)


def test_repro_json_contract(capsys: pytest.CaptureFixture[str]) -> None:
    data = _repro_json(capsys, "--mode", "full")
    assert list(data) == KEYS
    # Plain FULL captures every size (not only up to the 3 requests), so every step replays a graph.
    assert data["backend"] == "sim" and data["captured_sizes"] == {"full": [1, 2, 4, 8]} and data["error"] is None
    assert data["steps_by_mode"] == {"full": 4} and data["cudagraph_mode"] == "full"  # nothing lowered
    assert data["state_diverged"] is False and data["max_abs_diff"] < 1e-4


def test_divergence_and_refused_capture_still_exit_zero(capsys: pytest.CaptureFixture[str]) -> None:
    assert _repro_json(capsys, "--legacy-skip-attn")["state_diverged"] is True  # divergence is the finding
    error = _repro_json(capsys, "--legacy-skip-attn", "--strict-layers")["error"]
    assert error.startswith("MissingMetadataError: capturing the PIECEWISE")


def test_a_closed_stdout_says_the_result_was_not_printed() -> None:
    """Nothing was saved: the one line on stderr says the result was lost, not that the disk failed. (An eager
    run: what a graph mode adds here is only its seconds of compiling.)"""
    proc = subprocess.Popen(
        [sys.executable, "-m", "cglab", "repro", "--mode", "none", "--steps", "2", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    proc.stdout.close()
    err = [line for line in proc.stderr.read().splitlines() if " steps after " not in line]  # progress lines
    assert proc.wait(timeout=300) == 1
    assert err == [
        "python -m cglab repro: error: stdout was closed (its reader went away) before the result was printed in full"
    ]


@pytest.mark.parametrize(
    "spec", [[], ["--num-speculative-tokens", "1", "--layers", "attn,attn"]], ids=["plain", "speculative"]
)
def test_a_run_in_a_terminal_shows_how_far_it_got(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], spec: list[str]
) -> None:
    """A long run (``--batch-sizes 256 --steps 4000``: minutes) used to print nothing until the end: in a
    terminal, a bar of the steps goes to stderr (here at once; by default after 2 s)."""
    monkeypatch.setattr("cglab.cli.BAR_DELAY_S", 0)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    assert main(["repro", "--steps", "3", "--batch-sizes", "1,2", *spec]) == 0
    assert "repro:   0%|          | 0/3 [" in capsys.readouterr().err
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False)  # a log or a pipe: no bar
    assert main(["repro", "--steps", "3", "--batch-sizes", "1,2", *spec]) == 0
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("argv", [["--mode", "full_decode_only", "--capture-sizes", "16"], ["--batch-sizes", "100"]])
def test_an_all_eager_run_is_never_called_a_graph_result(capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    assert main(["repro", "--steps", "2", *argv]) == 0
    out = capsys.readouterr().out
    assert "NO GRAPH REPLAYED" in out and "matches eager" not in out
    assert main(["repro", "--steps", "2", "--check", *argv]) == 1  # --check refuses it as a pass


def test_strict_layers_error_fails_check_and_modes_ignore_case(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["repro", "--legacy-skip-attn", "--strict-layers", "--steps", "2", "--check"]) == 1
    assert "ERROR: MissingMetadataError" in capsys.readouterr().out
    assert _repro_json(capsys, "--mode", "PIECEWISE")["mode"] == "piecewise"


def test_repro_json_with_speculative_tokens(capsys: pytest.CaptureFixture[str]) -> None:
    """The two acceptance keys come last; --check passes the fixed drafter and fails the legacy one, whose
    target outputs are exact (an attention-only target) but whose acceptance fell below the eager drafter's."""
    argv = [
        "repro",
        "--json",
        "--check",
        "--steps",
        "4",
        "--batch-sizes",
        "1,2",
        "--layers",
        "attn,attn",
        "--num-speculative-tokens",
        "2",
        "--seed",
        "5",
    ]
    assert main(argv) == 0
    fixed = json.loads(capsys.readouterr().out)
    assert list(fixed) == [*KEYS, "acceptance_rate", "reference_acceptance_rate"]
    assert fixed["captured_sizes"] == {"piecewise": [3, 6, 12, 24]}  # K + 1 times 1, 2, 4, 8
    assert fixed["acceptance_rate"] == fixed["reference_acceptance_rate"] and fixed["state_diverged"] is False
    assert main([*argv, "--legacy-skip-attn"]) == 1
    legacy = json.loads(capsys.readouterr().out)
    assert legacy["max_abs_diff"] < 1e-4 and legacy["error"] is None
    assert legacy["reference_acceptance_rate"] == fixed["reference_acceptance_rate"]
    assert legacy["acceptance_rate"] < legacy["reference_acceptance_rate"]
    assert legacy["state_diverged"] is True  # the drafter's own caches


def test_spec_decode_captures_sizes_as_model_runner_v2(capsys: pytest.CaptureFixture[str]) -> None:
    """PIECEWISE graphs keep the capture sizes; FULL uniform-decode graphs round them up to multiples of K + 1,
    and any K the help allows runs: no size has to fit K + 1 (issue 37)."""
    argv = ["repro", "--json", "--mode", "full_and_piecewise", "--layers", "attn,attn", "--steps", "2"]
    for k, sizes, captured in (
        ("2", "1,2,4,8", {"piecewise": [1, 2, 4, 8], "full": [3, 6]}),
        ("16", "9,18,36", {"piecewise": [9, 18, 36], "full": [17, 34]}),
        ("16", "1,2,4,8", {"piecewise": [1, 2, 4, 8]}),
    ):  # 17 tokens fit no graph: eager
        assert main([*argv, "--num-speculative-tokens", k, "--capture-sizes", sizes]) == 0
        data = json.loads(capsys.readouterr().out)
        assert data["captured_sizes"] == captured and data["acceptance_rate"] == data["reference_acceptance_rate"]
    # The default sizes, 17 times 1, 2, 4, 8, and batch sizes (3, 1, 8): three steps reach each batch size once.
    assert main(["repro", "--num-speculative-tokens", "16", "--layers", "attn,attn", "--steps", "3", "--check"]) == 0
    assert "acceptance rate" in capsys.readouterr().out


# -- switches that would change nothing: one warning line each on stderr, and the run goes on ------------------

GRAPH_SWITCHES = [
    ["--legacy-skip-attn", "--check"],
    ["--piecewise-flavor", "compiled"],
    ["--splitting-ops", "cglab::unified_attention"],
    ["--capture-sizes", "1,2"],
    ["--strict-layers"],
    ["--python-guards"],
    ["--pre-49751-dummy-split"],
    ["--uniform-decode-rule", "51865"],
    ["--num-speculative-tokens", "2", "--frozen-step-index"],
]
NONE_WHY = "under --mode none: it captures no graph (the run compares eager with eager)"


def _warnings(capsys: pytest.CaptureFixture[str], *argv: str) -> list[str]:
    """Run ``repro`` (it must complete, exit 0) and return its stderr lines."""
    assert main(["repro", "--steps", "2", "--batch-sizes", "1,2", *argv]) == 0
    captured = capsys.readouterr()
    assert " -> " in captured.out  # the run went on to its verdict
    return captured.err.splitlines()


@pytest.mark.parametrize("switch", GRAPH_SWITCHES, ids=lambda argv: argv[0] if len(argv) < 3 else argv[-1])
def test_graph_switches_under_mode_none_warn_and_run(capsys: pytest.CaptureFixture[str], switch: list[str]) -> None:
    """Scripted sweeps pass the same switches to every mode: under none they do nothing, and say so once."""
    flag = next(
        a
        for a in switch
        if a not in ("--check", "--num-speculative-tokens", "2", "compiled", "1,2") and not a.startswith("cglab::")
    )
    assert _warnings(capsys, "--mode", "none", *switch) == [
        f"python -m cglab repro: warning: {flag} changes nothing {NONE_WHY}"
    ]


def test_every_graph_switch_under_mode_none_is_named_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert _warnings(capsys, "--mode", "none", "--legacy-skip-attn", "--strict-layers", "--capture-sizes", "1") == [
        f"python -m cglab repro: warning: --legacy-skip-attn and --capture-sizes and --strict-layers change nothing "
        f"{NONE_WHY}"
    ]


IDLE = "python -m cglab repro: warning: "
BREAKABLE_WHY = "with --piecewise-flavor breakable: nothing is compiled, the graphs break at attention"


@pytest.mark.parametrize(
    ("argv", "warnings"),
    [
        (
            ["--piecewise-flavor", "breakable", "--splitting-ops", "cglab::unified_attention", "--python-guards"],
            [f"{IDLE}--splitting-ops and --python-guards change nothing {BREAKABLE_WHY}"],
        ),
        (
            ["--mode", "full", "--piecewise-flavor", "breakable", "--splitting-ops", "cglab::unified_attention"],
            [f"{IDLE}--splitting-ops changes nothing {BREAKABLE_WHY}"],
        ),
        (
            ["--num-speculative-tokens", "1", "--frozen-step-index", "--layers", "attn,attn"],
            [f"{IDLE}--frozen-step-index changes nothing with one speculative token: no draft decode step"],
        ),
        (
            ["--frozen-step-index", "--draft-layers", "sconv,attn"],
            [
                f"{IDLE}--draft-layers and --frozen-step-index change nothing without --num-speculative-tokens K: there is no "
                "drafter"
            ],
        ),
        (
            ["--mode", "none", "--frozen-step-index", "--strict-layers"],
            [
                f"{IDLE}--frozen-step-index changes nothing without --num-speculative-tokens K: there is no drafter",
                f"{IDLE}--strict-layers changes nothing {NONE_WHY}",
            ],
        ),
        # Switches that do something here: not a word.
        (["--splitting-ops", "cglab::unified_attention,cglab::short_conv", "--python-guards"], []),
        (["--mode", "full", "--piecewise-flavor", "compiled", "--capture-sizes", "1,2"], []),
        (
            ["--num-speculative-tokens", "2", "--frozen-step-index", "--layers", "attn,attn", "--draft-layers", "attn"],
            [],
        ),
    ],
    ids=[
        "breakable-compiles-nothing",
        "breakable-under-full",
        "one-draft",
        "no-drafter",
        "none-and-no-drafter",
        "compiled-splitting-ops",
        "full-compiled",
        "drafter-switches",
    ],
)
def test_a_switch_that_does_nothing_here_is_one_warning_line(
    capsys: pytest.CaptureFixture[str], argv: list[str], warnings: list[str]
) -> None:
    assert _warnings(capsys, *argv) == warnings


def test_mode_none_still_runs_with_check(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["repro", "--mode", "none", "--steps", "2", "--check"]) == 0
    assert "matches eager" in capsys.readouterr().out


NOTE = (
    f"{IDLE}--legacy-skip-attn changes nothing here: this policy captures no PIECEWISE graph, and FULL graphs "
    "got capture metadata before the fix too"
)


@pytest.mark.parametrize("output", [["--json"], []], ids=["json", "human"])
def test_the_legacy_switch_under_full_is_a_warning(capsys: pytest.CaptureFixture[str], output: list[str]) -> None:
    """Accepted (notebook 00's first exercise runs it, to show that FULL never had the bug), and said."""
    argv = ["repro", "--mode", "full", "--piecewise-flavor", "breakable", "--legacy-skip-attn", "--steps", "2", *output]
    assert main(argv) == 0
    assert capsys.readouterr().err.splitlines() == [NOTE]
    # FULL lowered to FULL_AND_PIECEWISE (linear_attn's builder): PIECEWISE graphs, where the switch matters.
    assert main([*argv, "--layers", "linear_attn,attn"]) == 0
    captured = capsys.readouterr()
    assert captured.err == "" and ("lowered to FULL_AND_PIECEWISE" in captured.out) is not bool(output)


# -- arguments are checked before torch is imported ------------------------------------------------------

# One process runs every bad input in turn, each as Python runs `python -m cglab` (argv[0] reads "-m"; the
# exit status is __main__'s SystemExit), those refused before torch first, so whether torch is imported
# after each is that input's own finding. Before them `import cglab` alone, after them its names (the
# package is lazy). One start of torch instead of one per input.
PROBE = """
import contextlib, io, json, runpy, sys, traceback

import cglab, cglab.bench
found = {"import cglab": "torch" in sys.modules}
for case, argv in json.loads(sys.argv[1]):
    sys.argv = ["-m", *argv]
    out, err, exit_status = io.StringIO(), io.StringIO(), None
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            runpy._run_module_as_main("cglab")
        except SystemExit as exc:
            exit_status = exc.code
        except BaseException:
            traceback.print_exc()
    found[case] = [exit_status, out.getvalue(), err.getvalue(), "torch" in sys.modules]
from cglab import ModelRunner, ToyConfig, run_repro
from cglab.bench import run_bench
import cglab as c
names = all(hasattr(c, n) for n in c.__all__) and set(c.__all__) <= set(dir(c))
found["names"] = ["torch" in sys.modules, ModelRunner.__module__, names]
print(json.dumps(found))
"""
MODES = "'none', 'piecewise', 'full', 'full_decode_only', 'full_and_piecewise'"
# Every bad input: (argv, a fragment of its one line). All are refused before torch is imported, but
# AFTER_TORCH: those only the engine can judge.
BAD_ARGUMENTS = {
    "no subcommand": ([], "required"),
    "mode": (["repro", "--mode", "bogus"], f"argument --mode: invalid choice: 'bogus' (choose from {MODES})"),
    "device": (["repro", "--device", "tpu"], "argument --device: invalid choice: 'tpu' (choose from 'cpu', 'cuda')"),
    "unknown layer kind": (["repro", "--layers", "sconv,atn"], "valid kinds: attn, sconv, compressor"),
    "empty layer pattern": (["repro", "--layers", ","], "the layer pattern is empty"),
    "empty layer kind": (["repro", "--layers", "sconv,,ATTN"], "the layer pattern 'sconv,,ATTN' has an empty item"),
    "duplicate capture sizes": (["repro", "--capture-sizes", "1,2,2"], "drop the duplicates"),
    "empty capture size": (["repro", "--capture-sizes", "1,,2"], "argument --capture-sizes: '1,,2' has an empty"),
    "empty batch size": (["repro", "--batch-sizes", "1,,2"], "argument --batch-sizes: '1,,2' has an empty item"),
    "batch sizes ending in a comma": (["repro", "--batch-sizes", "1,2,"], "'1,2,' has an empty item"),
    "zero steps": (["repro", "--steps", "0"], "argument --steps: expected an integer of at least 1, got '0'"),
    "negative chunk": (
        ["repro", "--prefill-chunk", "-1"],
        "argument --prefill-chunk: expected an integer of at least 0",
    ),
    "negative seed": (["repro", "--seed", "-1"], "seed must be an integer from 0"),
    "empty splitting op": (
        ["repro", "--layers", "sconv,attn", "--splitting-ops", "cglab::unified_attention,,"],
        "splitting_ops 'cglab::unified_attention,,' has an empty item",
    ),
    "max_num_reqs below the largest batch": (
        ["repro", "--max-num-reqs", "2", "--batch-sizes", "3"],
        "--max-num-reqs 2 is below the largest batch size (3)",
    ),
    "zero max-num-reqs": (
        ["repro", "--max-num-reqs", "0"],
        "argument --max-num-reqs: expected an integer of at least 1",
    ),
    "negative K": (["repro", "--num-speculative-tokens", "-1"], "expected an integer of at least 0"),
    "K with chunked prefill": (
        ["repro", "--num-speculative-tokens", "2", "--prefill-chunk", "4"],
        "drop one of the two",
    ),
    "empty draft layers": (
        ["repro", "--num-speculative-tokens", "2", "--draft-layers", ""],
        "argument --draft-layers: expected comma-separated names from attn, sconv, compressor",
    ),
    "bench mode": (["bench", "--out", "x", "--modes", "fast"], "expected comma-separated names from none, piecewise"),
    "empty bench mode": (["bench", "--out", "unused", "--modes", "none,,full"], "argument --modes: 'none,,full' has"),
    "startup policy": (
        ["startup", "--out", "x", "--policies", "full_decode_only"],
        "expected comma-separated names from piecewise, full, full_and_piecewise",
    ),
    "capture size the scenario cannot batch": (
        ["repro", "--capture-sizes", "512"],
        "capture size 512: puts 64 tokens in one request of its capture batch (of at most 8), above the 48 a request "
        "may hold (max_model_len); the largest capture size that fits is 384",
    ),
}
AFTER_TORCH = {"capture size the scenario cannot batch"}
if not torch.cuda.is_available():
    BAD_ARGUMENTS["cuda without a GPU"] = (["repro", "--device", "cuda"], "--device cpu) to run the CPU simulator")
    AFTER_TORCH.add("cuda without a GPU")


@pytest.fixture(scope="module")
def probed() -> dict[str, list]:
    """What PROBE found for each bad input (exit status, stdout, stderr, torch imported) and for the imports."""
    cases = sorted(BAD_ARGUMENTS, key=lambda case: case in AFTER_TORCH)  # stable: the others keep their order
    argvs = json.dumps([[case, BAD_ARGUMENTS[case][0]] for case in cases])
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, argvs], check=False, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr  # nothing beside each input's own lines
    return json.loads(proc.stdout)


@pytest.mark.parametrize("case", list(BAD_ARGUMENTS))
def test_bad_arguments_exit_2_with_one_line(probed: dict[str, list], case: str) -> None:
    """One line naming the fix, exit 2, no traceback; and no torch unless the engine had to judge."""
    argv, message = BAD_ARGUMENTS[case]
    status, out, err, torch_imported = probed[case]
    error = err.splitlines()
    assert (status, out, torch_imported) == (2, "", case in AFTER_TORCH), err
    assert len(error) == 1 and error[0].startswith(f"python -m cglab {argv[0] if argv else ''}".strip()), error
    assert ": error: " in error[0] and message in error[0]


def test_import_cglab_imports_no_torch_until_a_name_is_used(probed: dict[str, list]) -> None:
    """The package is lazy (``python -m cglab`` imports it first); its names still import as before."""
    assert probed["import cglab"] is False
    assert probed["names"] == [True, "cglab.runner", True]  # every name of __all__ is there, and listed


def test_an_unknown_name_is_an_attribute_error() -> None:
    import cglab

    with pytest.raises(AttributeError, match="module 'cglab' has no attribute 'ModelRunnr'"):
        cglab.ModelRunnr  # noqa: B018


# -- --help: defaults and examples ---------------------------------------------------------------------------


def _help(capsys: pytest.CaptureFixture[str], *command: str) -> str:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args([*command, "--help"])
    assert exited.value.code == 0
    return capsys.readouterr().out


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


@pytest.mark.parametrize("command", ["repro", "bench", "startup"])
def test_every_option_says_its_default(capsys: pytest.CaptureFixture[str], command: str) -> None:
    text = " ".join(_help(capsys, command).split())  # unwrapped: a help may break a line anywhere
    for action in _subparsers()[command]._actions:
        if action.dest in ("help", "out"):  # --out is required: no default to show
            continue
        if action.default is None:  # worked out from other options: the help says how
            assert "default" in action.help.lower(), action.dest
        else:
            assert f"(default: {action.default})" in text, action.dest
    expected = {
        "repro": ["(default: piecewise)", "(default: 3,1,8)", "(default: 16)", "(default: False)"],
        "bench": ["default 1024 (--quick: 32)", "default 300 (--quick: 20)", "default 1,2,4,8,16,32,64,128,256"],
        "startup": ["default 256 (--quick: 8)", "default piecewise,full,full_and_piecewise"],
    }[command]
    assert all(e in text for e in expected), text


def _example_lines(text: str) -> list[str]:
    return [
        line.strip()
        for line in text.split("examples:\n", 1)[1].splitlines()
        if line.strip().startswith("python -m cglab ")
    ]


@pytest.mark.parametrize("command", [[], ["repro"], ["bench"], ["startup"]], ids=lambda c: c[0] if c else "top")
def test_help_ends_with_examples_that_parse(capsys: pytest.CaptureFixture[str], command: list[str]) -> None:
    lines = _example_lines(_help(capsys, *command))
    assert 2 <= len(lines) <= 4, lines
    for line in lines:
        argv = shlex.split(line)[3:]
        if argv[-1] == "--help":
            continue
        args = build_parser().parse_args(argv)  # a typo in an example would exit 2 here
        if getattr(args, "validate", None):
            args.validate(args)


def test_the_examples_are_real_runs(capsys: pytest.CaptureFixture[str]) -> None:
    """The two repro examples that show the bug and the fix say so."""
    assert main(["repro", "--legacy-skip-attn", "--steps", "4"]) == 0
    assert capsys.readouterr().out.splitlines()[-1].endswith("-> logits and caches DIVERGED from eager")
    assert main(["repro", "--check", "--steps", "4"]) == 0
    assert capsys.readouterr().out.splitlines()[-1].endswith("-> matches eager")


# -- verdicts name what diverged -----------------------------------------------------------------------------

TARGET, DRAFTER = "layers.0.sconv.conv_state", "draft.layers.0.sconv.conv_state"
SPEC_BASE = ReproResult(
    "piecewise",
    "compiled",
    True,
    "sconv,attn",
    "sim",
    {"piecewise": [3, 6]},
    4,
    0,
    {"piecewise": 4},
    0.0,
    False,
    None,
    state_diffs={TARGET: 0.0, DRAFTER: 0.0},
    num_speculative_tokens=2,
    acceptance_rate=0.5,
    reference_acceptance_rate=0.5,
    tokens_per_step=[2.0],
    reference_tokens_per_step=[2.0],
    outputs_identical=True,
)
# case -> (fields, the repro line's verdict, summarize_spec's cache verdict)
SPEC_VERDICTS = {
    "logits": (
        {"max_abs_diff": 0.3},
        "logits DIVERGED from eager; target caches and drafter caches match",
        "target caches and drafter caches match eager",
    ),
    "target-caches": (
        {"state_diffs": {TARGET: 0.5, DRAFTER: 0.0}, "state_diverged": True},
        "target caches DIVERGED from eager; logits and drafter caches match",
        f"target caches ({TARGET}) DIVERGED from eager; drafter caches match",
    ),
    "drafter-caches": (
        {"state_diffs": {TARGET: 0.0, DRAFTER: 0.5}, "state_diverged": True},
        "drafter caches DIVERGED from eager; logits and target caches match",
        f"drafter caches ({DRAFTER}) DIVERGED from eager; target caches match",
    ),
    "none": ({}, "matches eager", "target caches and drafter caches match eager"),
}


@pytest.mark.parametrize("case", list(SPEC_VERDICTS))
def test_the_speculative_verdict_names_what_diverged(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], case: str
) -> None:
    """A broken drafter leaves the logits exact: "DIVERGED" must say whose caches, in the repro line and in
    the speculative summary alike."""
    fields, verdict, caches = SPEC_VERDICTS[case]
    result = replace(SPEC_BASE, **fields)
    assert repro_verdict(result) == verdict
    assert summarize_spec(result).splitlines()[1] == f"generated tokens identical to the eager run: True; {caches}"
    monkeypatch.setattr("cglab.spec_decode.run_spec_repro", lambda *a, **k: result)
    assert main(["repro", "--num-speculative-tokens", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[3].endswith(f"caches diverged: {result.state_diverged} -> {verdict}"), lines[3]
    assert lines[-1].endswith(caches)


@pytest.mark.parametrize(
    ("fields", "verdict"),
    [
        (
            {"max_abs_diff": 0.3, "state_diffs": {TARGET: 0.5}, "state_diverged": True},
            "logits and caches DIVERGED from eager",
        ),
        ({"max_abs_diff": 0.3}, "logits DIVERGED from eager; caches match"),
        ({"state_diffs": {TARGET: 0.5}, "state_diverged": True}, "caches DIVERGED from eager; logits match"),
        ({"state_diverged": True}, "caches DIVERGED from eager; logits match"),  # which cache is not known
        ({}, "matches eager"),
    ],
    ids=["both", "logits", "caches", "caches-unnamed", "none"],
)
def test_the_verdict_without_a_drafter(fields: dict, verdict: str) -> None:
    result = replace(SPEC_BASE, **{"num_speculative_tokens": 0, "state_diffs": {TARGET: 0.0}, **fields})
    assert divergence_verdict(result) == verdict


def test_tokens_that_differ_are_named_too() -> None:
    result = replace(SPEC_BASE, max_abs_diff=0.3, outputs_identical=False)
    assert repro_verdict(result) == (
        "logits and generated tokens DIVERGED from eager; target caches and drafter caches match"
    )


# -- the header names the switches that change the run -------------------------------------------------------


def test_a_frozen_step_index_run_says_so_in_its_header(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    result = replace(SPEC_BASE, mode="full", legacy_skip_attn=False, captured_sizes={"full": [3, 6]})
    frozen = "--frozen-step-index on (the draft step index is a Python int frozen at capture)"
    assert repro_header(result, frozen_step_index=True) == f"mode FULL, layers sconv,attn, {frozen}, backend sim"
    assert "frozen" not in repro_header(result)
    monkeypatch.setattr("cglab.spec_decode.run_spec_repro", lambda *a, **k: result)
    assert main(["repro", "--mode", "full", "--num-speculative-tokens", "2", "--frozen-step-index"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == f"mode FULL, layers sconv,attn, {frozen}, backend sim"


def test_a_python_without_torch_gets_one_line_that_names_the_venv(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bare `python` in a terminal at the repository root finds cglab but not torch: one line, exit 2."""
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` now fails as it does outside the venv
    assert main(["repro", "--steps", "1"]) == 2
    assert capsys.readouterr().err == (
        f"python -m cglab repro: error: {sys.executable} has no torch; use the venv's Python: "
        ".venv/bin/python -m cglab (make setup)\n"
    )


def test_the_pre_49751_switch_reaches_the_capture(capsys: pytest.CaptureFixture[str]) -> None:
    """A capture size of 343 over 8 requests: the old split puts 49 tokens in the last one, above max_model_len
    (48 for 2 steps), and capture fails (exit 1 with --check); today's split (42 or 43 each) fits."""
    argv = ["repro", "--capture-sizes", "1,343", "--batch-sizes", "8", "--steps", "2", "--check", "--json"]
    assert main(argv) == 0
    assert main([*argv, "--pre-49751-dummy-split"]) == 1
    assert "above max_model_len" in json.loads(capsys.readouterr().out.splitlines()[-1])["error"]
