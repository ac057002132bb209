"""Tiny random transformers models of each supported family, shrunk from configs/*.json (no
download): hidden 64, 8 experts of width 64 (the GPU experts take widths that are multiples of
64), top-2, 2 layers, every weight bf16-exact so that an fp32 model and moekit (which reads bf16)
see the same numbers."""

from __future__ import annotations

import json
from pathlib import Path

import torch
import transformers

CONFIGS = Path(__file__).resolve().parents[2] / "configs"

_COMMON = dict(hidden_size=64, intermediate_size=96, moe_intermediate_size=64,
               num_experts_per_tok=2, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, head_dim=16, vocab_size=128,
               max_position_embeddings=128, rope_scaling=None, tie_word_embeddings=False,
               bos_token_id=None, eos_token_id=None, pad_token_id=None)

# family -> (configs/ file, the keys that shrink it beyond _COMMON)
FAMILIES = {
    "qwen3_moe": ("qwen3-30b-a3b", dict(num_experts=8, mlp_only_layers=[],
                                        decoder_sparse_step=1)),
    "mixtral": ("mixtral-8x7b", dict(num_local_experts=8, intermediate_size=64)),
    "deepseek_v2": ("deepseek-v2-lite", dict(n_routed_experts=8, n_shared_experts=2,
                                             first_k_dense_replace=1, kv_lora_rank=16,
                                             qk_nope_head_dim=16, qk_rope_head_dim=8,
                                             v_head_dim=16, head_dim=8, num_key_value_heads=4,
                                             routed_scaling_factor=1.5)),
    "deepseek_v3": ("deepseek-v3", dict(n_routed_experts=8, n_group=4, topk_group=2,
                                        n_shared_experts=1, first_k_dense_replace=1,
                                        q_lora_rank=32, kv_lora_rank=16, qk_nope_head_dim=16,
                                        qk_rope_head_dim=8, v_head_dim=16, head_dim=8,
                                        num_key_value_heads=4,
                                        routed_scaling_factor=2.5)),
    "qwen2_moe": ("qwen2-57b-a14b", dict(num_experts=8, shared_expert_intermediate_size=128,
                                         decoder_sparse_step=1)),
    "minimax_m2": ("minimax-m2", dict(num_local_experts=8, intermediate_size=64,
                                      rotary_dim=16)),
    "gpt_oss": ("gpt-oss-120b", dict(num_local_experts=8, experts_per_token=2,
                                     intermediate_size=64,
                                     layer_types=["sliding_attention", "full_attention"])),
    "glm_moe_dsa": ("glm-5", dict(n_routed_experts=8, n_group=1, topk_group=1,
                                  n_shared_experts=1, first_k_dense_replace=1,
                                  index_head_dim=16, index_n_heads=2, index_topk=4,
                                  kv_lora_rank=16, q_lora_rank=32, qk_nope_head_dim=16,
                                  qk_rope_head_dim=8, qk_head_dim=24, v_head_dim=16,
                                  head_dim=8, num_key_value_heads=4,
                                  routed_scaling_factor=2.5)),
    "glm4_moe": ("glm-4.5", dict(n_routed_experts=8, n_group=1, topk_group=1,
                                 n_shared_experts=1, first_k_dense_replace=1,
                                 routed_scaling_factor=2.5)),
    # no DeepSeek-V3.2 file in configs/: its MoE keys are DeepSeek-V3's, with the DSA indexer's
    "deepseek_v32": ("deepseek-v3", dict(model_type="deepseek_v32", n_routed_experts=8,
                                         n_group=4, topk_group=2, n_shared_experts=1,
                                         first_k_dense_replace=1, q_lora_rank=32,
                                         kv_lora_rank=16, qk_nope_head_dim=16,
                                         qk_rope_head_dim=8, v_head_dim=16, head_dim=8,
                                         num_key_value_heads=4, routed_scaling_factor=2.5,
                                         index_head_dim=16, index_n_heads=2, index_topk=4)),
    # 3 layers: one hash-routed (token-id table), two score-routed; attention shrunk (one
    # compressed layer), 2 hyper-connection streams
    "deepseek_v4": ("deepseek-v4-flash", dict(n_routed_experts=8, n_shared_experts=1,
                                              intermediate_size=64, num_hidden_layers=3,
                                              num_hash_layers=1, q_lora_rank=32,
                                              qk_rope_head_dim=8, num_key_value_heads=1,
                                              o_groups=2, o_lora_rank=16, index_head_dim=16,
                                              index_n_heads=2, index_topk=4,
                                              compress_ratios=[0, 4, 0], sliding_window=8,
                                              hc_mult=2)),
    # the text model of the VL checkpoint (text_config); layer 0 dense, layer 1 MoE
    "minimax_m3": ("minimax-m3", dict(model_type="minimax_m3_vl_text", num_local_experts=8,
                                      intermediate_size=64, shared_intermediate_size=64,
                                      dense_intermediate_size=96, moe_layer_freq=[0, 1],
                                      rotary_dim=8)),
}

_DROP = ("quantization_config", "auto_map", "torch_dtype", "transformers_version",
         "architectures", "num_nextn_predict_layers", "sparse_attention_config")


def tiny_config(family: str) -> transformers.PretrainedConfig:
    name, shrink = FAMILIES[family]
    d = json.loads((CONFIGS / f"{name}.json").read_text())
    d = d.get("text_config", d)  # a VL checkpoint: its text model
    for key in _DROP:
        d.pop(key, None)
    d.update(_COMMON)
    d.update(shrink)
    model_type = d.pop("model_type")
    return transformers.CONFIG_MAPPING[model_type](**d)


def tiny_model(family: str, seed: int = 0) -> torch.nn.Module:
    """fp32, eval mode, weights bf16-exact; random correction biases where the family has them
    (transformers initialises them to zero, which would not test them)."""
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(tiny_config(family))
    model = model.float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            # why: transformers' init leaves the 3D expert stacks at what torch.empty held
            scale = torch.randn_like(p) * 0.1
            p.copy_((1 + scale if "norm" in name else scale).bfloat16().float())
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias") and b.dim() == 1:
                b.copy_((torch.randn_like(b) * 0.05).bfloat16().float())
            if name.endswith("tid2eid"):  # DeepSeek-V4's hash table: k distinct experts a token
                experts = model.config.num_local_experts
                b.copy_(torch.stack([torch.randperm(experts)[:b.shape[1]]
                                     for _ in range(b.shape[0])]))
    return model


def moe_blocks(model: torch.nn.Module):
    from moekit.integrations.transformers import FAMILIES as SUPPORTED
    return [m for m in model.modules() if type(m).__name__ in SUPPORTED]


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    """max |got - want| over max |want|."""
    return ((got.float() - want.float()).abs().max() / want.float().abs().max()).item()


def router_module(block):
    return block.router if hasattr(block, "router") else block.gate


def correction_bias(block):
    """The block's e_score_correction_bias (on its router, or on the block: MiniMax-M2)."""
    for owner in (router_module(block), block):
        if hasattr(owner, "e_score_correction_bias"):
            return owner.e_score_correction_bias
    return None


def is_hash_routed(block) -> bool:
    """DeepSeek-V4's hash-routed layers: experts from the token ids, not from the scores."""
    return bool(getattr(block, "is_hash", False))


def score_routed_blocks(model: torch.nn.Module):
    return [b for b in moe_blocks(model) if not is_hash_routed(b)]


def block_router(block, x):
    """(logits, topk_weights, topk_ids) of the block's own router on x [T, H]."""
    if type(block).__name__ == "MiniMaxM2SparseMoeBlock":
        return block.gate(x, block.e_score_correction_bias)
    if type(block).__name__ == "MiniMaxM3VLSparseMoeBlock":
        # its block scales the routed sum, moekit (as the other families) the weights
        logits, weights, ids = block.gate(x)
        return logits, weights * block.routed_scaling_factor, ids
    return router_module(block)(x)


def expert_stacks(block):
    """{w13, w2, b13, b2} of the block in moekit's layout (bf16 stacks, fp32 biases), through
    patch()'s own getters."""
    from moekit.integrations.transformers import FAMILIES as SUPPORTED
    family = SUPPORTED[type(block).__name__]
    out = {}
    for name in ("w13", "w2", "b13", "b2"):
        getter = family.borrowed.get(name) or family.repacked.get(name)
        if getter is not None:
            dtype = torch.bfloat16 if name.startswith("w") else torch.float32
            out[name] = getter(block).detach().to(dtype).contiguous()
    return out
