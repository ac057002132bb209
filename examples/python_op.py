"""The Python op on an engine's own tensors: route, then the experts, and the whole layer, for a
Qwen3-MoE spec shrunk to 8 experts (random bf16 weights in vLLM's fused_experts layout), checked
against plain PyTorch. Run: python examples/python_op.py (after pip install .)."""

import torch

import moekit

spec = moekit.MoeSpec.from_config("qwen3-30b-a3b", hidden_size=64, num_experts=8,
                                  num_experts_per_tok=2, moe_intermediate_size=32)
H, E, I, T = spec.hidden, spec.num_experts, spec.expert_intermediate, 6
torch.manual_seed(0)
x = torch.randn(T, H).bfloat16()
router = (torch.randn(E, H) * 0.1).bfloat16()
w13 = (torch.randn(E, 2 * I, H) * 0.1).bfloat16()  # gate rows [0, I), then up rows
w2 = (torch.randn(E, H, I) * 0.1).bfloat16()

logits = x.float() @ router.float().T
ids, weights = moekit.route(logits, spec)  # int32 [T, 2], fp32 [T, 2]
y = moekit.fused_experts(x, w13, w2, ids, weights, spec)
layer = torch.compile(moekit.moe_layer, fullgraph=True)(x, spec, router, w13, w2)

# the same in plain PyTorch
probs = logits.softmax(-1)
top_w, top_i = probs.topk(spec.top_k, dim=-1)
top_w = top_w / top_w.sum(-1, keepdim=True)  # norm_topk_prob
want = torch.zeros(T, H)
for t in range(T):
    for j in range(spec.top_k):
        g, u = (w13[top_i[t, j]].float() @ x[t].float()).chunk(2)
        want[t] += top_w[t, j] * (w2[top_i[t, j]].float() @ (torch.nn.functional.silu(g) * u))
assert torch.equal(ids.long(), top_i), (ids, top_i)
err = (y.float() - want).abs().max().item() / want.abs().max().item()
layer_err = (layer.float() - want).abs().max().item() / want.abs().max().item()
print(f"{spec}: experts {ids.tolist()}, relative error {err:.2e} (layer {layer_err:.2e})")
assert err < 1e-2 and layer_err < 1e-2
