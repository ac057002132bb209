// The prefill path's MX grouped GEMM (prefill_mx.h): D_g = A_g . W_g^T with W_g expert g's
// packed MX matrix read as it is held (experts_mx_layout.h) and dequantised in registers by the
// bulk MX kernels' bit moves and multiply (experts_mx.cuh), so the GEMM reads the packed bytes
// once instead of a widened bf16 copy written and read again.
//
// A persistent CTA takes tiles of kBm tokens x 128 weight rows (8 held tiles of 16 rows; the
// matrix's last n-tile may hold fewer, the rest zeros) of the groups, the m-tiles of one weight
// tile consecutive, so CTAs that run together share its bytes in L2. Its K loop moves 128 elements
// a step (64 packed bytes a row for MXFP4, 128 for MXFP8, and each row's 4 e8m0 bytes) through a
// 3-stage cp.async ring; 8 warps, 2 along the tokens and 4 along the rows, each own 32 rows x kBm /
// 2 tokens. A thread's 16-byte pieces of rows g and g + 8 are the bulk kernels' (bytes 16t, and 64
// + 16t for MXFP8, of the step's bytes), their bf16 pairs the A fragments of the m16n8k16 mma in
// natural element order, and its B fragments the tokens' activations at the same elements, 8 bytes
// a step from a shared row whose 16-byte units are swizzled so that a half-warp's loads meet at
// most two to a bank.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "cuda/common/cuda_check.h"
#include "cuda/experts/experts_common.cuh"
#include "cuda/experts/experts_mx.cuh"
#include "cuda/experts/experts_mx_layout.h"
#include "cuda/prefill/prefill_mx.h"
#include "moekit/error.h"

namespace moekit::cuda {
namespace {

using experts_detail::mma_bf16;
using experts_detail::mx_factors;
using experts_detail::mx_weight;
using experts_detail::MxBits;

constexpr int kThreads = 256;
constexpr int kBn = 128;         // weight rows a tile: 8 held tiles
constexpr int kStepElems = 128;  // elements of K a step
constexpr int kStages = 3;
constexpr int kMaxGroups = 1024;  // groups whose tile counts a CTA keeps in shared memory
constexpr int kActRowBytes = kStepElems * 2;
constexpr int kStepScales = kStepElems / kMxGroup;  // e8m0 bytes of a row a step

template <ExpertFormat F, int kBm>
struct Tile {
  static constexpr int kElems = mx_elems_per_byte(F);
  static constexpr int kRowBytes = kStepElems / kElems;  // packed bytes of a row a step
  static constexpr int kPieces = kRowBytes / 64;         // a thread's pieces of a row (q)
  static constexpr int kSteps = MxBits<F>::kPairs / 2;   // mma steps of a piece
  static constexpr int kWarpTokens = kBm / 2;
  static constexpr int kNt = kWarpTokens / 8;  // n8 tiles of a warp
  static constexpr int kWeightBytes = kBn * kRowBytes;
  static constexpr int kScaleBytes = kBn * kStepScales;
  static constexpr int kActBytes = kBm * kActRowBytes;
  static constexpr int kStageBytes = kWeightBytes + kScaleBytes + kActBytes;
  static constexpr int kSmemBytes = kStages * kStageBytes + (kMaxGroups + 1) * 4;
};

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 (or 4) bytes from global to shared, zero-filled where `valid` is false (src not read).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smem_addr(dst)), "l"(src),
               "r"(valid ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void cp_async4(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(smem_addr(dst)), "l"(src),
               "r"(valid ? 4 : 0)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;" ::: "memory");
}
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(kPending) : "memory");
}

// The 16-byte unit of a token's shared row where unit c of its step's activations lives: units
// 8 apart (MXFP4's pieces t and t + 2) and consecutive rows' part at one unit's bank offset.
__device__ __forceinline__ int act_unit(int c, int row) {
  return c ^ ((c >> 3 & 1) << 1) ^ (row & 1);
}

// Where byte x of row i of held tile j lies in the matrix's packed bytes, and its e8m0 bytes:
// tile-major, then row chunk, then the tile's rows (experts_mx_layout.h).
struct HeldRow {
  long long byte;   // of byte x
  long long scale;  // of the e8m0 byte of element x * elems
};
template <ExpertFormat F>
__device__ __forceinline__ HeldRow held_row(int j, int i, int x, int row_bytes, int chunks) {
  constexpr int kScaleBytes = mx_chunk_scale_bytes(F);
  const int c = x / kMxChunkBytes, off = c * kMxChunkBytes;
  const int bytes = min(kMxChunkBytes, row_bytes - off);
  const long long tile = 16LL * row_bytes * j;
  return {tile + 16LL * off + static_cast<long long>(i) * bytes + (x - off),
          ((static_cast<long long>(j) * chunks + c) * 16 + i) * kScaleBytes +
              (x - off) * mx_elems_per_byte(F) / kMxGroup};
}

template <ExpertFormat F, int kBm>
__global__ void __launch_bounds__(kThreads, 1)
    mx_gemm_kernel(MxMatrices m, PrefillGroupArrays g, int groups) {
  using T = Tile<F, kBm>;
  extern __shared__ __align__(16) unsigned char smem[];
  int* tile_start = reinterpret_cast<int*>(smem + kStages * T::kStageBytes);  // [groups + 1]
  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  const int gq = lane >> 2, t = lane & 3;
  const int warp_m = warp & 1, warp_n = warp >> 1;
  const int row_bytes = m.k / T::kElems, chunks = mx_row_chunks(F, m.k);
  const int n_tiles = (m.rows + kBn - 1) / kBn;  // (the last may hold fewer held tiles)
  const int k_steps = (m.k + kStepElems - 1) / kStepElems;
  const long long matrix_bytes = static_cast<long long>(m.rows) * row_bytes;
  const long long matrix_scales = static_cast<long long>(chunks) * m.rows * mx_chunk_scale_bytes(F);

  // tile_start[group] = the m-tiles of the groups before it, by one warp's scan
  if (warp == 0) {
    int running = 0;
    for (int base = 0; base < groups; base += 32) {
      const int grp = base + lane;
      const int v = grp < groups ? (g.problems[grp].m + kBm - 1) / kBm : 0;
      int incl = v;
#pragma unroll
      for (int d = 1; d < 32; d <<= 1) {
        const int o = __shfl_up_sync(0xffffffffu, incl, d);
        if (lane >= d) incl += o;
      }
      if (grp < groups) tile_start[grp] = running + incl - v;
      running += __shfl_sync(0xffffffffu, incl, 31);
    }
    if (lane == 0) tile_start[groups] = running;
  }
  __syncthreads();
  const long long total = static_cast<long long>(tile_start[groups]) * n_tiles;

  for (long long tile = blockIdx.x; tile < total; tile += gridDim.x) {
    // the tile's group (the last whose start is at or before it), its weight tile and m-tile
    int lo = 0, hi = groups - 1;
    while (lo < hi) {
      const int mid = (lo + hi + 1) >> 1;
      if (tile_start[mid] * static_cast<long long>(n_tiles) <= tile)
        lo = mid;
      else
        hi = mid - 1;
    }
    const int grp = lo;
    const int g_tiles = tile_start[grp + 1] - tile_start[grp];
    const long long local = tile - static_cast<long long>(tile_start[grp]) * n_tiles;
    const int n_tile = static_cast<int>(local / g_tiles),
              m_tile = static_cast<int>(local % g_tiles);
    const int rows_m = g.problems[grp].m;
    const __nv_bfloat16* a = g.a[grp];
    const long long lda = g.stride_a[grp];
    const uint8_t* packed = m.packed + grp * matrix_bytes;
    const uint8_t* scales = m.scales + grp * matrix_scales;

    // one step's copies into stage s: weights and e8m0 bytes of the 128 rows, activations of the
    // kBm tokens (zeros past the group's rows and past K)
    auto load_step = [&](int s, int ks) {
      unsigned char* st = smem + s * T::kStageBytes;
      const int x0 = ks * T::kRowBytes;
      for (int u = tid; u < kBn * (T::kRowBytes / 16); u += kThreads) {
        const int r = u / (T::kRowBytes / 16), x = x0 + 16 * (u % (T::kRowBytes / 16));
        const bool in = x < row_bytes && n_tile * kBn + r < m.rows;
        const HeldRow h =
            in ? held_row<F>(n_tile * 8 + r / 16, r % 16, x, row_bytes, chunks) : HeldRow{0, 0};
        cp_async16(st + r * T::kRowBytes + (x - x0), packed + h.byte, in);
      }
      if (tid < kBn) {
        const int r = tid;
        const bool in = x0 < row_bytes && n_tile * kBn + r < m.rows;
        const HeldRow h =
            in ? held_row<F>(n_tile * 8 + r / 16, r % 16, x0, row_bytes, chunks) : HeldRow{0, 0};
        // (the step's 4 e8m0 bytes lie in one row chunk: 2048 bytes hold whole steps)
        cp_async4(st + T::kWeightBytes + r * kStepScales, scales + h.scale, in);
      }
      unsigned char* acts = st + T::kWeightBytes + T::kScaleBytes;
      for (int u = tid; u < kBm * (kActRowBytes / 16); u += kThreads) {
        const int r = u / (kActRowBytes / 16), c = u % (kActRowBytes / 16);
        const int row = m_tile * kBm + r, k = ks * kStepElems + 8 * c;
        const bool in = row < rows_m && k < m.k;
        const __nv_bfloat16* src = a + (in ? row * lda + k : 0);
        cp_async16(acts + r * kActRowBytes + 16 * act_unit(c, r), src, in);
      }
    };

    float acc[2][T::kNt][4];
#pragma unroll
    for (int mi = 0; mi < 2; ++mi)
#pragma unroll
      for (int ni = 0; ni < T::kNt; ++ni)
#pragma unroll
        for (int r = 0; r < 4; ++r) acc[mi][ni][r] = 0.0f;

#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
      if (s < k_steps) load_step(s, s);
      cp_async_commit();
    }
    for (int ks = 0; ks < k_steps; ++ks) {
      cp_async_wait<kStages - 2>();
      __syncthreads();
      if (ks + kStages - 1 < k_steps) load_step((ks + kStages - 1) % kStages, ks + kStages - 1);
      cp_async_commit();

      const unsigned char* st = smem + (ks % kStages) * T::kStageBytes;
      const unsigned char* acts = st + T::kWeightBytes + T::kScaleBytes;
      // the warp's pieces of rows g and g + 8 of its two m16 tiles, and their e8m0 bytes
      uint4 wlo[2][T::kPieces], whi[2][T::kPieces];
      uint32_t slo[2][T::kPieces], shi[2][T::kPieces];
      uint32_t largest = 0;
#pragma unroll
      for (int mi = 0; mi < 2; ++mi) {
        const int r = warp_n * 32 + mi * 16 + gq;
#pragma unroll
        for (int q = 0; q < T::kPieces; ++q) {
          const int off = 64 * q + 16 * t;  // the piece's byte in the row's step
          wlo[mi][q] = *reinterpret_cast<const uint4*>(st + r * T::kRowBytes + off);
          whi[mi][q] = *reinterpret_cast<const uint4*>(st + (r + 8) * T::kRowBytes + off);
          const int grp_byte = off * T::kElems / kMxGroup;
          slo[mi][q] = st[T::kWeightBytes + r * kStepScales + grp_byte];
          shi[mi][q] = st[T::kWeightBytes + (r + 8) * kStepScales + grp_byte];
          largest = max(largest, max(slo[mi][q], shi[mi][q]));
        }
      }
      // (warp-wide: the mma is one instruction of the warp's lanes; experts_mx.cuh)
      const bool two_steps = __any_sync(0xffffffffu, largest > MxBits<F>::kOneStepMax);
      auto mma_step = [&](auto two) {
        constexpr bool kTwo = decltype(two)::value;
#pragma unroll
        for (int q = 0; q < T::kPieces; ++q) {
          uint32_t f_lo[2], g_lo[2], f_hi[2], g_hi[2];
#pragma unroll
          for (int mi = 0; mi < 2; ++mi) {
            mx_factors<F, kTwo>(slo[mi][q], f_lo[mi], g_lo[mi]);
            mx_factors<F, kTwo>(shi[mi][q], f_hi[mi], g_hi[mi]);
          }
#pragma unroll
          for (int j = 0; j < T::kSteps; ++j) {
            uint32_t af[2][4];
#pragma unroll
            for (int mi = 0; mi < 2; ++mi) {
              const uint32_t lw[4] = {wlo[mi][q].x, wlo[mi][q].y, wlo[mi][q].z, wlo[mi][q].w};
              const uint32_t hw[4] = {whi[mi][q].x, whi[mi][q].y, whi[mi][q].z, whi[mi][q].w};
              af[mi][0] = mx_weight<kTwo>(mx_pair_bits(F, lw, 2 * j), f_lo[mi], g_lo[mi]);
              af[mi][1] = mx_weight<kTwo>(mx_pair_bits(F, hw, 2 * j), f_hi[mi], g_hi[mi]);
              af[mi][2] = mx_weight<kTwo>(mx_pair_bits(F, lw, 2 * j + 1), f_lo[mi], g_lo[mi]);
              af[mi][3] = mx_weight<kTwo>(mx_pair_bits(F, hw, 2 * j + 1), f_hi[mi], g_hi[mi]);
            }
            // the tokens' activations at elements e .. e + 3 of the step: 8 bytes of unit
            // c = byte / 16 of each token's row
            const int byte = 2 * (64 * q + 16 * t) * T::kElems + 8 * j;
            const int c = byte / 16, half = byte % 16;
#pragma unroll
            for (int ni = 0; ni < T::kNt; ++ni) {
              const int r = warp_m * T::kWarpTokens + ni * 8 + gq;
              const uint2 b = *reinterpret_cast<const uint2*>(acts + r * kActRowBytes +
                                                              16 * act_unit(c, r) + half);
#pragma unroll
              for (int mi = 0; mi < 2; ++mi) {
                mma_bf16(acc[mi][ni], af[mi][0], af[mi][1], af[mi][2], af[mi][3], b.x, b.y);
              }
            }
          }
        }
      };
      if (two_steps) {
        mma_step(std::true_type{});
      } else {
        mma_step(std::false_type{});
      }
    }
    cp_async_wait<0>();
    __syncthreads();  // the stages are the next tile's

    // D[token][column]: column = the held row's place in the matrix (gate rows, then up rows)
    __nv_bfloat16* d = g.d[grp];
    const long long ldd = g.stride_d[grp];
#pragma unroll
    for (int mi = 0; mi < 2; ++mi) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = warp_n * 32 + mi * 16 + gq + 8 * h;
        if (n_tile * kBn + r >= m.rows) continue;
        const int col = mx_tile_row(m.gate_up, m.rows, n_tile * 8 + r / 16, r % 16);
#pragma unroll
        for (int ni = 0; ni < T::kNt; ++ni) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int row = m_tile * kBm + warp_m * T::kWarpTokens + ni * 8 + 2 * t + e;
            if (row < rows_m) d[row * ldd + col] = __float2bfloat16_rn(acc[mi][ni][2 * h + e]);
          }
        }
      }
    }
  }
}

template <ExpertFormat F, int kBm>
void launch(const MxMatrices& m, const PrefillGroupArrays& arrays, int groups,
            cudaStream_t stream) {
  constexpr int kSmem = Tile<F, kBm>::kSmemBytes;
  static const bool attributes_set = [] {
    MK_CUDA_CHECK(cudaFuncSetAttribute(mx_gemm_kernel<F, kBm>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
    return true;
  }();
  (void)attributes_set;
  mx_gemm_kernel<F, kBm><<<prefill_sm_count(), kThreads, kSmem, stream>>>(m, arrays, groups);
  MK_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void run_prefill_gemm_mx(const MxMatrices& m, const PrefillGroupArrays& arrays, int groups,
                         int tile_m, cudaStream_t stream) {
  MK_CHECK(m.format == ExpertFormat::Mxfp4 || m.format == ExpertFormat::Mxfp8,
           "run_prefill_gemm_mx: expected an MX format, got " << expert_format_name(m.format));
  MK_CHECK(m.rows >= 16 && m.rows % 16 == 0 && m.k >= kMxGroup && m.k % kMxGroup == 0,
           "run_prefill_gemm_mx: expected rows a multiple of 16 and k of "
               << kMxGroup << ", got " << m.rows << " x " << m.k);
  MK_CHECK(groups >= 1 && groups <= kMaxGroups,
           "run_prefill_gemm_mx: expected 1 to " << kMaxGroups << " groups, got " << groups);
  MK_CHECK(tile_m == 64 || tile_m == 128,
           "run_prefill_gemm_mx: expected tile_m 64 or 128, got " << tile_m);
  MK_CHECK(m.packed != nullptr && m.scales != nullptr,
           "run_prefill_gemm_mx: packed and scales must be set");
  MK_CHECK(reinterpret_cast<uintptr_t>(m.packed) % 16 == 0 &&
               reinterpret_cast<uintptr_t>(m.scales) % 4 == 0,
           "run_prefill_gemm_mx: expected packed 16-byte and scales 4-byte aligned, got "
               << static_cast<const void*>(m.packed) << ", " << static_cast<const void*>(m.scales));
  const bool fp4 = m.format == ExpertFormat::Mxfp4;
  if (tile_m == 128) {
    fp4 ? launch<ExpertFormat::Mxfp4, 128>(m, arrays, groups, stream)
        : launch<ExpertFormat::Mxfp8, 128>(m, arrays, groups, stream);
  } else {
    fp4 ? launch<ExpertFormat::Mxfp4, 64>(m, arrays, groups, stream)
        : launch<ExpertFormat::Mxfp8, 64>(m, arrays, groups, stream);
  }
}

}  // namespace moekit::cuda
