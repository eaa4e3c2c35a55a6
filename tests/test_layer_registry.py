"""Layer kinds by registration: the built-in kinds and a user's go through one path (``cglab.layer_registry``),
and a bad registration is refused there in one line."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from cglab import AttentionCGSupport, ConfigError, ModelRunner, ToyConfig, bug_zoo
from cglab.compilation_config import CompilationConfig
from cglab.custom_ops import direct_register_custom_op
from cglab.forward_context import layer_metadata
from cglab.layer_registry import get_layer_kind, kind_of_op, layer_kinds, register_layer_kind
from cglab.layers import Attention, Compressor, LinearAttention, ShortConv
from cglab.metadata import (
    AttentionMetadataBuilder,
    CompressorMetadataBuilder,
    LinearAttentionMetadataBuilder,
    ShortConvMetadataBuilder,
)
from cglab.repro import run_repro


def _window_sum(x: torch.Tensor, output: torch.Tensor, cache: torch.Tensor, layer_name: str) -> None:
    """Each token plus the inputs of the previous ``sconv_kernel_size - 1`` tokens of its request."""
    md = layer_metadata(layer_name, False)
    if md is None:
        output.copy_(x)
        return
    cache[md.slot_mapping] = x
    taps = torch.where(md.tap_slots[..., None] >= 0, cache[md.tap_slots], 0)
    output.copy_(x + taps.sum(1))


window_sum = direct_register_custom_op("test_registry_window_sum", _window_sum, mutates_args=("output", "cache"))


class WindowSum(bug_zoo.WindowSum):
    """The zoo's block around this file's own guarded op (a user's layer, registered below)."""

    op = staticmethod(window_sum)

    def state_tensors(self) -> dict[str, torch.Tensor]:
        return {"cache": self.cache[:-1]}


register_layer_kind("test_window", WindowSum, ShortConvMetadataBuilder, "cglab::test_registry_window_sum")


def test_the_built_in_kinds_are_registered_like_any_other() -> None:
    assert layer_kinds()[:4] == ("attn", "sconv", "compressor", "linear_attn")
    config = ToyConfig(layers=("attn", "sconv", "compressor", "linear_attn"))
    expected = {
        "attn": (Attention, AttentionMetadataBuilder, "cglab::unified_attention", True),
        "sconv": (ShortConv, ShortConvMetadataBuilder, "cglab::short_conv", False),
        "compressor": (Compressor, CompressorMetadataBuilder, "cglab::compressor", False),
        "linear_attn": (LinearAttention, LinearAttentionMetadataBuilder, "cglab::linear_attention", True),
    }
    for name, (layer, builder, op, splitting) in expected.items():
        kind = get_layer_kind(name)
        assert type(kind.make_layer(config, f"layers.0.{name}")) is layer
        assert type(kind.make_builder(config, torch.device("cpu"))) is builder
        assert (kind.op, kind.splitting, kind_of_op(op)) == (op, splitting, name)
    assert [name for name in layer_kinds() if get_layer_kind(name).must_split] == ["linear_attn"]


def test_a_registered_kind_builds_its_module_its_builder_and_its_state(device: str) -> None:
    config = ToyConfig(layers="test_window,attn")
    runner = ModelRunner(config, "full", device=device)
    assert isinstance(runner.model.layers[0].mixer, WindowSum)
    assert [(g.kind, type(g.builder)) for g in runner.attn_groups] == [
        ("test_window", ShortConvMetadataBuilder),
        ("attn", AttentionMetadataBuilder),
    ]
    assert "layers.0.test_window.cache" in runner.state_tensors()
    # Its op is an ordinary splitting-op candidate, and not a default one (it is not attention-like).
    resolved = CompilationConfig(
        "piecewise", splitting_ops=("cglab::test_registry_window_sum", "cglab::unified_attention")
    )
    assert resolved.resolve(config, torch.device("cpu"), runner.attn_groups).splitting_ops[0] == (
        "cglab::test_registry_window_sum"
    )
    assert CompilationConfig("piecewise").resolve(config, torch.device("cpu"), runner.attn_groups).splitting_ops == (
        "cglab::unified_attention",
    )


@pytest.mark.parametrize("legacy", [False, True])
def test_a_registered_kind_is_captured_replayed_and_compared(device: str, legacy: bool) -> None:
    """The fix keeps it equal to eager; the legacy compiled capture has no metadata for it: it diverges."""
    cc = CompilationConfig("piecewise", legacy_skip_attn=legacy)
    result = run_repro(cc, ToyConfig(layers="test_window,attn"), batch_sizes=(3, 1), steps=4, device=device)
    assert result.error is None and result.steps_by_mode == {"piecewise": 4}
    assert result.diverged is legacy
    assert result.state_diverged is legacy  # its cache is compared like any built-in layer's


class _NoSupport:
    def build(self, common: object, for_capture: bool = False) -> None: ...


class _NoState(nn.Module):
    pass


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        (("attn", WindowSum, ShortConvMetadataBuilder, "cglab::test_registry_window_sum"), {}, "already registered"),
        (
            ("attn", WindowSum, ShortConvMetadataBuilder, "cglab::test_registry_window_sum"),
            {"replace": True},
            "built in",
        ),
        (("test_window", WindowSum, ShortConvMetadataBuilder, "cglab::test_registry_window_sum"), {}, "replace=True"),
        (("window2", WindowSum, None, "cglab::test_registry_window_sum"), {}, "has no metadata builder"),
        (("window2", WindowSum, _NoSupport, "cglab::test_registry_window_sum"), {}, "cudagraph_support"),
        (("window2", _NoState, ShortConvMetadataBuilder, "cglab::test_registry_window_sum"), {}, "state_tensors()"),
        (("window2", WindowSum, ShortConvMetadataBuilder, "cglab::window_sum_typo"), {}, "not a torch custom op"),
        (("window2", WindowSum, ShortConvMetadataBuilder, "aten::add"), {}, "not a torch custom op"),
        (("Window 2", WindowSum, ShortConvMetadataBuilder, "cglab::test_registry_window_sum"), {}, "lowercase"),
    ],
)
def test_a_bad_registration_is_refused_in_one_line(args: tuple, kwargs: dict, message: str) -> None:
    before = {name: get_layer_kind(name) for name in layer_kinds()}
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")) as caught:
        register_layer_kind(*args, **kwargs)
    assert "\n" not in str(caught.value)
    assert {name: get_layer_kind(name) for name in layer_kinds()} == before  # nothing half-registered


def test_a_kind_of_yours_registers_again_with_replace() -> None:
    kind = register_layer_kind(
        "test_window", WindowSum, ShortConvMetadataBuilder, "cglab::test_registry_window_sum", replace=True
    )
    assert get_layer_kind("test_window") is kind
    assert kind.builder.cudagraph_support is AttentionCGSupport.ALWAYS


def test_an_unknown_kind_names_the_registered_ones() -> None:
    with pytest.raises(ConfigError, match="unknown layer kind.*'windw'.*test_window"):
        ToyConfig(layers="windw,attn")
