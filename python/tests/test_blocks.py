"""Each family's transformers MoE block against torch.ops.moekit on the same weights."""

import pytest
import torch
from torch import nn

import moekit
from moekit.integrations.transformers import FAMILIES as SUPPORTED
from moekit.integrations.transformers import MoekitMoeBlock, patch
from tiny_models import (FAMILIES, block_router, correction_bias, expert_stacks, moe_blocks,
                         rel_err, score_routed_blocks, tiny_model)

FP32_TOL = 1e-2   # moekit reads x as bf16 and writes y as bf16
BF16_TOL = 3e-2   # and the bf16 model's own rounding on top


def _x(tokens=12, hidden=64, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(1, tokens, hidden, generator=g).bfloat16().float()


@pytest.fixture(params=sorted(FAMILIES))
def family(request):
    return request.param


def _block_and_spec(family):
    model = tiny_model(family)
    block = score_routed_blocks(model)[0]
    return model, block, moekit.MoeSpec.from_config(model.config)


def test_route_matches_the_block_router(family):
    model, block, spec = _block_and_spec(family)
    x = _x().reshape(-1, 64)
    logits, want_w, want_ids = block_router(block, x)
    logits = logits.float()
    bias = correction_bias(block)
    if spec.router_columns > spec.num_experts:  # Qwen2-MoE: the shared gate's column
        logits = torch.cat([logits, block.shared_expert_gate(x)], dim=1)
    ids, weights = moekit.route(logits, spec, correction_bias=bias)
    assert ids.dtype == torch.int32 and weights.dtype == torch.float32
    assert ids.shape == want_ids.shape
    order_got, order_want = ids.long().sort(dim=1), want_ids.sort(dim=1)
    assert torch.equal(order_got.values, order_want.values)
    got_w = weights.gather(1, order_got.indices)
    want_w = want_w.float().gather(1, order_want.indices)
    torch.testing.assert_close(got_w, want_w, rtol=1e-5, atol=1e-6)


def test_fused_experts_on_the_block_routing(family):
    model, block, spec = _block_and_spec(family)
    x = _x().reshape(-1, 64)
    _, w, ids = block_router(block, x)
    want = block.experts(x, ids, w)
    st = expert_stacks(block)
    got = moekit.fused_experts(x, st["w13"], st["w2"], ids, w, spec, st.get("b13"), st.get("b2"))
    assert got.dtype == x.dtype and got.shape == x.shape
    assert rel_err(got, want) < FP32_TOL


def test_fused_experts_slices_sum_to_the_whole(family):
    model, block, spec = _block_and_spec(family)
    x = _x().reshape(-1, 64)
    _, w, ids = block_router(block, x)
    st = expert_stacks(block)
    b13, b2 = st.get("b13"), st.get("b2")
    whole = moekit.fused_experts(x, st["w13"], st["w2"], ids, w, spec, b13, b2)
    parts = sum(moekit.fused_experts(
        x, st["w13"][lo:lo + 4], st["w2"][lo:lo + 4], ids, w, spec,
        None if b13 is None else b13[lo:lo + 4], None if b2 is None else b2[lo:lo + 4],
        expert_offset=lo) for lo in (0, 4))
    assert rel_err(parts, whole) < FP32_TOL


@pytest.mark.parametrize("dtype,tol", [(torch.float32, FP32_TOL), (torch.bfloat16, BF16_TOL)])
def test_patched_block_matches_the_block(family, dtype, tol):
    model, block, spec = _block_and_spec(family)
    x = _x()
    with torch.no_grad():
        want = block(x)  # fp32 on bf16-exact weights: the reference for both dtypes
        if isinstance(want, tuple):  # gpt-oss: (y, router scores)
            want = want[0]
        model.to(dtype)
        ours = MoekitMoeBlock(block, SUPPORTED[type(block).__name__], spec)
        got = ours(x.to(dtype))
        if isinstance(got, tuple):
            got = got[0]
    assert got.dtype == dtype and got.shape == x.shape
    assert rel_err(got, want) < tol


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_patch_keeps_the_model_logits(family, dtype):
    model = tiny_model(family).to(dtype)
    # token ids whose tokens meet no routing near-tie in any family's tiny model, either dtype:
    # moekit's activations are bf16, and a near-tie decided the other way by that rounding gives
    # a token other experts (seeds 3-9 and 11 each met one in some family)
    ids = torch.randint(0, 128, (2, 7), generator=torch.Generator().manual_seed(10))
    with torch.no_grad():
        want = model(ids).logits
        keys = set(model.state_dict())
        patch(model)
        got = model(ids).logits
    patched = [i for i, layer in enumerate(model.model.layers)
               if isinstance(layer.mlp, MoekitMoeBlock)]
    assert patched == moekit.MoeSpec.from_config(model.config).moe_layers
    assert set(model.state_dict()) == keys  # the block's own parameters, same names
    assert rel_err(got, want) < (FP32_TOL if dtype == torch.float32 else 2 * BF16_TOL)


def test_hash_routed_block_matches_the_block():
    """DeepSeek-V4's hash-routed layer: the block's own table routing, moekit's experts."""
    model = tiny_model("deepseek_v4")
    block = moe_blocks(model)[0]
    assert block.is_hash
    assert model.config.mlp_layer_types == ["hash_moe", "moe", "moe"]
    spec = moekit.MoeSpec.from_config(model.config)
    assert spec.moe_layers == [0, 1, 2]  # moekit runs the hash-routed layer too
    x = _x(tokens=7)
    ids = torch.randint(0, 128, (1, 7), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        want = block(x, input_ids=ids)
        ours = MoekitMoeBlock(block, SUPPORTED[type(block).__name__], spec)
        got = ours(x, input_ids=ids)
        assert rel_err(got, want) < FP32_TOL
        # another token's table row routes elsewhere: the ids are read
        other = ours(x, input_ids=(ids + 1) % 128)
        assert rel_err(other, want) > 10 * FP32_TOL
        with pytest.raises(ValueError, match="input_ids"):
            ours(x)


class _RemoteDeepseekV3MoE(nn.Module):
    """A remote-code block (Kimi-K2's, DeepSeek-V3's own repo): per-expert nn.Linear lists."""

    def __init__(self):
        super().__init__()
        self.gate = nn.Linear(64, 8, bias=False)
        self.experts = nn.ModuleList([nn.Linear(64, 64) for _ in range(8)])


def test_patch_refuses_a_remote_code_block_of_a_known_name():
    model = tiny_model("deepseek_v3")
    remote = type("DeepseekV3MoE", (_RemoteDeepseekV3MoE,), {"__module__": "remote.modeling"})
    model.model.layers[1].mlp = remote()
    with pytest.raises(NotImplementedError, match=r"DeepseekV3MoE from remote.modeling does not "
                                                  r"have the layout of transformers'"):
        patch(model)
