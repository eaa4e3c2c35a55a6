"""``cglab::fused_linear``: its aten body is the MLP's own arithmetic (bit for bit on the CPU); inside
``fused_linears`` every linear of the model is one launch of the op, which changes no bit on the CPU; on a
GPU its Triton kernel matches the aten body at 1-16 rows for every flag combination, fp32 and bf16, and a
row's bits do not depend on how many rows share the launch."""

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
    for k, n in ((1024, 4096), (2048, 1024), (32, 64), (10, 24)):
        full = _operands(MAX_ROWS, k, n, norm, act, residual, dtype, "cuda")
        with use_kernels("triton"):
            padded = fused_linear(*full)
        for rows in range(1, MAX_ROWS + 1):
            args = (full[0][:rows], *full[1:5], None if full[5] is None else full[5][:rows])
            with use_kernels("triton"):
                got = fused_linear(*args)
            torch.testing.assert_close(got, linear_reference(*args), **TOLERANCE[dtype])
            assert torch.equal(got, padded[:rows]), f"rows {rows}: a row's bits depend on the batch"
