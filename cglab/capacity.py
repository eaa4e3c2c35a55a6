"""Whether what was asked fits the machine, decided from the configs before anything is allocated: what
an engine will hold (weights, caches, block tables, persistent buffers, capture batches' outputs, the
drafter's) against the memory available, and each capture batch against the requests it must fit in."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence

import torch

from cglab.compilation_config import CompilationConfig, SpeculativeConfig
from cglab.config import CUDAGraphMode, ToyConfig, dummy_longest_request
from cglab.errors import ConfigError

Problem = Callable[[Mapping[str, int]], "str | None"]  # why the inputs do not fit, or None


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
    """What a ``ModelRunner`` of ``config`` (with ``spec``'s drafter) allocates, as arithmetic on the config."""
    tokens, reqs, hidden, length = config.max_num_tokens, config.max_num_reqs, config.hidden_size, config.max_model_len
    slots, ratio, twice = config.num_slots + 1, config.compress_ratio, 2 if spec else 1
    kinds = [*config.layers, *(([k for _, k in spec.draft_layers] or ["sconv", "attn"]) if spec else [])]
    cache = {"attn": 2 * slots, "sconv": slots, "compressor": slots + slots // ratio, "linear_attn": slots}
    index = {"attn": 0, "sconv": config.sconv_kernel_size, "compressor": ratio + 1 + length // ratio, "linear_attn": 0}
    floats = (config.vocab_size + length + 12 * hidden * len(kinds) + sum(cache[k] for k in kinds)) * hidden
    # One forward's activations (the profiling run; the drafter's hidden states), each graph's outputs.
    graphs = 0 if cc.cudagraph_mode is CUDAGraphMode.NONE else 2 * sum(cc.cudagraph_capture_sizes)
    floats += (tokens * twice + graphs) * (config.vocab_size + 8 * hidden * len(kinds))
    # Token ids, positions, slots, sequence lengths, block tables, the builders' index buffers (int64).
    ints = (tokens * 3 + reqs * (3 + config.max_blocks_per_req)) * twice + reqs * len(kinds)
    ints += tokens * sum(index[k] for k in dict.fromkeys(kinds))
    return floats * (4 if config.dtype == "float32" else 2) + ints * 8


def fit_problem(
    config: ToyConfig, cc: CompilationConfig, need: int, free: int, device: str | torch.device
) -> str | None:
    """Why ``config`` cannot hold ``cc``'s capture batches (the old split is let through: its failure is the
    lesson), or why ``need`` bytes do not fit in ``free``; None if nothing is wrong."""
    sizes = cc.cudagraph_capture_sizes if cc.cudagraph_mode is not CUDAGraphMode.NONE else ()
    longest = max((dummy_longest_request(s, config.max_num_reqs) for s in sizes), default=0)
    if max(sizes, default=0) > config.max_num_batched_tokens:
        return f"is above the {config.max_num_batched_tokens} tokens a step may hold (max_num_batched_tokens)"
    if longest > config.max_model_len and not cc.pre_49751_dummy_split:
        return (
            f"puts {longest:,} tokens in one request of its capture batch ({config.max_num_reqs:,} requests), above "
            f"the {config.max_model_len:,} a request may hold (max_model_len)"
        )
    where = "free on the GPU" if str(device).startswith("cuda") else "of memory available"
    return None if need <= free else f"needs {need / 2**30:,.1f} GiB, above the {free / 2**30:,.1f} GiB {where}"


def up_to(cc: CompilationConfig, largest: int) -> CompilationConfig:
    """``cc`` capturing ``largest`` instead of any larger size."""
    sizes = {*(s for s in cc.cudagraph_capture_sizes if s < largest), largest}
    return dataclasses.replace(cc, cudagraph_capture_sizes=tuple(sizes))


def engine_problem(
    config: ToyConfig, cc: CompilationConfig, device: torch.device, spec: SpeculativeConfig | None = None
) -> tuple[dict[str, int], Problem]:
    """A ``ModelRunner``'s inputs (the config's sizes, its largest capture size) and why they may not fit."""
    free, fields = available_memory(device), ("max_num_reqs", "max_num_batched_tokens", "max_model_len", "num_blocks")

    def problem(v: Mapping[str, int]) -> str | None:
        hidden = max(v["hidden_size"] // config.num_heads, 1) * config.num_heads  # a size the heads divide
        sized = dataclasses.replace(config, hidden_size=hidden, **{f: v[f] for f in fields})
        cut = up_to(cc, v["capture size"])
        return fit_problem(sized, cut, engine_bytes(sized, cut, spec), free, device)

    sizes = {f: vars(config)[f] for f in ("hidden_size", *fields)}
    return {"capture size": max((*cc.cudagraph_capture_sizes, 1)), **sizes}, problem


def check_fits(inputs: Mapping[str, int], problem: Problem) -> None:
    """Refuse, in one line, ``inputs`` that have a ``problem`` (which may raise a ConfigError), naming the input
    to lower and the largest value of it that fits with the others as given (a binary search)."""

    def fails(values: Mapping[str, int]) -> str | None:
        try:  # torch sizes tensors with 64-bit integers
            return "is beyond the 64-bit integer range" if max(values.values()) >= 2**63 else problem(values)
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


def run_problem(
    sized: Callable[..., ToyConfig],
    cc: CompilationConfig,
    batch_sizes: Sequence[int],
    steps: int,
    max_num_reqs: int | None,
    device: str,
    spec: SpeculativeConfig | None = None,
) -> tuple[dict[str, int], Problem]:
    """A run's inputs (``run_repro``'s) and why they may not fit: its engines (graphs, eager reference, the
    drafter's shadow), each ``sized(cc, batch_sizes, steps, max_num_reqs=...)``, and what it keeps per step."""
    engines, free = 3 if spec else 2, available_memory(device)
    inputs = {
        "steps": steps,
        "batch size": max(batch_sizes),
        "capture size": max(cc.cudagraph_capture_sizes, default=1),
    }
    inputs |= {"max_num_reqs": max_num_reqs} if max_num_reqs else {}

    def problem(v: Mapping[str, int]) -> str | None:
        cut = up_to(cc, v["capture size"])
        config = sized(cut, [v["batch size"]], v["steps"], max_num_reqs=v.get("max_num_reqs"))
        need = engines * engine_bytes(config, cut, spec) + v["steps"] * (16 * v["batch size"] + 200)
        return fit_problem(config, cut, need, free, device)

    return inputs, problem
