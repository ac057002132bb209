// LocalTransportLayer (moekit/ep_local.h): every rank on one GPU, the dispatch and combine
// kernels (dispatch_combine.h) between the ranks' buffers, cudaMemcpyAsync as the transport.
//
// Buffers, all of max_tokens_per_rank = cap rows:
//   per rank r      ids / weights [cap, k], shared scale [cap], home partial [cap, H],
//                   pos [W, cap] (token t's packed row in the block for d), counts [W]
//   per (r, d != r) send x [cap, H], ids / weights [cap, k]; back partial [cap, H]
//   per rank d      receive x / ids / weights / partial of (W - 1) blocks, source r's block b =
//                   r < d ? r : r - 1 (Throughput: packed at the counts' prefix; LowLatency: at b
//                   cap)
#include <cuda_runtime.h>

#include <algorithm>

#include "cuda/common/cuda_check.h"
#include "cuda/common/device_buffer.h"
#include "cuda/ep/dispatch_combine.h"
#include "moekit/ep_local.h"
#include "moekit/error.h"

namespace moekit::ep {

struct LocalTransportLayer::Impl {
  MoeSpec spec;
  Placement placement;
  LocalOptions opt;
  int W = 0, H = 0, k = 0, cap = 0;
  std::unique_ptr<MoeOp> op;
  cuda::DeviceBuffer ws;
  struct Rank {
    cuda::DeviceBuffer ids, weights, scale, home, pos, counts;
    cuda::DeviceBuffer recv_x, recv_ids, recv_weights, recv_y;
    std::vector<cuda::DeviceBuffer> send_x, send_ids, send_weights, back;  // [W], none at r
    int tokens = 0;
  };
  std::vector<Rank> ranks;
  std::vector<int32_t> counts;  // [W * W] source-major, the last forward's (Throughput)

  Impl(const MoeSpec& s, const Placement& p, const LocalOptions& o)
      : spec(s), placement(p), opt(o) {}
  int block_of(int src, int dst) const { return src < dst ? src : src - 1; }
};

namespace {

// Makes `device` current for the scope and restores the caller's (borrow, don't own).
struct DeviceScope {
  int previous = 0;
  explicit DeviceScope(int device) {
    MK_CUDA_CHECK(cudaGetDevice(&previous));
    MK_CUDA_CHECK(cudaSetDevice(device));
  }
  ~DeviceScope() { MK_CUDA_WARN(cudaSetDevice(previous)); }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;
};

int sentinel_for(const Placement& p, int d) {
  const int E = p.num_experts(), n = p.local_experts(d);
  MK_CHECK(n < E, "rank " << d << " holds all " << E << " experts: nothing is sent to it");
  return n == 0 ? 0 : (p.contiguous_first(d) + n) % E;
}

}  // namespace

LocalTransportLayer::LocalTransportLayer(const MoeSpec& spec, const Placement& placement,
                                         const LocalOptions& options)
    : impl_(std::make_unique<Impl>(spec, placement, options)) {
  Impl& m = *impl_;
  const DeviceScope device(options.engine.device);
  m.W = placement.world_size();
  m.H = spec.hidden;
  m.k = spec.top_k;
  m.cap = options.max_tokens_per_rank;
  MK_CHECK(placement.num_experts() == spec.num_experts,
           "the placement is of " << placement.num_experts() << " experts, " << spec.name << " has "
                                  << spec.num_experts);
  MK_CHECK(m.W >= 1 && m.W <= kMaxLocalRanks && m.W <= cuda::kEpMaxRanks,
           "the local transport takes 1 to " << kMaxLocalRanks << " ranks, got " << m.W);
  MK_CHECK(m.cap > 0, "expected max_tokens_per_rank > 0 (it sizes the buffers), got " << m.cap);
  MK_CHECK(m.H % 8 == 0,
           "the dispatch copies rows as 16-byte vectors: expected hidden % 8 == 0, "
           "got "
               << m.H);
  for (int r = 0; r < m.W; ++r) {
    MK_CHECK(placement.contiguous_first(r) >= 0,
             "the GPU path takes contiguous placements (the engine API's expert slices), rank "
                 << r << " holds " << placement.describe());
  }
  MoeOptions eo = options.engine;
  eo.max_tokens = std::max({eo.max_tokens, m.cap, (m.W - 1) * m.cap});
  m.op = std::make_unique<MoeOp>(spec, eo);
  m.ws = cuda::DeviceBuffer(m.op->workspace_bytes());
  m.op->prepare_workspace(m.ws.ptr, m.ws.bytes, nullptr);

  const size_t row = sizeof(Bf16) * m.H, pairs = sizeof(int32_t) * m.k;
  const size_t cap = m.cap, remote = static_cast<size_t>(m.W - 1) * cap;
  m.ranks.resize(m.W);
  m.counts.assign(static_cast<size_t>(m.W) * m.W, 0);
  for (Impl::Rank& r : m.ranks) {
    r.ids = cuda::DeviceBuffer(cap * pairs);
    r.weights = cuda::DeviceBuffer(cap * pairs);
    r.scale = cuda::DeviceBuffer(cap * sizeof(float));
    r.home = cuda::DeviceBuffer(cap * row);
    r.pos = cuda::DeviceBuffer(m.W * cap * sizeof(int32_t));
    r.counts = cuda::DeviceBuffer(m.W * sizeof(int32_t));
    r.recv_x = cuda::DeviceBuffer(remote * row);
    r.recv_ids = cuda::DeviceBuffer(remote * pairs);
    r.recv_weights = cuda::DeviceBuffer(remote * pairs);
    r.recv_y = cuda::DeviceBuffer(remote * row);
    // why zeroed: rows the pack never writes are read by no pair, but stay finite regardless
    MK_CUDA_CHECK(cudaMemset(r.recv_x.ptr, 0, r.recv_x.bytes));
    MK_CUDA_CHECK(cudaMemset(r.counts.ptr, 0, r.counts.bytes));
    r.send_x.resize(m.W);
    r.send_ids.resize(m.W);
    r.send_weights.resize(m.W);
    r.back.resize(m.W);
  }
  for (int s = 0; s < m.W; ++s) {
    for (int d = 0; d < m.W; ++d) {
      if (d == s) continue;
      Impl::Rank& r = m.ranks[s];
      r.send_x[d] = cuda::DeviceBuffer(cap * row);
      r.send_ids[d] = cuda::DeviceBuffer(cap * pairs);
      r.send_weights[d] = cuda::DeviceBuffer(cap * pairs);
      r.back[d] = cuda::DeviceBuffer(cap * row);
      MK_CUDA_CHECK(cudaMemset(r.send_x[d].ptr, 0, r.send_x[d].bytes));
    }
  }
}

LocalTransportLayer::~LocalTransportLayer() {
  if (!impl_) return;
  // the buffers are freed on the device they were allocated on
  int previous = 0;
  if (cudaGetDevice(&previous) != cudaSuccess) return;
  MK_CUDA_WARN(cudaSetDevice(impl_->opt.engine.device));
  impl_.reset();
  MK_CUDA_WARN(cudaSetDevice(previous));
}

void LocalTransportLayer::forward(const std::vector<LocalRank>& ranks, CUstream_st* stream) {
  Impl& m = *impl_;
  const int W = m.W, H = m.H, k = m.k;
  const bool low_latency = m.opt.mode == Mode::LowLatency;
  const DeviceScope device(m.opt.engine.device);
  MK_CHECK(static_cast<int>(ranks.size()) == W,
           "expected one LocalRank for each of the " << W << " ranks, got " << ranks.size());
  for (int r = 0; r < W; ++r) {
    const LocalRank& lr = ranks[r];
    MK_CHECK(lr.weights.location == Location::Device,
             "rank " << r << ": the local transport runs device views, got a host view");
    MK_CHECK(lr.weights.expert_offset == m.placement.contiguous_first(r) &&
                 lr.weights.local_experts(m.spec) == m.placement.local_experts(r),
             "rank " << r << "'s view holds experts [" << lr.weights.expert_offset << ", "
                     << lr.weights.expert_offset + lr.weights.local_experts(m.spec)
                     << "), the placement gives it " << m.placement.describe());
    MK_CHECK(lr.tokens >= 0 && lr.tokens <= m.cap,
             "rank " << r << " routes " << lr.tokens << " tokens, more than max_tokens_per_rank "
                     << m.cap << " that sizes the buffers");
    m.ranks[r].tokens = lr.tokens;
  }
  cudaStream_t st = stream;
  const bool has_shared = m.spec.shared_kind != SharedKind::None;

  // route, the home partial (own experts + shared expert), the pack for every other rank
  for (int r = 0; r < W; ++r) {
    const LocalRank& lr = ranks[r];
    Impl::Rank& R = m.ranks[r];
    float* scale = has_shared ? R.scale.as<float>() : nullptr;
    if (lr.tokens > 0) {
      m.op->route(lr.weights, lr.x, lr.tokens, R.ids.as<int32_t>(), R.weights.as<float>(), scale,
                  m.ws.ptr, m.ws.bytes, st);
      ExpertsOptions home;
      home.add_shared = true;
      home.shared_scale = scale;
      m.op->experts(lr.weights, lr.x, R.ids.as<int32_t>(), R.weights.as<float>(), R.home.ptr,
                    lr.tokens, home, m.ws.ptr, m.ws.bytes, st);
    }
    cuda::EpPackParams pp;
    pp.x = static_cast<const Bf16*>(lr.x);
    pp.topk_ids = R.ids.as<int32_t>();
    pp.topk_weights = R.weights.as<float>();
    pp.tokens = lr.tokens;
    pp.hidden = H;
    pp.top_k = k;
    pp.fill_rows = low_latency ? m.cap : 0;
    for (int d = 0; d < W; ++d) {
      if (d == r) continue;
      cuda::EpPackDest& pd = pp.dests[pp.num_dests++];
      pd.slice_first = m.placement.contiguous_first(d);
      pd.slice_count = m.placement.local_experts(d);
      pd.sentinel = sentinel_for(m.placement, d);
      pd.send_x = R.send_x[d].as<Bf16>();
      pd.send_ids = R.send_ids[d].as<int32_t>();
      pd.send_weights = R.send_weights[d].as<float>();
      pd.pos = R.pos.as<int32_t>() + static_cast<size_t>(d) * m.cap;
      pd.count = R.counts.as<int32_t>() + d;
    }
    cuda::launch_ep_dispatch_pack(pp, st);
  }

  // Throughput: the count exchange (the one host synchronisation)
  if (!low_latency) {
    for (int r = 0; r < W; ++r) {
      MK_CUDA_CHECK(cudaMemcpyAsync(m.counts.data() + static_cast<size_t>(r) * W,
                                    m.ranks[r].counts.ptr, sizeof(int32_t) * W,
                                    cudaMemcpyDeviceToHost, st));
    }
    MK_CUDA_CHECK(cudaStreamSynchronize(st));
  }
  // rows of source s's block at d, and where the block starts
  auto rows = [&](int s, int d) { return low_latency ? m.cap : m.counts[s * W + d]; };
  auto offset = [&](int s, int d) {
    if (low_latency) return m.block_of(s, d) * m.cap;
    int o = 0;
    for (int q = 0; q < s; ++q) o += q == d ? 0 : m.counts[q * W + d];
    return o;
  };
  const size_t row = sizeof(Bf16) * H, pair = sizeof(int32_t) * k;

  // dispatch's transport, the destination's experts on what it received, the return
  for (int d = 0; d < W; ++d) {
    Impl::Rank& D = m.ranks[d];
    int total = 0;
    for (int s = 0; s < W; ++s) {
      if (s == d || rows(s, d) == 0) continue;
      const size_t o = offset(s, d), n = rows(s, d);
      const Impl::Rank& S = m.ranks[s];
      MK_CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(D.recv_x.ptr) + o * row, S.send_x[d].ptr,
                                    n * row, cudaMemcpyDeviceToDevice, st));
      MK_CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(D.recv_ids.ptr) + o * pair,
                                    S.send_ids[d].ptr, n * pair, cudaMemcpyDeviceToDevice, st));
      MK_CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(D.recv_weights.ptr) + o * pair,
                                    S.send_weights[d].ptr, n * pair, cudaMemcpyDeviceToDevice, st));
      total = std::max<int>(total, static_cast<int>(o + n));
    }
    if (total > 0) {
      ExpertsOptions remote;
      remote.add_shared = false;  // the shared expert ran at home
      m.op->experts(ranks[d].weights, D.recv_x.ptr, D.recv_ids.as<int32_t>(),
                    D.recv_weights.as<float>(), D.recv_y.ptr, total, remote, m.ws.ptr, m.ws.bytes,
                    st);
    }
    for (int s = 0; s < W; ++s) {
      if (s == d || rows(s, d) == 0) continue;
      const size_t o = offset(s, d), n = rows(s, d);
      MK_CUDA_CHECK(cudaMemcpyAsync(m.ranks[s].back[d].ptr,
                                    static_cast<char*>(D.recv_y.ptr) + o * row, n * row,
                                    cudaMemcpyDeviceToDevice, st));
    }
  }

  // combine: in rank order, r's home partial at its own place
  for (int r = 0; r < W; ++r) {
    if (ranks[r].tokens == 0) continue;
    Impl::Rank& R = m.ranks[r];
    cuda::EpCombineParams cp;
    cp.y = static_cast<Bf16*>(ranks[r].y);
    cp.tokens = ranks[r].tokens;
    cp.hidden = H;
    for (int d = 0; d < W; ++d) {
      cuda::EpCombineTerm& term = cp.terms[cp.num_terms++];
      if (d == r) {
        term.rows = R.home.as<Bf16>();
        term.pos = nullptr;
      } else {
        term.rows = R.back[d].as<Bf16>();
        term.pos = R.pos.as<int32_t>() + static_cast<size_t>(d) * m.cap;
      }
    }
    cuda::launch_ep_combine(cp, st);
  }
}

std::vector<int32_t> LocalTransportLayer::topk_ids(int rank, CUstream_st* stream) const {
  const Impl& m = *impl_;
  MK_CHECK(rank >= 0 && rank < m.W, "expected a rank in [0, " << m.W << "), got " << rank);
  std::vector<int32_t> ids(static_cast<size_t>(m.ranks[rank].tokens) * m.k);
  MK_CUDA_CHECK(cudaMemcpyAsync(ids.data(), m.ranks[rank].ids.ptr, ids.size() * sizeof(int32_t),
                                cudaMemcpyDeviceToHost, stream));
  MK_CUDA_CHECK(cudaStreamSynchronize(stream));
  return ids;
}

std::vector<int32_t> LocalTransportLayer::rows_sent(int rank, CUstream_st* stream) const {
  const Impl& m = *impl_;
  MK_CHECK(rank >= 0 && rank < m.W, "expected a rank in [0, " << m.W << "), got " << rank);
  std::vector<int32_t> n(m.W);
  MK_CUDA_CHECK(cudaMemcpyAsync(n.data(), m.ranks[rank].counts.ptr, n.size() * sizeof(int32_t),
                                cudaMemcpyDeviceToHost, stream));
  MK_CUDA_CHECK(cudaStreamSynchronize(stream));
  n[rank] = 0;
  return n;
}

MoeStatus LocalTransportLayer::read_status(CUstream_st* stream) {
  return impl_->op->read_status(impl_->ws.ptr, stream);
}

}  // namespace moekit::ep
