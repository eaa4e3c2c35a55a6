"""The CPU simulator of CUDA graphs: a GPU capture's semantics, not its speed. Capture records every aten
call with the memory it touched; replay re-runs the record on that storage. As a GPU capture runs nothing,
each segment is undone when it closes: written buffers get their bytes back, new tensors hold poison.
"""

from __future__ import annotations

import os
import warnings
from typing import Any

import torch
from torch.utils._pytree import tree_map_only

from cglab.graphs.capture_driver import CaptureSession, GraphBackend, GraphSegment
from cglab.graphs.ops import _fresh_outputs, _OpInfo, _storage_ptr, _tensors_in

__all__ = ["SIMULATOR_LABEL", "SimBackend", "SimSegment"]

SIMULATOR_LABEL = "CPU simulator of CUDA graphs (semantics only, not speed)"

# (whether the op has one return, the op, its arguments, its keyword arguments, the captured outputs
# that replay copies the new tensors into: (return index, list index or -1, tensor)).
_Record = tuple[bool, Any, tuple[Any, ...], dict[str, Any], tuple[tuple[int, int, torch.Tensor], ...]]


class SimSegment(GraphSegment):
    """A recorded list of aten calls; replay re-runs them in order on the captured tensors."""

    def __init__(self, records: list[_Record], num_ops: int) -> None:
        super().__init__(num_ops)
        self._records = records

    def replay(self) -> None:
        # The record sits below autograd (the dispatch mode sees post-autograd calls), and model
        # buffers may be inference tensors: inference mode is right for both.
        with torch.inference_mode():
            for single, func, args, kwargs, targets in self._records:
                result = func(*args, **kwargs)
                items = (result,) if single else result
                for i, j, target in targets:
                    target.copy_(items[i] if j < 0 else items[i][j])

    def reset(self) -> None:
        self._records = []


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


def _bytes_of(t: torch.Tensor) -> torch.Tensor:
    """A uint8 tensor over the whole storage of ``t`` (covers every view of that memory)."""
    storage = t.untyped_storage()
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)


class _SimSession(CaptureSession):
    """Records each segment's work and, when it closes, undoes what the work did."""

    def start_segment(self, index: int) -> None:
        self.count, self._index, self._records = 0, index, []
        self._created: set[int] = set()  # storages born in this segment
        self._snapshots: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # ptr -> (bytes, saved)
        self._made: list[torch.Tensor] = []

    def run(self, func: Any, info: _OpInfo, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        for pos, name in info.writes:
            for t in _tensors_in(args[pos] if pos < len(args) else kwargs.get(name)):
                self._snapshot(t)
        out = func(*args, **kwargs)
        if info.alloc:
            for t in _tensors_in(out):
                self._adopt(t)
            return out
        fresh = _fresh_outputs(info, args, kwargs, out)
        if not (info.writes or fresh):
            return out  # views and aliases: the tensor object already points at the memory
        for _, _, t in fresh:
            self._adopt(t)
        # The record keeps aliases, not the caller's tensor objects: a GPU graph bakes in
        # addresses and strides, so later metadata changes (t_(), resize) must not leak into
        # replay, and replay writes must not bump autograd version counters.
        args, kwargs = tree_map_only(torch.Tensor, _alias, (args, kwargs))
        targets = tuple((i, j, _alias(t)) for i, j, t in fresh)
        self._records.append((info.num_returns == 1, func, args, kwargs, targets))
        self.count += 1
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

    def finish_segment(self) -> GraphSegment:
        self.abandon_segment()
        if self.count == 0:
            warnings.warn(
                f"The simulated CUDA graph segment {self._index} is empty: nothing was recorded, "
                f"so replaying it does nothing (on a GPU torch warns 'The CUDA Graph is empty'). "
                f"[{SIMULATOR_LABEL}]",
                UserWarning,
                stacklevel=2,
            )
        return SimSegment(self._records, self.count)

    def abandon_segment(self) -> None:
        """Make the segment look as if nothing ran, as on a GPU during capture (the mode is inactive:
        these copies and fills are not recorded)."""
        with torch.inference_mode():
            for raw, saved in self._snapshots.values():
                raw.copy_(saved)
            for t in self._made:
                _poison(t)
        self._snapshots.clear()
        self._made.clear()
        self._created.clear()


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

    def _session(self, breakable: bool) -> CaptureSession:
        return _SimSession(breakable)
