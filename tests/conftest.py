"""Shared fixtures. Tests run on the CPU simulator here; the `cuda` parametrisations run on a GPU."""

from __future__ import annotations

import pytest
import torch

from cglab.config import ToyConfig

# The toy's matrices are tiny: extra intra-op threads only spin, and on a busy CI machine (2 cores,
# parallel CLI subprocesses) they made steps 30x slower.
torch.set_num_threads(1)

BACKEND_PARAMS = [
    pytest.param("cpu", id="sim"),
    pytest.param("cuda", id="cuda", marks=pytest.mark.skipif(
        not torch.cuda.is_available(), reason="needs a CUDA GPU (runs on the GPU machine)")),
]


@pytest.fixture(params=BACKEND_PARAMS)
def device(request: pytest.FixtureRequest) -> str:
    """Run the test on the simulator (device cpu) and, where a GPU exists, on real CUDA graphs."""
    return request.param


@pytest.fixture
def small_config() -> ToyConfig:
    return ToyConfig(layers=("sconv", "attn", "compressor", "attn"), max_num_reqs=8, max_model_len=48)
