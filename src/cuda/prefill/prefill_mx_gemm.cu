// The prefill path's MX grouped GEMM (prefill_mx.h): D_g = A_g . W_g^T with W_g expert g's
// packed MX matrix read as it is held (experts_mx_layout.h) and dequantised in registers by the
// bulk MX kernels' bit moves and multiply (experts_mx.cuh), so the GEMM reads the packed bytes
// once instead of a widened bf16 copy written and read again.
//
// A persistent CTA takes tiles of 128 weight rows (8 held tiles of 16 rows; the matrix's last
// n-tile may hold fewer, the rest zeros) x kBm tokens of the groups, the m-tiles of one weight tile
// consecutive, so CTAs that run together share its bytes in L2. Its K loop moves 128 elements a
// step (64 packed bytes a row for MXFP4, 128 for MXFP8, and each row's 4 e8m0 bytes, and the
// tokens' activations) through a ring of cp.async stages, as many as shared memory holds. Two
// warpgroups own 64 weight rows each: they make the A fragments of Hopper's warpgroup mma
// (wgmma.cuh) in registers from the step's packed words and multiply them into all kBm tokens,
// whose activations wgmma reads from shared memory in the 128-byte swizzle, K-major, in natural
// element order. The m16n8k16 A fragment gives lane (g, t) elements 2t, 2t + 1 of each 8, so a
// thread takes bf16 pair t of every MXFP4 word (8 elements), pair t % 2 of MXFP8 words t / 2 and
// 2 + t / 2 of every 16 elements; the step's A fragments are double-buffered so that a
// warpgroup's mma of one step runs while it makes the next step's.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "cuda/common/cuda_check.h"
#include "cuda/common/wgmma.cuh"
#include "cuda/experts/bulk_copy.cuh"
#include "cuda/experts/experts_common.cuh"
#include "cuda/experts/experts_mx.cuh"
#include "cuda/experts/experts_mx_layout.h"
#include "cuda/prefill/prefill_mx.h"
#include "moekit/error.h"

namespace moekit::cuda {
namespace {

using experts_detail::mx_factors;
using experts_detail::mx_weight;
using experts_detail::MxBits;
using experts_detail::smem_addr;

constexpr int kThreads = 256;    // two warpgroups
constexpr int kBn = 128;         // weight rows a tile: 8 held tiles, 64 a warpgroup
constexpr int kStepElems = 128;  // elements of K a step: 8 wgmma k-steps
constexpr int kKSteps = kStepElems / 16;
constexpr int kMaxGroups = 1024;  // groups whose tile counts a CTA keeps in shared memory
constexpr int kSmemLimit = 227 * 1024;
constexpr int kAtomBytes = 128;  // a token's row of one 128-byte swizzle atom: 64 elements
constexpr int kStepScales = kStepElems / kMxGroup;  // e8m0 bytes of a row a step

template <ExpertFormat F, int kBm>
struct Tile {
  static constexpr int kElems = mx_elems_per_byte(F);
  static constexpr int kRowBytes = kStepElems / kElems;  // packed bytes of a row a step
  static constexpr int kUnits = kRowBytes / 16;
  // a stage: the activations ([atom][token][128 bytes], 1024-byte aligned), the weights, the
  // e8m0 bytes (padded to keep the next stage aligned)
  static constexpr int kActBytes = kBm * 2 * kAtomBytes;
  static constexpr int kWeightBytes = kBn * kRowBytes;
  static constexpr int kScaleBytes = 1024;
  static constexpr int kStageBytes = kActBytes + kWeightBytes + kScaleBytes;
  static constexpr int kTailBytes = 1024 + (kMaxGroups + 1) * 4;  // alignment, tile counts
  static constexpr int kStages =
      (kSmemLimit - kTailBytes) / kStageBytes < 8 ? (kSmemLimit - kTailBytes) / kStageBytes : 8;
  static constexpr int kAhead = kStages - 2;  // steps in flight ahead of the one computed
  static constexpr int kSmemBytes = kStages * kStageBytes + kTailBytes;
  static_assert(kStageBytes % 1024 == 0 && kStages >= 3, "the ring's stages");
};

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

// The 16-byte unit of a weight row's step bytes where unit u lives: the 8 rows of a warp's loads
// (rows g, one unit) on distinct banks.
template <ExpertFormat F>
__device__ __forceinline__ int weight_unit(int u, int r) {
  return F == ExpertFormat::Mxfp4 ? u ^ (r >> 1 & 3) : u ^ (r & 7);
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

// A thread's bf16 pair bits of one packed word: pair t (of 4) of an MXFP4 word, pair t % 2 (of 2)
// of an MXFP8 word (mx_pair_bits with the pair a register: MXFP4 pairs 0-2 take one rotation and
// mask, pair 3 two, so every lane takes two, the second masked to nothing below pair 3).
struct PairPick {
  uint32_t rot1, rot2, mask1, mask2, shift;
};
template <ExpertFormat F>
__device__ __forceinline__ PairPick pair_pick(int t) {
  if constexpr (F == ExpertFormat::Mxfp8) {
    return {0, 0, 0, 0, 8u * (t & 1)};
  } else {
    const bool three = t == 3;
    const uint32_t rot = t == 0   ? mx_fp4_rotate(0)
                         : t == 1 ? mx_fp4_rotate(1)
                         : t == 2 ? mx_fp4_rotate(2)
                                  : mx_fp4_rotate(3);
    return {rot, three ? static_cast<uint32_t>(kMxfp4Rotate3Top) : 0u,
            three ? kMxfp4Pair3Low : kMxfp4Pair, three ? (kMxfp4Pair & ~kMxfp4Pair3Low) : 0u, 0};
  }
}
template <ExpertFormat F>
__device__ __forceinline__ uint32_t pair_bits(uint32_t w, const PairPick& p) {
  if constexpr (F == ExpertFormat::Mxfp8) {
    const uint32_t v = w << p.shift;
    return ((v >> 4) & 0x07f007f0u) | (v & 0x80008000u);
  } else {
    return (__funnelshift_l(w, w, p.rot1) & p.mask1) | (__funnelshift_l(w, w, p.rot2) & p.mask2);
  }
}

template <ExpertFormat F, int kBm>
__global__ void __launch_bounds__(kThreads, 1)
    mx_gemm_kernel(MxMatrices m, PrefillGroupArrays g, int groups) {
  using T = Tile<F, kBm>;
  constexpr int kS = T::kStages, kAhead = T::kAhead;
  if constexpr (!wgmma::kAvailable) __trap();  // (run_prefill_gemm_mx launches on sm_90 only)
  extern __shared__ unsigned char smem_raw[];
  // the stages 1024-byte aligned (the swizzle atoms' rows), the tile counts after them
  unsigned char* smem = smem_raw + ((1024 - smem_addr(smem_raw) % 1024) % 1024);
  int* tile_start = reinterpret_cast<int*>(smem + kS * T::kStageBytes);  // [groups + 1]
  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  const int gq = lane >> 2, t = lane & 3;
  const int row_lo = 16 * warp + gq;  // the thread's rows of the tile: row_lo, row_lo + 8
  const int row_bytes = m.k / T::kElems, chunks = mx_row_chunks(F, m.k);
  const int n_tiles = (m.rows + kBn - 1) / kBn;  // (the last may hold fewer held tiles)
  const int k_steps = (m.k + kStepElems - 1) / kStepElems;
  const long long matrix_bytes = static_cast<long long>(m.rows) * row_bytes;
  const long long matrix_scales = static_cast<long long>(chunks) * m.rows * mx_chunk_scale_bytes(F);
  const PairPick pick = pair_pick<F>(t);

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

    // one step's copies into stage s: the kBm tokens' activations (zeros past the group's rows
    // and past K) into the swizzle atoms, the 128 rows' weights and e8m0 bytes
    auto load_step = [&](int s, int ks) {
      unsigned char* st = smem + s * T::kStageBytes;
      for (int u = tid; u < kBm * (kStepElems / 8); u += kThreads) {
        const int r = u / (kStepElems / 8), c = u % (kStepElems / 8);
        const int row = m_tile * kBm + r, k = ks * kStepElems + 8 * c;
        const bool in = row < rows_m && k < m.k;
        const __nv_bfloat16* src = a + (in ? row * lda + k : 0);
        cp_async16(st + (c >> 3) * (kBm * kAtomBytes) + r * kAtomBytes + 16 * ((c & 7) ^ (r & 7)),
                   src, in);
      }
      unsigned char* wts = st + T::kActBytes;
      const int x0 = ks * T::kRowBytes;
      for (int u = tid; u < kBn * T::kUnits; u += kThreads) {
        const int r = u / T::kUnits, c = u % T::kUnits, x = x0 + 16 * c;
        const bool in = x < row_bytes && n_tile * kBn + r < m.rows;
        const HeldRow h =
            in ? held_row<F>(n_tile * 8 + r / 16, r % 16, x, row_bytes, chunks) : HeldRow{0, 0};
        cp_async16(wts + r * T::kRowBytes + 16 * weight_unit<F>(c, r), packed + h.byte, in);
      }
      if (tid < kBn) {
        const int r = tid;
        const bool in = x0 < row_bytes && n_tile * kBn + r < m.rows;
        const HeldRow h =
            in ? held_row<F>(n_tile * 8 + r / 16, r % 16, x0, row_bytes, chunks) : HeldRow{0, 0};
        // (the step's 4 e8m0 bytes lie in one row chunk: 2048 bytes hold whole steps)
        cp_async4(wts + T::kWeightBytes + r * kStepScales, scales + h.scale, in);
      }
    };

    float acc[kBm / 2];          // (the first step's first mma overwrites it)
    uint32_t af[2][kKSteps][4];  // the A fragments of two steps

    // step ks's A fragments into af[kBuf] and its 8 mma, committed as one group; the group of
    // step ks - 1 (the other buffer's) is then waited for
    auto compute_step = [&](int ks, auto buf) {
      constexpr int kBuf = decltype(buf)::value;
      const unsigned char* st = smem + (ks % kS) * T::kStageBytes;
      const unsigned char* wts = st + T::kActBytes;
      const uint32_t s_lo =
          *reinterpret_cast<const uint32_t*>(wts + T::kWeightBytes + row_lo * kStepScales);
      const uint32_t s_hi =
          *reinterpret_cast<const uint32_t*>(wts + T::kWeightBytes + (row_lo + 8) * kStepScales);
      // (warp-wide: a warp's lanes take one path; experts_mx.cuh)
      const uint32_t big = MxBits<F>::kOneStepMax * 0x01010101u;
      const bool two_steps =
          __any_sync(0xffffffffu, (__vcmpgtu4(s_lo, big) | __vcmpgtu4(s_hi, big)) != 0);
      auto make = [&](auto two) {
        constexpr bool kTwo = decltype(two)::value;
#pragma unroll
        for (int grp32 = 0; grp32 < kStepScales; ++grp32) {
          uint32_t f_lo, g_lo, f_hi, g_hi;
          mx_factors<F, kTwo>(s_lo >> (8 * grp32) & 0xff, f_lo, g_lo);
          mx_factors<F, kTwo>(s_hi >> (8 * grp32) & 0xff, f_hi, g_hi);
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int kk = 2 * grp32 + h;  // the wgmma k-step: elements 16 kk .. 16 kk + 15
            uint32_t wl[2], wh[2];         // the words of elements 16 kk + 2t (+ 8)
            if constexpr (F == ExpertFormat::Mxfp4) {
              // unit grp32's words 2h, 2h + 1
              const int off_lo = row_lo * T::kRowBytes + 16 * weight_unit<F>(grp32, row_lo) + 8 * h;
              const int off_hi =
                  (row_lo + 8) * T::kRowBytes + 16 * weight_unit<F>(grp32, row_lo + 8) + 8 * h;
              const uint2 l = *reinterpret_cast<const uint2*>(wts + off_lo);
              const uint2 u = *reinterpret_cast<const uint2*>(wts + off_hi);
              wl[0] = l.x, wl[1] = l.y, wh[0] = u.x, wh[1] = u.y;
            } else {
              // unit kk's words t / 2 and 2 + t / 2
              const int off_lo =
                  row_lo * T::kRowBytes + 16 * weight_unit<F>(kk, row_lo) + 4 * (t >> 1);
              const int off_hi =
                  (row_lo + 8) * T::kRowBytes + 16 * weight_unit<F>(kk, row_lo + 8) + 4 * (t >> 1);
              wl[0] = *reinterpret_cast<const uint32_t*>(wts + off_lo);
              wl[1] = *reinterpret_cast<const uint32_t*>(wts + off_lo + 8);
              wh[0] = *reinterpret_cast<const uint32_t*>(wts + off_hi);
              wh[1] = *reinterpret_cast<const uint32_t*>(wts + off_hi + 8);
            }
            af[kBuf][kk][0] = mx_weight<kTwo>(pair_bits<F>(wl[0], pick), f_lo, g_lo);
            af[kBuf][kk][1] = mx_weight<kTwo>(pair_bits<F>(wh[0], pick), f_hi, g_hi);
            af[kBuf][kk][2] = mx_weight<kTwo>(pair_bits<F>(wl[1], pick), f_lo, g_lo);
            af[kBuf][kk][3] = mx_weight<kTwo>(pair_bits<F>(wh[1], pick), f_hi, g_hi);
          }
        }
      };
      if (two_steps) {
        make(std::true_type{});
      } else {
        make(std::false_type{});
      }
      const uint32_t acts = smem_addr(st);
      wgmma::fence();
#pragma unroll
      for (int kk = 0; kk < kKSteps; ++kk) {
        wgmma::mma_rs_bf16<kBm>(
            acc, af[kBuf][kk],
            wgmma::b_desc_sw128(acts + (kk >> 2) * (kBm * kAtomBytes) + 32 * (kk & 3)),
            ks > 0 || kk > 0);
      }
      wgmma::commit();
      wgmma::wait<1>();
    };

    // the ring: step ks's copies wait for their group, every thread's writes are made visible
    // to the mma's reads, and the barrier also means every warpgroup has waited for the mma of
    // step ks - 2, whose stage the copies of step ks + kAhead then take
#pragma unroll
    for (int s = 0; s < kAhead; ++s) {
      if (s < k_steps) load_step(s, s);
      cp_async_commit();
    }
    auto ring_step = [&](int ks) {
      cp_async_wait<kAhead - 1>();
      wgmma::fence_proxy_async_shared();
      __syncthreads();
      if (ks + kAhead < k_steps) load_step((ks + kAhead) % kS, ks + kAhead);
      cp_async_commit();
    };
    for (int ks = 0; ks < k_steps; ks += 2) {
      ring_step(ks);
      compute_step(ks, std::integral_constant<int, 0>{});
      if (ks + 1 < k_steps) {
        ring_step(ks + 1);
        compute_step(ks + 1, std::integral_constant<int, 1>{});
      }
    }
    wgmma::wait<0>();
#pragma unroll
    for (int i = 0; i < kBm / 2; ++i) wgmma::fence_operand(acc[i]);
    cp_async_wait<0>();
    __syncthreads();  // the stages are the next tile's

    // D[token][column]: column = the held row's place in the matrix (gate rows, then up rows);
    // acc[4 i + 2 h + e] is row row_lo + 8 h, token 8 i + 2 t + e
    __nv_bfloat16* d = g.d[grp];
    const long long ldd = g.stride_d[grp];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = row_lo + 8 * h;
      if (n_tile * kBn + r >= m.rows) continue;
      const int col = mx_tile_row(m.gate_up, m.rows, n_tile * 8 + r / 16, r % 16);
#pragma unroll
      for (int i = 0; i < kBm / 8; ++i) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int row = m_tile * kBm + 8 * i + 2 * t + e;
          if (row < rows_m) d[row * ldd + col] = __float2bfloat16_rn(acc[4 * i + 2 * h + e]);
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
  const char* why = nullptr;  // (its warpgroup mma is sm_90a's, as the CUTLASS instances are)
  MK_CHECK(prefill_gemm_supported(&why), "run_prefill_gemm_mx: " << why);
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
