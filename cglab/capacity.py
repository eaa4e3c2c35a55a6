"""Whether what was asked fits the machine, decided from the configs before anything is allocated."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence

import torch

from cglab.compilation_config import CompilationConfig, SpeculativeConfig
from cglab.config import CUDAGraphMode, ToyConfig, dummy_longest_request
from cglab.errors import ConfigError


def available_memory(device: object) -> int:
    """Bytes free to allocate: the GPU's free memory on cuda, the system's available memory on the CPU."""
    if str(device).startswith("cuda") and torch.cuda.is_available():  # a bad device is refused later, by name
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    except (OSError, StopIteration):  # not Linux: all of the physical memory
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") if hasattr(os, "sysconf") else 2**63


def engine_bytes(config: ToyConfig, cc: CompilationConfig, spec: SpeculativeConfig | None = None) -> int:
    """What a ``ModelRunner`` allocates: weights, caches, block tables, persistent and index buffers, one
    forward's activations, each graph's outputs, and the drafter's (``spec``) of each."""
    tokens, reqs, hidden, twice = config.max_num_tokens, config.max_num_reqs, config.hidden_size, 2 if spec else 1
    kinds = [*config.layers, *(([k for _, k in spec.draft_layers] or ["sconv", "attn"]) if spec else [])]
    slots = {"attn": 2, "compressor": 1 + 1 / config.compress_ratio}  # cache rows per slot (else 1)
    floats = (config.vocab_size + config.max_model_len + 12 * hidden * len(kinds)) * hidden
    floats += sum(slots.get(k, 1) for k in kinds) * (config.num_slots + 1) * hidden
    graphs = 0 if cc.cudagraph_mode is CUDAGraphMode.NONE else 2 * sum(cc.cudagraph_capture_sizes)
    floats += (tokens * twice + graphs) * (config.vocab_size + 8 * hidden * len(kinds))
    index = {"sconv": config.sconv_kernel_size, "compressor": config.max_model_len // config.compress_ratio + 5}
    ints = (tokens * 3 + reqs * (3 + config.max_blocks_per_req)) * twice + reqs * len(kinds)
    ints += tokens * sum(index.get(k, 0) for k in dict.fromkeys(kinds))
    return int(floats) * (4 if config.dtype == "float32" else 2) + ints * 8


def fit_problem(config: ToyConfig, cc: CompilationConfig, need: int, free: int, device: object) -> str | None:
    """Why ``cc``'s capture batches do not fit ``config`` (the old split is let through: its failure is the
    lesson), or ``need`` bytes do not fit in ``free``; None if they fit."""
    sizes = cc.cudagraph_capture_sizes if cc.cudagraph_mode is not CUDAGraphMode.NONE else ()
    longest = max((dummy_longest_request(s, config.max_num_reqs) for s in sizes), default=0)
    if max(sizes, default=0) > config.max_num_batched_tokens:
        return f"is above the {config.max_num_batched_tokens} tokens a step may hold (max_num_batched_tokens)"
    if longest > config.max_model_len and not cc.pre_49751_dummy_split:
        return (
            f"puts {longest:,} tokens in one request of its capture batch (of at most {config.max_num_reqs:,}), "
            f"above the {config.max_model_len:,} a request may hold (max_model_len)"
        )
    where = "free on the GPU" if str(device).startswith("cuda") else "of memory available"
    return None if need <= free else f"needs {need / 2**30:,.1f} GiB, above the {free / 2**30:,.1f} GiB {where}"


def check_fits(
    inputs: Mapping[str, int],
    sized: Callable[[Mapping[str, int], CompilationConfig], ToyConfig],
    cc: CompilationConfig,
    device: object,
    spec: SpeculativeConfig | None = None,
    engines: int = 1,
) -> None:
    """Refuse, in one line, ``inputs`` whose engines (``sized(inputs, cc)``, ``engines`` of them, with each
    step's record) do not fit, naming the input to lower and the largest value of it that fits with the
    others as given: a binary search over the same arithmetic."""
    free = available_memory(device)

    def fails(v: Mapping[str, int]) -> str | None:
        try:  # torch sizes tensors with 64-bit integers
            if max(v.values()) >= 2**63:
                return "is beyond the 64-bit integer range"
            largest = v["capture size"]  # captured instead of the larger sizes
            sizes = [s for s in cc.cudagraph_capture_sizes if s < largest] + [largest]
            cut = dataclasses.replace(cc, cudagraph_capture_sizes=sizes)
            config = sized(v, cut)
            need = engines * engine_bytes(config, cut, spec) + v.get("steps", 0) * (16 * config.max_num_reqs + 200)
            return fit_problem(config, cut, need, free, device)
        except ConfigError as exc:
            return str(exc)

    why, largest = fails(inputs), {}
    for name, given in inputs.items() if why else ():
        low, high = 0, given  # low fits (0: nothing does), high does not
        while high - low > 1:
            mid = (low + high) // 2
            low, high = (mid, high) if fails({**inputs, name: mid}) is None else (low, mid)
        largest[name] = low
    if why:
        name = max(inputs, key=lambda n: inputs[n] / largest[n] if largest[n] else 0)
        fix = f"the largest {name} that fits is {largest[name]:,}" if largest[name] else "ask for less"
        raise ConfigError(f"{name} {inputs[name]:,}: {why}; {fix}")


def check_engine_fits(
    config: ToyConfig, cc: CompilationConfig, device: object, spec: SpeculativeConfig | None = None
) -> CompilationConfig:
    """``cc``, once a ``ModelRunner``'s config sizes and largest capture size fit, or a refusal by name (a
    hidden size rounded down to a multiple of the heads)."""
    names, heads = ("max_num_reqs", "max_num_batched_tokens", "max_model_len", "num_blocks"), config.num_heads
    sizes = {"capture size": max((*cc.cudagraph_capture_sizes, 1)), "hidden_size": config.hidden_size}
    hidden = lambda v: max(v["hidden_size"] // heads, 1) * heads  # noqa: E731
    sized = lambda v, cut: dataclasses.replace(config, hidden_size=hidden(v), **{n: v[n] for n in names})  # noqa: E731
    check_fits(sizes | {n: vars(config)[n] for n in names}, sized, cc, device, spec)
    return cc


def check_run_fits(
    sized: Callable[..., ToyConfig],
    cc: CompilationConfig,
    batch_sizes: Sequence[int],
    steps: int,
    max_num_reqs: int | None,
    device: str,
    spec: SpeculativeConfig | None = None,
) -> None:
    """A run's boundary (``run_repro``'s arguments): its engines, each ``sized(cc, batch_sizes, steps,
    max_num_reqs=...)``: graphs and eager reference (and the drafter's shadow)."""
    inputs = {"steps": steps, "batch size": max(batch_sizes), "capture size": max((*cc.cudagraph_capture_sizes, 1))}
    inputs |= {"max_num_reqs": max_num_reqs} if max_num_reqs else {}
    run = lambda v, cut: sized(cut, [v["batch size"]], v["steps"], max_num_reqs=v.get("max_num_reqs"))  # noqa: E731
    check_fits(inputs, run, cc, device, spec, engines=3 if spec else 2)
