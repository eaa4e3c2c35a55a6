"""Compiled PIECEWISE (vLLM: ``vllm/compilation/``): ``CompiledModel`` compiles once, ``CglabBackend`` splits
the FX graph at ``splitting_ops`` and wraps each piece in a ``CUDAGraphWrapper``."""

from cglab.compilation.backends import CglabBackend, SplitItem, split_graph
from cglab.compilation.cuda_graph import CUDAGraphWrapper, cudagraph_capturing_enabled
from cglab.compilation.wrapper import CompiledModel
from cglab.custom_ops import direct_register_custom_op, registered_op_names

__all__ = [
    "CUDAGraphWrapper",
    "CglabBackend",
    "CompiledModel",
    "SplitItem",
    "cudagraph_capturing_enabled",
    "direct_register_custom_op",
    "registered_op_names",
    "split_graph",
]
