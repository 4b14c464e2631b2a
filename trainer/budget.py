"""The token budget of a micro-batch, activation checkpointing, and running out of memory as a user error.

Default budget: a share of the memory free when training starts (GPU: the device's free memory
after the model, its gradients and Adam's two moments; CPU: MemAvailable, split between the local
processes) divided by an estimate of the training memory per token of a packed row. Per token and
layer a forward keeps about 12·hidden + 4·intermediate values (projections, norms, attention
output, MLP); with activation checkpointing only the layer input (hidden) stays, plus one layer's
values while it is recomputed. The estimate is doubled for allocator slack and the fused head's
buffers; bench/long_sessions.py measures the real slope."""

from __future__ import annotations

import os
from contextlib import contextmanager

import torch

from harnessrl.errors import UserError

MEMORY_SHARE = 0.4  # of the free memory for a micro-batch's activations; the rest: allocator, other processes
LONG_SAMPLE = 8192  # tokens: from this sample length on, activation checkpointing is on unless configured
MIN_BUDGET, MAX_BUDGET = 4096, 1 << 20


def bytes_per_token(config, dtype_bytes: int, checkpointing: bool) -> int:
    c = config.get_text_config() if hasattr(config, "get_text_config") else config
    h, i, layers = c.hidden_size, getattr(c, "intermediate_size", 4 * c.hidden_size), c.num_hidden_layers
    per_layer = 2 * h if checkpointing else 12 * h + 4 * i
    return 2 * (dtype_bytes * (layers * per_layer + 12 * h + 4 * i) + 64)  # + 64: ids, positions, labels, log-probs


def free_memory(device: torch.device, model: torch.nn.Module) -> int:
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        trainable = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
        on_device = next(model.parameters()).device.type == "cuda"
        weights = 0 if on_device else sum(p.numel() * p.element_size() for p in model.parameters())
        return max(free - weights - 3 * trainable, 0)  # gradients + Adam's two moments
    try:
        with open("/proc/meminfo") as f:
            avail = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    except (OSError, StopIteration):
        avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return avail // int(os.environ.get("LOCAL_WORLD_SIZE", "1"))


def default_budget(model: torch.nn.Module, device: torch.device, checkpointing: bool) -> int:
    dtype_bytes = next(model.parameters()).element_size()
    tokens = int(MEMORY_SHARE * free_memory(device, model)) // bytes_per_token(model.config, dtype_bytes, checkpointing)
    return max(MIN_BUDGET, min(MAX_BUDGET, tokens // 1024 * 1024))


def _is_oom(exc: BaseException) -> bool:
    return isinstance(exc, (torch.OutOfMemoryError, MemoryError)) or (
        isinstance(exc, RuntimeError) and ("can't allocate memory" in str(exc) or "not enough memory" in str(exc)))


@contextmanager
def memory_guard(describe):
    """An allocation failure inside becomes a UserError saying what did not fit (`describe()`) and what to change."""
    try:
        yield
    except Exception as exc:
        if not _is_oom(exc):
            raise
        raise UserError(f"out of memory training {describe()}: lower --max-tokens-per-microbatch, "
                        "or cap the sample length with --max-sample-tokens") from None
