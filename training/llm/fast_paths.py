"""The FSDP2 fast paths of the language-model trainer, each behind a job option, and a report of which were taken.

    --activation-checkpointing --ac-every K   recompute every K-th decoder layer only (selective: K = 1 is all of
                                              them, Accelerate's own path; K = 2 saves half the recompute for
                                              about half the activation memory)
    --prefetch N                              explicit FSDP2 prefetch: each decoder layer starts the all-gathers of
                                              the next N layers in forward (the previous N in backward) instead of
                                              FSDP2's implicit one-ahead (torch's FSDP2 `set_modules_to_*_prefetch`)
    --reshard-last-layer false                keep the last decoder layer gathered from forward into backward,
                                              which uses it first (one all-gather less per micro batch, one layer
                                              of bf16 weights more in memory; FSDP2 tutorial's advice)
    --reduce-dtype fp32                       under bf16: reduce-scatter gradients in fp32 (FSDP2
                                              MixedPrecisionPolicy; Accelerate's bf16 default reduces in bf16)
    --fused-adamw true|false                  AdamW's fused kernel (default on GPUs) or the multi-tensor foreach one
    --attention flash|math                    pin scaled_dot_product_attention to one backend (default `sdpa`:
                                              PyTorch picks; `flash` fails where FlashAttention cannot run)
    --compile true                            torch.compile each decoder layer in place (regional compilation)
                                              before FSDP2 shards it and torch's checkpoint wrappers wrap it;
                                              identical layers share one compiled graph

None changes what a step computes except --reduce-dtype, --fused-adamw, --attention and --compile (rounding only;
--compile: inductor's fused kernels); the tests hold each to the plain path's losses on CPU
(tests/e2e/test_fast_paths.py). The defaults are the plain paths: no GPU was lent when these were written to choose
otherwise from a measurement (docs/performance.md).

`taken(model)` reads back from the prepared model what FSDP2 and the wrappers actually hold (not the flags), with
the kernel the passes are pinned to, for the run's summary.
"""

from __future__ import annotations

import contextlib

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

ATTENTION_BACKENDS = {"flash": SDPBackend.FLASH_ATTENTION, "math": SDPBackend.MATH}


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The decoder layers of a (possibly wrapped) Hugging Face causal LM, in order: every model type trainkit trains
    (training/decoders.py `DECODER_TYPES`) holds them as `model.model.layers`."""
    inner = model
    while not hasattr(inner, "model") or not hasattr(inner.model, "layers"):
        inner = inner.module  # DDP / compile wrappers
    return list(inner.model.layers)


def checkpoint_every(model: torch.nn.Module, every: int) -> list[int]:
    """Wrap every `every`-th decoder layer (0, every, 2*every, ...) for recomputation in backward, before FSDP2
    shards it (as Accelerate's own activation checkpointing does for all of them); returns the wrapped indices."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    layers = model.model.layers
    wrapped = list(range(0, len(layers), every))
    for index in wrapped:
        layers[index] = checkpoint_wrapper(layers[index], preserve_rng_state=False)
    return wrapped


def compile_layers(model: torch.nn.Module) -> None:
    """torch.compile every decoder layer in place (`nn.Module.compile`: the module stays itself, so checkpoint
    wrappers, FSDP2 and the state dict's keys see the same module as without)."""
    for layer in model.model.layers:
        layer.compile()


def compiled_graphs() -> int:
    """Graphs dynamo built in this process so far (its own counter): `compiled_layers` says what was asked for,
    this says the compiler ran (0 if dynamo was disabled or fell back to eager)."""
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]


def schedule(model: torch.nn.Module, prefetch: int, reshard_last_layer: bool) -> None:
    """Explicit prefetch over the decoder layers and the last layer's reshard-after-forward, on a model FSDP2
    already sharded (each decoder layer an FSDPModule)."""
    from torch.distributed.fsdp import FSDPModule

    layers = [_fsdp_module(layer) for layer in decoder_layers(model)]
    if not all(isinstance(layer, FSDPModule) for layer in layers):
        return  # NO_SHARD (DDP) or one process: nothing is gathered
    if prefetch:
        for index, layer in enumerate(layers):
            ahead = layers[index + 1 : index + 1 + prefetch]
            behind = layers[max(0, index - prefetch) : index][::-1]
            if ahead:
                layer.set_modules_to_forward_prefetch(ahead)
            if behind:
                layer.set_modules_to_backward_prefetch(behind)
    if not reshard_last_layer:
        layers[-1].set_reshard_after_forward(False)


def _fsdp_module(layer: torch.nn.Module) -> torch.nn.Module:
    """The FSDP-sharded module of a decoder layer: the layer, or the one inside a checkpoint wrapper."""
    return getattr(layer, "_checkpoint_wrapped_module", layer)


def _config_of(model: torch.nn.Module):
    inner = model
    while not hasattr(inner, "config"):
        inner = inner.module
    return inner.config


def attention(backend: str):
    """The context the forward runs in: `sdpa` leaves the choice to PyTorch, else that backend only."""
    if backend == "sdpa":
        return contextlib.nullcontext()
    return sdpa_kernel(ATTENTION_BACKENDS[backend])


def taken(model: torch.nn.Module, attention_backend: str) -> dict:
    """What the prepared model holds: checkpointed layers (torch's checkpoint wrapper, or Hugging Face's own
    checkpointing on the DDP path), FSDP2's prefetch lists, which layers reshard after forward, the mixed-precision
    policy of the sharded layers; `attention` is the kernel the passes are pinned to (`sdpa`: PyTorch's choice).
    FSDP2's side is read from its private state (torch 2.11-2.13): should that move, the report says so and the
    run goes on."""
    layers = decoder_layers(model)
    checkpointed = [
        i
        for i, layer in enumerate(layers)
        if hasattr(layer, "_checkpoint_wrapped_module") or getattr(layer, "gradient_checkpointing", False)
    ]
    compiled = [i for i, layer in enumerate(layers) if getattr(_fsdp_module(layer), "_compiled_call_impl", None)]
    report: dict = {"checkpointed_layers": checkpointed, "compiled_layers": compiled, "attention": attention_backend}
    # the attention implementation the model calls: a pinned SDPA kernel binds only where this is "sdpa"
    report["attention_implementation"] = getattr(_config_of(model), "_attn_implementation", None)
    try:
        report |= _fsdp_report(layers)
    except (AttributeError, IndexError, TypeError) as error:
        report["fsdp"] = f"not readable on torch {torch.__version__}: {error!r}"
    return report


def optimizer_kernel(optimizer: torch.optim.Optimizer) -> str:
    """`fused`, `foreach` or `for-loop`: the kernel the (possibly Accelerate-wrapped) optimizer was built with."""
    defaults = getattr(optimizer, "optimizer", optimizer).defaults
    return "fused" if defaults.get("fused") else "foreach" if defaults.get("foreach") else "for-loop"


def _fsdp_report(layers: list[torch.nn.Module]) -> dict:
    from torch.distributed.fsdp import FSDPModule

    report: dict = {}
    sharded = [_fsdp_module(layer) for layer in layers]
    if all(isinstance(layer, FSDPModule) for layer in sharded):
        states = [layer._get_fsdp_state() for layer in sharded]
        groups = [state._fsdp_param_group for state in states]
        policy = groups[0].mp_policy
        report |= {
            "forward_prefetch": [len(state._states_to_forward_prefetch) for state in states],
            "backward_prefetch": [len(state._states_to_backward_prefetch) for state in states],
            "reshard_after_forward": [group.post_forward_mesh_info is not None for group in groups],
            "param_dtype": str(policy.param_dtype).removeprefix("torch.") if policy.param_dtype else None,
            "reduce_dtype": str(policy.reduce_dtype).removeprefix("torch.") if policy.reduce_dtype else None,
        }
    return report
