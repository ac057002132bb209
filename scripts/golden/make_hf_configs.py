#!/usr/bin/env python3
"""Config fixtures written by transformers' own config classes, for moekit's config-defaults tests.

For every model_type moekit supports, this script writes into tests/configs_hf/:
  <model_type>.default.json   save_pretrained() of the default-constructed config class;
  <model>.resaved.json        save_pretrained() of the config class built from the keys of
                              configs/<model>.json that the class has as fields (what an engine
                              gets when it builds the config in code: remote-code-only keys such
                              as topk_method or scoring_func are gone);
  <model>.stripped.json       the resaved file without every key whose value equals the class
                              default (model_type and architectures kept), so that every omitted
                              key has to come from moekit's defaults table;
  expected_defaults.json      per <model_type>.default.json, the MoeSpec fields that transformers'
                              modeling code derives from the default config (layer selection and
                              routing as its decoder layer and router read them);
  class_defaults.json         per model_type, the class default of every key moekit reads.
The resaved and stripped files must give the same MoeSpec as configs/<model>.json.

Kimi-K2 has no transformers class; its architecture is DeepseekV3ForCausalLM, so its files are
made with DeepseekV3Config and keep model_type "kimi_k2".
Needs only transformers (no torch): pip install transformers==5.24.0.
Usage: make_hf_configs.py [--out DIR] (DIR defaults to tests/configs_hf).
"""

import argparse
import dataclasses
import json
import os
import tempfile

import transformers
from transformers import CONFIG_MAPPING

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# model_type -> (transformers config model_type, published configs/ files of that family)
FAMILIES = {
    "deepseek_v2": ("deepseek_v2", ["deepseek-v2-lite"]),
    "deepseek_v3": ("deepseek_v3", ["deepseek-v3"]),
    "deepseek_v32": ("deepseek_v32", []),
    "deepseek_v4": ("deepseek_v4", ["deepseek-v4-flash"]),
    "kimi_k2": ("deepseek_v3", ["kimi-k2"]),
    "glm4_moe": ("glm4_moe", ["glm-4.5"]),
    "glm_moe_dsa": ("glm_moe_dsa", ["glm-5"]),
    "minimax_m2": ("minimax_m2", ["minimax-m2"]),
    "minimax_m3_vl": ("minimax_m3_vl", ["minimax-m3"]),
    "mixtral": ("mixtral", ["mixtral-8x7b"]),
    "qwen2_moe": ("qwen2_moe", ["qwen2-57b-a14b"]),
    "qwen3_moe": ("qwen3_moe", ["qwen3-30b-a3b", "qwen3-235b-a22b"]),
    "gpt_oss": ("gpt_oss", ["gpt-oss-120b"]),
}

# Keys moekit's parser reads (src/spec/spec.cpp); class_defaults.json lists their class defaults.
READ_KEYS = [
    "hidden_size", "num_hidden_layers", "n_routed_experts", "num_experts", "num_local_experts",
    "num_experts_per_tok", "moe_intermediate_size", "intermediate_size", "n_shared_experts",
    "shared_expert_intermediate_size", "shared_intermediate_size", "n_group", "topk_group",
    "topk_method", "scoring_func", "norm_topk_prob", "routed_scaling_factor",
    "first_k_dense_replace", "decoder_sparse_step", "mlp_only_layers", "hidden_act",
    "swiglu_limit", "swiglu_alpha",
]

# What each family's modeling code fixes (transformers 5.24 modeling_<type>.py, router and
# decoder layer): scoring, correction bias, group score, renormalisation (None: norm_topk_prob).
SEMANTICS = {
    "deepseek_v2": ("softmax", False, False, None),
    "deepseek_v3": ("sigmoid", True, True, None),
    "deepseek_v32": ("sigmoid", True, True, None),
    "deepseek_v4": ("sqrtsoftplus", True, False, True),
    "glm4_moe": ("sigmoid", True, True, None),
    "glm_moe_dsa": ("sigmoid", True, True, None),
    "minimax_m2": ("sigmoid", True, False, True),
    "minimax_m3_vl": ("sigmoid", True, False, True),
    "mixtral": ("softmax", False, False, True),
    "qwen2_moe": ("softmax", False, False, None),
    "qwen3_moe": ("softmax", False, False, None),
    # The softmax over the k picked logits sums to 1: moekit's renormalize flag stays off.
    "gpt_oss": ("softmax-of-topk", False, False, False),
}


def text_class(cls):
    """The language-model config class (MiniMax-M3 nests it under text_config)."""
    sub = getattr(cls, "sub_configs", {}) or {}
    return sub.get("text_config", cls)


def field_names(cls):
    names = {f.name for f in dataclasses.fields(cls)}
    return names | set(getattr(cls, "attribute_map", {}).keys())


def saved_dict(config):
    with tempfile.TemporaryDirectory() as d:
        config.save_pretrained(d)
        with open(os.path.join(d, "config.json")) as f:
            return json.load(f)


def strip_defaults(saved, cls):
    """`saved` without the keys whose value is the class default (nested text_config too)."""
    defaults = json.loads(json.dumps(cls().to_dict()))
    out = {}
    for k, v in saved.items():
        if k in ("model_type", "architectures"):
            out[k] = v
        elif k == "text_config" and isinstance(v, dict):
            out[k] = strip_defaults(v, text_class(cls))
        elif k not in defaults or defaults[k] != v:
            out[k] = v
    return out


def build_from_published(cls, published):
    """The config class built from the published keys it has as fields."""
    tcls = text_class(cls)
    if tcls is not cls:
        text = published.get("text_config", published)
        # post_init folds moe_layer_freq into mlp_layer_types; pass it, the class consumes it.
        kw = {k: v for k, v in text.items() if k in field_names(tcls) or k == "moe_layer_freq"}
        top = {k: v for k, v in published.items() if k in field_names(cls) and k != "text_config"}
        return cls(text_config=tcls(**kw), **top)
    kw = {k: v for k, v in published.items() if k in field_names(cls)}
    return cls(**kw)


def expected_spec(mt, cfg):
    """MoeSpec fields transformers' modeling code derives from `cfg` (a default config)."""
    t = getattr(cfg, "text_config", None) or cfg
    scoring, bias, top2, renorm = SEMANTICS[mt]
    n = t.num_hidden_layers
    if getattr(t, "mlp_layer_types", None) is not None:
        layers = [i for i, v in enumerate(t.mlp_layer_types) if v in ("sparse", "moe", "hash_moe")]
        hash_layers = sum(1 for v in t.mlp_layer_types if v == "hash_moe")
    elif hasattr(t, "first_k_dense_replace"):
        layers = [i for i in range(n) if i >= t.first_k_dense_replace]
        hash_layers = 0
    elif hasattr(t, "decoder_sparse_step"):
        layers = [i for i in range(n)
                  if i not in t.mlp_only_layers and (i + 1) % t.decoder_sparse_step == 0]
        hash_layers = 0
    else:
        layers = list(range(n))
        hash_layers = 0
    if t.num_experts_per_tok is None:
        return {"error": "num_experts_per_tok"}
    inter = getattr(t, "moe_intermediate_size", None) or t.intermediate_size
    n_group = getattr(t, "n_group", None) or 1
    topk_group = getattr(t, "topk_group", None) or 1
    if mt == "deepseek_v2" and t.topk_method != "group_limited_greedy":
        n_group = topk_group = 1
    if mt in ("deepseek_v4", "minimax_m2", "minimax_m3_vl", "mixtral", "qwen2_moe", "qwen3_moe",
              "gpt_oss"):
        n_group = topk_group = 1  # their routers have no groups
    shared_kind, shared = "none", 0
    if getattr(t, "shared_expert_intermediate_size", 0):
        shared_kind, shared = "gated", t.shared_expert_intermediate_size
    elif getattr(t, "shared_intermediate_size", 0):
        shared_kind, shared = "plain", t.shared_intermediate_size
    elif getattr(t, "n_shared_experts", 0):
        shared_kind, shared = "plain", t.n_shared_experts * inter
    activation = {"gpt_oss": "swiglu-oai-interleaved", "minimax_m3_vl": "swigluoai"}.get(mt, "silu")
    rsf = getattr(t, "routed_scaling_factor", 1.0) if mt != "minimax_m2" else 1.0
    return {
        "hidden": t.hidden_size,
        "num_experts": next(getattr(t, k) for k in ("num_local_experts", "num_experts",
                                                    "n_routed_experts") if hasattr(t, k)),
        "top_k": t.num_experts_per_tok,
        "expert_intermediate": inter,
        "num_layers": n,
        "moe_layers": layers,
        "scoring": scoring,
        "has_correction_bias": bias,
        "group_score_top2_sum": top2,
        "n_group": n_group,
        "topk_group": topk_group,
        "renormalize": bool(t.norm_topk_prob) if renorm is None else renorm,
        "routed_scaling_factor": rsf,
        "activation": activation,
        "swiglu_limit": getattr(t, "swiglu_limit", 0.0) or 0.0,
        "swiglu_alpha": getattr(t, "swiglu_alpha", 1.702),
        "shared_kind": shared_kind,
        "shared_intermediate": shared,
        "num_hash_layers": hash_layers,
    }


def write(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f, indent=1, sort_keys=True)
        f.write("\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "configs_hf"))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    expected, class_defaults = {}, {}
    for mt, (hf_type, published_names) in FAMILIES.items():
        cls = CONFIG_MAPPING[hf_type]
        tcls = text_class(cls)
        tdefaults = tcls().to_dict()
        class_defaults[mt] = {k: tdefaults[k] for k in READ_KEYS if k in tdefaults}
        if mt != "kimi_k2":
            cfg = cls()
            write(os.path.join(args.out, f"{mt}.default.json"), saved_dict(cfg))
            expected[mt] = expected_spec(mt, cfg)
        for name in published_names:
            with open(os.path.join(ROOT, "configs", f"{name}.json")) as f:
                published = json.load(f)
            cfg = build_from_published(cls, published)
            saved = saved_dict(cfg)
            if mt == "kimi_k2":
                saved["model_type"] = "kimi_k2"
            write(os.path.join(args.out, f"{name}.resaved.json"), saved)
            write(os.path.join(args.out, f"{name}.stripped.json"), strip_defaults(saved, cls))
    write(os.path.join(args.out, "expected_defaults.json"),
          {"transformers_version": transformers.__version__, "specs": expected})
    write(os.path.join(args.out, "class_defaults.json"),
          {"transformers_version": transformers.__version__, "defaults": class_defaults})


if __name__ == "__main__":
    main()
