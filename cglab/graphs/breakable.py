"""The backend-agnostic capture driver, the captured-graph container and the aten op rules.

A capture is a list of *steps*: graph segments (recorded work, replayed as a unit) and eager
steps (Python functions re-run at replay). FULL mode makes one segment; PIECEWISE mode
(``breakable=True``) ends a segment at every call of an ``eager_break_during_capture``
function, runs it eagerly and starts a new segment, as vLLM does around attention.
Backends (sim, cuda) only say how to open and close one segment; everything else lives here
so both backends obey the same rules.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from cglab.errors import CaptureError

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])

# The capture in progress in this thread/context, or None. A ContextVar (not a global) so two
# threads or asyncio tasks never see each other's capture.
_CURRENT: ContextVar[_ActiveCapture | None] = ContextVar("cglab_graph_capture", default=None)


def is_capturing() -> bool:
    """True while a graph segment is being recorded in this context.

    False inside an eager step of a breakable capture: like a GPU, that code really runs.
    """
    return _CURRENT.get() is not None


# --------------------------------------------------------------------------------------------
# Steps and the captured graph
# --------------------------------------------------------------------------------------------


class GraphSegment(ABC):
    """One recorded stretch of work; replaying it redoes all of it against the same memory."""

    def __init__(self, index: int, num_ops: int) -> None:
        self.index = index
        self.num_ops = num_ops

    @abstractmethod
    def replay(self) -> None:
        """Redo the recorded work (reads and writes the storage seen at capture)."""

    @abstractmethod
    def reset(self) -> None:
        """Drop the recording so its memory can be freed; replay is impossible afterwards."""

    def describe(self) -> str:
        empty = " (empty graph)" if self.num_ops == 0 else ""
        return f"segment {self.index}: {self.num_ops} ops{empty}"


class EagerStep:
    """A function re-run for real at every replay, between two graph segments.

    It keeps the very argument objects of the capture-time call, so it sees whatever those
    buffers (and any Python state it reads) hold at replay time.
    """

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.fn = fn
        self.args = args
        self.kwargs = kwargs
        self.name = getattr(fn, "__name__", repr(fn))
        self._dropped = False

    def replay(self) -> None:
        if self._dropped:
            raise CaptureError(f"eager step {self.name!r} was reset; capture the graph again")
        self.fn(*self.args, **self.kwargs)

    def reset(self) -> None:
        # Dropping the arguments lets the buffers they reference be freed.
        self.args, self.kwargs, self._dropped = (), {}, True

    def describe(self) -> str:
        return f"eager: {self.name}"


Step = GraphSegment | EagerStep


class CapturedGraph:
    """The result of a capture: ordered steps, replayed by one loop.

    ``replay()`` redoes the captured work; the static output that ``capture`` returned is
    rewritten in place each time. Python code of the captured function does not run again,
    except inside eager steps.
    """

    def __init__(self, backend_name: str, steps: list[Step], label: str) -> None:
        self.backend_name = backend_name
        self.steps = steps
        self.label = label
        self._is_reset = False

    def replay(self) -> None:
        if self._is_reset:
            raise CaptureError("this graph was reset (its memory freed); capture it again to replay")
        for step in self.steps:
            step.replay()

    def reset(self) -> None:
        """Drop every recording / CUDA graph so their memory can be freed."""
        for step in self.steps:
            step.reset()
        self._is_reset = True

    @property
    def num_segments(self) -> int:
        return sum(isinstance(s, GraphSegment) for s in self.steps)

    @property
    def num_eager_breaks(self) -> int:
        return sum(isinstance(s, EagerStep) for s in self.steps)

    @property
    def ops_per_segment(self) -> list[int]:
        """Ops that do work at replay (kernels on a GPU) per segment: views, aliases and bare
        allocations are not counted, so the figure is the same on every backend."""
        return [s.num_ops for s in self.steps if isinstance(s, GraphSegment)]

    @property
    def num_ops(self) -> int:
        return sum(self.ops_per_segment)

    def describe(self) -> str:
        head = (
            f"{self.label}: {self.num_segments} graph segment(s), "
            f"{self.num_eager_breaks} eager break(s), {self.num_ops} ops"
        )
        if self._is_reset:
            head += " [reset]"
        return "\n".join([head, *(step.describe() for step in self.steps)])

    def __repr__(self) -> str:
        return (
            f"CapturedGraph(backend={self.backend_name!r}, segments={self.num_segments}, "
            f"eager_breaks={self.num_eager_breaks}, ops={self.ops_per_segment})"
        )


# --------------------------------------------------------------------------------------------
# The eager-break decorator
# --------------------------------------------------------------------------------------------


def eager_break_during_capture(fn: F) -> F:
    """Mark ``fn`` as a place where a breakable (PIECEWISE) capture splits the graph.

    Contract: ``fn`` must write its results into caller-provided tensors and return None (or
    a value the caller ignores). Reason: at replay ``fn`` is re-run with the capture-time
    arguments and only those caller buffers persist; a returned tensor would be the stale
    object from capture time.

    Outside a breakable capture (eager code, or a FULL capture) it is a plain call, so in FULL
    mode its ops are captured into the single segment like any other code.
    """

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        capture = _CURRENT.get()
        if capture is None or not capture.breakable:
            return fn(*args, **kwargs)
        return capture.run_eager(fn, args, kwargs)

    return wrapper  # type: ignore[return-value]


# --------------------------------------------------------------------------------------------
# Aten op rules shared by both backends
# --------------------------------------------------------------------------------------------

# Allocation-only ops: no kernel runs, so at replay there is nothing to do (the memory simply
# holds whatever it holds, as uninitialised memory does).
_ALLOC_OPS = frozenset(
    {"empty", "empty_like", "empty_strided", "empty_permuted", "new_empty", "new_empty_strided"}
)
# Ops that write only bookkeeping, never tensor bytes.
_BOOKKEEPING_OPS = frozenset({"record_stream"})


@dataclass(frozen=True, slots=True)
class _OpInfo:
    """What an aten op does to memory, read once from its schema (cached per overload)."""

    name: str
    alloc: bool
    writes: tuple[tuple[int, str], ...]  # (position, name) of the arguments it writes
    fresh: tuple[int, ...]  # indices of returns that are new tensors (no alias annotation)
    num_returns: int


_OP_INFO: dict[Any, _OpInfo] = {}


def _op_info(func: Any) -> _OpInfo:
    info = _OP_INFO.get(func)
    if info is None:
        info = _OP_INFO[func] = _classify(func)
    return info


def _classify(func: Any) -> _OpInfo:
    schema = func._schema
    name = func.overloadpacket.__name__
    alloc = name in _ALLOC_OPS
    # In-place *view* ops (t_, unsqueeze_, set_, resize_) change only the Python tensor's
    # metadata, which is already in place after capture: re-running them would apply it twice.
    metadata_only = torch.Tag.inplace_view in func.tags or name in _BOOKKEEPING_OPS
    writes: tuple[tuple[int, str], ...] = ()
    fresh: tuple[int, ...] = ()
    if not (alloc or metadata_only):
        writes = tuple(
            (i, a.name)
            for i, a in enumerate(schema.arguments)
            if a.alias_info is not None and a.alias_info.is_write
        )
        fresh = tuple(i for i, r in enumerate(schema.returns) if r.alias_info is None)
    return _OpInfo(name, alloc, writes, fresh, len(schema.returns))


def _tensors_in(value: Any) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            if isinstance(item, torch.Tensor):
                yield item


def _written_tensors(info: _OpInfo, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Iterator[torch.Tensor]:
    for pos, name in info.writes:
        value = args[pos] if pos < len(args) else kwargs.get(name)
        yield from _tensors_in(value)


def _storage_ptr(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def _input_storages(args: tuple[Any, ...], kwargs: dict[str, Any]) -> set[int]:
    ptrs = {_storage_ptr(t) for a in args for t in _tensors_in(a)}
    ptrs.update(_storage_ptr(t) for v in kwargs.values() for t in _tensors_in(v))
    return ptrs


def _fresh_outputs(
    info: _OpInfo, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any
) -> list[tuple[int, int, torch.Tensor]]:
    """The new tensors an op returned, as (return index, list index or -1, tensor).

    A return without alias annotation can still share its input's memory (``_unsafe_view``
    does): such outputs are views in fact, so they are left out by comparing storages.
    """
    if not info.fresh:
        return []
    items = (out,) if info.num_returns == 1 else out
    found: list[tuple[int, int, torch.Tensor]] = []
    for i in info.fresh:
        value = items[i]
        if isinstance(value, torch.Tensor):
            found.append((i, -1, value))
        elif isinstance(value, (list, tuple)):
            found.extend((i, j, v) for j, v in enumerate(value) if isinstance(v, torch.Tensor))
    if not found:
        return found
    inputs = _input_storages(args, kwargs)
    inputs.discard(0)  # zero-size storages have no address to share
    return [f for f in found if _storage_ptr(f[2]) not in inputs]


def _does_work(info: _OpInfo, fresh: list[tuple[int, int, torch.Tensor]]) -> bool:
    """Whether the op is counted in ``ops_per_segment``: it writes memory or makes new data."""
    return bool(info.writes) or bool(fresh)


# -- host syncs --------------------------------------------------------------------------------

_FIX_SCALAR = (
    "`.item()` / `bool(tensor)` / printing a tensor needs the value on the host, which a CUDA "
    "graph cannot do during capture; keep values on the device (use torch.where / masking) "
    "or compute them before capture"
)
_FIX_SHAPE = (
    "its output shape depends on tensor values, so the host must read them back from the device, which a CUDA "
    "graph cannot do during capture; use fixed-shape ops (torch.where, multiply by a mask, pass output_size=) "
    "or compute it before capture"
)
_FIX_COPY = (
    "copying between host and device makes the host wait, which a CUDA graph cannot do during "
    "capture; copy inputs into static device buffers before replay and read outputs after it"
)
_SCALAR_SYNC_OPS = frozenset({"_local_scalar_dense", "is_nonzero", "equal", "allclose"})
_SHAPE_SYNC_OPS = frozenset(
    {
        "nonzero", "nonzero_numpy", "argwhere", "masked_select", "bincount",
        "unique", "_unique", "_unique2", "unique_dim", "unique_consecutive", "unique_dim_consecutive",
    }
)
_COPY_OPS = frozenset({"_to_copy", "copy_", "_copy_from", "_copy_from_and_resize"})


def _host_sync_error(what: str, fix: str) -> CaptureError:
    return CaptureError(f"host sync during graph capture ({what}): {fix}")


def _is_mask(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and t.dtype in (torch.bool, torch.uint8)


def _check_host_sync(info: _OpInfo, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Raise CaptureError, before the op runs, if it would make the host wait for the device."""
    name = info.name
    if name in _SCALAR_SYNC_OPS:
        raise _host_sync_error(f"aten.{name}", _FIX_SCALAR)
    if name in _SHAPE_SYNC_OPS:
        raise _host_sync_error(f"aten.{name}", _FIX_SHAPE)
    if name == "repeat_interleave" and kwargs.get("output_size") is None:
        raise _host_sync_error("repeat_interleave without output_size", _FIX_SHAPE)
    if name == "index" and any(_is_mask(i) for i in args[1]):
        raise _host_sync_error("indexing with a boolean mask", _FIX_SHAPE)
    if name in ("index_put", "index_put_", "_index_put_impl_") and _mask_put_syncs(args, kwargs):
        raise _host_sync_error("assigning through a boolean mask", _FIX_SHAPE)
    if name in _COPY_OPS:
        _check_copy(name, args, kwargs)


def _mask_put_syncs(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    indices = [i for i in args[1] if i is not None]
    if not any(_is_mask(i) for i in indices):
        return False
    # torch turns `x[mask] = scalar` into masked_fill_ (no sync); any other mask put needs
    # nonzero() on the device first.
    values = args[2]
    accumulate = args[3] if len(args) > 3 else kwargs.get("accumulate", False)
    scalar_fill = (
        len(indices) == 1
        and indices[0].device == args[0].device
        and values.numel() == 1
        and values.device.type == "cpu"
    )
    return bool(accumulate) or not scalar_fill


def _check_copy(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    # 0-dim CPU tensors are Python scalars in disguise (torch passes them by value): skip them.
    devices = {t.device for a in args for t in _tensors_in(a) if not (t.device.type == "cpu" and t.dim() == 0)}
    target = kwargs.get("device")
    if target is not None:
        devices.add(torch.device(target))
    kinds = {d.type for d in devices}
    if "cpu" in kinds and len(kinds - {"cpu", "meta"}) > 0:
        src, dst = sorted(str(d) for d in devices)[:2]
        raise _host_sync_error(f"aten.{name} between {src} and {dst}", _FIX_COPY)


# -- host reads that bypass the dispatcher -------------------------------------------------------

# Printing (torch disables dispatch modes while formatting), tolist() and numpy() read tensor
# memory directly from Python, so no dispatch mode sees them; under inference mode neither does
# item() nor float()/int()/operator.index() on a tensor (engines capture in inference mode). They
# are guarded by patching these Tensor methods for as long as any capture is running; the guard
# only bites in a context whose capture is recording, so other threads print normally.
_GUARDED_METHODS = {
    "__repr__": "printing a tensor",
    "tolist": "Tensor.tolist()",
    "numpy": "Tensor.numpy()",
    "item": "Tensor.item()",
    "__float__": "float(tensor)",
    "__int__": "int(tensor)",
    "__index__": "using a tensor as an index or size",
}
_guard_lock = threading.Lock()
_guard_users = 0
_guard_saved: dict[str, Any] = {}


def _guarded(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
    what = _GUARDED_METHODS[name]

    @functools.wraps(original)
    def guard(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if _CURRENT.get() is not None:
            raise _host_sync_error(what, _FIX_SCALAR)
        return original(self, *args, **kwargs)

    return guard


@contextlib.contextmanager
def _host_read_guard() -> Iterator[None]:
    global _guard_users
    with _guard_lock:
        if _guard_users == 0:
            for name in _GUARDED_METHODS:
                _guard_saved[name] = torch.Tensor.__dict__.get(name)
                setattr(torch.Tensor, name, _guarded(name, getattr(torch.Tensor, name)))
        _guard_users += 1
    try:
        yield
    finally:
        with _guard_lock:
            _guard_users -= 1
            if _guard_users == 0:
                for name in _GUARDED_METHODS:
                    saved = _guard_saved.pop(name)
                    if saved is None:
                        delattr(torch.Tensor, name)  # it was inherited from TensorBase
                    else:
                        setattr(torch.Tensor, name, saved)


# --------------------------------------------------------------------------------------------
# The driver
# --------------------------------------------------------------------------------------------


class OpCounter(TorchDispatchMode):
    """Counts the aten ops that do work (write memory or make new data: a kernel each on a GPU)
    while ``active``. Views and bare allocations launch nothing and are not counted. One rule for
    every backend, so "ops per segment" and "launches per step" mean the same everywhere.

    ``check_host_syncs=True`` also stops host syncs before CUDA sees them: an error raised here
    leaves a CUDA capture valid, so it can be closed cleanly.
    """

    def __init__(self, check_host_syncs: bool = False, active: bool = True) -> None:
        super().__init__()
        self.check_host_syncs = check_host_syncs
        self.active = active
        self.count = 0

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        kwargs = kwargs or {}
        if not self.active:
            return func(*args, **kwargs)
        info = _op_info(func)
        if self.check_host_syncs:
            _check_host_sync(info, args, kwargs)
        out = func(*args, **kwargs)
        if not info.alloc and _does_work(info, _fresh_outputs(info, args, kwargs, out)):
            self.count += 1
        return out


class CaptureSession(ABC):
    """What a backend supplies for one capture: a scope and how to open/close a segment.

    Entered once around the whole capture. Between ``finish_segment`` and the next
    ``start_segment`` (an eager step) nothing may be recorded.
    """

    def __enter__(self) -> CaptureSession:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    @abstractmethod
    def start_segment(self, index: int) -> None: ...

    @abstractmethod
    def finish_segment(self) -> GraphSegment: ...

    @abstractmethod
    def abandon_segment(self) -> None:
        """Undo/close the open segment after an error; a no-op if none is open."""

    def translate(self, exc: BaseException) -> BaseException | None:
        """A CaptureError for a backend's own capture-rule error, or None to re-raise as is."""
        return None


class _ActiveCapture:
    """State of one running capture: its session, whether it is breakable, the steps so far."""

    def __init__(self, session: CaptureSession, breakable: bool) -> None:
        self.session = session
        self.breakable = breakable
        self.steps: list[Step] = []
        self.segments = 0

    def start(self) -> None:
        self.session.start_segment(self.segments)
        self.segments += 1

    def finish(self) -> None:
        self.steps.append(self.session.finish_segment())

    def run_eager(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        self.finish()
        # Nested decorated calls inside fn are plain calls, and host reads are allowed: this
        # code really runs, outside any graph.
        token = _CURRENT.set(None)
        try:
            result = fn(*args, **kwargs)
        finally:
            _CURRENT.reset(token)
        self.steps.append(EagerStep(fn, args, kwargs))
        self.start()
        return result


class GraphBackend(ABC):
    """A way to capture and replay graphs: ``SimBackend`` (any device) or ``CudaBackend``.

    All graphs captured by one backend object share one memory pool.
    """

    name: str
    device: torch.device
    label: str

    def warmup_context(self) -> contextlib.AbstractContextManager[Any]:
        """Where warmup runs must happen (the capture stream on CUDA)."""
        return contextlib.nullcontext()

    def synchronize(self) -> None:
        """Wait for queued device work (for timing)."""

    @abstractmethod
    def _session(self) -> CaptureSession: ...

    def capture(self, fn: Callable[[], T], *, breakable: bool = False) -> tuple[CapturedGraph, T]:
        """Run ``fn`` once under capture; return the graph and fn's result (the static output).

        ``breakable=False``: one segment (FULL). ``breakable=True``: every call of an
        ``eager_break_during_capture`` function ends the segment, runs eagerly and becomes an
        ``EagerStep`` (PIECEWISE). On error nothing stays half-captured: the open segment is
        rolled back/closed, steps are reset and the backend can capture again.
        """
        if _CURRENT.get() is not None:
            raise CaptureError("capture() was called inside another capture; capture graphs one at a time")
        session = self._session()
        capture = _ActiveCapture(session, breakable)
        token = _CURRENT.set(capture)
        try:
            with _host_read_guard(), session:
                try:
                    capture.start()
                    out = fn()
                    capture.finish()
                except BaseException as exc:
                    session.abandon_segment()
                    for step in capture.steps:
                        step.reset()
                    translated = session.translate(exc)
                    if translated is not None and translated is not exc:
                        raise translated from exc
                    raise
        finally:
            _CURRENT.reset(token)
        return CapturedGraph(self.name, capture.steps, self.label), out

    def __repr__(self) -> str:
        return f"{type(self).__name__}(device={str(self.device)!r})"
