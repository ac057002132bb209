// CheckpointLayerWeights: the LayerWeights that load_checkpoint_weights returns, one MoE layer of
// a checkpoint directory. Its members are defined by what they read: the layer's tensors found,
// the router and the bf16 shared MLP (checkpoint_weights.cpp), routed experts in bf16
// (checkpoint_experts_bf16.cpp), in fp8 with block scales (checkpoint_experts_fp8.cpp) and in an
// MX format (checkpoint_experts_mx.cpp).
#pragma once

#include <string>
#include <vector>

#include "io/checkpoint_dir.h"
#include "io/layer_tensors.h"
#include "io/lazy_experts.h"
#include "io/matrix_source.h"
#include "moekit/checkpoint.h"
#include "moekit/weights.h"

namespace moekit::io {

// How a checkpoint stores the routed experts: a tensor per expert and matrix, transformers-5
// stacked [E, ...] tensors, or gpt-oss's fused (transposed, interleaved) and MXFP4 tensors.
enum class ExpertForm { PerExpert, Stacked, GptOssDense, GptOssMxfp4 };

const char* form_name(ExpertForm f);

class CheckpointLayerWeights final : public LayerWeights {
 public:
  CheckpointLayerWeights(const MoeSpec& spec, int layer, const std::string& path,
                         const LoadOptions& options);

  ExpertView expert(int e) const override { return experts_.get(e); }
  int materialised_experts() const override { return experts_.materialised(); }
  std::string origin() const override;

 private:
  struct PerExpertSrc {
    MatrixSrc gate, up, down;  // Stacked: gate holds the whole [2I, H] gate_up slice
  };

  // The router weight (with a gated shared expert's gate as its last row), the correction bias
  // and the router bias, read and checked now.
  void load_router(LayerTensors& t);

  // Expert e (routed, or a fused shared slot) in the layer's expert format: LazyExperts'
  // callback.
  void build(int e, ExpertStorage& out) const;
  // "checkpoint <dir>, layer L: <what>" for the finiteness checks.
  std::string where(const std::string& what) const;

  // bf16 (checkpoint_experts_bf16.cpp): expert e converted where it is not bf16 in moekit's
  // layout already, then checked for finiteness.
  void build_bf16(int e, ExpertStorage& out) const;
  // gate_up [E, H, 2I] used as x . W: w13[i][h] = W[h][2i] (gate), w13[I+i][h] = W[h][2i+1] (up);
  // down [E, I, H]: w2[h][i] = D[i][h].
  void build_gpt_oss_dense(int e, ExpertStorage& out) const;
  // MXFP4 blocks decode to [E, 2I, H] (rows interleaved gate/up, before transformers' transpose
  // to [E, H, 2I]) and [E, H, I] (already moekit's w2 layout).
  void build_gpt_oss_mxfp4(int e, ExpertStorage& out) const;
  // gpt-oss's biases: gate_up_proj_bias is interleaved like the gate_up rows (gate even, up odd).
  void read_biases(int e, ExpertStorage& out) const;

  // fp8 (checkpoint_experts_fp8.cpp). With the experts kept in fp8: every expert matrix is
  // F8_E4M3 with a 128x128 scale, and a stacked gate_up's gate/up boundary falls on a tile edge
  // (its [ceil(2I/128), .] scale grid then splits into the gate's and the up's, ExpertView's
  // layout).
  void check_fp8_experts() const;
  void load_shared_fp8(LayerTensors& t);
  // Expert e in fp8: e4m3 bytes in place where one tensor holds the matrix, scales in fp32.
  void build_fp8(int e, ExpertStorage& out) const;

  // MX (checkpoint_experts_mx.cpp). With the experts kept in an MX format: Mxfp4 is gpt-oss's
  // _blocks / _scales form; Mxfp8 takes per-expert or stacked F8_E4M3 matrices with 1x32 e8m0
  // scales (quant_method mxfp8).
  void check_mx_experts() const;
  void load_shared_mx(LayerTensors& t);
  // Expert e in an MX format: packed bytes and e8m0 bytes, in place where one tensor holds them.
  void build_mx(int e, ExpertStorage& out) const;

  CheckpointDir dir_;
  CheckpointNaming naming_ = CheckpointNaming::HfMlp;
  ExpertForm form_ = ExpertForm::PerExpert;
  std::vector<PerExpertSrc> per_expert_;
  TensorRef gate_up_, down_, gate_up_scales_, down_scales_, gate_up_bias_, down_bias_;
  LazyExperts experts_;
};

}  // namespace moekit::io
