"""cglab: how LLM inference engines capture CUDA graphs, and the missing-metadata bug, in a toy engine.

Start with ``ModelRunner`` (one decode step end to end) or ``run_repro`` (the bug, end to end). To read the engine,
go in README's order ("Read the engine"): config, layer_registry, compilation_config, forward_context, buffers,
batch, metadata, layers, model, compilation, cudagraph_utils, runner.
The names below import on first use."""

from __future__ import annotations

# First: under `python -m cglab`, a Ctrl-C during the seconds of importing torch gets one line.
from cglab import _interrupt  # noqa: F401
from cglab._lazy import lazy_exports

__version__ = "0.1.0"

# Where each public name lives; ``from cglab import ModelRunner`` imports ``cglab.runner`` then.
_EXPORTS = {
    "cglab.batch": ("BatchExecutionDescriptor", "CudagraphDispatcher", "InputBatch"),
    "cglab.buffers": ("PAD_SLOT_ID", "BlockTables", "InputBuffers"),
    "cglab.cudagraph_utils": ("CudaGraphManager", "prepare_inputs_to_capture", "prepare_inputs_to_capture_legacy"),
    "cglab.compare": ("state_differences",),
    "cglab.compilation_config": ("CompilationConfig", "SpeculativeConfig"),
    "cglab.config": ("CUDAGraphMode", "ToyConfig"),
    "cglab.cudagraph_support": ("AttentionCGSupport",),
    "cglab.errors": (
        "AddressChangedError",
        "CapacityError",
        "CaptureError",
        "CglabError",
        "ConfigError",
        "MetadataBuildError",
        "MissingMetadataError",
    ),
    "cglab.forward_context": ("get_forward_context", "set_forward_context"),
    "cglab.metadata": ("prepare_attn",),
    "cglab.model": ("ToyTransformer",),
    "cglab.repro": ("ReproResult", "run_repro"),
    "cglab.runner": ("ModelRunner", "StepOutput"),
}

__all__ = sorted(name for names in _EXPORTS.values() for name in names)
__getattr__, __dir__ = lazy_exports("cglab", _EXPORTS, globals(), __all__)
