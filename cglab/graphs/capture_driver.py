"""The backend-agnostic capture driver and the captured-graph container.

A capture is a list of *steps*: graph segments (recorded work, replayed as a unit) and eager
steps (Python functions re-run at replay). FULL mode makes one segment; PIECEWISE mode
(``breakable=True``) ends a segment at every call of an ``eager_break_during_capture``
function, runs it eagerly and starts a new segment, as vLLM does around attention.
Backends (sim, cuda) only say how to open and close one segment; everything else lives here,
and the aten op rules both obey live in ``ops``.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import Any, TypeVar

import torch

from cglab.errors import CaptureError
from cglab.graphs.ops import _FIX_SCALAR, _host_sync_error

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

    def synchronize(self) -> None:  # noqa: B027 - nothing to wait for unless a backend queues work
        """Wait for queued device work (for timing)."""

    def memory_in_use(self) -> int | None:
        """Bytes in use where this backend's graphs keep their memory, or None if it cannot tell."""
        return None

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
