"""Where a benchmark's numbers come from: device, driver, versions, date, host CPU, and how each
column was measured. Written beside every result (``OUT.json``), so recorded GPU data carries its
environment.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from datetime import datetime, timezone
from typing import Any

import torch

__all__ = ["collect_environment"]


def collect_environment(device: torch.device) -> dict[str, Any]:
    """Where the numbers come from: device, driver, versions, date, host CPU and how things were timed."""
    cuda = device.type == "cuda"
    env: dict[str, Any] = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "backend": "cuda" if cuda else "sim",
        "device": device.type,
        "device_name": torch.cuda.get_device_name(device) if cuda else f"CPU ({_host_cpu()})",
        "driver": _nvidia_driver(device) if cuda else None,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "host_cpu": _host_cpu(),
        "cpu_count": os.cpu_count(),
        "torch_threads": 1 if not cuda else torch.get_num_threads(),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
    }
    if cuda:
        props = torch.cuda.get_device_properties(device)
        env["gpu"] = {
            "capability": f"{props.major}.{props.minor}",
            "memory_gib": round(props.total_memory / 2**30, 1),
            "multiprocessors": props.multi_processor_count,
        }
        env["timer"] = "CUDA events around ModelRunner.execute (device); time.perf_counter_ns incl. sync (host)"
        env["kernel_floor"] = "torch.profiler: summed durations of the step's kernels, copies and fills"
        env["launches"] = "torch.profiler: distinct CUDA correlation ids among the step's GPU activities"
        env["kernel_span"] = "torch.profiler: first kernel start to last kernel end (floor plus idle gaps)"
        env["enqueue"] = "time.perf_counter_ns until ModelRunner.execute returns: launching, before waiting"
    else:
        env["timer"] = "time.perf_counter_ns around ModelRunner.execute (device and host columns are the same)"
        env["kernel_floor"] = "torch.profiler: summed self CPU time of aten ops (no GPU: semantics only)"
        env["launches"] = "counted: graph segments plus work-doing aten ops outside graphs"
        env["note"] = "CPU simulator of CUDA graphs: semantics only, not GPU speed"
    return env


def _host_cpu() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def _nvidia_driver(device: torch.device) -> str | None:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    index = device.index if device.index is not None else torch.cuda.current_device()
    try:
        out = subprocess.run(
            [smi, "--query-gpu=driver_version", "--format=csv,noheader", f"--id={index}"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None
