"""Padding and dispatch: which graph serves which batch."""

import pytest

from cglab import BatchExecutionDescriptor, CUDAGraphMode, CudagraphDispatcher
from cglab.config import default_capture_sizes

NONE, PW, FULL = CUDAGraphMode.NONE, CUDAGraphMode.PIECEWISE, CUDAGraphMode.FULL


def test_piecewise_pads_tokens_not_requests():
    d = CudagraphDispatcher(PW, [1, 2, 4, 8], max_num_reqs=8)
    assert d.dispatch(3, 3, uniform_decode=True) == BatchExecutionDescriptor(PW, 4, None)
    assert d.dispatch(2, 7, uniform_decode=False) == BatchExecutionDescriptor(PW, 8, None)


def test_full_pads_tokens_and_requests():
    d = CudagraphDispatcher(FULL, [1, 2, 4, 8], max_num_reqs=8)
    assert d.dispatch(3, 3, uniform_decode=True) == BatchExecutionDescriptor(FULL, 4, 4)
    assert d.dispatch(5, 5, uniform_decode=True) == BatchExecutionDescriptor(FULL, 8, 8)


def test_too_large_or_mixed_runs_eagerly():
    d = CudagraphDispatcher(FULL, [1, 2, 4], max_num_reqs=8)
    assert d.dispatch(5, 5, uniform_decode=True).cg_mode is NONE
    assert d.dispatch(2, 4, uniform_decode=False).cg_mode is NONE  # a FULL graph is a decode graph
    assert CudagraphDispatcher(PW, [1, 2, 4], 8).dispatch(3, 9, False) == BatchExecutionDescriptor(NONE, 9, 3)


def test_full_and_piecewise_policy():
    d = CudagraphDispatcher(CUDAGraphMode.FULL_AND_PIECEWISE, [1, 2, 4], max_num_reqs=4)
    assert d.dispatch(2, 2, uniform_decode=True).cg_mode is FULL
    assert d.dispatch(2, 3, uniform_decode=False).cg_mode is PW


def test_capture_order_piecewise_first_then_full_largest_first():
    d = CudagraphDispatcher(CUDAGraphMode.FULL_AND_PIECEWISE, [1, 2, 4, 8], max_num_reqs=4)
    order = [(x.cg_mode, x.num_tokens) for x in d.capture_descriptors()]
    assert order == [(PW, 8), (PW, 4), (PW, 2), (PW, 1), (FULL, 4), (FULL, 2), (FULL, 1)]


def test_none_policy_captures_nothing():
    assert CudagraphDispatcher(NONE, [1, 2], 2).capture_descriptors() == []


def test_default_capture_sizes_ladder():
    assert default_capture_sizes(40) == (1, 2, 4, 8, 16, 24, 32, 40)
    assert default_capture_sizes(300)[-3:] == (256, 272, 288)


@pytest.mark.parametrize("mode", ["FULL", "full", " Piecewise "])
def test_mode_parse(mode):
    assert CUDAGraphMode.parse(mode) in (FULL, PW)
