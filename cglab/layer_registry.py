"""Layer kinds by name: a module, its metadata builder and its kernel's custom op (vLLM: the attention-backend
registry, ``register_backend(backend, class_path=...)``, whose backends name their builder). The built-in kinds
register here as a user's kind does; classes given as ``"module:Class"`` are imported on first use, so a
command line checks a layer pattern before it imports torch. Torch-free at import."""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cglab.cudagraph_support import AttentionCGSupport
from cglab.errors import ConfigError

if TYPE_CHECKING:
    import torch

_NAME = re.compile(r"[a-z][a-z0-9_]*")


@dataclass(frozen=True)
class LayerKind:
    """One registered kind. ``layer``: an ``nn.Module`` class built as ``layer(config, layer_name)``, with
    ``state_tensors()``; ``builder``: a metadata builder class built as ``builder(config, device)``, with
    ``build(common, for_capture)`` and a ``cudagraph_support``; ``op``: the custom op its kernel is.
    ``splitting``: a default splitting op (vLLM's attention-like ops); ``must_split``: compiled PIECEWISE
    refuses it inside a piece; ``spec_decode``: it can serve speculative decoding."""

    name: str
    layer: type | str
    builder: type | str
    op: str
    splitting: bool = False
    must_split: bool = False
    spec_decode: bool = True
    builtin: bool = False

    # config: a ToyConfig (not imported: config.py checks its layer pattern against this registry)
    def make_layer(self, config: Any, layer_name: str) -> Any:
        return _resolved(self)[0](config, layer_name)

    def make_builder(self, config: Any, device: torch.device) -> Any:
        return _resolved(self)[1](config, device)


_REGISTRY: dict[str, LayerKind] = {}
_CLASSES: dict[str, tuple[type, type]] = {}  # kind -> its layer and builder classes, checked


def register_layer_kind(
    name: str,
    layer: type | str,
    builder: type | str | None,
    op: str,
    *,
    splitting: bool = False,
    must_split: bool = False,
    spec_decode: bool = True,
    replace: bool = False,
) -> LayerKind:
    """Register a layer kind so that ``ToyConfig(layers=...)`` accepts ``name``; classes are checked now (a
    ``"module:Class"`` path on first use). ``replace``: register a kind of yours again (a re-run cell)."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ConfigError(f"a layer kind's name is lowercase letters, digits and '_' (such as 'window'), got {name!r}")
    old = _REGISTRY.get(name)
    if old is not None and (old.builtin or not replace):
        how = "" if old.builtin else ", or pass replace=True to register it again"
        raise ConfigError(f"layer kind {name!r} is already registered ({_describe(old)}); choose another name{how}")
    if builder is None:
        raise ConfigError(
            f"layer kind {name!r} has no metadata builder: give a class with build(common, for_capture) and a "
            "cudagraph_support, such as cglab.metadata.ShortConvMetadataBuilder"
        )
    kind = LayerKind(name, layer, builder, op, splitting, must_split, spec_decode, builtin=_BUILTINS_OPEN)
    _CLASSES.pop(name, None)
    if not isinstance(layer, str) or not isinstance(builder, str):
        _CLASSES[name] = _check(kind)
    _REGISTRY[name] = kind
    return kind


def layer_kinds() -> tuple[str, ...]:
    """Every registered kind's name, in the order registered (the built-in ones first)."""
    return tuple(_REGISTRY)


def get_layer_kind(name: str) -> LayerKind:
    """The kind registered as ``name`` (a ``ToyConfig`` checked its pattern: an unknown name is a bug here)."""
    return _REGISTRY[name]


def kind_of_op(op: str) -> str | None:
    """The kind whose kernel ``op`` is, or None."""
    return next((k.name for k in _REGISTRY.values() if k.op == op), None)


def _describe(kind: LayerKind) -> str:
    return "built in" if kind.builtin else f"by {getattr(kind.layer, '__qualname__', kind.layer)}"


def _resolved(kind: LayerKind) -> tuple[type, type]:
    if kind.name not in _CLASSES:
        _CLASSES[kind.name] = _check(kind)
    return _CLASSES[kind.name]


def _load(value: type | str) -> Any:
    if not isinstance(value, str):
        return value
    module, _, qualname = value.partition(":")
    return getattr(importlib.import_module(module), qualname)


def _check(kind: LayerKind) -> tuple[type, type]:
    """The kind's classes, each checked once, with one line for what is missing."""
    from cglab.custom_ops import registered_op_names  # here: torch, only once a class is at hand

    layer, builder = _load(kind.layer), _load(kind.builder)
    where = f"layer kind {kind.name!r}"
    if not isinstance(layer, type) or not callable(getattr(layer, "state_tensors", None)):
        raise ConfigError(
            f"{where}: layer must be an nn.Module class built as layer(config, layer_name), with a state_tensors() "
            f"method that returns its caches ({{}} if none), got {layer!r}"
        )
    if not (
        callable(getattr(builder, "build", None))
        and isinstance(getattr(builder, "cudagraph_support", None), AttentionCGSupport)
    ):
        raise ConfigError(
            f"{where}: builder {getattr(builder, '__name__', builder)!r} must have a build(common, for_capture) "
            "method and a cudagraph_support such as AttentionCGSupport.ALWAYS (which batches it can build "
            "capture metadata for)"
        )
    if kind.op not in registered_op_names():
        raise ConfigError(
            f"{where}: op {kind.op!r} is not a torch custom op of cglab; register the kernel with "
            "cglab.custom_ops.direct_register_custom_op(name, impl, mutates_args) and name it 'cglab::<name>': "
            "torch.compile keeps a custom op whole, so its guard runs when it runs and splitting_ops can name it"
        )
    return layer, builder


# The built-in kinds, through the same call as a user's kind.
_BUILTINS_OPEN = True
register_layer_kind(
    "attn",
    "cglab.layers.attention:Attention",
    "cglab.metadata:AttentionMetadataBuilder",
    "cglab::unified_attention",
    splitting=True,
)
register_layer_kind(
    "sconv", "cglab.layers.sconv:ShortConv", "cglab.metadata:ShortConvMetadataBuilder", "cglab::short_conv"
)
register_layer_kind(
    "compressor", "cglab.layers.compressor:Compressor", "cglab.metadata:CompressorMetadataBuilder", "cglab::compressor"
)
register_layer_kind(
    "linear_attn",
    "cglab.layers.linear_attn:LinearAttention",
    "cglab.metadata:LinearAttentionMetadataBuilder",
    "cglab::linear_attention",
    splitting=True,
    must_split=True,
    spec_decode=False,  # one recurrent state per request: it would absorb the drafts verification rejects
)
_BUILTINS_OPEN = False
