// MatrixSrc's readers (matrix_source.h).
#include "io/matrix_source.h"

#include <cstdint>
#include <string>
#include <vector>

#include "io/mx_experts.h"
#include "io/tensor_convert.h"

namespace moekit::io {

const Bf16* direct_bf16(const MatrixSrc& m) {
  if (m.fp4 || m.dtype != DType::BF16) return nullptr;
  const uint8_t* p = static_cast<const uint8_t*>(m.w.file->data(m.w.name())) + m.offset * 2;
  if (reinterpret_cast<uintptr_t>(p) % alignof(Bf16) != 0) return nullptr;
  return reinterpret_cast<const Bf16*>(p);
}

void read_bf16(const MatrixSrc& m, Bf16* out) {
  if (m.fp4) {
    const uint8_t* blocks = static_cast<const uint8_t*>(m.w.file->raw_data(m.w.name())) + m.offset;
    const void* scale = m.scale.file->raw_data(m.scale.name());
    const std::string& sd = m.scale.info->dtype_name;
    const size_t groups = m.cols / kMxBlock;
    std::vector<float> row(m.cols);
    std::vector<float> scales(groups);
    const std::string where = m.scale.where();
    for (size_t r = 0; r < m.rows; ++r) {
      for (size_t g = 0; g < groups; ++g)
        scales[g] = scale_value(sd, scale, m.scale_offset + r * groups + g, where);
      decode_mxfp4_row(blocks + r * m.cols / 2, scales.data(), groups, row.data());
      for (size_t c = 0; c < m.cols; ++c) out[r * m.cols + c] = float_to_bf16(row[c]);
    }
    return;
  }
  const uint8_t* base = static_cast<const uint8_t*>(m.w.file->data(m.w.name()));
  const size_t count = m.rows * m.cols;
  if (m.mx8) {
    const uint8_t* scale =
        static_cast<const uint8_t*>(m.scale.file->raw_data(m.scale.name())) + m.scale_offset;
    const size_t groups = m.cols / kMxBlock;
    for (size_t r = 0; r < m.rows; ++r)
      mx_decode_row(ExpertFormat::Mxfp8, base + m.offset + r * m.cols, scale + r * groups, m.cols,
                    out + r * m.cols);
    return;
  }
  if (m.dtype == DType::F8_E4M3) {
    dequant_fp8_block(base + m.offset, m.rows, m.cols, m.scale.info->dtype_name,
                      m.scale.file->raw_data(m.scale.name()), m.scale_offset, out, m.scale.where());
    return;
  }
  convert_to_bf16(m.dtype, base + m.offset * dtype_size(m.dtype), count, out);
}

void read_f32(const TensorRef& t, size_t offset, size_t count, float* out) {
  const DType d = t.file->dtype(t.name());
  convert_to_f32(d, static_cast<const uint8_t*>(t.file->data(t.name())) + offset * dtype_size(d),
                 count, out);
}

}  // namespace moekit::io
