#!/usr/bin/env python3
"""Golden files for moekit's CPU reference, made by the models' public reference code.

For every MoE family that transformers implements, this script
  1. shrinks the model's published config.json (configs/<model>.json; same keys, tiny values) so
     that layer L is an MoE layer, and writes it as tests/golden/<case>/config.json;
  2. builds the whole tiny model with transformers (eager experts) and fills the MoE block of
     layer L with seeded random weights whose values are exactly representable in bf16;
  3. writes those weights under the tensor names the published checkpoints use
     (model.safetensors), in the checkpoints' dtypes (bf16 weights, fp32 correction bias, fp32
     routers where the model keeps them in fp32);
  4. loads the directory back with transformers' own `from_pretrained` (its checkpoint
     conversion: per-expert -> stacked, renames) and checks that every tensor of the block came
     back bit-exact, so the names are the ones transformers itself expects;
  5. runs the *reloaded* block in float32 on a random bf16-representable input x [T,H] and writes
     io.safetensors: x (bf16), y (f32, the block output), expert_ids (i32 [T,k], ascending per
     token) and expert_weights (f32 [T,k], the weight each routed expert's output is multiplied by
     in the final sum, i.e. with any routed scaling folded in).

Deterministic: every tensor comes from a torch.Generator seeded from (seed, case, tensor name).
Usage: make_golden.py [--out DIR] [--only case,case] (DIR defaults to tests/golden).
Needs torch 2.11 and transformers 5.17 (scripts/golden/requirements.txt).
"""

import argparse
import copy
import hashlib
import json
import os
import shutil
import sys
import tempfile

import torch
import transformers
from safetensors.torch import load_file, save_file

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SEED = 20261130
TOKENS = 7

# Attention / embedding sizes only have to make a valid tiny model: the golden covers the MoE
# block, but the whole model is built so that from_pretrained checks the checkpoint names.
TINY_COMMON = {
    "vocab_size": 256,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 32,
    "q_lora_rank": 32,
    "kv_lora_rank": 32,
    "o_lora_rank": 32,
    "o_groups": 2,
    "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 16,
    "qk_head_dim": 32,
    "v_head_dim": 16,
    "index_head_dim": 32,
    "index_n_heads": 2,
    "index_topk": 8,
    "max_position_embeddings": 4096,
    "rotary_dim": 16,
    "sliding_window": 16,
    "num_nextn_predict_layers": 0,
}


def drop(cfg, *keys):
    for k in keys:
        cfg.pop(k, None)


def shrink(cfg, hidden, dense_intermediate, layers, overrides):
    """Same keys as the published file, tiny values. Only keys the file has are changed (plus
    the overrides), so the config stays in the family's real format."""
    cfg = copy.deepcopy(cfg)
    drop(cfg, "quantization_config", "auto_map", "expert_dtype")
    for k, v in TINY_COMMON.items():
        if k in cfg:
            cfg[k] = v
    cfg["hidden_size"] = hidden
    cfg["num_hidden_layers"] = layers
    if "intermediate_size" in cfg and "moe_intermediate_size" in cfg:
        cfg["intermediate_size"] = dense_intermediate
    if "rope_scaling" in cfg and isinstance(cfg["rope_scaling"], dict):
        rs = cfg["rope_scaling"]
        if "original_max_position_embeddings" in rs:
            rs["original_max_position_embeddings"] = 256
    for k in ("layer_types", "attn_type_list", "compress_ratios"):
        if isinstance(cfg.get(k), list):
            cfg[k] = cfg[k][:layers]
    if "pad_token_id" in cfg:
        cfg["pad_token_id"] = 0  # must index the shrunk vocabulary
    cfg.update(overrides)
    return cfg


# ---------------------------------------------------------------------------------------------
# Published checkpoint names of one MoE layer, per family. Each function maps the block's
# transformers-internal tensors (name in the module -> tensor) to {published name: tensor}.

def unstack_experts(out, k, v, E, prefix, gate, up, down):
    """transformers-5 stacked expert tensors (experts.gate_up_proj [E, 2I, H], experts.down_proj
    [E, H, I]) -> per-expert {prefix}{e}.{gate|up|down}.weight; False when k is neither."""
    if k == "experts.gate_up_proj":
        I = v.shape[1] // 2
        for e in range(E):
            out[f"{prefix}{e}.{gate}.weight"] = v[e, :I]
            out[f"{prefix}{e}.{up}.weight"] = v[e, I:]
        return True
    if k == "experts.down_proj":
        for e in range(E):
            out[f"{prefix}{e}.{down}.weight"] = v[e]
        return True
    return False


def names_qwen2_style(sd, p, E, stacked=False):
    """DeepSeek-V2/V3, Kimi-K2, GLM-4.5/5, Qwen2/3-MoE: mlp.gate, mlp.experts.{e}.*_proj."""
    out = {}
    for k, v in sd.items():
        if stacked or not unstack_experts(out, k, v, E, f"{p}mlp.experts.", "gate_proj",
                                          "up_proj", "down_proj"):
            out[p + "mlp." + k] = v
    return out


def names_mixtral_style(sd, p, E):
    """Mixtral, MiniMax-M2: block_sparse_moe.gate, block_sparse_moe.experts.{e}.w1/w3 (gate/up),
    w2 (down); MiniMax-M2 keeps e_score_correction_bias on the block."""
    out = {}
    for k, v in sd.items():
        if not unstack_experts(out, k, v, E, f"{p}block_sparse_moe.experts.", "w1", "w3", "w2"):
            out[p + "block_sparse_moe." + k] = v
    return out


def names_gpt_oss(sd, p, E):
    """gpt-oss (bf16 release layout): mlp.router.{weight,bias}, mlp.experts.gate_up_proj
    [E,H,2I] (x @ W, gate/up interleaved columns) + _bias, mlp.experts.down_proj [E,I,H] + _bias."""
    return {p + "mlp." + k: v for k, v in sd.items()}


def names_minimax_m3(sd, p, E):
    """MiniMax-M3 (VL wrapper): language_model.model.layers.L.block_sparse_moe.{gate.weight,
    e_score_correction_bias, experts.{e}.w1/w2/w3.weight, shared_experts.{gate,up,down}_proj}."""
    out = {}
    for k, v in sd.items():
        if unstack_experts(out, k, v, E, f"{p}block_sparse_moe.experts.", "w1", "w3", "w2"):
            pass
        elif k == "gate.e_score_correction_bias":
            out[p + "block_sparse_moe.e_score_correction_bias"] = v
        elif k == "shared_experts.gate_up_proj.weight":
            I = v.shape[0] // 2
            out[p + "block_sparse_moe.shared_experts.gate_proj.weight"] = v[:I]
            out[p + "block_sparse_moe.shared_experts.up_proj.weight"] = v[I:]
        else:
            out[p + "block_sparse_moe." + k] = v
    return out


def names_deepseek_v4(sd, p, E):
    """DeepSeek-V4 (its own reference layout): layers.L.ffn.gate.{weight,bias},
    ffn.experts.{e}.w1/w2/w3.weight, ffn.shared_experts.w1/w2/w3.weight."""
    out = {}
    w = {"gate_proj": "w1", "down_proj": "w2", "up_proj": "w3"}
    for k, v in sd.items():
        if unstack_experts(out, k, v, E, f"{p}ffn.experts.", "w1", "w3", "w2"):
            pass
        elif k == "gate.e_score_correction_bias":
            out[p + "ffn.gate.bias"] = v
        elif k.startswith("shared_experts."):
            proj = k.split(".")[1]
            out[f"{p}ffn.shared_experts.{w[proj]}.weight"] = v
        else:
            out[p + "ffn." + k] = v
    return out


# ---------------------------------------------------------------------------------------------
# The cases. `scale` sets the spread of each tensor kind: router weights so the logits are O(1),
# expert weights so the gate/up activations reach the clamp where the family has one.

def cfg_from(name):
    with open(os.path.join(REPO, "configs", name + ".json")) as f:
        return json.load(f)


H = 64
I = 32


def case_list():
    cases = []

    def add(name, base, layer, layers, overrides, names, **kw):
        cases.append(dict(name=name, base=base, layer=layer, layers=layers, overrides=overrides,
                          names=names, **kw))

    # DeepSeek-V3: sigmoid + bias, grouped top-k (4 groups of 4, keep 2; top-2-sum group score).
    add("deepseek_v3", "deepseek-v3", 1, 2,
        {"first_k_dense_replace": 1, "n_routed_experts": 16, "num_experts_per_tok": 4,
         "moe_intermediate_size": I, "n_group": 4, "topk_group": 2},
        names_qwen2_style, bias_scale=0.1)
    # Kimi-K2 runs DeepseekV3 code (model_type kimi_k2 is remote code): n_group 1, rsf 2.827.
    add("kimi_k2", "kimi-k2", 1, 2,
        {"first_k_dense_replace": 1, "n_routed_experts": 8, "num_experts_per_tok": 4,
         "moe_intermediate_size": I},
        names_qwen2_style, config_class="DeepseekV3Config", model_class="DeepseekV3ForCausalLM",
        bias_scale=0.1)
    # DeepSeek-V2: softmax, group_limited_greedy with group max, no renorm, rsf 16, 2 shared.
    add("deepseek_v2", "deepseek-v2-lite", 1, 2,
        {"first_k_dense_replace": 1, "n_routed_experts": 8, "num_experts_per_tok": 3,
         "moe_intermediate_size": I, "n_group": 4, "topk_group": 2,
         "topk_method": "group_limited_greedy", "routed_scaling_factor": 16.0},
        names_qwen2_style)
    # DeepSeek-V2-Lite: softmax, greedy, no renorm, rsf 1.
    add("deepseek_v2_lite", "deepseek-v2-lite", 1, 2,
        {"first_k_dense_replace": 1, "n_routed_experts": 8, "num_experts_per_tok": 3,
         "moe_intermediate_size": I},
        names_qwen2_style)
    # Qwen3-MoE: softmax, renorm; per-expert names, and once more with the stacked names.
    qwen3 = {"num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": I,
             "mlp_only_layers": [0]}
    add("qwen3_moe", "qwen3-30b-a3b", 1, 2, qwen3, names_qwen2_style)
    add("qwen3_moe_stacked", "qwen3-235b-a22b", 1, 2, dict(qwen3, num_experts_per_tok=3),
        lambda sd, p, E: names_qwen2_style(sd, p, E, stacked=True))
    # Qwen2-MoE: softmax, no renorm, sigmoid-gated shared expert of 2*I (= 2 fused slots).
    add("qwen2_moe", "qwen2-57b-a14b", 1, 2,
        {"num_experts": 8, "num_experts_per_tok": 4, "moe_intermediate_size": I,
         "shared_expert_intermediate_size": 2 * I, "mlp_only_layers": [0]},
        names_qwen2_style)
    # Mixtral: softmax over all 8, top-2, renorm.
    add("mixtral", "mixtral-8x7b", 1, 2, {"intermediate_size": I}, names_mixtral_style)
    # gpt-oss: softmax over the top-k logits (router bias), clamped swiglu, interleaved gate/up.
    add("gpt_oss", "gpt-oss-120b", 1, 2,
        {"num_local_experts": 8, "num_experts_per_tok": 4, "experts_per_token": 4,
         "intermediate_size": I},
        names_gpt_oss, expert_scale=3.0, bias_scale=1.0)
    # GLM-4.5: sigmoid + bias, n_group 1, rsf 2.5, 1 shared.
    add("glm4_moe", "glm-4.5", 1, 2,
        {"first_k_dense_replace": 1, "n_routed_experts": 8, "num_experts_per_tok": 4,
         "moe_intermediate_size": I},
        names_qwen2_style, bias_scale=0.1)
    # GLM-5 (glm_moe_dsa): same MoE as GLM-4.5.
    add("glm_moe_dsa", "glm-5", 1, 2,
        {"first_k_dense_replace": 1, "n_routed_experts": 8, "num_experts_per_tok": 4,
         "moe_intermediate_size": I, "index_topk": 8},
        names_qwen2_style, bias_scale=0.1)
    # MiniMax-M2: sigmoid + bias kept on the block, fp32 router, renorm, no shared expert.
    add("minimax_m2", "minimax-m2", 1, 2,
        {"num_local_experts": 8, "num_experts_per_tok": 3, "intermediate_size": I},
        names_mixtral_style, fp32_router=True, bias_scale=0.1)
    # DeepSeek-V4-Flash: sqrtsoftplus + bias, clamped SiLU (limit 10) also on the shared expert.
    add("deepseek_v4", "deepseek-v4-flash", 3, 4,
        {"n_routed_experts": 8, "num_experts_per_tok": 3, "moe_intermediate_size": I,
         "num_hash_layers": 3},
        names_deepseek_v4, fp32_router=True, expert_scale=4.0, bias_scale=0.1, prefix="layers.")
    # MiniMax-M3 (VL): sigmoid + bias, fp32 router, swigluoai (limit 7) incl. its shared expert.
    add("minimax_m3", "minimax-m3", 1, 2,
        {"num_local_experts": 8, "num_experts_per_tok": 3, "intermediate_size": I,
         "shared_intermediate_size": I, "dense_intermediate_size": 128},
        names_minimax_m3, fp32_router=True, expert_scale=3.0, bias_scale=0.1, text_config=True,
        prefix="language_model.model.layers.", module_prefix="model.language_model.layers.")
    return cases


def shrink_case(case):
    full = cfg_from(case["base"])
    layers = case["layers"]
    if case.get("text_config"):
        cfg = copy.deepcopy(full)
        tc = shrink(cfg["text_config"], H, 128, layers, case["overrides"])
        for k in ("moe_layer_freq",):
            if isinstance(tc.get(k), list):
                tc[k] = tc[k][:1] + tc[k][-(layers - 1):]  # layer 0 dense, the rest MoE
        sac = tc.get("sparse_attention_config")
        if isinstance(sac, dict):
            for k, v in list(sac.items()):
                if isinstance(v, list):
                    sac[k] = v[:1] + v[-(layers - 1):]
            sac["sparse_index_dim"] = 16
            sac["sparse_num_index_heads"] = 1
            sac["sparse_block_size"] = 16
        cfg["text_config"] = tc
        if "projector_hidden_size" in cfg:
            cfg["projector_hidden_size"] = H
        vc = cfg.get("vision_config")
        if isinstance(vc, dict):  # not part of the golden; only kept small and valid
            vc.update({"hidden_size": 32, "num_attention_heads": 2, "num_hidden_layers": 1,
                       "intermediate_size": 64, "projection_dim": H})
        drop(cfg, "quantization_config")
        return cfg
    return shrink(full, H, 128, layers, case["overrides"])


def gen(case_name, tensor_name, shape, scale):
    """Seeded normal values x scale in fp32, a function of (SEED, case, tensor name) only; the
    caller rounds them to bf16 where the checkpoint stores bf16."""
    h = hashlib.sha256(f"{SEED}/{case_name}/{tensor_name}".encode()).digest()
    g = torch.Generator().manual_seed(int.from_bytes(h[:8], "little") & ((1 << 63) - 1))
    return torch.randn(shape, generator=g, dtype=torch.float32) * scale


def fill_block(case, block):
    """Random weights for every tensor of the MoE block; returns {module name: fp32 tensor}."""
    filled = {}
    hidden = H
    for name, t in list(block.named_parameters()) + list(block.named_buffers()):
        leaf = name.split(".")[-1]
        if "correction_bias" in name:
            v = gen(case["name"], name, t.shape, case.get("bias_scale", 0.1))  # fp32 in checkpoints
        elif name in ("gate.weight", "router.weight"):
            v = gen(case["name"], name, t.shape, 1.0 / hidden ** 0.5)
            if not case.get("fp32_router"):
                v = v.to(torch.bfloat16).float()
        elif leaf.endswith("bias"):
            v = gen(case["name"], name, t.shape, case.get("bias_scale", 0.5))
            v = v.to(torch.bfloat16).float()
        else:
            fan_in = t.shape[-1] if t.dim() >= 2 else hidden
            if name == "experts.gate_up_proj" and case["name"] == "gpt_oss":
                fan_in = t.shape[1]  # gpt-oss stores [E, H, 2I] and computes x @ W
            if name == "experts.down_proj" and case["name"] == "gpt_oss":
                fan_in = t.shape[1]
            scale = case.get("expert_scale", 1.0) / fan_in ** 0.5
            if "down" in name:
                scale = 1.0 / fan_in ** 0.5
            v = gen(case["name"], name, t.shape, scale).to(torch.bfloat16).float()
        with torch.no_grad():
            t.copy_(v)
        filled[name] = v
    return filled


def checkpoint_dtype(case, pub):
    """The dtype the published checkpoints store this tensor in: the correction bias in fp32,
    the router in fp32 where the model keeps it so, everything else bf16."""
    if pub.endswith("e_score_correction_bias") or (case["name"] == "deepseek_v4" and
                                                   pub.endswith("ffn.gate.bias")):
        return torch.float32
    if pub.endswith(("gate.weight", "router.weight")) and "shared" not in pub:
        return torch.float32 if case.get("fp32_router") else torch.bfloat16
    return torch.bfloat16


def get_classes(case, cfg):
    if "config_class" in case:
        # model_type kimi_k2 names remote code; transformers' DeepseekV3 code (and its checkpoint
        # conversion, looked up by model_type) is what runs it here.
        config = getattr(transformers, case["config_class"])(
            **{k: v for k, v in cfg.items() if k != "model_type"})
        model_cls = getattr(transformers, case["model_class"])
        return config, model_cls
    config = transformers.AutoConfig.for_model(**cfg)
    if config.model_type == "minimax_m3_vl":
        model_cls = transformers.AutoModelForImageTextToText
    else:
        model_cls = transformers.AutoModelForCausalLM
    return config, model_cls


def make_case(case, out_root):
    name = case["name"]
    L = case["layer"]
    out = os.path.join(out_root, name)
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    cfg = shrink_case(case)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")

    config, model_cls = get_classes(case, cfg)
    torch.manual_seed(SEED)
    if "config_class" in case:  # a concrete class (Kimi-K2 through DeepseekV3)
        model = model_cls._from_config(config, dtype=torch.float32,
                                       experts_implementation="eager")
    else:
        model = model_cls.from_config(config, dtype=torch.float32, experts_implementation="eager")
    module_path = case.get("module_prefix", "model.layers.") + f"{L}.mlp"
    block = model.get_submodule(module_path)
    if not hasattr(block, "experts"):
        raise RuntimeError(f"{name}: {module_path} is {type(block).__name__}, not an MoE block")
    filled = fill_block(case, block)
    E = block.experts.gate_up_proj.shape[0]

    prefix = case.get("prefix", "model.layers.") + f"{L}."
    published = case["names"](filled, prefix, E)
    tensors = {}
    for pub, v in published.items():
        t = v.contiguous().to(checkpoint_dtype(case, pub))
        if t.dtype == torch.bfloat16:
            assert torch.equal(t.float(), v), f"{pub} is not bf16-representable"
        tensors[pub] = t
    save_file(tensors, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})

    # Reload through transformers' own loader; every tensor of the block must come back exactly.
    load_kwargs = dict(dtype=torch.float32, experts_implementation="eager")
    if "config_class" in case:
        load_kwargs["config"] = config
    reloaded = model_cls.from_pretrained(out, **load_kwargs)
    rblock = reloaded.get_submodule(module_path)
    rstate = dict(list(rblock.named_parameters()) + list(rblock.named_buffers()))
    for k, v in filled.items():
        if not torch.equal(rstate[k].float(), v):
            raise RuntimeError(f"{name}: {k} did not round-trip through from_pretrained; the "
                               f"published names {sorted(tensors)[:4]}... are not what "
                               f"transformers expects")
    rblock.eval()

    # Capture the routing: every family calls experts(hidden, top_k_index, top_k_weights).
    captured = {}

    def hook(_mod, args):
        captured["ids"] = args[1].detach().clone()
        captured["w"] = args[2].detach().clone().float()

    handle = rblock.experts.register_forward_pre_hook(hook)
    x = gen(name, "x", (TOKENS, H), 1.0).to(torch.bfloat16)
    with torch.no_grad():
        y = rblock(x.float().unsqueeze(0))
    handle.remove()
    if isinstance(y, tuple):
        y = y[0]
    y = y.reshape(TOKENS, H).float().contiguous()
    assert torch.isfinite(y).all()

    ids, w = captured["ids"].long(), captured["w"]
    # MiniMax-M3 multiplies the routed sum by routed_scaling_factor after the experts.
    post = float(getattr(rblock, "routed_scaling_factor", 1.0) or 1.0)
    w = w * post
    order = torch.argsort(ids, dim=-1)
    ids = torch.gather(ids, 1, order).to(torch.int32).contiguous()
    w = torch.gather(w, 1, order).contiguous()
    save_file({"x": x.contiguous(), "y": y, "expert_ids": ids, "expert_weights": w},
              os.path.join(out, "io.safetensors"), metadata={
                  "layer": str(L), "module": type(rblock).__name__,
                  "transformers": transformers.__version__, "torch": torch.__version__})
    print(f"{name}: {type(rblock).__name__} layer {L} E={E} {len(tensors)} tensors, "
          f"|y|max={y.abs().max().item():.4g}, ids[0]={ids[0].tolist()}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(REPO, "tests", "golden"))
    ap.add_argument("--only", default="")
    args = ap.parse_args()
    torch.use_deterministic_algorithms(True)
    transformers.logging.set_verbosity_error()
    only = set(filter(None, args.only.split(",")))
    failed = []
    for case in case_list():
        if only and case["name"] not in only:
            continue
        try:
            make_case(case, args.out)
        except Exception as e:  # report every family, then fail
            failed.append(case["name"])
            print(f"{case['name']}: FAILED: {type(e).__name__}: {e}", file=sys.stderr)
    if failed:
        print("failed: " + ", ".join(failed), file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
