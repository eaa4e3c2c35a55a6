"""The CPU simulator of CUDA graphs: a GPU capture's semantics, not its speed.

Capture records every aten call with the memory it touched (addresses baked in, as on a GPU);
replay re-runs the record on that storage. Capture launches nothing on a GPU, so each segment is
undone when it closes: written buffers get their bytes back, new tensors hold poison until replay.
"""

from __future__ import annotations

import os
import warnings
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from cglab.errors import CaptureError
from cglab.graphs.capture_driver import CaptureSession, GraphBackend, GraphSegment
from cglab.graphs.ops import (
    _check_host_sync,
    _does_work,
    _fresh_outputs,
    _op_info,
    _storage_ptr,
    _tensors_in,
    _written_tensors,
    inline_custom_op,
)

__all__ = ["SIMULATOR_LABEL", "SimBackend", "SimSegment"]

SIMULATOR_LABEL = "CPU simulator of CUDA graphs (semantics only, not speed)"

# Record kinds, decided at capture so replay does no schema work.
_CALL = 0  # re-run for its in-place writes
_COPY_ONE = 1  # re-run and copy the single new tensor into the captured output
_COPY_MANY = 2  # re-run and copy several new tensors (tuple / list returns)

_Record = tuple[int, Any, tuple[Any, ...], dict[str, Any], Any]


class SimSegment(GraphSegment):
    """A recorded list of aten calls; replay re-runs them in order on the captured tensors."""

    def __init__(self, index: int, records: list[_Record], num_ops: int) -> None:
        super().__init__(index, num_ops)
        self._records: list[_Record] | None = records

    def replay(self) -> None:
        records = self._records
        if records is None:
            raise CaptureError(f"simulated segment {self.index} was reset; capture the graph again")
        # The record sits below autograd (the dispatch mode sees post-autograd calls), and model
        # buffers may be inference tensors: inference mode is right for both.
        with torch.inference_mode():
            for kind, func, args, kwargs, dst in records:
                if kind == _COPY_ONE:
                    dst.copy_(func(*args, **kwargs))
                elif kind == _CALL:
                    func(*args, **kwargs)
                else:
                    result = func(*args, **kwargs)
                    single, targets = dst
                    items = (result,) if single else result
                    for i, j, target in targets:
                        target.copy_(items[i] if j < 0 else items[i][j])

    def reset(self) -> None:
        self._records = None

    def describe(self) -> str:
        return super().describe() + " (simulated)"


def _poison(t: torch.Tensor) -> None:
    """Fill a tensor whose kernel 'did not run' with a wrong value, through a fresh alias: bumping the
    version counter would break views made during capture."""
    if t.numel() == 0:
        return
    try:
        _alias(t).fill_(_poison_value(t.dtype))
    except (RuntimeError, TypeError):
        # Overlapping layouts or exotic dtypes cannot be filled element-wise; all-0xFF bytes are
        # NaN for floats and an absurd value for integers, which serves the same purpose.
        _bytes_of(t).fill_(255)


def _poison_value(dtype: torch.dtype) -> float | int | bool:
    if dtype.is_floating_point or dtype.is_complex:
        return float("nan")
    if dtype == torch.bool:
        return False
    return torch.iinfo(dtype).max


def _alias(t: torch.Tensor) -> torch.Tensor:
    """A new tensor object over the same memory with the same size, strides and offset."""
    plain = type(t) in (torch.Tensor, torch.nn.Parameter) and t.layout == torch.strided
    if not plain or t.is_conj() or t.is_neg() or t.is_quantized:
        return t  # lazy conj/neg bits, subclasses, exotic layouts: keep the object itself
    alias = torch.empty(0, dtype=t.dtype, device=t.device)
    return alias.set_(t.untyped_storage(), t.storage_offset(), t.size(), t.stride())


def _alias_all(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return _alias(value)
    if isinstance(value, list):
        return [_alias(v) if isinstance(v, torch.Tensor) else v for v in value]
    if isinstance(value, tuple):
        return tuple(_alias(v) if isinstance(v, torch.Tensor) else v for v in value)
    return value


def _bytes_of(t: torch.Tensor) -> torch.Tensor:
    """A uint8 tensor over the whole storage of ``t`` (covers every view of that memory)."""
    storage = t.untyped_storage()
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)


class _Recorder:
    """Records one segment and, when it closes, undoes its visible effects."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.records: list[_Record] = []
        self.num_ops = 0
        self._created: set[int] = set()  # storages born in this segment
        self._snapshots: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # ptr -> (bytes, saved)
        self._made: list[torch.Tensor] = []

    def record(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        info = _op_info(func)
        _check_host_sync(info, args, kwargs)
        if info.writes:
            for t in _written_tensors(info, args, kwargs):
                self._snapshot(t)
        out = func(*args, **kwargs)
        if info.alloc:
            for t in _tensors_in(out):
                self._adopt(t)
            return out
        fresh = _fresh_outputs(info, args, kwargs, out)
        if not _does_work(info, fresh):
            return out  # views and aliases: the tensor object already points at the memory
        for _, _, t in fresh:
            self._adopt(t)
        # The record keeps aliases, not the caller's tensor objects: a GPU graph bakes in
        # addresses and strides, so later metadata changes (t_(), resize) must not leak into
        # replay, and replay writes must not bump autograd version counters.
        args = tuple(_alias_all(a) for a in args)
        kwargs = {k: _alias_all(v) for k, v in kwargs.items()}
        if not fresh:
            self.records.append((_CALL, func, args, kwargs, None))
        elif info.num_returns == 1 and len(fresh) == 1 and fresh[0][1] < 0:
            self.records.append((_COPY_ONE, func, args, kwargs, _alias(fresh[0][2])))
        else:
            targets = tuple((i, j, _alias(t)) for i, j, t in fresh)
            self.records.append((_COPY_MANY, func, args, kwargs, (info.num_returns == 1, targets)))
        self.num_ops += 1
        return out

    def _snapshot(self, t: torch.Tensor) -> None:
        ptr = _storage_ptr(t)
        if ptr == 0 or ptr in self._created or ptr in self._snapshots:
            return
        raw = _bytes_of(t)
        self._snapshots[ptr] = (raw, raw.clone())

    def _adopt(self, t: torch.Tensor) -> None:
        ptr = _storage_ptr(t)
        if ptr:
            self._created.add(ptr)
            self._made.append(t)

    def rollback(self) -> None:
        """Make the segment look as if nothing ran, as on a GPU during capture."""
        with torch.inference_mode():
            for raw, saved in self._snapshots.values():
                raw.copy_(saved)
            for t in self._made:
                _poison(t)
        self._snapshots.clear()
        self._made.clear()
        self._created.clear()


class _RecordingMode(TorchDispatchMode):
    """Routes every aten call to the open segment's recorder; passes through between segments."""

    def __init__(self) -> None:
        super().__init__()
        self.recorder: _Recorder | None = None

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        kwargs = kwargs or {}
        recorder = self.recorder
        if recorder is None:
            return func(*args, **kwargs)
        inlined, out = inline_custom_op(self, func, args, kwargs)
        if inlined:
            return out
        return recorder.record(func, args, kwargs)


class _SimSession(CaptureSession):
    def __init__(self) -> None:
        self._mode = _RecordingMode()
        self._recorder: _Recorder | None = None

    def __enter__(self) -> _SimSession:
        self._mode.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._mode.__exit__(*exc)

    def start_segment(self, index: int) -> None:
        self._recorder = _Recorder(index)
        self._mode.recorder = self._recorder

    def finish_segment(self) -> GraphSegment:
        recorder = self._close()
        if recorder.num_ops == 0:
            warnings.warn(
                f"The simulated CUDA graph segment {recorder.index} is empty: nothing was recorded, "
                f"so replaying it does nothing (on a GPU torch warns 'The CUDA Graph is empty'). "
                f"[{SIMULATOR_LABEL}]",
                UserWarning,
                stacklevel=2,
            )
        return SimSegment(recorder.index, recorder.records, recorder.num_ops)

    def abandon_segment(self) -> None:
        if self._recorder is not None:
            self._close()

    def _close(self) -> _Recorder:
        recorder = self._recorder
        assert recorder is not None, "no segment is open"
        # Stop recording first: the rollback's own copies and fills must not be recorded.
        self._mode.recorder = None
        self._recorder = None
        recorder.rollback()
        return recorder


class SimBackend(GraphBackend):
    """Simulated CUDA graphs on any device (CPU by default); recorded tensors live with the graph."""

    name = "sim"

    def __init__(self, device: str | torch.device | None = None) -> None:
        self.device = torch.device("cpu") if device is None else torch.device(device)
        self.label = f"{SIMULATOR_LABEL} on {self.device}"

    def synchronize(self) -> None:
        # Nothing is asynchronous on the CPU; tensors on a GPU still run asynchronously.
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def memory_in_use(self) -> int | None:
        """The process's resident memory (recorded tensors live in ordinary host memory); None off Linux."""
        try:
            with open("/proc/self/statm", encoding="ascii") as f:
                return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, IndexError):
            return None

    def _session(self) -> CaptureSession:
        return _SimSession()
