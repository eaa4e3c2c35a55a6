"""cglab: how LLM inference engines capture CUDA graphs, and the missing-metadata bug, in a toy engine.

Start with ``ModelRunner`` (one decode step end to end) or ``run_repro`` (the bug, end to end).
"""

# First: under `python -m cglab`, a Ctrl-C during the seconds of importing torch below gets one line.
from cglab import _interrupt  # noqa: F401
from cglab.batch import BatchExecutionDescriptor, CudagraphDispatcher, InputBatch
from cglab.buffers import PAD_SLOT_ID, BlockTables, InputBuffers
from cglab.cudagraph_utils import CudaGraphManager, prepare_inputs_to_capture, prepare_inputs_to_capture_legacy
from cglab.config import CUDAGraphMode, ToyConfig
from cglab.cudagraph_support import AttentionCGSupport
from cglab.errors import (
    AddressChangedError,
    CapacityError,
    CaptureError,
    CglabError,
    ConfigError,
    MetadataBuildError,
    MissingMetadataError,
)
from cglab.forward_context import get_forward_context, set_forward_context
from cglab.metadata import prepare_attn
from cglab.model import ToyTransformer
from cglab.repro import ReproResult, run_repro
from cglab.runner import ModelRunner, StepOutput, state_differences

__version__ = "0.1.0"

__all__ = [
    "PAD_SLOT_ID", "AddressChangedError", "AttentionCGSupport", "BatchExecutionDescriptor", "BlockTables",
    "CUDAGraphMode", "CapacityError", "CaptureError", "CglabError", "ConfigError", "CudaGraphManager",
    "CudagraphDispatcher", "InputBatch", "InputBuffers", "MetadataBuildError", "MissingMetadataError", "ModelRunner",
    "ReproResult", "StepOutput", "ToyConfig", "ToyTransformer", "get_forward_context", "prepare_attn",
    "prepare_inputs_to_capture", "prepare_inputs_to_capture_legacy", "run_repro", "set_forward_context",
    "state_differences",
]
