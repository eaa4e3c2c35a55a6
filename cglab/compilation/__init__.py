"""Compiled PIECEWISE: torch.compile with a backend that splits the model at attention.

vLLM: ``vllm/compilation/``. ``CompiledModel`` compiles once with a symbolic token count;
``CglabBackend`` splits the FX graph at ``splitting_ops`` and wraps each piece in a
``CUDAGraphWrapper``, which captures on first use for each batch descriptor and replays after.
"""

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
