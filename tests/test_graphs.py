"""Semantics of graph capture, on the CPU simulator and (on a GPU machine) on real CUDA graphs."""

from __future__ import annotations

import contextlib
import io
import warnings

import pytest
import torch

from cglab.errors import CaptureError, ConfigError
from cglab.graphs import (
    SIMULATOR_LABEL,
    CapturedGraph,
    GraphBackend,
    eager_break_during_capture,
    get_backend,
    is_capturing,
)
from cglab.graphs.capture_driver import EagerStep, GraphSegment

NEEDS_GPU = "needs a CUDA GPU (runs on the GPU machine)"


@pytest.fixture(params=["sim", pytest.param("cuda", marks=pytest.mark.cuda)])
def backend(request: pytest.FixtureRequest) -> GraphBackend:
    if request.param == "cuda" and not torch.cuda.is_available():
        pytest.skip(NEEDS_GPU)
    return get_backend(request.param)


def _buf(backend: GraphBackend, *values: float, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype, device=backend.device)


def _capture(backend: GraphBackend, fn, **kw):  # type: ignore[no-untyped-def]
    """Warm up (as engines do) then capture."""
    with backend.warmup_context():
        fn()
    backend.synchronize()
    graph, out = backend.capture(fn, **kw)
    backend.synchronize()
    return graph, out


# -- replay and "capture launches nothing" ---------------------------------------------------


def test_replay_recomputes_from_updated_static_inputs(backend: GraphBackend) -> None:
    x = _buf(backend, 1.0, 2.0, 3.0)
    graph, y = _capture(backend, lambda: (x * 2 + 1).relu())
    for new in ([4.0, -5.0, 6.0], [0.5, 0.25, -1.0]):
        x.copy_(torch.tensor(new))
        graph.replay()
        backend.synchronize()
        assert torch.equal(y.cpu(), (torch.tensor(new) * 2 + 1).relu())


def test_capture_launches_nothing_and_replay_runs_once(backend: GraphBackend) -> None:
    counter = _buf(backend, 0.0)
    x = _buf(backend, 1.0, 2.0)

    def fn() -> torch.Tensor:
        counter.add_(1)
        return x + 1

    graph, y = backend.capture(fn)  # no warmup: the counter must count graph launches only
    backend.synchronize()
    assert counter.cpu().item() == 0.0  # the in-graph write did not happen at capture
    if backend.name == "sim":
        assert torch.isnan(y).all()  # the kernel "did not run": output is garbage until replay
    for n in (1, 2, 3):
        graph.replay()
        backend.synchronize()
        assert counter.cpu().item() == float(n)
    assert torch.equal(y.cpu(), torch.tensor([2.0, 3.0]))


def test_sim_poisons_integer_and_bool_outputs() -> None:
    backend = get_backend("sim")
    x = torch.tensor([1, 2, 3])
    graph, (i, b) = backend.capture(lambda: (x * 2, x > 1))
    assert (i == torch.iinfo(torch.int64).max).all() and not b.any()
    graph.replay()
    assert torch.equal(i, torch.tensor([2, 4, 6])) and torch.equal(b, torch.tensor([False, True, True]))


def test_sim_rollback_restores_views_and_in_graph_buffers() -> None:
    backend = get_backend("sim")
    cache = torch.arange(6.0).reshape(2, 3)
    src = torch.ones(3)

    def fn() -> torch.Tensor:
        cache[1].copy_(src)  # a write through a view, as a KV-cache write is
        scratch = torch.empty(3)
        scratch.copy_(cache[1] * 2)  # writes into memory born in the segment
        return scratch

    graph, out = backend.capture(fn)
    assert torch.equal(cache, torch.arange(6.0).reshape(2, 3))
    assert torch.isnan(out).all()
    graph.replay()
    assert torch.equal(cache[1], src) and torch.equal(out, src * 2)


def test_a_buffer_written_twice_during_capture_gets_its_value_from_before(backend: GraphBackend) -> None:
    """Capture launches nothing: after it, a buffer written twice holds what it held before, not its
    first write (notebook 01's lesson); replay then writes both, in order."""
    buf = _buf(backend, 5.0, 5.0)
    x = _buf(backend, 1.0, 2.0)

    def fn() -> None:
        buf.copy_(x + 1)
        buf.mul_(10)

    graph, _ = backend.capture(fn)
    backend.synchronize()
    assert torch.equal(buf.cpu(), torch.tensor([5.0, 5.0]))
    graph.replay()
    backend.synchronize()
    assert torch.equal(buf.cpu(), torch.tensor([20.0, 30.0]))


# -- Python does not run at replay --------------------------------------------------------------


def test_python_is_frozen_at_capture(backend: GraphBackend) -> None:
    x = _buf(backend, 1.0, 2.0)
    state = {"calls": 0, "negate": False}

    def fn() -> torch.Tensor:
        state["calls"] += 1
        print("traced")  # printing a *string* is fine; it happens once
        scale = 10.0 if state["negate"] else 3.0  # a Python branch and scalar
        return x * scale

    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        graph, y = backend.capture(fn)
        state["negate"] = True
        for _ in range(3):
            graph.replay()
    backend.synchronize()
    assert state["calls"] == 1
    assert stdout.getvalue() == "traced\n"
    assert torch.equal(y.cpu(), torch.tensor([3.0, 6.0]))  # the branch taken at capture


# -- host syncs ----------------------------------------------------------------------------------


def _print_tensor(t: torch.Tensor) -> None:
    print(t)


HOST_SYNCS = {
    "item": lambda x: x.sum().item(),
    "bool": lambda x: bool(x.sum() > 0),
    "nonzero": lambda x: torch.nonzero(x),
    "print": _print_tensor,
    "bool_mask_index": lambda x: x[x > 0],
    "tolist": lambda x: x.tolist(),
    "unique": lambda x: torch.unique(x),
    "repeat_interleave": lambda x: torch.repeat_interleave(x.long().abs()),
}


@pytest.mark.parametrize("kind", list(HOST_SYNCS))
def test_host_sync_raises_and_backend_stays_usable(backend: GraphBackend, kind: str) -> None:
    x = _buf(backend, 1.0, -2.0, 3.0)
    counter = _buf(backend, 0.0)

    def bad() -> None:
        counter.add_(1)
        HOST_SYNCS[kind](x)

    with contextlib.redirect_stdout(io.StringIO()), pytest.raises(CaptureError) as err:
        backend.capture(bad)
    assert str(err.value).startswith("host sync during graph capture")
    assert not is_capturing()
    backend.synchronize()
    assert counter.cpu().item() == 0.0  # the abandoned capture left no trace
    print(x)  # printing works again outside capture
    graph, y = backend.capture(lambda: x + 1)
    graph.replay()
    backend.synchronize()
    assert torch.equal(y.cpu(), torch.tensor([2.0, -1.0, 4.0]))


SCALAR_READS = {
    "item": lambda x: x.sum().item(),
    "float": lambda x: float(x.sum()),
    "int": lambda x: int(x.sum()),
    "index": lambda x: list(range(x.long().sum())),
}


@pytest.mark.parametrize("kind", list(SCALAR_READS))
def test_scalar_reads_raise_under_inference_mode(backend: GraphBackend, kind: str) -> None:
    # Engines capture in inference mode, where these reads skip the dispatcher (no aten op to see).
    x = _buf(backend, 1.0, 2.0)
    with torch.inference_mode(), pytest.raises(CaptureError, match="^host sync during graph capture"):
        backend.capture(lambda: SCALAR_READS[kind](x))
    assert not is_capturing()


def test_masked_scalar_assignment_is_not_a_sync(backend: GraphBackend) -> None:
    x = _buf(backend, 1.0, -2.0, 3.0)

    def fn() -> torch.Tensor:
        y = x.clone()
        y[y < 0] = 0.0  # torch turns this into masked_fill_: no host sync
        return y

    graph, y = backend.capture(fn)
    graph.replay()
    backend.synchronize()
    assert torch.equal(y.cpu(), torch.tensor([1.0, 0.0, 3.0]))


@pytest.mark.cuda
def test_torch_capture_error_becomes_capture_error() -> None:
    if not torch.cuda.is_available():
        pytest.skip(NEEDS_GPU)
    backend = get_backend("cuda")
    x = _buf(backend, 1.0)
    with pytest.raises(CaptureError) as err:
        backend.capture(lambda: (x + 1, torch.cuda.synchronize()))  # no aten op: CUDA itself refuses
    assert isinstance(err.value.__cause__, RuntimeError)
    graph, y = backend.capture(lambda: x * 5)
    graph.replay()
    backend.synchronize()
    assert y.cpu().item() == 5.0


# -- static addresses --------------------------------------------------------------------------


def test_rebinding_a_name_does_not_feed_the_graph_but_copy_does(backend: GraphBackend) -> None:
    x = _buf(backend, 1.0, 2.0)
    captured_x = x
    graph, y = backend.capture(lambda: captured_x + 1)
    captured_x = _buf(backend, 100.0, 200.0)  # rebinding: the graph still reads the old storage
    graph.replay()
    backend.synchronize()
    assert torch.equal(y.cpu(), torch.tensor([2.0, 3.0]))
    x.copy_(torch.tensor([100.0, 200.0]))  # writing into the captured storage
    graph.replay()
    backend.synchronize()
    assert torch.equal(y.cpu(), torch.tensor([101.0, 201.0]))


# -- breakable (PIECEWISE) and FULL capture ----------------------------------------------------

_LIVE = {"scale": 2.0}


@eager_break_during_capture
def scaled_copy(src: torch.Tensor, dst: torch.Tensor) -> None:
    """Stands in for attention: reads live Python state, writes into a caller buffer."""
    assert not is_capturing()  # in PIECEWISE mode this really runs, outside any graph
    dst.copy_(src * _LIVE["scale"])


@eager_break_during_capture
def _inside_full(src: torch.Tensor, dst: torch.Tensor) -> None:
    _SEEN.append(is_capturing())
    dst.copy_(src * _LIVE["scale"])


_SEEN: list[bool] = []


def _layer(x: torch.Tensor, mid: torch.Tensor, eager) -> torch.Tensor:  # type: ignore[no-untyped-def]
    h = x + 1
    eager(h, mid)
    return mid * 3 + h


def test_breakable_capture_splits_and_eager_step_sees_live_state(backend: GraphBackend) -> None:
    x, mid = _buf(backend, 1.0, 2.0), _buf(backend, 0.0, 0.0)
    _LIVE["scale"] = 2.0
    graph, out = _capture(backend, lambda: _layer(x, mid, scaled_copy), breakable=True)
    kinds = [type(s) for s in graph.steps]
    assert isinstance(graph.steps[0], GraphSegment) and isinstance(graph.steps[2], GraphSegment)
    assert isinstance(graph.steps[1], EagerStep) and len(kinds) == 3
    assert (graph.num_segments, graph.num_eager_breaks) == (2, 1)
    assert graph.steps[1].name == "scaled_copy"

    x.copy_(torch.tensor([5.0, -1.0]))
    _LIVE["scale"] = 7.0  # changed after capture: the eager step reads it at replay
    graph.replay()
    backend.synchronize()
    h = torch.tensor([5.0, -1.0]) + 1
    assert torch.equal(mid.cpu(), h * 7.0)
    assert torch.equal(out.cpu(), h * 7.0 * 3 + h)


def test_eager_step_really_runs_during_capture(backend: GraphBackend) -> None:
    x, mid = _buf(backend, 1.0, 2.0), _buf(backend, 0.0, 0.0)
    _LIVE["scale"] = 2.0

    def fn() -> torch.Tensor:
        h = x * 1  # in the graph: not computed at capture
        scaled_copy(x, mid)  # eager: reads the real x, writes mid for real, not rolled back
        return h + mid

    graph, out = backend.capture(fn, breakable=True)
    backend.synchronize()
    assert torch.equal(mid.cpu(), torch.tensor([2.0, 4.0]))
    graph.replay()
    backend.synchronize()
    assert torch.equal(out.cpu(), torch.tensor([3.0, 6.0]))


def test_grad_mode_capture_leaves_autograd_alone(backend: GraphBackend) -> None:
    # Capture writes nothing and replay bumps no autograd version counter, as on a GPU: an
    # eager step reading a view of a graph output must not see "modified by an inplace op".
    w = torch.ones(4, device=backend.device, requires_grad=True)
    x, mid = _buf(backend, 1.0, 2.0, 3.0, 4.0), _buf(backend, 0.0, 0.0)

    @eager_break_during_capture
    def read_view(k: torch.Tensor, out: torch.Tensor) -> None:
        out.copy_((k * 1).detach())  # autograd checks k's base was not modified in place

    def fn() -> torch.Tensor:
        _, k = (x * w).chunk(2)
        read_view(k, mid)
        return mid + 1

    graph, out = backend.capture(fn, breakable=True)
    x.copy_(torch.tensor([5.0, 6.0, 7.0, 8.0]))
    graph.replay()
    backend.synchronize()
    assert torch.equal(out.cpu(), torch.tensor([8.0, 9.0]))


def test_graph_bakes_in_addresses_and_strides(backend: GraphBackend) -> None:
    x = torch.tensor([[1.0, 2.0], [3.0, 4.0]], device=backend.device)
    graph, y = _capture(backend, lambda: x * 10)
    x.t_()  # a metadata change after capture: the graph keeps the layout it was captured with
    graph.replay()
    backend.synchronize()
    assert torch.equal(y.cpu(), torch.tensor([[10.0, 20.0], [30.0, 40.0]]))


def test_full_capture_records_the_decorated_function(backend: GraphBackend) -> None:
    x, mid = _buf(backend, 1.0, 2.0), _buf(backend, 0.0, 0.0)
    _LIVE["scale"] = 2.0
    _SEEN.clear()
    graph, out = _capture(backend, lambda: _layer(x, mid, _inside_full))
    assert _SEEN == [False, True]  # warmup ran it eagerly; capture recorded it in the graph
    assert (graph.num_segments, graph.num_eager_breaks) == (1, 0)
    _LIVE["scale"] = 7.0  # frozen at capture in FULL mode
    graph.replay()
    backend.synchronize()
    h = torch.tensor([2.0, 3.0])
    assert torch.equal(out.cpu(), h * 2.0 * 3 + h)


def test_decorated_function_outside_capture_is_a_plain_call() -> None:
    src, dst = torch.ones(2), torch.zeros(2)
    _LIVE["scale"] = 4.0
    assert scaled_copy(src, dst) is None
    assert torch.equal(dst, torch.full((2,), 4.0))


def test_empty_segment_has_zero_ops_and_warns(backend: GraphBackend) -> None:
    x, mid = _buf(backend, 1.0), _buf(backend, 0.0)

    def fn() -> torch.Tensor:
        scaled_copy(x, mid)  # nothing before the break: segment 0 is empty
        return mid + 1

    with pytest.warns(UserWarning, match="empty"):
        graph, out = _capture(backend, fn, breakable=True)
    assert graph.ops_per_segment == [0, 1]
    _LIVE["scale"] = 3.0
    graph.replay()
    backend.synchronize()
    assert out.cpu().item() == 4.0


def test_no_warning_for_a_non_empty_segment(backend: GraphBackend) -> None:
    x = _buf(backend, 1.0)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*empty.*")
        backend.capture(lambda: x + 1)


def test_ops_per_segment_counts_work_not_views_or_allocations(backend: GraphBackend) -> None:
    x = _buf(backend, 1.0, 2.0, 3.0, 4.0)

    def fn() -> torch.Tensor:
        flat = x.view(2, 2).t()  # views: no work
        tmp = torch.empty(2, 2, device=x.device)  # bare allocation: no work
        tmp.copy_(flat)  # 1
        return tmp * 2  # 2

    graph, out = backend.capture(fn)
    assert graph.ops_per_segment == [2] and graph.num_ops == 2
    graph.replay()
    backend.synchronize()
    assert torch.equal(out.cpu(), torch.tensor([[2.0, 6.0], [4.0, 8.0]]))


def test_reset_frees_and_forbids_replay(backend: GraphBackend) -> None:
    x = _buf(backend, 1.0)
    graph, _ = backend.capture(lambda: x + 1)
    graph.reset()
    with pytest.raises(CaptureError, match="reset"):
        graph.replay()


def test_repr_names_the_backend(backend: GraphBackend) -> None:
    x = _buf(backend, 1.0)
    graph, _ = backend.capture(lambda: x + 1)
    assert isinstance(graph, CapturedGraph) and graph.label == backend.label
    assert repr(graph).endswith("ops per segment: [1])")
    assert (SIMULATOR_LABEL in repr(graph)) == (backend.name == "sim")


# -- grad modes ---------------------------------------------------------------------------------


@pytest.mark.parametrize("grad_mode", [torch.inference_mode, torch.no_grad])
def test_capture_and_replay_under_grad_modes(backend: GraphBackend, grad_mode) -> None:  # type: ignore[no-untyped-def]
    with grad_mode():
        x, counter = _buf(backend, 1.0, 2.0), _buf(backend, 0.0)

        def fn() -> torch.Tensor:
            counter.add_(1)
            return x * x

        graph, y = backend.capture(fn)
        x.copy_(torch.tensor([3.0, 4.0]))
        graph.replay()
    graph.replay()  # also outside the grad mode
    backend.synchronize()
    assert torch.equal(y.cpu(), torch.tensor([9.0, 16.0]))
    assert counter.cpu().item() == 2.0


def test_is_capturing_only_during_capture(backend: GraphBackend) -> None:
    seen: list[bool] = []
    x = _buf(backend, 1.0)
    backend.capture(lambda: (seen.append(is_capturing()), x + 1))
    assert seen == [True] and not is_capturing()


def test_nested_capture_is_refused(backend: GraphBackend) -> None:
    with pytest.raises(CaptureError, match="inside another capture"):
        backend.capture(lambda: backend.capture(lambda: None))
    assert not is_capturing()


# -- get_backend ---------------------------------------------------------------------------------


def test_get_backend_names() -> None:
    sim = get_backend("sim")
    assert sim.name == "sim" and sim.device == torch.device("cpu")
    assert get_backend("cuda" if torch.cuda.is_available() else "sim").name in ("cuda", "sim")


def test_cuda_without_gpu_points_to_sim() -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(ConfigError, match="sim"):
        get_backend("cuda")
