"""The capture matrix: one layer pattern through the configurations an engine like vLLM captures graphs in, each
judged against eager by the repro's own verdict (``run_repro``, ``run_spec_repro``), in one table.

A row that diverged or failed gets a finding, what differed at capture, from checks that run only then: the
legacy path gave the capture no attention metadata; a rerun with the address check finds a tensor replaced
after capture; padding an eager step as a graph pads it (token rows, requests) changes a cache; else the graph
froze a Python value (an int, a plan, a branch), since metadata, addresses and padding were all sound.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from cglab.compare import exceeds
from cglab.compilation_config import CompilationConfig, SpeculativeConfig
from cglab.config import CUDAGraphMode, ToyConfig
from cglab.errors import ConfigError
from cglab.forward_context import set_forward_context
from cglab.layer_registry import get_layer_kind
from cglab.repro import ReproResult, new_result, run_repro, tolerance
from cglab.runner import ModelRunner, prepare_inputs
from cglab.spec_decode import run_spec_repro

# The batches a row replays: keyword arguments of run_repro (spec_decode: of run_spec_repro).
BATCHES = {
    "uniform_decode": {"batch_sizes": (1, 2, 4), "steps": 3},  # every batch a capture size: no padding
    "padded": {"batch_sizes": (3,), "steps": 3, "max_num_reqs": 4},  # 4 tokens; FULL pads a request too
    "chunked_prefill": {"batch_sizes": (2,), "steps": 10, "prefill_chunk": 4},  # mixed batches, then decodes
    "spec_decode": {"batch_sizes": (1, 2), "steps": 2},  # K + 1 tokens a request, verified
}
NUM_SPECULATIVE_TOKENS = 2


@dataclass(frozen=True)
class MatrixCase:
    """One configuration: a mode or policy, its PIECEWISE flavour (None: no PIECEWISE graph), a capture path."""

    mode: str
    piecewise_flavor: str | None
    capture_path: str  # "legacy" (before vLLM PR #49364) or "fixed"
    batch: str

    @property
    def key(self) -> str:
        return "/".join((self.mode, self.piecewise_flavor or "-", self.capture_path, self.batch))

    def compilation_config(self, check_addresses: bool = False) -> CompilationConfig:
        return CompilationConfig(
            self.mode,
            use_breakable_cg=self.piecewise_flavor == "breakable",
            legacy_skip_attn=self.capture_path == "legacy",
            check_addresses=check_addresses,
        )


def _case(spec: str) -> MatrixCase:
    mode, flavor, path, batch = spec.split("/")
    return MatrixCase(mode, None if flavor == "-" else flavor, path, batch)


# vLLM's modes and policies, both PIECEWISE flavours, the legacy path where it differs, every kind of batch.
CASES = tuple(
    map(
        _case,
        (
            "full/-/fixed/uniform_decode",
            "full/-/fixed/padded",
            "full_decode_only/-/fixed/chunked_prefill",
            "piecewise/compiled/legacy/uniform_decode",
            "piecewise/compiled/fixed/uniform_decode",
            "piecewise/compiled/fixed/padded",
            "piecewise/compiled/fixed/chunked_prefill",
            "piecewise/breakable/legacy/padded",
            "piecewise/breakable/fixed/padded",
            "piecewise/breakable/fixed/chunked_prefill",
            "full_and_piecewise/compiled/legacy/chunked_prefill",
            "full_and_piecewise/compiled/fixed/chunked_prefill",
            "full_and_piecewise/compiled/fixed/spec_decode",
        ),
    )
)


@dataclass
class MatrixRow:
    case: MatrixCase
    verdict: str  # "matches", "diverged" or "error"
    first_diverged_step: int | None  # 1-based; a state-only divergence: the last step (caches compared after it)
    diverged_in: str | None  # "logits", "state" or "logits and state"
    replays: int  # steps that replayed a graph (a row with none compared eager with eager)
    finding: str | None  # what differed at capture, in words

    def to_json(self) -> dict[str, object]:
        return {
            **{k: v for k, v in dataclasses.asdict(self.case).items()},
            "verdict": self.verdict,
            "first_diverged_step": self.first_diverged_step,
            "diverged_in": self.diverged_in,
            "replays": self.replays,
            "finding": self.finding,
        }


@dataclass
class CaptureMatrix:
    layers: str
    backend: str
    rows: list[MatrixRow]

    def to_json(self) -> dict[str, object]:
        return {"layers": self.layers, "backend": self.backend, "rows": [row.to_json() for row in self.rows]}

    def failing(self, capture_path: str | None = "fixed") -> list[str]:
        """The keys of the rows that did not match eager, on one capture path (None: both)."""
        return [r.case.key for r in self.rows if r.verdict != "matches" and capture_path in (None, r.case.capture_path)]

    def table(self, findings: bool = True) -> str:
        """One line per row, aligned (``findings=False``: without what differed at capture)."""
        head = ("mode", "piecewise", "path", "batch", "verdict", "step", "in", "replays", "what differed at capture")
        lines = [head] + [
            (
                r.case.mode,
                r.case.piecewise_flavor or "-",
                r.case.capture_path,
                r.case.batch,
                r.verdict,
                "-" if r.first_diverged_step is None else str(r.first_diverged_step),
                r.diverged_in or "-",
                str(r.replays),
                r.finding or "-",
            )
            for r in self.rows
        ]
        lines = lines if findings else [line[:-1] + ("",) for line in lines]
        widths = [max(len(line[i]) for line in lines) for i in range(len(head) - 1)]
        out = [f"capture matrix of layers {self.layers} ({self.backend}): each row against eager"]
        out += ["  ".join([*(c.ljust(w) for c, w in zip(line, widths)), line[-1]]).rstrip() for line in lines]
        return "\n".join(out)


def run_capture_matrix(
    layers: str | Sequence[str] | ToyConfig,
    *,
    cases: Sequence[MatrixCase] = CASES,
    device: str = "cpu",
    diagnose: bool = True,
    progress: Callable[[MatrixCase], object] | None = None,
) -> CaptureMatrix:
    """Run every case of ``cases`` for the layer pattern ``layers`` (kinds built in or registered; a ToyConfig
    for other sizes) against eager and return the table; ``diagnose``: find what differed at capture for
    each row that did not match (a few more runs); ``progress(case)`` after each row."""
    config = layers if isinstance(layers, ToyConfig) else ToyConfig(layers=layers)
    rows, backend, padding = [], "eager", {}
    for case in cases:
        result = _run(case, config, device)
        backend = result.backend if result.backend != "eager" else backend
        row = _judge(case, result)
        if row.verdict != "matches" and diagnose:
            if not padding:  # once per pattern: a fact of its ops, not of a configuration
                padding = {pad: padding_changes(config, device, pad_requests=pad) for pad in (False, True)}
            row.finding = _finding(case, config, result, padding, device)
        rows.append(row)
        if progress is not None:
            progress(case)
    return CaptureMatrix(",".join(config.layers), backend, rows)


def _run(case: MatrixCase, config: ToyConfig, device: str, check_addresses: bool = False) -> ReproResult:
    cc, batch = case.compilation_config(check_addresses), BATCHES[case.batch]
    try:
        if case.batch == "spec_decode":
            return run_spec_repro(cc, SpeculativeConfig(NUM_SPECULATIVE_TOKENS), config, device=device, **batch)
        return run_repro(cc, config, device=device, **batch)
    except ConfigError as exc:  # a mode its builders cannot serve (a NEVER builder under FULL): a finding
        result = new_result(cc, config, batch["steps"])
        result.error = f"{type(exc).__name__}: {exc}"
        return result


def _judge(case: MatrixCase, result: ReproResult) -> MatrixRow:
    replays = sum(n for mode, n in result.steps_by_mode.items() if mode != "none")
    if result.error is not None:
        return MatrixRow(case, "error", None, None, replays, None)
    logits = [i for i, d in enumerate(result.step_diffs, 1) if exceeds(d, result.tolerance)]
    state = bool(result.state_diverged) or result.outputs_identical is False
    if not (logits or state):
        return MatrixRow(case, "matches", None, None, replays, None)
    where = " and ".join(part for part, hit in (("logits", logits), ("state", state)) if hit)
    return MatrixRow(case, "diverged", logits[0] if logits else len(result.step_diffs), where, replays, None)


def _finding(
    case: MatrixCase, config: ToyConfig, result: ReproResult, padding: dict[bool, list[str]], device: str
) -> str:
    """What differed at capture, by the first check that explains the row (the module's docstring)."""
    if result.error is not None:
        return result.error.split(". ")[0]
    cc = case.compilation_config()
    in_pieces = [k for k in config.layers if not get_layer_kind(k).splitting]
    compiled_piecewise = not cc.use_breakable_cg and CUDAGraphMode.PIECEWISE in cc.cudagraph_mode.runtime_modes()
    if cc.legacy_skip_attn and compiled_piecewise and in_pieces:
        kinds = list(dict.fromkeys(in_pieces))
        their = "its" if len(kinds) == 1 else "their"
        return f"no attention metadata at capture: {', '.join(kinds)} recorded {their} None branch"
    rerun = _run(case, config, device, check_addresses=True)
    if rerun.error is not None and rerun.error.startswith("AddressChangedError"):
        return "an address baked at capture: " + rerun.error.split(": ", 1)[1].split(" replaced")[0] + " replaced"
    if case.batch != "uniform_decode" and padding[False]:
        return f"a padded row written: padding tokens (PAD_SLOT_ID) change {', '.join(padding[False])}"
    if case.batch != "uniform_decode" and padding[True]:
        return f"a padded request read as real: a request with no token changes {', '.join(padding[True])}"
    return "a Python value frozen at capture (metadata present, addresses kept, no padded write)"


@torch.inference_mode()
def padding_changes(config: ToyConfig, device: str = "cpu", *, pad_requests: bool = False) -> list[str]:
    """The caches that one eager step of a 3-token request leaves different when its batch is padded as a
    graph pads it: 2 more token rows (``PAD_SLOT_ID``), and with ``pad_requests`` a request with no token
    (FULL's padding). Any is a padded row written, or a padded request read as real."""
    states = []
    for padded in (False, True):
        runner = ModelRunner(config, "none", device=device)
        runner.add_request("r")
        runner.reserve_blocks(runner.requests["r"], 3)
        batch, metadata = prepare_inputs(
            [runner.requests["r"]],
            [3],
            [3],
            [1, 2, 3],
            runner.input_buffers,
            runner.block_tables,
            runner.attn_groups,
            3 + 2 * padded,
            1 + (padded and pad_requests),
        )
        with set_forward_context(metadata, CUDAGraphMode.NONE):
            runner.forward_model(batch.input_ids, batch.positions)
        states.append(runner.state_tensors())
    tol = tolerance(config.dtype)  # padding changes matmul shapes: rounding is no write
    return [n for n, t in states[1].items() if exceeds((t.float() - states[0][n].float()).abs().max().item(), tol)]
