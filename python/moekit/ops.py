"""The ops on a MoeSpec: x of any leading dimensions ([..., H]), the spec from any config form.

Weights follow vLLM's fused_experts contract (include/moekit/moe.h): w13 [n, 2I, H] bf16 (gate
rows first, then up rows), w2 [n, H, I] bf16, n experts from global id expert_offset; router
[E(+1), H] in the spec's router dtype (bf16, or fp32 for MiniMax-M2/M3 and DeepSeek-V4; row E is
a gated shared expert's gate, Qwen2-MoE); biases fp32. y has x's dtype; moekit computes from x
rounded to bf16 with fp32 accumulation.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from .spec import ConfigLike, as_spec


def route(router_logits: torch.Tensor, spec: ConfigLike,
          correction_bias: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """(topk_ids int32 [..., k], topk_weights fp32 [..., k]) from router logits [..., E(+1)]
    (router bias already added), by the spec's routing (scoring, correction bias, groups,
    renormalisation, routed scaling)."""
    s = as_spec(spec)
    lead = router_logits.shape[:-1]
    ids, weights = torch.ops.moekit.route(
        router_logits.reshape(-1, router_logits.shape[-1]), correction_bias, s.json)
    return ids.reshape(*lead, -1), weights.reshape(*lead, -1)


def fused_experts(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_ids: torch.Tensor,
                  topk_weights: torch.Tensor, spec: ConfigLike, b13: Optional[torch.Tensor] = None,
                  b2: Optional[torch.Tensor] = None, expert_offset: int = 0) -> torch.Tensor:
    """y[t] = sum_j topk_weights[t, j] * expert_{topk_ids[t, j]}(x[t]) over the experts w13/w2
    hold (global ids [expert_offset, expert_offset + n)); pairs routed elsewhere add nothing, so
    ranks holding slices sum their y. The spec gives the activation and its parameters."""
    s = as_spec(spec)
    h = x.shape[-1]
    k = topk_ids.shape[-1]
    y = torch.ops.moekit.fused_experts(
        x.reshape(-1, h), w13, w2, topk_ids.reshape(-1, k), topk_weights.reshape(-1, k), s.json,
        b13, b2, expert_offset)
    return y.reshape(x.shape)


def fused_experts_mx(x: torch.Tensor, w13_mx: torch.Tensor, w13_mx_scale: torch.Tensor,
                     w2_mx: torch.Tensor, w2_mx_scale: torch.Tensor, topk_ids: torch.Tensor,
                     topk_weights: torch.Tensor, spec: ConfigLike, format: str = "mxfp4",
                     b13: Optional[torch.Tensor] = None, b2: Optional[torch.Tensor] = None,
                     expert_offset: int = 0) -> torch.Tensor:
    """fused_experts on OCP MX experts (CPU tensors; W4A16 / W8A16, each weight dequantised
    exactly): uint8 w13_mx [n, 2I, H/2] (format "mxfp4": two e2m1 a byte, the even column in the
    low nibble) or [n, 2I, H] ("mxfp8": e4m3fn), gate rows first; w13_mx_scale [n, 2I, H/32]
    e8m0 exponent bytes (2^(s - 127)); w2_mx [n, H, I/2 or I] and w2_mx_scale [n, H, I/32]."""
    s = as_spec(spec)
    h = x.shape[-1]
    k = topk_ids.shape[-1]
    y = torch.ops.moekit.fused_experts_mx(
        x.reshape(-1, h), w13_mx, w13_mx_scale, w2_mx, w2_mx_scale, topk_ids.reshape(-1, k),
        topk_weights.reshape(-1, k), format, s.json, b13, b2, expert_offset)
    return y.reshape(x.shape)


def moe_layer(x: torch.Tensor, spec: ConfigLike, router_weight: torch.Tensor, w13: torch.Tensor,
              w2: torch.Tensor, *, router_bias: Optional[torch.Tensor] = None,
              correction_bias: Optional[torch.Tensor] = None, b13: Optional[torch.Tensor] = None,
              b2: Optional[torch.Tensor] = None, shared_w13: Optional[torch.Tensor] = None,
              shared_w2: Optional[torch.Tensor] = None, expert_offset: int = 0) -> torch.Tensor:
    """The whole MoE layer: router GEMM, routing, experts, combine, and the shared expert
    (shared_w13 [2 Is, H] gate rows first, shared_w2 [H, Is]) when the spec has one."""
    s = as_spec(spec)
    h = x.shape[-1]
    y = torch.ops.moekit.moe_layer(
        x.reshape(-1, h), router_weight, router_bias, correction_bias, w13, w2, b13, b2,
        shared_w13, shared_w2, s.json, expert_offset)
    return y.reshape(x.shape)


# The status word's bits (include/moekit/moe.h: MoeStatus::word).
STATUS_EXPERT_ID_OUT_OF_RANGE = 1


def _device(device) -> torch.device:
    d = torch.device(device)
    if d.type == "cuda" and d.index is None:
        d = torch.device("cuda", torch.cuda.current_device())
    return d


def read_status(device="cpu", clear: bool = True) -> int:
    """The status word of the ops' calls on `device` since it was last cleared (0: nothing seen):
    STATUS_EXPERT_ID_OUT_OF_RANGE when a pair's expert id was outside [0, E). A GPU call cannot
    raise without synchronising, so it sets the word instead (its outputs are then undefined)
    and this reads it, synchronising the current stream; a CPU call raises at once and sets the
    same bits, so one check serves both. clear: reset the word after reading."""
    return int(torch.ops.moekit.read_status(_device(device), clear))


def check_status(device="cpu", clear: bool = True) -> None:
    """Raises RuntimeError naming what read_status(device) reports, if anything."""
    word = read_status(device, clear)
    if word & STATUS_EXPERT_ID_OUT_OF_RANGE:
        raise RuntimeError(f"moekit: a call on {_device(device)} saw an expert id outside [0, E) "
                           "in its routing (its pair was dropped; the outputs of that call are "
                           "undefined)")
    if word:
        raise RuntimeError(f"moekit: status word {word:#x} on {_device(device)}")
