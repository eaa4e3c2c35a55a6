"""Programmatic dependent launch (PDL) in every Triton kernel of the toy: a kernel starts while the one before
it runs and waits only before it reads that kernel's outputs; its start-up (the fused linear: its weights) overlaps."""

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait  # Triton 3.3 and newer

from cglab.kernels import pdl_enabled


@triton.jit
def wait_for_previous_kernels(PDL: tl.constexpr):
    # Without PDL (an older GPU, CGLAB_PDL=0, the interpreter) nothing: the launch itself waited.
    if PDL:
        gdc_wait()  # from here on, what the previous kernels wrote is visible
        gdc_launch_dependents()  # the next kernel may start; its own wait keeps it behind this one


def pdl_options() -> dict[str, bool]:
    """A launch's PDL arguments: the kernels' ``PDL`` switch and Triton's ``launch_pdl``."""
    return {"PDL": pdl_enabled(), "launch_pdl": pdl_enabled()}
