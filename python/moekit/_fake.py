"""Fake (meta) kernels of torch.ops.moekit: the output shapes and dtypes, so that torch.compile
(fullgraph=True) traces the ops and torch.library.opcheck checks them against the real kernels."""

import torch
from torch.utils._python_dispatch import _disable_current_modes

from .spec import summary


def _top_k(spec: str) -> int:
    # why: the spec is parsed by the C++ op, which must run on the real string, not under the
    # fake mode that is active while this kernel runs
    with _disable_current_modes():
        return summary(spec)["top_k"]


@torch.library.register_fake("moekit::route")
def _route_fake(router_logits, correction_bias, spec):
    k = _top_k(spec)
    t = router_logits.shape[0]
    return (
        router_logits.new_empty((t, k), dtype=torch.int32),
        router_logits.new_empty((t, k), dtype=torch.float32),
    )


@torch.library.register_fake("moekit::fused_experts")
def _fused_experts_fake(x, w13, w2, topk_ids, topk_weights, spec, b13=None, b2=None,
                        expert_offset=0):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@torch.library.register_fake("moekit::fused_experts_mx")
def _fused_experts_mx_fake(x, w13_mx, w13_mx_scale, w2_mx, w2_mx_scale, topk_ids, topk_weights,
                           format, spec, b13=None, b2=None, expert_offset=0):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@torch.library.register_fake("moekit::moe_layer")
def _moe_layer_fake(x, router_weight, router_bias, correction_bias, w13, w2, b13, b2, shared_w13,
                    shared_w2, spec, expert_offset=0):
    return torch.empty_like(x, memory_format=torch.contiguous_format)
