"""torch.ops.moekit.fused_experts_mx: OCP MX experts (MXFP4 gpt-oss with its biases, MXFP8) on the
CPU give the bf16 op on the same weights dequantised here from the OCP MX v1.0 tables, bit for
bit; opcheck; the errors' messages."""

import pytest
import torch

import moekit
from tiny_models import tiny_config

E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def _dequantise(packed: torch.Tensor, scales: torch.Tensor, fmt: str) -> torch.Tensor:
    """bf16(element x 2^(s - 127)) of every element: e2m1 codes low nibble first, or e4m3fn."""
    if fmt == "mxfp4":
        codes = torch.stack([packed & 0xF, packed >> 4], dim=-1).flatten(-2).long()
        magnitude = E2M1[codes & 7]
        values = torch.where((codes & 8) != 0, -magnitude, magnitude)
    else:
        values = packed.view(torch.float8_e4m3fn).float()
    s = scales.int()
    # 2^(s - 127) from its fp32 bits (s = 0: the subnormal 2^-127)
    factor = torch.where(s == 0, 1 << 22, s << 23).view(torch.float32)
    return (values * factor.repeat_interleave(32, dim=-1)).bfloat16()


def _mx_case(family: str, fmt: str, tokens: int = 7, seed: int = 0):
    spec = moekit.MoeSpec.from_config(tiny_config(family))
    g = torch.Generator().manual_seed(seed)
    e, h, i, k = spec.num_experts, spec.hidden, spec.expert_intermediate, spec.top_k
    per_byte = 2 if fmt == "mxfp4" else 1

    def packed(rows, cols):
        b = torch.randint(0, 256, (e, rows, cols // per_byte), generator=g, dtype=torch.uint8)
        if fmt == "mxfp8":
            b = torch.where((b & 0x7F) == 0x7F, b ^ 1, b)  # (no e4m3 NaN: refused at load)
        return b

    def exponents(rows, cols):
        return torch.randint(118, 134, (e, rows, cols // 32), generator=g, dtype=torch.uint8)

    w = dict(w13=packed(2 * i, h), w13s=exponents(2 * i, h), w2=packed(h, i),
             w2s=exponents(h, i))
    x = torch.randn(tokens, h, generator=g).bfloat16()
    ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(tokens)]).int()
    weights = torch.rand(tokens, k, generator=g)
    biases = {}
    if spec.has_expert_bias:
        biases = dict(b13=torch.randn(e, 2 * i, generator=g), b2=torch.randn(e, h, generator=g))
    return spec, w, x, ids, weights, biases


@pytest.mark.parametrize("family,fmt", [("gpt_oss", "mxfp4"), ("qwen3_moe", "mxfp8"),
                                        ("gpt_oss", "mxfp8")])
def test_mx_experts_equal_the_bf16_op_on_the_dequantised_weights(family, fmt):
    spec, w, x, ids, weights, biases = _mx_case(family, fmt)
    y = moekit.fused_experts_mx(x, w["w13"], w["w13s"], w["w2"], w["w2s"], ids, weights, spec,
                                format=fmt, **biases)
    w13 = _dequantise(w["w13"], w["w13s"], fmt)
    w2 = _dequantise(w["w2"], w["w2s"], fmt)
    want = moekit.fused_experts(x, w13, w2, ids, weights, spec, **biases)
    assert y.dtype == x.dtype and y.shape == x.shape
    assert y.abs().sum() > 0
    assert torch.equal(y, want)
    # a slice of the experts (ranks summing their y), and x of another dtype
    half = spec.num_experts // 2
    parts = [moekit.fused_experts_mx(
        x.float(), w["w13"][a:b], w["w13s"][a:b], w["w2"][a:b], w["w2s"][a:b], ids, weights, spec,
        format=fmt, expert_offset=a, **{n: t[a:b] for n, t in biases.items()})
        for a, b in ((0, half), (half, spec.num_experts))]
    whole = moekit.fused_experts(x.float(), w13, w2, ids, weights, spec, **biases)
    for a, b in ((0, half), (half, spec.num_experts)):
        part = moekit.fused_experts(x.float(), w13[a:b], w2[a:b], ids, weights, spec,
                                    expert_offset=a, **{n: t[a:b] for n, t in biases.items()})
        assert torch.equal(parts[0 if a == 0 else 1], part)
    # (each part rounded to bf16 before the sum: within a bf16 step of the largest |y|)
    torch.testing.assert_close(parts[0].float() + parts[1].float(), whole.float(), rtol=0,
                               atol=2e-2 * whole.abs().max().item())


def test_opcheck_and_compile():
    spec, w, x, ids, weights, biases = _mx_case("qwen3_moe", "mxfp4")
    args = (x, w["w13"], w["w13s"], w["w2"], w["w2s"], ids, weights, "mxfp4", spec.json)
    torch.library.opcheck(torch.ops.moekit.fused_experts_mx.default, args)
    f = torch.compile(lambda t: moekit.fused_experts_mx(t, w["w13"], w["w13s"], w["w2"], w["w2s"],
                                                        ids, weights, spec), fullgraph=True)
    assert torch.equal(f(x), torch.ops.moekit.fused_experts_mx(*args))


def test_errors_name_the_problem():
    spec, w, x, ids, weights, _ = _mx_case("qwen3_moe", "mxfp4")
    call = dict(w13_mx=w["w13"], w13_mx_scale=w["w13s"], w2_mx=w["w2"], w2_mx_scale=w["w2s"])

    def run(fmt="mxfp4", **edit):
        a = {**call, **edit}
        return moekit.fused_experts_mx(x, a["w13_mx"], a["w13_mx_scale"], a["w2_mx"],
                                       a["w2_mx_scale"], ids, weights, spec, format=fmt)
    with pytest.raises(RuntimeError, match=r"expected w13_mx_scale uint8 \(packed elements or "
                                           r"e8m0 exponent bytes\), got Float"):
        run(w13_mx_scale=w["w13s"].float())
    with pytest.raises(RuntimeError, match=r"expected w13_mx of shape \[n, 128, 32\]"):
        run(w13_mx=w["w13"][:, :, :16])
    with pytest.raises(RuntimeError, match=r"expected w2_mx_scale of shape \[n, 64, 2\]"):
        run(w2_mx_scale=w["w2s"][:, :, :1])
    with pytest.raises(RuntimeError, match=r"expected format mxfp4 or mxfp8, got fp8"):
        run("fp8")
    with pytest.raises(RuntimeError, match=r"mxfp8"):
        run("mx9")
    with pytest.raises(RuntimeError, match=r"expected w2 with as many experts as w13 \(8\), got 4"):
        run(w2_mx=w["w2"][:4])
    with pytest.raises(RuntimeError, match=r"expected the scales with as many experts as w13_mx "
                                           r"\(8\), got 8 and 4"):
        run(w2_mx_scale=w["w2s"][:4])
