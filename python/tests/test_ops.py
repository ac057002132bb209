"""torch.ops.moekit's contracts: opcheck (schema, fake kernels, dispatch), torch.compile, the
errors' messages, the spec loading, patch()'s refusal of unsupported blocks."""

import pytest
import torch
from torch import nn

import moekit
from moekit.integrations.transformers import patch
from tiny_models import correction_bias, moe_blocks, tiny_model


@torch.no_grad()  # the ops are for inference: they have no backward
def _weights(family, tokens=5):
    model = tiny_model(family)
    block = moe_blocks(model)[0]
    spec = moekit.MoeSpec.from_config(model.config)
    x = torch.randn(tokens, 64).bfloat16()
    router = block.gate.weight.bfloat16()
    if spec.shared_kind == "gated":
        router = torch.cat([router, block.shared_expert_gate.weight.bfloat16()])
    logits = (x.float() @ router.float().T)
    bias = correction_bias(block)
    shared = getattr(block, "shared_experts", None) or getattr(block, "shared_expert", None)
    sw13 = sw2 = None
    if shared is not None:
        sw13 = torch.cat([shared.gate_proj.weight, shared.up_proj.weight]).bfloat16()
        sw2 = shared.down_proj.weight.bfloat16()
    return dict(spec=spec, x=x, router=router, logits=logits, bias=bias,
                w13=block.experts.gate_up_proj.bfloat16(),
                w2=block.experts.down_proj.bfloat16(), sw13=sw13, sw2=sw2)


@pytest.mark.parametrize("family", ["qwen3_moe", "deepseek_v3", "qwen2_moe"])
def test_opcheck_every_op(family):
    w = _weights(family)
    s = w["spec"].json
    torch.library.opcheck(torch.ops.moekit.route.default, (w["logits"], w["bias"], s))
    ids, weights = torch.ops.moekit.route(w["logits"], w["bias"], s)
    torch.library.opcheck(torch.ops.moekit.fused_experts.default,
                          (w["x"], w["w13"], w["w2"], ids, weights, s))
    torch.library.opcheck(torch.ops.moekit.fused_experts.default,
                          (w["x"].float(), w["w13"][2:6], w["w2"][2:6], ids.long(), weights, s),
                          {"expert_offset": 2})
    torch.library.opcheck(torch.ops.moekit.moe_layer.default,
                          (w["x"], w["router"], None, w["bias"], w["w13"], w["w2"], None, None,
                           w["sw13"], w["sw2"], s, 0))


def test_moe_layer_is_route_then_experts_plus_shared():
    w = _weights("deepseek_v3")
    s = w["spec"]
    ids, weights = moekit.route(w["logits"], s, correction_bias=w["bias"])
    routed = moekit.fused_experts(w["x"].float(), w["w13"], w["w2"], ids, weights, s)
    g, u = (w["x"].float() @ w["sw13"].float().T).chunk(2, dim=-1)
    shared = (torch.nn.functional.silu(g) * u) @ w["sw2"].float().T
    layer = moekit.moe_layer(w["x"].float(), s, w["router"], w["w13"], w["w2"],
                             correction_bias=w["bias"], shared_w13=w["sw13"],
                             shared_w2=w["sw2"])
    torch.testing.assert_close(layer, routed + shared, rtol=2e-2, atol=2e-3)


@pytest.mark.parametrize("family", ["qwen3_moe", "deepseek_v3"])
def test_compile_fullgraph_on_a_patched_block(family):
    model = patch(tiny_model(family).to(torch.bfloat16))
    block = next(m for m in model.modules() if type(m).__name__ == "MoekitMoeBlock")
    x = torch.randn(2, 3, 64).bfloat16()
    eager = block(x)
    compiled = torch.compile(block, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(x), eager, rtol=0, atol=0)
    bias = block._tensor("correction_bias")
    route = torch.compile(lambda l: moekit.route(l, block.spec, correction_bias=bias),
                          fullgraph=True, backend="aot_eager")
    logits = torch.randn(6, 8)
    got_ids, got_w = route(logits)
    want_ids, want_w = moekit.route(logits, block.spec, correction_bias=bias)
    assert torch.equal(got_ids, want_ids) and torch.equal(got_w, want_w)


def test_errors_name_the_problem():
    w = _weights("qwen3_moe")
    s = w["spec"]
    ids, weights = moekit.route(w["logits"], s)
    with pytest.raises(RuntimeError, match=r"expected w13 bf16, got Float"):
        moekit.fused_experts(w["x"], w["w13"].float(), w["w2"], ids, weights, s)
    with pytest.raises(RuntimeError, match=r"expected w13 of shape \[n, 128, 64\]"):
        moekit.fused_experts(w["x"], w["w13"][:, :10], w["w2"], ids, weights, s)
    with pytest.raises(RuntimeError, match=r"expected topk_ids of shape \[5, 2\]"):
        moekit.fused_experts(w["x"], w["w13"], w["w2"], ids[:, :1], weights, s)
    with pytest.raises(RuntimeError, match=r"expected router_logits of shape \[tokens, 8\]"):
        moekit.route(w["logits"][:, :7], s)
    with pytest.raises(RuntimeError, match=r"outside \[0, 8\)"):
        moekit.fused_experts(w["x"], w["w13"], w["w2"], ids + 8, weights, s)
    with pytest.raises(RuntimeError, match=r"expert_offset \+ experts held <= 8"):
        moekit.fused_experts(w["x"], w["w13"], w["w2"], ids, weights, s, expert_offset=1)
    with pytest.raises(RuntimeError, match=r"routes without a correction bias"):
        moekit.route(w["logits"], s, correction_bias=torch.zeros(8))
    dsv3 = _weights("deepseek_v3")
    with pytest.raises(RuntimeError, match=r"expected correction_bias \[8\], got None"):
        moekit.route(dsv3["logits"], dsv3["spec"])


def test_spec_from_every_form(tmp_path):
    by_name = moekit.MoeSpec.from_config("qwen3-30b-a3b")
    assert (by_name.num_experts, by_name.top_k, by_name.hidden) == (128, 8, 2048)
    (tmp_path / "config.json").write_text(by_name.json)
    by_dir = moekit.MoeSpec.from_config(tmp_path)
    assert by_dir.fields == by_name.fields
    small = moekit.MoeSpec.from_config(by_name, num_experts=16)
    assert small.num_experts == 16
    with pytest.raises(FileNotFoundError, match="no-such-model"):
        moekit.MoeSpec.from_config("no-such-model")
    with pytest.raises(RuntimeError, match="model_type"):
        moekit.MoeSpec.from_config({"model_type": "llama", "hidden_size": 8})


class _OtherMoe(nn.Module):
    def __init__(self):
        super().__init__()
        self.gate = nn.Linear(4, 2)
        self.experts = nn.ModuleList([nn.Linear(4, 4), nn.Linear(4, 4)])


def test_patch_refuses_an_unsupported_block():
    model = tiny_model("qwen3_moe")
    model.model.layers[0].mlp = _OtherMoe()
    with pytest.raises(NotImplementedError, match=r"_OtherMoe .*not supported; supported: "
                                                  r"Qwen3MoeSparseMoeBlock"):
        patch(model)
    with pytest.raises(ValueError, match="holds no MoE block"):
        patch(nn.Sequential(nn.Linear(2, 2)))


def test_compile_fullgraph_on_the_wrappers():
    w = _weights("deepseek_v3")
    s = w["spec"]
    kwargs = dict(correction_bias=w["bias"], shared_w13=w["sw13"], shared_w2=w["sw2"])
    layer = torch.compile(moekit.moe_layer, fullgraph=True, backend="aot_eager")
    x = w["x"].reshape(1, 5, 64)
    got = layer(x, s, w["router"], w["w13"], w["w2"], **kwargs)
    want = moekit.moe_layer(x, s, w["router"], w["w13"], w["w2"], **kwargs)
    assert got.shape == x.shape and torch.equal(got, want)


def test_x_at_any_offset_gives_the_same_y():
    w = _weights("qwen3_moe")
    s = w["spec"]
    ids, weights = moekit.route(w["logits"], s)
    buf = torch.empty(w["x"].numel() + 1, dtype=torch.bfloat16)
    shifted = buf[1:].view_as(w["x"])  # 2 bytes past a 16-byte boundary
    shifted.copy_(w["x"])
    want = moekit.fused_experts(w["x"], w["w13"], w["w2"], ids, weights, s)
    assert torch.equal(moekit.fused_experts(shifted, w["w13"], w["w2"], ids, weights, s), want)


def _status_case(device):
    w = _weights("qwen3_moe")
    s = w["spec"]
    ids, weights = moekit.route(w["logits"], s)
    args = [t.to(device) for t in (w["x"], w["w13"], w["w2"])]
    return s, args, ids.to(device), weights.to(device)


def test_read_status_on_the_cpu():
    s, (x, w13, w2), ids, weights = _status_case("cpu")
    moekit.read_status("cpu")  # clear what earlier tests left
    moekit.fused_experts(x, w13, w2, ids, weights, s)
    assert moekit.read_status("cpu") == 0
    bad = ids.clone()
    bad[1, 0] = s.num_experts
    with pytest.raises(RuntimeError, match=r"topk_ids\[1, 0\] = 8 is outside \[0, 8\)"):
        moekit.fused_experts(x, w13, w2, bad, weights, s)
    # the same bit a GPU call sets (it cannot raise), kept until read with clear
    assert moekit.read_status("cpu", clear=False) == moekit.STATUS_EXPERT_ID_OUT_OF_RANGE
    assert torch.ops.moekit.read_status(torch.device("cpu"), False) == 1
    with pytest.raises(RuntimeError, match=r"expert id outside \[0, E\)"):
        moekit.check_status("cpu")
    assert moekit.read_status("cpu") == 0
    moekit.check_status("cpu")
    bad[1, 0] = -1
    with pytest.raises(RuntimeError, match="outside"):
        moekit.fused_experts(x, w13, w2, bad, weights, s)
    assert moekit.read_status("cpu") == moekit.STATUS_EXPERT_ID_OUT_OF_RANGE


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_read_status_on_the_gpu():
    s, (x, w13, w2), ids, weights = _status_case("cuda")
    moekit.fused_experts(x, w13, w2, ids, weights, s)
    moekit.read_status("cuda")
    bad = ids.clone()
    bad[1, 0] = s.num_experts
    moekit.fused_experts(x, w13, w2, bad, weights, s)  # no raise: the device cannot
    assert moekit.read_status("cuda") == moekit.STATUS_EXPERT_ID_OUT_OF_RANGE
    assert moekit.read_status("cuda") == 0
