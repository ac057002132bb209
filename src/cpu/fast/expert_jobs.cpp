// A fast CPU layer job's weights and its units' projections, per expert format (expert_jobs.h).
#include "cpu/fast/expert_jobs.h"

#include <algorithm>
#include <vector>

#include "cpu/fast/fast_common.h"
#include "moekit/error.h"

namespace moekit::cpu_fast::detail {

namespace {

size_t fp8_tiles(size_t n) { return (n + kFp8Tile - 1) / kFp8Tile; }

// Rows per dequantisation chunk of the fp8 path: a multiple of the kernels' 4-row tiles, small
// enough that a chunk's gate and up rows stay in L2 (4 x 7168 x 2 x 2 bytes = 112 KB).
constexpr int kFp8ChunkRows = 4;

// Rows [r0, r1) of an fp8 matrix whose rows hold ld codes (the first k used) into
// out[r1 - r0, k] as bf16.
void dequant_rows(const Kernels& kern, const uint8_t* q, const float* scale, size_t ld, int r0,
                  int r1, int k, Bf16* out) {
  const size_t scale_ld = fp8_tiles(ld);
  for (int r = r0; r < r1; ++r) {
    kern.dequant_fp8_row(q + static_cast<size_t>(r) * ld,
                         scale + static_cast<size_t>(r / kFp8Tile) * scale_ld, k,
                         out + static_cast<size_t>(r - r0) * k);
  }
}

// Points an MX job at gate/up rows w13 [2 inter, H] and down rows w2 [H, down_stride].
void set_mx(Job& job, ExpertFormat f, size_t H, const uint8_t* w13, const uint8_t* s13,
            const uint8_t* w2, const uint8_t* s2) {
  job.gate_mx = {f, w13, s13, H};
  job.up_mx = job.gate_mx.offset_rows(job.inter);
  job.down_mx = {f, w2, s2, static_cast<size_t>(job.down_stride)};
}

// The fp8 rows of a job go straight into an ISA's fused fp8 kernel where it has one for the
// job's token count (gate/up also needs one for its activations' type).
bool fp8_rows(const Kernels& kern, const Job& job) {
  return kern.dot_rows_fp8_f32 != nullptr && job.count <= kern.fp8_row_tokens;
}

}  // namespace

void attach_weights(const LayerWeights& w, Job& job) {
  const MoeSpec& spec = w.spec();
  const ExpertView ex = w.expert(job.expert);
  MK_CHECK((ex.w13 != nullptr && ex.w2 != nullptr) ||
               (ex.w13_mx != nullptr && ex.w2_mx != nullptr && ex.w13_mx_scale != nullptr &&
                ex.w2_mx_scale != nullptr) ||
               (ex.w13_fp8 != nullptr && ex.w2_fp8 != nullptr && ex.w13_scale != nullptr &&
                ex.w2_scale != nullptr),
           "expert " << job.expert << " of " << spec.name << " has null weights");
  if (spec.has_expert_bias && job.expert < spec.num_experts) {
    MK_CHECK(ex.b13 != nullptr && ex.b2 != nullptr,
             spec.name << " has expert biases but expert " << job.expert << " holds none");
  }
  if (ex.w13_mx != nullptr) {
    set_mx(job, ex.mx_format, spec.hidden, ex.w13_mx, ex.w13_mx_scale, ex.w2_mx, ex.w2_mx_scale);
  } else if (ex.w13_fp8 != nullptr) {
    const size_t H = spec.hidden, inter = job.inter;
    job.gate8 = ex.w13_fp8;
    job.up8 = ex.w13_fp8 + inter * H;
    job.down8 = ex.w2_fp8;
    job.gate_scale = ex.w13_scale;
    job.up_scale = ex.w13_scale + fp8_tiles(inter) * fp8_tiles(H);
    job.down_scale = ex.w2_scale;
  } else {
    job.gate = ex.w13;
    job.up = ex.w13 + static_cast<size_t>(job.inter) * spec.hidden;
    job.down = ex.w2;
  }
  job.b_gate = ex.b13;
  job.b_up = ex.b13 ? ex.b13 + job.inter : nullptr;
  job.b_down = ex.b2;
}

void attach_shared_weights(const LayerWeights& w, Job& sj) {
  const MoeSpec& spec = w.spec();
  const int H = spec.hidden;
  const int Is = sj.inter;
  const ExpertFormat format = w.expert_format();
  if (format == ExpertFormat::Mxfp4 || format == ExpertFormat::Mxfp8) {
    MK_CHECK(Is > 0 && w.shared_w13_mx() && w.shared_w13_mx_scale() && w.shared_w2_mx() &&
                 w.shared_w2_mx_scale(),
             expert_format_name(format)
                 << " shared expert weights of " << spec.name << " are missing");
    set_mx(sj, format, H, w.shared_w13_mx(), w.shared_w13_mx_scale(), w.shared_w2_mx(),
           w.shared_w2_mx_scale());
  } else if (format == ExpertFormat::Fp8Block) {
    MK_CHECK(Is > 0 && w.shared_w13_fp8() && w.shared_w13_scale() && w.shared_w2_fp8() &&
                 w.shared_w2_scale(),
             "fp8 shared expert weights of " << spec.name << " are missing");
    sj.gate8 = w.shared_w13_fp8();
    sj.up8 = w.shared_w13_fp8() + static_cast<size_t>(Is) * H;
    sj.down8 = w.shared_w2_fp8();
    sj.gate_scale = w.shared_w13_scale();
    sj.up_scale = w.shared_w13_scale() + fp8_tiles(Is) * fp8_tiles(H);
    sj.down_scale = w.shared_w2_scale();
  } else {
    MK_CHECK(Is > 0 && w.shared_w13() != nullptr && w.shared_w2() != nullptr,
             "shared expert weights of " << spec.name << " are missing (shared_intermediate " << Is
                                         << ")");
    sj.gate = w.shared_w13();
    sj.up = w.shared_w13() + static_cast<size_t>(Is) * H;
    sj.down = w.shared_w2();
  }
}

void project_gate_up(const Kernels& kern, const Job& job, int H, int i0, int i1,
                     const float* const* xf, const Bf16* const* xb, float* g, float* u) {
  const bool bf16_dot = xb != nullptr;
  // gate and up rows [a, b), their first rows at gw / uw
  auto project = [&](const Bf16* gw, const Bf16* uw, int a, int b) {
    if (bf16_dot) {
      kern.dot_rows_bf16(gw, H, b - a, H, xb, job.count, g + a, job.inter);
      kern.dot_rows_bf16(uw, H, b - a, H, xb, job.count, u + a, job.inter);
    } else {
      kern.dot_rows_f32(gw, H, b - a, H, xf, job.count, g + a, job.inter);
      kern.dot_rows_f32(uw, H, b - a, H, xf, job.count, u + a, job.inter);
    }
  };
  if (job.gate8 != nullptr && fp8_rows(kern, job) && (!bf16_dot || kern.dot_rows_fp8_bf16)) {
    const uint8_t* gate = job.gate8 + static_cast<size_t>(i0) * H;
    const uint8_t* up = job.up8 + static_cast<size_t>(i0) * H;
    if (bf16_dot) {
      kern.dot_rows_fp8_bf16(gate, H, job.gate_scale, fp8_tiles(H), i0, i1 - i0, H, xb, job.count,
                             g + i0, job.inter);
      kern.dot_rows_fp8_bf16(up, H, job.up_scale, fp8_tiles(H), i0, i1 - i0, H, xb, job.count,
                             u + i0, job.inter);
    } else {
      kern.dot_rows_fp8_f32(gate, H, job.gate_scale, fp8_tiles(H), i0, i1 - i0, H, xf, job.count,
                            g + i0, job.inter);
      kern.dot_rows_fp8_f32(up, H, job.up_scale, fp8_tiles(H), i0, i1 - i0, H, xf, job.count,
                            u + i0, job.inter);
    }
  } else if (!job.gate_mx.empty()) {
    mx_project(kern, job.gate_mx, i0, i1, H, xf, xb, job.count, g + i0, job.inter);
    mx_project(kern, job.up_mx, i0, i1, H, xf, xb, job.count, u + i0, job.inter);
  } else if (job.gate8 != nullptr) {
    thread_local std::vector<Bf16> rows_buffer;
    Bf16* gw = scratch(rows_buffer, 2 * static_cast<size_t>(kFp8ChunkRows) * H);
    Bf16* uw = gw + static_cast<size_t>(kFp8ChunkRows) * H;
    for (int a = i0; a < i1; a += kFp8ChunkRows) {
      const int b = std::min(i1, a + kFp8ChunkRows);
      dequant_rows(kern, job.gate8, job.gate_scale, H, a, b, H, gw);
      dequant_rows(kern, job.up8, job.up_scale, H, a, b, H, uw);
      project(gw, uw, a, b);
    }
  } else {
    const size_t off = static_cast<size_t>(i0) * H;
    project(job.gate + off, job.up + off, i0, i1);
  }
}

void project_down(const Kernels& kern, const Job& job, int H, int r0, int r1,
                  const float* const* act, float* out) {
  if (job.down8 != nullptr && fp8_rows(kern, job)) {
    kern.dot_rows_fp8_f32(job.down8 + static_cast<size_t>(r0) * job.down_stride, job.down_stride,
                          job.down_scale, fp8_tiles(job.down_stride), r0, r1 - r0, job.inter, act,
                          job.count, out + r0, H);
    return;
  }
  if (!job.down_mx.empty()) {
    mx_project(kern, job.down_mx, r0, r1, job.inter, act, nullptr, job.count, out + r0, H);
    return;
  }
  if (job.down8 != nullptr) {
    thread_local std::vector<Bf16> rows_buffer;
    Bf16* dw = scratch(rows_buffer, static_cast<size_t>(kFp8ChunkRows) * job.inter);
    for (int a = r0; a < r1; a += kFp8ChunkRows) {
      const int b = std::min(r1, a + kFp8ChunkRows);
      dequant_rows(kern, job.down8, job.down_scale, job.down_stride, a, b, job.inter, dw);
      kern.dot_rows_f32(dw, job.inter, b - a, job.inter, act, job.count, out + a, H);
    }
    return;
  }
  kern.dot_rows_f32(job.down + static_cast<size_t>(r0) * job.down_stride, job.down_stride, r1 - r0,
                    job.inter, act, job.count, out + r0, H);
}

}  // namespace moekit::cpu_fast::detail
