"""The capture driver shared by both backends, and the captured graph: a list of graph segments
(recorded work) and eager steps (functions re-run at replay). A breakable capture ends a segment at every
``eager_break_during_capture`` call, as vLLM does around attention. A backend supplies its ``CaptureSession``.
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
from cglab.graphs.ops import _FIX_SCALAR, OpCounter, _host_sync_error

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])

# The capture in progress in this thread/context, or None. A ContextVar (not a global) so two
# threads or asyncio tasks never see each other's capture.
_CURRENT: ContextVar[CaptureSession | None] = ContextVar("cglab_graph_capture", default=None)


def is_capturing() -> bool:
    """True while a graph segment records in this context; False inside an eager step, which really runs."""
    return _CURRENT.get() is not None


class GraphSegment(ABC):
    """One recorded stretch of work; replaying it redoes all of it against the memory seen at capture."""

    def __init__(self, num_ops: int) -> None:
        self.num_ops = num_ops

    @abstractmethod
    def replay(self) -> None: ...

    @abstractmethod
    def reset(self) -> None:
        """Drop the recording so its memory can be freed."""


class EagerStep:
    """A function re-run for real at every replay, between two segments, with the capture-time arguments."""

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.fn, self.args, self.kwargs = fn, args, kwargs
        self.name = getattr(fn, "__name__", repr(fn))

    def replay(self) -> None:
        self.fn(*self.args, **self.kwargs)

    def reset(self) -> None:
        self.args, self.kwargs = (), {}  # lets the buffers they reference be freed


Step = GraphSegment | EagerStep


class CapturedGraph:
    """The result of a capture: ordered steps; ``replay()`` rewrites the static output ``capture`` returned."""

    def __init__(self, steps: list[Step], label: str) -> None:
        self.steps = steps
        self.label = label
        self._is_reset = False

    def replay(self) -> None:
        if self._is_reset:
            raise CaptureError("this graph was reset (its memory freed); capture it again to replay")
        for step in self.steps:
            step.replay()

    def reset(self) -> None:
        for step in self.steps:
            step.reset()
        self._is_reset = True

    @property
    def num_segments(self) -> int:
        return len(self.ops_per_segment)

    @property
    def num_eager_breaks(self) -> int:
        return len(self.steps) - self.num_segments

    @property
    def ops_per_segment(self) -> list[int]:
        """Ops that do work at replay (a kernel each on a GPU), per segment; the same on every backend."""
        return [s.num_ops for s in self.steps if isinstance(s, GraphSegment)]

    @property
    def num_ops(self) -> int:
        return sum(self.ops_per_segment)

    def __repr__(self) -> str:
        return f"CapturedGraph({self.label}, ops per segment: {self.ops_per_segment})"


def eager_break_during_capture(fn: F) -> F:
    """Mark ``fn`` as where a breakable capture splits the graph; elsewhere it is a plain call. ``fn`` writes
    into caller-provided tensors and returns None: at replay it re-runs with the capture-time arguments."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        capture = _CURRENT.get()
        if capture is None or not capture.breakable:
            return fn(*args, **kwargs)
        return capture.run_eager(fn, args, kwargs)

    return wrapper  # type: ignore[return-value]


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
    @functools.wraps(original)
    def guard(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if _CURRENT.get() is not None:
            raise _host_sync_error(_GUARDED_METHODS[name], _FIX_SCALAR)
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
                for name, saved in _guard_saved.items():
                    if saved is None:
                        delattr(torch.Tensor, name)  # it was inherited from TensorBase
                    else:
                        setattr(torch.Tensor, name, saved)


class CaptureSession(OpCounter, ABC):
    """One capture: the dispatch mode that sees its aten ops while a segment records, and its steps so far."""

    def __init__(self, breakable: bool) -> None:
        super().__init__(check_host_syncs=True, active=False)
        self.breakable = breakable
        self.steps: list[Step] = []
        self.num_segments = 0

    def scope(self) -> contextlib.AbstractContextManager[Any]:
        """What holds around the whole capture (on CUDA: the capture stream, and CUDA's errors made CaptureErrors)."""
        return contextlib.nullcontext()

    @abstractmethod
    def start_segment(self, index: int) -> None: ...

    @abstractmethod
    def finish_segment(self) -> GraphSegment: ...

    @abstractmethod
    def abandon_segment(self) -> None:
        """Undo or close the open segment after an error; a no-op if none is open."""

    def start(self) -> None:
        self.start_segment(self.num_segments)
        self.num_segments += 1
        self.active = True

    def finish(self) -> None:
        self.active = False
        self.steps.append(self.finish_segment())

    def run_eager(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        self.finish()
        # This code really runs, outside any graph: nested decorated calls are plain calls, host reads are allowed.
        token = _CURRENT.set(None)
        try:
            result = fn(*args, **kwargs)
        finally:
            _CURRENT.reset(token)
        self.steps.append(EagerStep(fn, args, kwargs))
        self.start()
        return result


class GraphBackend(ABC):
    """A way to capture and replay graphs: ``SimBackend`` (any device) or ``CudaBackend``. All graphs
    captured by one backend object share one memory pool."""

    name: str
    device: torch.device
    label: str

    def warmup_context(self) -> contextlib.AbstractContextManager[Any]:
        """Where warmup runs must happen (the capture stream on CUDA)."""
        return contextlib.nullcontext()

    @abstractmethod
    def synchronize(self) -> None:
        """Wait for queued device work (for timing)."""

    @abstractmethod
    def memory_in_use(self) -> int | None:
        """Bytes in use where this backend's graphs keep their memory, or None if it cannot tell."""

    @abstractmethod
    def _session(self, breakable: bool) -> CaptureSession: ...

    def capture(self, fn: Callable[[], T], *, breakable: bool = False) -> tuple[CapturedGraph, T]:
        """Run ``fn`` once under capture; return the graph and fn's result (the static output). ``breakable``:
        eager breaks become ``EagerStep``s between segments. On error nothing stays half-captured."""
        if _CURRENT.get() is not None:
            raise CaptureError("capture() was called inside another capture; capture graphs one at a time")
        session = self._session(breakable)
        token = _CURRENT.set(session)
        try:
            with _host_read_guard(), session.scope(), session:
                try:
                    session.start()
                    out = fn()
                    session.finish()
                except BaseException:
                    session.active = False
                    session.abandon_segment()
                    for step in session.steps:
                        step.reset()
                    raise
        finally:
            _CURRENT.reset(token)
        return CapturedGraph(session.steps, self.label), out

    def __repr__(self) -> str:
        return f"{type(self).__name__}(device={str(self.device)!r})"
