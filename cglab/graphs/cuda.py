"""The real CUDA backend: raw ``torch.cuda.CUDAGraph`` segments on one side stream (no ``torch.cuda``
at import, for CPU-only builds)."""

from __future__ import annotations

import contextlib
import gc
import warnings
from collections.abc import Iterator
from typing import Any

import torch

from cglab.errors import CaptureError, ConfigError
from cglab.graphs.capture_driver import CaptureSession, GraphBackend, GraphSegment
from cglab.graphs.ops import _host_sync_error
from cglab.kernels import triton_launches

__all__ = ["CudaBackend", "CudaSegment"]

_FIX_ANY = (
    "a CUDA graph cannot make the host wait for the device during capture (`.item()`, "
    "`bool(tensor)`, printing, data-dependent shapes, host<->device copies, "
    "torch.cuda.synchronize()); keep values on the device (use torch.where / masking) or "
    "compute them before capture"
)


# One side stream per device, shared by every backend: cuBLAS keeps a workspace per (handle,
# stream) until the process ends, so a stream per backend would grow GPU memory with every runner.
_SIDE_STREAMS: dict[torch.device, torch.cuda.Stream] = {}


class CudaSegment(GraphSegment):
    """One ``torch.cuda.CUDAGraph``; replay launches it on the current stream."""

    def __init__(self, graph: torch.cuda.CUDAGraph, num_ops: int, backend: CudaBackend) -> None:
        super().__init__(num_ops)
        self._graph: torch.cuda.CUDAGraph | None = graph
        self._backend = backend
        backend._graphs_in_pool += 1

    def replay(self) -> None:
        assert self._graph is not None, "CapturedGraph.replay refuses a reset graph"
        self._graph.replay()

    def reset(self) -> None:
        if self._graph is not None:
            self._graph.reset()
            self._graph = None
            self._backend._release_pool_use()


class _CudaSession(CaptureSession):
    def __init__(self, backend: CudaBackend, breakable: bool) -> None:
        super().__init__(breakable)
        self._backend = backend
        self._graph: torch.cuda.CUDAGraph | None = None
        self._launches_before = 0

    @contextlib.contextmanager
    def scope(self) -> Iterator[None]:
        # Work queued before the capture must not be mistaken for captured work.
        torch.cuda.synchronize(self._backend.device)
        # A graph left in a reference cycle (a failed capture's traceback holds one) is freed whenever
        # Python's cycle collector runs; torch's reset of a graph is not allowed while a stream captures,
        # and a test's capture was seen invalidated that way. So the collector waits until the session
        # ends; what it would have freed is freed after it.
        gc_was_enabled = gc.isenabled()
        gc.disable()
        try:
            with self._backend._on_side_stream():
                yield
        except RuntimeError as exc:
            # torch raises AcceleratorError (a RuntimeError) with CUDA's text, e.g. "operation not
            # permitted when stream is capturing" or "... a previous error during capture".
            if isinstance(exc, CaptureError) or "captur" not in str(exc).lower():
                raise
            first_line = str(exc).strip().splitlines()[0]
            raise _host_sync_error(f"torch: {first_line}", _FIX_ANY) from exc
        finally:
            if gc_was_enabled:
                gc.enable()

    def start_segment(self, index: int) -> None:
        self._graph = torch.cuda.CUDAGraph()
        self.count = 0
        self._launches_before = triton_launches()
        self._graph.capture_begin(pool=self._backend.pool)

    def finish_segment(self) -> GraphSegment:
        graph, self._graph = self._graph, None
        assert graph is not None, "no segment is open"
        try:
            graph.capture_end()  # torch itself warns "The CUDA Graph is empty" if it is
        except BaseException:
            self._backend._forget_pool_after_failure(graph)
            raise
        # A Triton launch is no aten op, so the counter misses it: the kernels package counts them.
        launched = triton_launches() - self._launches_before
        return CudaSegment(graph, self.count + launched, self._backend)

    def abandon_segment(self) -> None:
        graph, self._graph = self._graph, None
        if graph is None:
            return
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # an abandoned graph being empty is no news
                graph.capture_end()
        except Exception:
            # CUDA invalidated the capture (a host sync reached it): the stream capture is over,
            # but torch's allocator may still route this pool to it.
            self._backend._forget_pool_after_failure(graph)
        else:
            graph.reset()
            if self._backend._graphs_in_pool == 0:  # it was the pool's only user: see _release_pool_use
                self._backend._pool = None


class CudaBackend(GraphBackend):
    """Real CUDA graphs: capture on a side stream, replay on the current one (in program order); one
    shared memory pool, as vLLM's, safe because one graph runs at a time."""

    name = "cuda"

    def __init__(self, device: str | torch.device | None = None) -> None:
        dev = torch.device("cuda") if device is None else torch.device(device)
        if dev.type != "cuda" or not torch.cuda.is_available():
            raise ConfigError(
                f"graph backend 'cuda' needs a visible CUDA GPU and device 'cuda' (got {dev}); "
                "use graph backend 'sim', the CPU simulator, otherwise"
            )
        if dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
        self.device = dev
        self.label = f"CUDA graphs on {dev} ({torch.cuda.get_device_name(dev)})"
        self._pool: Any = None
        self._graphs_in_pool = 0

    @property
    def pool(self) -> Any:
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        return self._pool

    def warmup_context(self) -> contextlib.AbstractContextManager[Any]:
        # Lazy initialisation (cuBLAS handles, workspaces) then happens on the stream the capture will use.
        return self._on_side_stream()

    def synchronize(self) -> None:
        torch.cuda.synchronize(self.device)

    def memory_in_use(self) -> int:
        """Device memory in use as the driver counts it, after the caching allocator returned its free blocks."""
        torch.cuda.empty_cache()
        free, total = torch.cuda.mem_get_info(self.device)
        return total - free

    def _session(self, breakable: bool) -> CaptureSession:
        return _CudaSession(self, breakable)

    @contextlib.contextmanager
    def _on_side_stream(self) -> Iterator[None]:
        """Capture and warmup run on a side stream: capture may not use the default stream."""
        if self.device not in _SIDE_STREAMS:
            _SIDE_STREAMS[self.device] = torch.cuda.Stream(device=self.device)
        stream = _SIDE_STREAMS[self.device]
        current = torch.cuda.current_stream(self.device)
        stream.wait_stream(current)  # see the inputs the current stream wrote
        try:
            with torch.cuda.device(self.device), torch.cuda.stream(stream):
                yield
        finally:
            current.wait_stream(stream)  # later work on the current stream sees our writes

    def _release_pool_use(self) -> None:
        """Torch frees a private pool with the last graph that uses it, and refuses a later capture
        into that pool's handle: once no graph uses the pool, the next capture gets a new one."""
        self._graphs_in_pool -= 1
        if self._graphs_in_pool == 0:
            self._pool = None

    def _forget_pool_after_failure(self, graph: torch.cuda.CUDAGraph) -> None:
        """After a capture CUDA aborted, torch may leave this pool 'being captured into': try to unregister
        it, and give later graphs a fresh pool."""
        pool, self._pool = self._pool, None
        for name in ("_cuda_endAllocateToPool", "_cuda_endAllocateCurrentStreamToPool"):
            end = getattr(torch._C, name, None)
            if pool is None or end is None:
                continue
            try:
                end(self.device.index, pool)
                break
            except Exception:  # already unregistered, or another torch version's signature
                continue
        with contextlib.suppress(Exception):
            graph.reset()
