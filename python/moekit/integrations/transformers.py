"""patch(model): a loaded transformers model's MoE blocks on moekit's ops.

Each MoE block becomes a MoekitMoeBlock that adopts the block's own submodules (so parameter
names, state_dict keys and .to() are unchanged) and runs torch.ops.moekit.moe_layer on their
weights. transformers 5 stores the routed experts in moekit's layout (experts.gate_up_proj
[E, 2I, H] gate rows first, experts.down_proj [E, H, I]); those, the router and its correction
bias are borrowed (read at each call, never copied) when they already have moekit's dtype (bf16
stacks, the spec's router dtype). A one-time repack at patch() time, held as non-persistent
buffers (so later changes to the source parameters are not seen):
  - any tensor of another dtype (an fp32 model's stacks to bf16; a router to the spec's dtype);
  - the shared expert: shared_w13 = cat(gate_proj.weight, up_proj.weight) [2 Is, H] (its
    down_proj.weight [H, Is] is borrowed where bf16);
  - Qwen2-MoE: the router with the shared expert's gate row appended ([E + 1, H]);
  - gpt-oss: experts.gate_up_proj [E, H, 2I] (x @ W, gate and up in interleaved columns) to w13
    [E, 2I, H] gate rows first, its bias likewise, and experts.down_proj [E, I, H] to w2
    [E, H, I]. Its block returns (y, router_scores); the patched one returns (y, None) (the
    decoder layer discards the scores).
MiniMax-M3's shared MLP is already fused (shared_experts.gate_up_proj [2 Is, H], gate rows
first): borrowed as shared_w13. DeepSeek-V4's hash-routed layers (the first ones, whose gate
is a DeepseekV4HashRouter: experts picked from the token ids by a table) keep the block's own
router and shared MLP and run the routed experts on torch.ops.moekit.fused_experts; they need
the input_ids the decoder layer passes.

transformers 5.23 ships a class for every MoE family moekit serves except Kimi-K2, whose
checkpoints carry their own code (DeepSeek-V3's architecture under model_type kimi_k2): load it
as DeepseekV3ForCausalLM to patch it. A block of remote code whose class name matches one
below but whose layout does not (per-expert nn.Linear lists) is refused naming its module.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, Optional

import torch
from torch import nn

from ..spec import MoeSpec

Getter = Callable[[nn.Module], torch.Tensor]


@dataclass
class Family:
    """Where one transformers MoE block class keeps each tensor of the engine API's view."""
    borrowed: Dict[str, Getter]                     # read at each call where the dtype matches
    repacked: Dict[str, Getter] = field(default_factory=dict)  # built once at patch()
    returns_tuple: bool = False  # the block returns (y, router scores): gpt-oss


def _shared_mlp(attr: str) -> Dict[str, Getter]:
    return {"shared_w13": lambda b: torch.cat([getattr(b, attr).gate_proj.weight,
                                               getattr(b, attr).up_proj.weight], dim=0)}


def _deinterleave(t: torch.Tensor) -> torch.Tensor:
    """[..., 2I] with gate and up in alternate columns -> [..., 2I] gate columns first."""
    return torch.cat([t[..., 0::2], t[..., 1::2]], dim=-1)


_ROUTED: Dict[str, Getter] = {
    "router_weight": lambda b: b.gate.weight,
    "w13": lambda b: b.experts.gate_up_proj,
    "w2": lambda b: b.experts.down_proj,
}

FAMILIES: Dict[str, Family] = {
    "Qwen3MoeSparseMoeBlock": Family(dict(_ROUTED)),
    "MixtralSparseMoeBlock": Family(dict(_ROUTED)),
    "DeepseekV2Moe": Family(
        {**_ROUTED, "shared_w2": lambda b: b.shared_experts.down_proj.weight},
        _shared_mlp("shared_experts")),
    "DeepseekV3MoE": Family(
        {**_ROUTED, "correction_bias": lambda b: b.gate.e_score_correction_bias,
         "shared_w2": lambda b: b.shared_experts.down_proj.weight},
        _shared_mlp("shared_experts")),
    "Glm4MoeMoE": Family(
        {**_ROUTED, "correction_bias": lambda b: b.gate.e_score_correction_bias,
         "shared_w2": lambda b: b.shared_experts.down_proj.weight},
        _shared_mlp("shared_experts")),
    "GlmMoeDsaMoE": Family(
        {**_ROUTED, "correction_bias": lambda b: b.gate.e_score_correction_bias,
         "shared_w2": lambda b: b.shared_experts.down_proj.weight},
        _shared_mlp("shared_experts")),
    "DeepseekV32MoE": Family(
        {**_ROUTED, "correction_bias": lambda b: b.gate.e_score_correction_bias,
         "shared_w2": lambda b: b.shared_experts.down_proj.weight},
        _shared_mlp("shared_experts")),
    # the hash-routed layers' gate has no correction bias (and routes by token id)
    "DeepseekV4SparseMoeBlock": Family(
        {**_ROUTED,
         "correction_bias": lambda b: getattr(b.gate, "e_score_correction_bias", None),
         "shared_w2": lambda b: b.shared_experts.down_proj.weight},
        _shared_mlp("shared_experts")),
    "MiniMaxM2SparseMoeBlock": Family(
        {**_ROUTED, "correction_bias": lambda b: b.e_score_correction_bias}),
    "MiniMaxM3VLSparseMoeBlock": Family(
        {**_ROUTED, "correction_bias": lambda b: b.gate.e_score_correction_bias,
         "shared_w13": lambda b: b.shared_experts.gate_up_proj.weight,
         "shared_w2": lambda b: b.shared_experts.down_proj.weight}),
    "Qwen2MoeSparseMoeBlock": Family(
        {"w13": _ROUTED["w13"], "w2": _ROUTED["w2"],
         "shared_w2": lambda b: b.shared_expert.down_proj.weight},
        {**_shared_mlp("shared_expert"),
         "router_weight": lambda b: torch.cat([b.gate.weight, b.shared_expert_gate.weight], 0)}),
    "GptOssMLP": Family(
        {"router_weight": lambda b: b.router.weight, "router_bias": lambda b: b.router.bias,
         "b2": lambda b: b.experts.down_proj_bias},
        {"w13": lambda b: _deinterleave(b.experts.gate_up_proj).transpose(1, 2),
         "b13": lambda b: _deinterleave(b.experts.gate_up_proj_bias),
         "w2": lambda b: b.experts.down_proj.transpose(1, 2)},
        returns_tuple=True),
}


_NAMES = ("router_weight", "router_bias", "correction_bias", "w13", "w2", "b13", "b2",
          "shared_w13", "shared_w2")


def _dtype_of(spec: MoeSpec, name: str) -> torch.dtype:
    if name == "router_weight":
        return torch.float32 if spec.router_dtype == "F32" else torch.bfloat16
    if name in ("router_bias", "correction_bias", "b13", "b2"):
        return torch.float32
    return torch.bfloat16


class MoekitMoeBlock(nn.Module):
    """A transformers MoE block's submodules, run by torch.ops.moekit.moe_layer."""

    def __init__(self, block: nn.Module, family: Family, spec: MoeSpec):
        super().__init__()
        self.source_class = type(block).__name__
        self.returns_tuple = family.returns_tuple
        # DeepSeek-V4's hash-routed layers: the block's own gate picks the experts by token id
        self.hash_routed = bool(getattr(block, "is_hash", False))
        self.spec = spec
        for name, child in block.named_children():
            self.add_module(name, child)
        for name, p in block.named_parameters(recurse=False):
            self.register_parameter(name, p)
        for name, b in block.named_buffers(recurse=False):  # MiniMax-M2's correction bias
            self.register_buffer(name, b, persistent=name not in block._non_persistent_buffers_set)
        self._borrowed: Dict[str, Getter] = {}
        for name in _NAMES:
            getter = family.borrowed.get(name)
            source = _read(block, getter, name)
            if source is not None and source.dtype == _dtype_of(spec, name):
                self._borrowed[name] = getter
                continue
            if source is None and family.repacked.get(name) is not None:
                source = _read(block, family.repacked[name], name)
            packed = None
            if source is not None:
                with torch.no_grad():
                    packed = source.detach().to(_dtype_of(spec, name)).contiguous()
            self.register_buffer("packed_" + name, packed, persistent=False)

    def _tensor(self, name: str) -> Optional[torch.Tensor]:
        getter = self._borrowed.get(name)
        return getter(self) if getter is not None else getattr(self, "packed_" + name)

    def forward(self, hidden_states: torch.Tensor,
                input_ids: Optional[torch.Tensor] = None) -> torch.Tensor:
        # input_ids: passed by DeepSeek-V4's decoder layer, read by its hash-routed layers only
        t = {name: self._tensor(name) for name in _NAMES}
        h = hidden_states.shape[-1]
        x = hidden_states.reshape(-1, h)
        if self.hash_routed:
            y = self._hash_routed(x, input_ids, t)
        else:
            y = torch.ops.moekit.moe_layer(
                x, t["router_weight"], t["router_bias"], t["correction_bias"], t["w13"], t["w2"],
                t["b13"], t["b2"], t["shared_w13"], t["shared_w2"], self.spec.json, 0)
        y = y.reshape(hidden_states.shape)
        return (y, None) if self.returns_tuple else y

    def _hash_routed(self, x: torch.Tensor, input_ids: Optional[torch.Tensor],
                     t: Dict[str, Optional[torch.Tensor]]) -> torch.Tensor:
        if input_ids is None:
            raise ValueError(f"moekit: the hash-routed {self.source_class} picks its experts from "
                             "the token ids: call the model with input_ids, not inputs_embeds")
        _, weights, ids = self.gate(x, input_ids)
        routed = torch.ops.moekit.fused_experts(x, t["w13"], t["w2"], ids.to(torch.int32),
                                                weights.float(), self.spec.json, None, None, 0)
        return routed + self.shared_experts(x).to(routed.dtype)

    def extra_repr(self) -> str:
        return f"moekit for {self.source_class}: {self.spec!r}"


def _read(block: nn.Module, getter: Optional[Getter], name: str) -> Optional[torch.Tensor]:
    """getter(block), or a NotImplementedError naming the block's class and module where the
    block lacks the layout of transformers' own class (remote code of the same name)."""
    if getter is None:
        return None
    try:
        return getter(block)
    except AttributeError as e:
        cls = type(block)
        raise NotImplementedError(
            f"moekit.integrations.transformers.patch: {cls.__name__} from {cls.__module__} does "
            f"not have the layout of transformers' {cls.__name__} (reading {name}: {e}); moekit "
            "patches transformers' own classes (load the model without trust_remote_code)"
        ) from e


def _looks_like_moe(module: nn.Module) -> bool:
    return hasattr(module, "experts") and (hasattr(module, "gate") or hasattr(module, "router"))


def patch(model: nn.Module, spec: Optional[MoeSpec] = None) -> nn.Module:
    """Replaces, in place, every MoE block of `model` with a MoekitMoeBlock on the block's own
    weights, and returns the model. The spec is read from model.config (as transformers reads
    it) unless given. Raises NotImplementedError naming the class of a block moekit does not
    support, ValueError when the model holds no MoE block."""
    targets = []
    for name, module in model.named_modules():
        cls = type(module).__name__
        if cls in FAMILIES:
            targets.append((name, module, FAMILIES[cls]))
        elif _looks_like_moe(module) and not isinstance(module, MoekitMoeBlock):
            raise NotImplementedError(
                f"moekit.integrations.transformers.patch: the MoE block {cls} (at {name!r} of "
                f"{type(model).__name__}) is not supported; supported: {', '.join(FAMILIES)}")
    if not targets and not any(isinstance(m, MoekitMoeBlock) for m in model.modules()):
        raise ValueError(f"moekit.integrations.transformers.patch: {type(model).__name__} holds "
                         f"no MoE block (supported: {', '.join(FAMILIES)})")
    if targets and spec is None:
        spec = MoeSpec.from_config(model.config)
    for name, module, family in targets:
        parent_name, _, attr = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, attr, MoekitMoeBlock(module, family, spec))
    return model
