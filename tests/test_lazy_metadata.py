"""A lazily planned attention kernel under graphs: why capture needs fresh metadata, not the warmup's
(vLLM PR #42444, DeepSeek V4's FlashMLA scheduler metadata)."""

import contextlib
from collections import Counter

import pytest

from cglab import ModelRunner, ToyConfig
from cglab.compilation_config import CompilationConfig
from cglab.graphs.sim import SimSegment
from cglab.metadata import LazyPlanAttentionMetadataBuilder

CONFIG = ToyConfig(layers=("attn", "sconv", "attn"), max_num_reqs=4, max_model_len=32, num_blocks=32)
SIZES = (1, 2, 4)
# Block size 4: every sequence fits one key block at the first decode step (lengths 3, 4, 2) and at
# least one is longer at every later step, so a plan of one block per request is right only at first.
PROMPT_LENGTHS = (2, 3, 1)
DECODE_STEPS = 6
TOLERANCE = 1e-4  # float32 rounding (padding changes matmul shapes), not divergence
FLAVORS = ["compiled", "breakable"]


class WarmupMetadataRunner(ModelRunner):
    """Captures each graph with the very forward, and metadata, its warmup ran: the bug of #42444."""

    def __init__(self, *args, **kwargs):
        self.warmup_forwards = {}  # before ModelRunner.__init__, which captures
        super().__init__(*args, **kwargs)

    def create_forward_fn(self, desc, warmup):
        if warmup:
            self.warmup_forwards[desc] = super().create_forward_fn(desc, warmup)
            return self.warmup_forwards[desc]
        if desc in self.warmup_forwards:
            return self.warmup_forwards[desc]
        return super().create_forward_fn(desc, warmup)  # compiled PIECEWISE: one forward serves both runs


def lazy_runner(runner_class: type[ModelRunner], mode: str, device: str, flavor: str = "compiled") -> ModelRunner:
    return runner_class(
        CONFIG,
        CompilationConfig(mode, SIZES, use_breakable_cg=flavor == "breakable"),
        device=device,
        builders={"attn": LazyPlanAttentionMetadataBuilder(CONFIG)},
    )


def decode_differences(runner: ModelRunner, reference: ModelRunner) -> list[float]:
    """Prefill eagerly, then decode every request: the largest logit difference of each decode step."""
    for i, length in enumerate(PROMPT_LENGTHS):
        for r in (runner, reference):
            r.add_request(f"r{i}")
            r.step({f"r{i}": [(5 * i + j + 1) % CONFIG.vocab_size for j in range(length)]}, eager=True)
    differences = []
    for step in range(DECODE_STEPS):
        batch = {f"r{i}": [(3 * step + i) % CONFIG.vocab_size] for i in range(len(PROMPT_LENGTHS))}
        differences.append((runner.step(batch).logits - reference.step(batch).logits).abs().max().item())
    return differences


def recorded_op_names(runner: ModelRunner) -> dict[object, list[str]]:
    """The ops each FULL graph recorded, by descriptor (the simulator keeps them; a GPU does not)."""
    names = {}
    for desc, entry in runner.cudagraph_manager.graphs.items():
        assert all(isinstance(s, SimSegment) for s in entry.graph.steps)
        names[desc] = [str(record[1]).split(".")[1] for s in entry.graph.steps for record in s._records]
    return names


def only_in_first(first: list[str], second: list[str]) -> Counter[str]:
    """The ops ``first`` recorded beyond those ``second`` recorded, with their counts."""
    return Counter(first) - Counter(second)


@pytest.mark.parametrize("flavor", FLAVORS)
def test_full_graphs_with_a_lazy_plan_match_eager(device, flavor, replays):
    """Fresh metadata for capture: the graph plans at every replay, from the live sequence lengths."""
    runner = lazy_runner(ModelRunner, "full", device, flavor)
    differences = decode_differences(runner, ModelRunner(CONFIG, "none", device=device))
    assert max(differences) < TOLERANCE, differences
    assert replays == {"full": DECODE_STEPS}  # every decode step replayed a FULL graph


@pytest.mark.parametrize("flavor", FLAVORS)
def test_capture_with_the_warmups_metadata_diverges_under_full(device, flavor, replays):
    """The warmup planned for the dummy batch (one block per request); the capture found the plan
    ready and recorded no planning; every replay reads one key block per request, and nothing raises."""
    runner = lazy_runner(WarmupMetadataRunner, "full", device, flavor)
    differences = decode_differences(runner, ModelRunner(CONFIG, "none", device=device))
    assert replays == {"full": DECODE_STEPS}
    assert differences[0] < TOLERANCE  # every sequence still fits the stale plan's one block
    assert min(differences[1:]) > 0.05, differences  # not rounding: the keys past the first block are gone


@pytest.mark.parametrize("flavor", FLAVORS)
def test_piecewise_is_unaffected_by_the_warmups_metadata(device, flavor, replays):
    """Attention runs eagerly at every PIECEWISE step, with that step's fresh metadata, so it plans
    every step whatever the capture saw."""
    runner = lazy_runner(WarmupMetadataRunner, "piecewise", device, flavor)
    differences = decode_differences(runner, ModelRunner(CONFIG, "none", device=device))
    assert max(differences) < TOLERANCE, differences
    assert replays == {"piecewise": DECODE_STEPS}


def test_full_graph_records_the_planning_ops(device):
    """With fresh metadata every FULL graph holds the planning ops; captured with the warmup's it
    holds none of them (and the plan's reads, which both have)."""
    fresh = lazy_runner(ModelRunner, "full", device).cudagraph_manager.graphs
    reused = lazy_runner(WarmupMetadataRunner, "full", device).cudagraph_manager.graphs
    assert fresh.keys() == reused.keys() and len(fresh) == len(SIZES)
    planning_ops = 2  # one add and one div: the group's first attention layer plans, the other reuses it
    for desc in fresh:
        assert fresh[desc].graph.num_ops - reused[desc].graph.num_ops == planning_ops, desc


def test_the_planning_ops_by_name():
    """On the simulator the recorded ops have names: the fresh capture's extra ops are the plan."""
    fresh = recorded_op_names(lazy_runner(ModelRunner, "full", "cpu"))
    reused = recorded_op_names(lazy_runner(WarmupMetadataRunner, "full", "cpu"))
    plain = recorded_op_names(ModelRunner(CONFIG, CompilationConfig("full", SIZES), device="cpu"))
    for desc in fresh:
        assert only_in_first(fresh[desc], reused[desc]) == Counter(["add", "div"])
        assert not only_in_first(reused[desc], fresh[desc])
        # Every attention layer reads the plan, in both; the ordinary builder's graph has no plan at all.
        assert not only_in_first(plain[desc], reused[desc])
        assert only_in_first(reused[desc], plain[desc]) == Counter(["index", "mul", "lt", "__and__"] * 2)


class ProcedureRunner(ModelRunner):
    """Logs what capture does, in order: each forward made for a descriptor, and each run of one, with
    its mode and whether it ran inside the backend's warmup context (on CUDA: the capture stream)."""

    def __init__(self, *args, **kwargs):
        self.log = []  # before ModelRunner.__init__, which captures
        super().__init__(*args, **kwargs)

    def profile_run(self):  # the last thing before capture
        super().profile_run()
        self._spy_on_warmups(self.graph_backend)

    def create_forward_fn(self, desc, warmup):
        forward = super().create_forward_fn(desc, warmup)
        self.log.append((str(desc), "warmup forward" if warmup else "forward"))
        run = forward.run

        def logged(cg_mode):
            self.log.append((str(desc), f"run {cg_mode.name}" + (" (warmup context)" if self._warm else "")))
            return run(cg_mode)

        forward.run = logged
        return forward

    def _spy_on_warmups(self, backend):
        self._warm, original = False, backend.warmup_context

        @contextlib.contextmanager
        def warmup_context():
            with original():
                self._warm = True
                try:
                    yield
                finally:
                    self._warm = False

        backend.warmup_context = warmup_context


def _procedure(desc, *steps):
    return [(desc, step) for step in steps]


def test_every_graph_is_captured_after_one_eager_warmup(device):
    """vLLM's procedure, per graph: an eager warmup on the dummy batch inside the warmup context, then
    the capture. FULL graphs (and breakable PIECEWISE) get fresh metadata for the capture, not the
    warmup's (see the tests above); a compiled PIECEWISE graph runs one forward twice, as in vLLM.
    A FULL graph records the forward run in mode NONE (the piece wrappers step aside); a PIECEWISE
    capture runs it in mode PIECEWISE, and the wrappers capture.

    On the simulator a skipped warmup changes no value: nothing in the toy initialises lazily per
    size, and the profiling run compiled the model already. The warmup is there for a GPU, where
    first uses (cuBLAS on the capture stream, a kernel's first launch) must happen outside capture.
    So this test checks the procedure itself.
    """
    config = ToyConfig(layers=("sconv", "attn"), max_num_reqs=2)
    compiled = ProcedureRunner(config, CompilationConfig("full_and_piecewise", (1, 2)), device=device).log
    pw, full = "PIECEWISE(tokens={}, reqs=any)", "FULL(tokens={0}, reqs={0}, uniform=1)"
    compiled_pw = ("forward", "run NONE (warmup context)", "run PIECEWISE")
    full_steps = ("warmup forward", "run NONE (warmup context)", "forward", "run NONE")
    assert compiled == [
        *_procedure(pw.format(2), *compiled_pw),
        *_procedure(pw.format(1), *compiled_pw),
        *_procedure(full.format(2), *full_steps),
        *_procedure(full.format(1), *full_steps),
    ]
    breakable = ProcedureRunner(
        config, CompilationConfig("piecewise", (1, 2), use_breakable_cg=True), device=device
    ).log
    breakable_pw = ("warmup forward", "run NONE (warmup context)", "forward", "run PIECEWISE")
    assert breakable == [*_procedure(pw.format(2), *breakable_pw), *_procedure(pw.format(1), *breakable_pw)]
