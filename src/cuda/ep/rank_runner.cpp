// RankRunner (rank_runner.h): one expert-parallel rank's buffers and phases, and run_forward,
// the order every driver runs them in.
#include "cuda/ep/rank_runner.h"

#include <algorithm>

#include "cuda/common/cuda_check.h"
#include "cuda/common/device_guard.h"
#include "cuda/ep/dispatch_combine.h"
#include "moekit/error.h"

namespace moekit::ep {

namespace {

// The phase boundaries timings record (RankStats' fields, in order).
enum Mark { kStart, kRouted, kHome, kPacked, kCounted, kDispatched, kRemote, kReturned, kDone };
constexpr int kMarks = kDone + 1;

int sentinel_for(const Placement& p, int d) {
  const int E = p.num_experts(), n = p.local_experts(d);
  MK_CHECK(n < E, "rank " << d << " holds all " << E << " experts: nothing is sent to it");
  return n == 0 ? 0 : (p.contiguous_first(d) + n) % E;
}

}  // namespace

RankRunner::RankRunner(const MoeSpec& spec, const Placement& placement, int rank,
                       const LayerOptions& options)
    : spec_(spec), placement_(placement), options_(options), rank_(rank) {
  W_ = placement.world_size();
  H_ = spec.hidden;
  k_ = spec.top_k;
  cap_ = options.max_tokens_per_rank;
  low_latency_ = options.mode == Mode::LowLatency;
  MK_CHECK(placement.num_experts() == spec.num_experts,
           "the placement is of " << placement.num_experts() << " experts, " << spec.name << " has "
                                  << spec.num_experts);
  MK_CHECK(W_ >= 1 && W_ <= kMaxGpuRanks && W_ <= cuda::kEpMaxRanks,
           "expert parallelism on the GPU takes 1 to " << kMaxGpuRanks << " ranks, got " << W_);
  MK_CHECK(rank >= 0 && rank < W_, "expected a rank in [0, " << W_ << "), got " << rank);
  MK_CHECK(cap_ > 0, "expected max_tokens_per_rank > 0 (it sizes the buffers), got " << cap_);
  MK_CHECK(H_ % 8 == 0,
           "the dispatch copies rows as 16-byte vectors: expected hidden % 8 == 0, got " << H_);
  for (int r = 0; r < W_; ++r) {
    MK_CHECK(placement.contiguous_first(r) >= 0,
             "the GPU path takes contiguous placements (the engine API's expert slices), rank "
                 << r << " holds " << placement.describe());
    // a destination must leave an id outside its slice for the fill rows: refused here, not in
    // a forward
    if (r != rank && W_ > 1) sentinel_for(placement, r);
  }
  cuda::DeviceGuard guard(options.engine.device);
  MoeOptions eo = options.engine;
  eo.max_tokens = std::max(cap_, (W_ - 1) * cap_);
  op_ = std::make_unique<MoeOp>(spec, eo);
  ws_ = cuda::DeviceBuffer(op_->workspace_bytes());
  op_->prepare_workspace(ws_.ptr, ws_.bytes, nullptr);

  const size_t row = sizeof(Bf16) * H_, pairs = sizeof(int32_t) * k_;
  const size_t cap = cap_, remote = static_cast<size_t>(W_ - 1) * cap;
  ids_ = cuda::DeviceBuffer(cap * pairs);
  weights_ = cuda::DeviceBuffer(cap * pairs);
  scale_ = cuda::DeviceBuffer(cap * sizeof(float));
  home_ = cuda::DeviceBuffer(cap * row);
  pos_ = cuda::DeviceBuffer(W_ * cap * sizeof(int32_t));
  counts_ = cuda::DeviceBuffer(W_ * sizeof(int32_t));
  recv_counts_ = cuda::DeviceBuffer(W_ * sizeof(int32_t));
  recv_x_ = cuda::DeviceBuffer(remote * row);
  recv_ids_ = cuda::DeviceBuffer(remote * pairs);
  recv_weights_ = cuda::DeviceBuffer(remote * pairs);
  recv_y_ = cuda::DeviceBuffer(remote * row);
  // why zeroed: rows the pack never writes are read by no pair, but stay finite regardless
  MK_CUDA_CHECK(cudaMemset(recv_x_.ptr, 0, recv_x_.bytes));
  MK_CUDA_CHECK(cudaMemset(counts_.ptr, 0, counts_.bytes));
  MK_CUDA_CHECK(cudaMemset(recv_counts_.ptr, 0, recv_counts_.bytes));
  send_x_.resize(W_);
  send_ids_.resize(W_);
  send_weights_.resize(W_);
  back_.resize(W_);
  for (int d = 0; d < W_; ++d) {
    if (d == rank) continue;
    send_x_[d] = cuda::DeviceBuffer(cap * row);
    send_ids_[d] = cuda::DeviceBuffer(cap * pairs);
    send_weights_[d] = cuda::DeviceBuffer(cap * pairs);
    back_[d] = cuda::DeviceBuffer(cap * row);
    MK_CUDA_CHECK(cudaMemset(send_x_[d].ptr, 0, send_x_[d].bytes));
  }
  MK_CUDA_CHECK(cudaMallocHost(&host_counts_, 2 * W_ * sizeof(int32_t)));
  std::fill(host_counts_, host_counts_ + 2 * W_, 0);
  MK_CUDA_CHECK(cudaEventCreateWithFlags(&counts_ready_, cudaEventDisableTiming));
  if (options.timings) {
    marks_.resize(kMarks);
    for (cudaEvent_t& e : marks_) MK_CUDA_CHECK(cudaEventCreate(&e));
  }
  MK_CUDA_CHECK(cudaDeviceSynchronize());
}

RankRunner::~RankRunner() {
  // the buffers and events are freed on the device they were made on
  int previous = 0;
  if (cudaGetDevice(&previous) != cudaSuccess) return;
  MK_CUDA_WARN(cudaSetDevice(device()));
  for (cudaEvent_t e : marks_) MK_CUDA_WARN(cudaEventDestroy(e));
  if (counts_ready_ != nullptr) MK_CUDA_WARN(cudaEventDestroy(counts_ready_));
  if (host_counts_ != nullptr) MK_CUDA_WARN(cudaFreeHost(host_counts_));
  send_x_.clear();
  send_ids_.clear();
  send_weights_.clear();
  back_.clear();
  ws_ = {};
  ids_ = {}, weights_ = {}, scale_ = {}, home_ = {}, pos_ = {}, counts_ = {}, recv_counts_ = {};
  recv_x_ = {}, recv_ids_ = {}, recv_weights_ = {}, recv_y_ = {};
  op_.reset();
  MK_CUDA_WARN(cudaSetDevice(previous));
}

void RankRunner::check(const RankIo& io) const {
  MK_CHECK(io.weights.location == Location::Device,
           "rank " << rank_ << ": expert parallelism runs device views, got a host view");
  MK_CHECK(io.weights.expert_offset == placement_.contiguous_first(rank_) &&
               io.weights.local_experts(spec_) == placement_.local_experts(rank_),
           "rank " << rank_ << "'s view holds experts [" << io.weights.expert_offset << ", "
                   << io.weights.expert_offset + io.weights.local_experts(spec_)
                   << "), the placement gives it " << placement_.describe());
  MK_CHECK(io.tokens >= 0 && io.tokens <= cap_, "rank " << rank_ << " routes " << io.tokens
                                                        << " tokens, more than max_tokens_per_rank "
                                                        << cap_ << " that sizes the buffers");
  MK_CHECK(io.tokens == 0 || (io.x != nullptr && io.y != nullptr),
           "rank " << rank_ << ": x and y must be set for " << io.tokens << " tokens");
}

void RankRunner::mark(int phase) {
  if (!marks_.empty()) MK_CUDA_CHECK(cudaEventRecord(marks_[phase], stream_));
}

int RankRunner::rows_to(int d) const { return low_latency_ ? cap_ : host_counts_[d]; }
int RankRunner::rows_from(int s) const { return low_latency_ ? cap_ : host_counts_[W_ + s]; }

int RankRunner::offset_from(int s) const {
  if (low_latency_) return (s < rank_ ? s : s - 1) * cap_;
  int o = 0;
  for (int q = 0; q < s; ++q) o += q == rank_ ? 0 : rows_from(q);
  return o;
}

int RankRunner::received_rows() const {
  int n = 0;
  for (int s = 0; s < W_; ++s) n += s == rank_ ? 0 : rows_from(s);
  return n;
}

void RankRunner::start(const RankIo& io, cudaStream_t s) {
  io_ = io;  // (run_forward checked every rank's io before any rank starts)
  stream_ = s;
  cuda::DeviceGuard guard(device());
  mark(kStart);
  float* scale = has_shared() ? scale_.as<float>() : nullptr;
  if (io.tokens > 0) {
    op_->route(io.weights, io.x, io.tokens, ids_.as<int32_t>(), weights_.as<float>(), scale,
               ws_.ptr, ws_.bytes, s);
  }
  mark(kRouted);
  if (io.tokens > 0) {
    ExpertsOptions home;
    home.add_shared = true;
    home.shared_scale = scale;
    op_->experts(io.weights, io.x, ids_.as<int32_t>(), weights_.as<float>(), home_.ptr, io.tokens,
                 home, ws_.ptr, ws_.bytes, s);
  }
  mark(kHome);
  if (W_ > 1) {
    cuda::EpPackParams pp;
    pp.x = static_cast<const Bf16*>(io.x);
    pp.topk_ids = ids_.as<int32_t>();
    pp.topk_weights = weights_.as<float>();
    pp.tokens = io.tokens;
    pp.hidden = H_;
    pp.top_k = k_;
    pp.fill_rows = low_latency_ ? cap_ : 0;
    for (int d = 0; d < W_; ++d) {
      if (d == rank_) continue;
      cuda::EpPackDest& pd = pp.dests[pp.num_dests++];
      pd.slice_first = placement_.contiguous_first(d);
      pd.slice_count = placement_.local_experts(d);
      pd.sentinel = sentinel_for(placement_, d);
      pd.send_x = send_x_[d].as<Bf16>();
      pd.send_ids = send_ids_[d].as<int32_t>();
      pd.send_weights = send_weights_[d].as<float>();
      pd.pos = pos_.as<int32_t>() + static_cast<size_t>(d) * cap_;
      pd.count = counts_.as<int32_t>() + d;
    }
    cuda::launch_ep_dispatch_pack(pp, s);
  }
  mark(kPacked);
  if (low_latency_) mark(kCounted);  // no count exchange: a phase of no time
}

void RankRunner::post_counts(Exchange& ex) {
  for (int d = 0; d < W_; ++d) {
    if (d != rank_) ex.send(rank_, d, counts_.as<int32_t>() + d, sizeof(int32_t), stream_);
  }
  for (int s = 0; s < W_; ++s) {
    if (s != rank_) ex.recv(rank_, s, recv_counts_.as<int32_t>() + s, sizeof(int32_t), stream_);
  }
}

void RankRunner::read_counts() {
  cuda::DeviceGuard guard(device());
  const size_t n = sizeof(int32_t) * W_;
  MK_CUDA_CHECK(cudaMemcpyAsync(host_counts_, counts_.ptr, n, cudaMemcpyDeviceToHost, stream_));
  MK_CUDA_CHECK(
      cudaMemcpyAsync(host_counts_ + W_, recv_counts_.ptr, n, cudaMemcpyDeviceToHost, stream_));
  MK_CUDA_CHECK(cudaEventRecord(counts_ready_, stream_));
}

void RankRunner::wait_counts() {
  cuda::DeviceGuard guard(device());
  MK_CUDA_CHECK(cudaEventSynchronize(counts_ready_));
  host_counts_[rank_] = host_counts_[W_ + rank_] = 0;
  for (int q = 0; q < W_; ++q) {
    MK_CHECK(host_counts_[q] >= 0 && host_counts_[q] <= cap_ && host_counts_[W_ + q] >= 0 &&
                 host_counts_[W_ + q] <= cap_,
             "rank " << rank_ << ": a row count with rank " << q << " outside [0, " << cap_
                     << "] (sent " << host_counts_[q] << ", received " << host_counts_[W_ + q]
                     << "): the ranks disagree on max_tokens_per_rank or the placement");
  }
  mark(kCounted);
}

void RankRunner::post_dispatch(Exchange& ex) {
  const size_t row = sizeof(Bf16) * H_, pair = sizeof(int32_t) * k_;
  for (int d = 0; d < W_; ++d) {
    const size_t n = d == rank_ ? 0 : rows_to(d);
    if (n == 0) continue;
    ex.send(rank_, d, send_x_[d].ptr, n * row, stream_);
    ex.send(rank_, d, send_ids_[d].ptr, n * pair, stream_);
    ex.send(rank_, d, send_weights_[d].ptr, n * pair, stream_);
  }
  for (int s = 0; s < W_; ++s) {
    const size_t n = s == rank_ ? 0 : rows_from(s), o = offset_from(s);
    if (n == 0) continue;
    ex.recv(rank_, s, static_cast<char*>(recv_x_.ptr) + o * row, n * row, stream_);
    ex.recv(rank_, s, static_cast<char*>(recv_ids_.ptr) + o * pair, n * pair, stream_);
    ex.recv(rank_, s, static_cast<char*>(recv_weights_.ptr) + o * pair, n * pair, stream_);
  }
}

void RankRunner::remote_experts() {
  cuda::DeviceGuard guard(device());
  mark(kDispatched);
  const int total = received_rows();
  if (total > 0) {
    ExpertsOptions remote;
    remote.add_shared = false;  // the shared expert ran at home
    op_->experts(io_.weights, recv_x_.ptr, recv_ids_.as<int32_t>(), recv_weights_.as<float>(),
                 recv_y_.ptr, total, remote, ws_.ptr, ws_.bytes, stream_);
  }
  mark(kRemote);
}

void RankRunner::post_return(Exchange& ex) {
  const size_t row = sizeof(Bf16) * H_;
  for (int s = 0; s < W_; ++s) {
    const size_t n = s == rank_ ? 0 : rows_from(s), o = offset_from(s);
    if (n > 0) ex.send(rank_, s, static_cast<char*>(recv_y_.ptr) + o * row, n * row, stream_);
  }
  for (int d = 0; d < W_; ++d) {
    const size_t n = d == rank_ ? 0 : rows_to(d);
    if (n > 0) ex.recv(rank_, d, back_[d].ptr, n * row, stream_);
  }
}

void RankRunner::finish() {
  cuda::DeviceGuard guard(device());
  mark(kReturned);
  if (io_.tokens > 0) {
    cuda::EpCombineParams cp;
    cp.y = static_cast<Bf16*>(io_.y);
    cp.tokens = io_.tokens;
    cp.hidden = H_;
    for (int d = 0; d < W_; ++d) {
      cuda::EpCombineTerm& term = cp.terms[cp.num_terms++];
      if (d == rank_) {
        term.rows = home_.as<Bf16>();
        term.pos = nullptr;
      } else {
        term.rows = back_[d].as<Bf16>();
        term.pos = pos_.as<int32_t>() + static_cast<size_t>(d) * cap_;
      }
    }
    cuda::launch_ep_combine(cp, stream_);
  }
  mark(kDone);
}

std::vector<int32_t> RankRunner::topk_ids() const {
  cuda::DeviceGuard guard(device());
  std::vector<int32_t> ids(static_cast<size_t>(io_.tokens) * k_);
  MK_CUDA_CHECK(cudaStreamSynchronize(stream_));
  MK_CUDA_CHECK(
      cudaMemcpy(ids.data(), ids_.ptr, ids.size() * sizeof(int32_t), cudaMemcpyDeviceToHost));
  return ids;
}

std::vector<int32_t> RankRunner::rows_sent() const {
  cuda::DeviceGuard guard(device());
  std::vector<int32_t> n(W_);
  MK_CUDA_CHECK(cudaStreamSynchronize(stream_));
  MK_CUDA_CHECK(
      cudaMemcpy(n.data(), counts_.ptr, n.size() * sizeof(int32_t), cudaMemcpyDeviceToHost));
  n[rank_] = 0;
  return n;
}

RankStats RankRunner::stats() const {
  MK_CHECK(!marks_.empty(), "rank " << rank_ << ": no timings (LayerOptions::timings is off)");
  cuda::DeviceGuard guard(device());
  MK_CUDA_CHECK(cudaEventSynchronize(marks_[kDone]));
  auto us = [&](int a, int b) {
    float ms = 0;
    MK_CUDA_CHECK(cudaEventElapsedTime(&ms, marks_[a], marks_[b]));
    return ms * 1000.0f;
  };
  RankStats st;
  st.route_us = us(kStart, kRouted);
  st.home_us = us(kRouted, kHome);
  st.pack_us = us(kHome, kPacked);
  st.counts_us = us(kPacked, kCounted);
  st.dispatch_us = us(kCounted, kDispatched);
  st.remote_us = us(kDispatched, kRemote);
  st.return_us = us(kRemote, kReturned);
  st.combine_us = us(kReturned, kDone);
  st.total_us = us(kStart, kDone);
  const size_t row = sizeof(Bf16) * H_, pair = sizeof(int32_t) * k_;
  for (int q = 0; q < W_; ++q) {
    if (q == rank_) continue;
    st.dispatch_bytes += static_cast<size_t>(rows_to(q)) * (row + 2 * pair);
    st.dispatch_bytes += low_latency_ ? 0 : sizeof(int32_t);
    st.return_bytes += static_cast<size_t>(rows_from(q)) * row;
  }
  return st;
}

MoeStatus RankRunner::read_status(cudaStream_t stream) {
  cuda::DeviceGuard guard(device());
  return op_->read_status(ws_.ptr, stream);
}

void run_forward(const std::vector<RankRunner*>& ranks, const std::vector<RankIo>& io,
                 const std::vector<cudaStream_t>& streams, Exchange& ex) {
  MK_CHECK(io.size() == ranks.size() && streams.size() == ranks.size(),
           "expected one RankIo and one stream per rank driven ("
               << ranks.size() << "), got " << io.size() << " and " << streams.size());
  for (size_t i = 0; i < ranks.size(); ++i) ranks[i]->check(io[i]);
  // every phase for every rank; an exchange phase inside one group
  auto exchange = [&](void (RankRunner::*post)(Exchange&)) {
    ex.begin();
    try {
      for (RankRunner* r : ranks) (r->*post)(ex);
    } catch (...) {
      ex.abandon();
      throw;
    }
    ex.end();
  };
  for (size_t i = 0; i < ranks.size(); ++i) ranks[i]->start(io[i], streams[i]);
  if (!ranks.front()->low_latency()) {
    exchange(&RankRunner::post_counts);
    for (RankRunner* r : ranks) r->read_counts();
    for (RankRunner* r : ranks) r->wait_counts();
  }
  exchange(&RankRunner::post_dispatch);
  for (RankRunner* r : ranks) r->remote_experts();
  exchange(&RankRunner::post_return);
  for (RankRunner* r : ranks) r->finish();
}

}  // namespace moekit::ep
