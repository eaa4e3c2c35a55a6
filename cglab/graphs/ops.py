"""The aten op rules both graph backends obey, read once per op from its schema: what it does to
memory, whether it needs the host (cannot be captured), whether it is work (a kernel on a GPU)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from cglab.custom_ops import custom_op_impl
from cglab.errors import CaptureError

# Allocation-only ops: no kernel runs, so at replay there is nothing to do (the memory simply
# holds whatever it holds, as uninitialised memory does).
_ALLOC_OPS = frozenset({"empty", "empty_like", "empty_strided", "empty_permuted", "new_empty", "new_empty_strided"})
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
    if alloc or torch.Tag.inplace_view in func.tags or name in _BOOKKEEPING_OPS:
        return _OpInfo(name, alloc, (), (), len(schema.returns))
    writes = tuple(
        (i, a.name) for i, a in enumerate(schema.arguments) if a.alias_info is not None and a.alias_info.is_write
    )
    fresh = tuple(i for i, r in enumerate(schema.returns) if r.alias_info is None)
    return _OpInfo(name, alloc, writes, fresh, len(schema.returns))


def _tensors_in(value: Any) -> list[torch.Tensor]:
    return [t for t in tree_leaves(value) if isinstance(t, torch.Tensor)]


def _storage_ptr(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def _fresh_outputs(
    info: _OpInfo, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any
) -> list[tuple[int, int, torch.Tensor]]:
    """The new tensors an op returned, as (return index, list index or -1, tensor); outputs sharing an
    input's storage without an alias annotation (``_unsafe_view``) are views in fact, left out."""
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
    inputs = {_storage_ptr(t) for t in _tensors_in((args, kwargs))} - {0}  # zero-size storages share no address
    return [f for f in found if _storage_ptr(f[2]) not in inputs]


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
        "nonzero",
        "nonzero_numpy",
        "argwhere",
        "masked_select",
        "bincount",
        "_unique2",
        "unique_dim",
        "unique_consecutive",
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
    devices = {t.device for t in _tensors_in(args) if not (t.device.type == "cpu" and t.dim() == 0)}
    target = kwargs.get("device")
    if target is not None:
        devices.add(torch.device(target))
    kinds = {d.type for d in devices}
    if "cpu" in kinds and len(kinds - {"cpu", "meta"}) > 0:
        src, dst = sorted(str(d) for d in devices)[:2]
        raise _host_sync_error(f"aten.{name} between {src} and {dst}", _FIX_COPY)


class OpCounter(TorchDispatchMode):
    """Counts the aten ops that do work (a kernel each on a GPU) while ``active``: one rule for every backend.
    cglab's custom ops run their Python body, so their kernels count one by one. ``check_host_syncs``:
    refuse host syncs before CUDA sees them, so a capture closes cleanly. Subclasses record in ``run``."""

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
        impl = custom_op_impl(func)
        if impl is not None:
            with self:  # torch pops the mode while it handles an op: push it back for the body's kernels
                return impl(*args, **kwargs)
        info = _op_info(func)
        if self.check_host_syncs:
            _check_host_sync(info, args, kwargs)
        return self.run(func, info, args, kwargs)

    def run(self, func: Any, info: _OpInfo, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        out = func(*args, **kwargs)
        if not info.alloc and (info.writes or _fresh_outputs(info, args, kwargs, out)):
            self.count += 1
        return out
