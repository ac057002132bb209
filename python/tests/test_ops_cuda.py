"""torch.ops.moekit on the GPU: each op's CUDA kernel against its CPU kernel on the same inputs,
opcheck on CUDA tensors, patched blocks against the transformers blocks on the GPU, PyTorch's
current stream, CUDA graph capture and torch.compile. Skipped without a GPU."""

import pytest
import torch

import moekit
from moekit.integrations.transformers import patch
from test_ops import _weights
from tiny_models import FAMILIES, rel_err, score_routed_blocks, tiny_model

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")

BF16_TOL = 3e-2  # bf16 weights and outputs; the GPU sums in another order than the CPU


def _on(w, device):
    return {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in w.items()}


@pytest.mark.parametrize("family", ["qwen3_moe", "deepseek_v3", "qwen2_moe"])
def test_every_op_on_the_gpu_equals_its_cpu_kernel(family):
    w = _weights(family, tokens=9)
    g = _on(w, "cuda")
    s = w["spec"]
    ids, weights = moekit.route(w["logits"], s, correction_bias=w["bias"])
    gids, gweights = moekit.route(g["logits"], s, correction_bias=g["bias"])
    assert gids.is_cuda and gweights.is_cuda
    assert torch.equal(gids.cpu(), ids)
    torch.testing.assert_close(gweights.cpu(), weights, rtol=1e-5, atol=1e-6)
    want = moekit.fused_experts(w["x"], w["w13"], w["w2"], ids, weights, s)
    got = moekit.fused_experts(g["x"], g["w13"], g["w2"], gids, gweights, s)
    assert got.is_cuda and got.shape == want.shape and got.dtype == want.dtype
    assert rel_err(got.cpu(), want) < BF16_TOL
    # a slice of the experts (expert_offset), as an expert-parallel rank holds them
    part = moekit.fused_experts(g["x"], g["w13"][2:6], g["w2"][2:6], gids, gweights, s,
                                expert_offset=2)
    want_part = moekit.fused_experts(w["x"], w["w13"][2:6], w["w2"][2:6], ids, weights, s,
                                     expert_offset=2)
    assert rel_err(part.cpu(), want_part) < BF16_TOL
    kwargs = dict(correction_bias=w["bias"], shared_w13=w["sw13"], shared_w2=w["sw2"])
    gkwargs = dict(correction_bias=g["bias"], shared_w13=g["sw13"], shared_w2=g["sw2"])
    want_layer = moekit.moe_layer(w["x"], s, w["router"], w["w13"], w["w2"], **kwargs)
    got_layer = moekit.moe_layer(g["x"], s, g["router"], g["w13"], g["w2"], **gkwargs)
    assert rel_err(got_layer.cpu(), want_layer) < BF16_TOL
    assert moekit.read_status("cuda") == 0


@pytest.mark.parametrize("family", ["qwen3_moe", "deepseek_v3"])
def test_opcheck_every_op_on_cuda_tensors(family):
    g = _on(_weights(family), "cuda")
    s = g["spec"].json
    torch.library.opcheck(torch.ops.moekit.route.default, (g["logits"], g["bias"], s))
    ids, weights = torch.ops.moekit.route(g["logits"], g["bias"], s)
    torch.library.opcheck(torch.ops.moekit.fused_experts.default,
                          (g["x"], g["w13"], g["w2"], ids, weights, s))
    torch.library.opcheck(torch.ops.moekit.moe_layer.default,
                          (g["x"], g["router"], None, g["bias"], g["w13"], g["w2"], None, None,
                           g["sw13"], g["sw2"], s, 0))


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_patched_block_on_the_gpu_matches_the_block(family):
    model = tiny_model(family).to("cuda", torch.bfloat16)
    block = score_routed_blocks(model)[0]
    x = torch.randn(1, 12, 64, generator=torch.Generator().manual_seed(3)).bfloat16().cuda()
    want = block(x)
    want = want[0] if isinstance(want, tuple) else want
    name = next(n for n, m in model.named_modules() if m is block)
    moekit_block = patch(model).get_submodule(name)
    assert type(moekit_block).__name__ == "MoekitMoeBlock"
    got = moekit_block(x)
    got = got[0] if isinstance(got, tuple) else got
    assert got.is_cuda and got.shape == want.shape
    assert rel_err(got, want) < BF16_TOL


def test_the_ops_run_on_the_current_stream_and_replay_in_a_cuda_graph():
    g = _on(_weights("deepseek_v3", tokens=7), "cuda")
    s = g["spec"]
    kwargs = dict(correction_bias=g["bias"], shared_w13=g["sw13"], shared_w2=g["sw2"])

    def layer(x):
        return moekit.moe_layer(x, s, g["router"], g["w13"], g["w2"], **kwargs)

    want = layer(g["x"])
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        on_side = layer(g["x"])  # (the first call of a shape: its workspace is sized here)
    torch.cuda.current_stream().wait_stream(side)
    assert torch.equal(on_side, want)
    x = g["x"].clone()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = layer(x)
    x.copy_(torch.flip(g["x"], [0]))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(y, layer(torch.flip(g["x"], [0])))


def test_compile_fullgraph_on_the_gpu():
    model = patch(tiny_model("qwen3_moe").to("cuda", torch.bfloat16))
    block = next(m for m in model.modules() if type(m).__name__ == "MoekitMoeBlock")
    x = torch.randn(2, 3, 64, device="cuda").bfloat16()
    eager = block(x)
    compiled = torch.compile(block, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(x), eager, rtol=0, atol=0)


def test_a_weight_on_another_device_is_named():
    g = _weights("qwen3_moe")
    s = g["spec"]
    ids, weights = moekit.route(g["logits"], s)
    with pytest.raises(RuntimeError, match=r"expected w13 on cuda:0.*got cpu"):
        moekit.fused_experts(g["x"].cuda(), g["w13"], g["w2"].cuda(), ids.cuda(),
                             weights.cuda(), s)
