"""``cglab::fused_linear``: its aten body is the MLP's own arithmetic (bit for bit on the CPU); inside
``fused_linears`` every linear of the model is one launch of the op, which changes no bit on the CPU; on a
GPU its Triton kernel matches the aten body at 1-16 rows for every flag combination, fp32 and bf16, a row's
bits do not depend on how many rows share the launch, and the op launches it up to ``MAX_ROWS`` rows only."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch.nn import functional as F

from cglab.config import ToyConfig
from cglab.forward_context import set_forward_context
from cglab.kernels import fused_linear as fused_linear_module
from cglab.kernels import use_kernels
from cglab.kernels.fused_linear import FUSED, MAX_ROWS, fused_linear, fused_linears, linear_reference
from cglab.model import ToyTransformer

CUDA = torch.cuda.is_available()
KERNEL_ROWS = 16  # the Triton kernel is tested to 16 rows, beyond the op's MAX_ROWS (where cuBLAS is faster)
TOLERANCE = {torch.float32: {"atol": 2e-5, "rtol": 2e-5}, torch.bfloat16: {"atol": 4e-2, "rtol": 3e-2}}
# (norm, act, residual): every combination the op allows (SiLU-times-up halves the input a norm would span)
FLAGS = [
    f
    for f in itertools.product((False, True), ("none", "silu", "silu_mul"), (False, True))
    if f[:2] != (True, "silu_mul")
]


def _operands(rows: int, k: int, n: int, norm: bool, act: str, residual: bool, dtype: torch.dtype, device: str):
    gen = torch.Generator().manual_seed(rows * 31 + k)
    x = torch.randn(rows, 2 * k if act == "silu_mul" else k, generator=gen).to(device, dtype)
    weight = (torch.randn(n, k, generator=gen) / k**0.5).to(device, dtype)
    norm_weight = (1 + 0.1 * torch.randn(k, generator=gen)).to(device, dtype) if norm else None
    res = torch.randn(rows, n, generator=gen).to(device, dtype) if residual else None
    return x, weight, norm_weight, None, act, res


def test_the_aten_body_is_the_mlps_arithmetic() -> None:
    mlp = ToyTransformer(ToyConfig(layers=("sconv",))).layers[0].mlp
    hidden = torch.randn(5, mlp.norm.weight.shape[0])
    gate, up = mlp.gate_up(mlp.norm(hidden)).chunk(2, dim=-1)
    assert torch.equal(mlp(hidden), hidden + mlp.down(F.silu(gate) * up))


def test_inside_fused_linears_every_linear_is_one_launch_of_the_op(monkeypatch: pytest.MonkeyPatch) -> None:
    model = ToyTransformer(ToyConfig(layers=("sconv", "attn", "compressor", "linear_attn")))
    ids, positions = torch.tensor([3, 1, 4]), torch.arange(3)
    with set_forward_context(None):  # a profiling run: the stateful ops do nothing, every linear runs
        expected = model(ids, positions)
        launches: list[torch.Size] = []
        op = fused_linear_module.fused_linear
        monkeypatch.setattr(
            fused_linear_module, "fused_linear", lambda *args: launches.append(args[1].shape) or op(*args)
        )
        with fused_linears():
            assert FUSED.linears and torch.equal(model(ids, positions), expected)  # the op's aten body on the CPU
            with fused_linears(False):
                assert not FUSED.linears
            assert FUSED.linears
        assert not FUSED.linears
    linears = [m.weight.shape for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert len(launches) == len(linears) == 17 and sorted(launches) == sorted(linears)


@pytest.mark.parametrize(("norm", "act", "residual"), FLAGS)
def test_the_op_runs_its_aten_body_on_the_cpu(norm: bool, act: str, residual: bool) -> None:
    args = _operands(3, 16, 24, norm, act, residual, torch.float32, "cpu")
    assert torch.equal(fused_linear(*args), linear_reference(*args))


@pytest.mark.skipif(not CUDA, reason="the Triton kernel runs on CUDA tensors")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize(("norm", "act", "residual"), FLAGS)
def test_the_triton_kernel_matches_its_aten_body(
    dtype: torch.dtype, norm: bool, act: str, residual: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)  # the oracle in true fp32, as the kernel
    from cglab.kernels.linear import fused_linear as kernel  # the launcher: any row count, the op's limit aside

    for k, n in ((1024, 4096), (2048, 1024), (32, 64), (10, 24)):
        full = _operands(KERNEL_ROWS, k, n, norm, act, residual, dtype, "cuda")
        padded = kernel(*full)
        for rows in range(1, KERNEL_ROWS + 1):
            args = (full[0][:rows], *full[1:5], None if full[5] is None else full[5][:rows])
            got = kernel(*args)
            torch.testing.assert_close(got, linear_reference(*args), **TOLERANCE[dtype])
            assert torch.equal(got, padded[:rows]), f"rows {rows}: a row's bits depend on the batch"


@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU (runs on the GPU machine)")
def test_the_op_launches_the_kernel_up_to_max_rows_and_cublas_above() -> None:
    from cglab.kernels import triton_launches

    args = _operands(MAX_ROWS + 1, 64, 32, True, "none", True, torch.bfloat16, "cuda")
    launched = []
    with use_kernels("triton"):
        for rows in (1, MAX_ROWS, MAX_ROWS + 1):
            before = triton_launches()
            got = fused_linear(args[0][:rows], *args[1:5], args[5][:rows])
            launched.append(triton_launches() - before)
            torch.testing.assert_close(
                got, linear_reference(args[0][:rows], *args[1:5], args[5][:rows]), **TOLERANCE[torch.bfloat16]
            )
    assert launched == [1, 1, 0]


@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU (runs on the GPU machine)")
def test_a_chain_captured_with_pdl_replays_the_bits_of_launches_without_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each launch reads the previous one's output: with PDL a kernel starts before that output is written,
    so a read placed before its ``gdc_wait`` would show here, in a captured chain replayed many times."""
    import cglab.kernels.pdl as pdl_module
    from cglab.kernels import pdl_enabled

    hopper = torch.cuda.get_device_capability() >= (9, 0)
    assert pdl_enabled() or not hopper, "a Hopper GPU with this Triton should launch with PDL"
    k = 1024
    gen = torch.Generator().manual_seed(0)
    weights = [(torch.randn(k, k, generator=gen) / k**0.5).to("cuda", torch.bfloat16) for _ in range(6)]
    norm = torch.ones(k, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(4, k, generator=gen).to("cuda", torch.bfloat16)

    def chain() -> torch.Tensor:
        h = x
        for i, w in enumerate(weights):  # norm, activation and residual in turn: every read of h after the wait
            h = fused_linear(h, w, norm if i % 2 else None, None, "silu" if i % 3 == 1 else "none", h)
        return h

    with use_kernels("triton"):
        monkeypatch.setattr(pdl_module, "pdl_enabled", lambda: False)
        expected = chain()
        monkeypatch.undo()
        if not hopper:
            pytest.skip("PDL needs a Hopper or newer GPU: the chain above ran without it")
        chain()  # compiles the PDL variant before the capture
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            got = chain()
        for _ in range(50):
            g.replay()
            torch.cuda.synchronize()
            assert torch.equal(got, expected), "a replay with PDL differs from the launches without it"


@pytest.mark.parametrize(("setting", "expected"), [("0", False), ("1", None), (None, None)])
def test_cglab_pdl_turns_pdl_off_and_never_on_where_it_cannot_run(
    setting: str | None, expected: bool | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from cglab import kernels

    if setting is None:
        monkeypatch.delenv(kernels.PDL_ENV, raising=False)
    else:
        monkeypatch.setenv(kernels.PDL_ENV, setting)
    kernels.pdl_enabled.cache_clear()
    try:
        on = kernels.pdl_enabled()
    finally:
        kernels.pdl_enabled.cache_clear()
    possible = kernels.triton_available() and CUDA and torch.cuda.get_device_capability() >= (9, 0)
    assert on == (possible if expected is None else expected)


def test_a_cglab_pdl_that_is_no_switch_is_refused_with_what_to_set(monkeypatch: pytest.MonkeyPatch) -> None:
    from cglab import ConfigError, kernels

    monkeypatch.setenv(kernels.PDL_ENV, "off")
    kernels.pdl_enabled.cache_clear()
    try:
        with pytest.raises(ConfigError, match=r"CGLAB_PDL='off': set it to 0 .* or 1, or unset it"):
            kernels.pdl_enabled()
    finally:
        kernels.pdl_enabled.cache_clear()
