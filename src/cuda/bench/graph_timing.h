// CUDA-graph timing for the GPU benchmarks (bench.cu, stream_probe.cu): RAII stream, graph and
// events, stream capture, and the median of graph replays.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

#include "cuda/common/cuda_check.h"

namespace moekit::cuda::bench_timing {

struct Stream {
  cudaStream_t s = nullptr;
  Stream() { MK_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)); }
  ~Stream() { MK_CUDA_WARN(cudaStreamDestroy(s)); }
};

struct Graph {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  ~Graph() {
    if (exec) MK_CUDA_WARN(cudaGraphExecDestroy(exec));
    if (graph) MK_CUDA_WARN(cudaGraphDestroy(graph));
  }
};

struct Events {
  cudaEvent_t a = nullptr, b = nullptr;
  Events() {
    MK_CUDA_CHECK(cudaEventCreate(&a));
    MK_CUDA_CHECK(cudaEventCreate(&b));
  }
  ~Events() {
    MK_CUDA_WARN(cudaEventDestroy(a));
    MK_CUDA_WARN(cudaEventDestroy(b));
  }
};

template <typename Fn>
inline void capture(Graph& g, cudaStream_t stream, Fn body) {
  MK_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  try {
    body();
  } catch (...) {
    cudaGraph_t broken = nullptr;
    (void)cudaStreamEndCapture(stream, &broken);
    if (broken) (void)cudaGraphDestroy(broken);
    throw;
  }
  MK_CUDA_CHECK(cudaStreamEndCapture(stream, &g.graph));
  MK_CUDA_CHECK(cudaGraphInstantiate(&g.exec, g.graph, 0));
}

// Median microseconds of `reps` replays (after `warm` untimed ones).
inline double time_graph(const Graph& g, cudaStream_t stream, int reps, int warm) {
  Events ev;
  for (int i = 0; i < warm; ++i) MK_CUDA_CHECK(cudaGraphLaunch(g.exec, stream));
  std::vector<float> ms(reps);
  for (int i = 0; i < reps; ++i) {
    MK_CUDA_CHECK(cudaEventRecord(ev.a, stream));
    MK_CUDA_CHECK(cudaGraphLaunch(g.exec, stream));
    MK_CUDA_CHECK(cudaEventRecord(ev.b, stream));
    MK_CUDA_CHECK(cudaEventSynchronize(ev.b));
    MK_CUDA_CHECK(cudaEventElapsedTime(&ms[i], ev.a, ev.b));
  }
  std::sort(ms.begin(), ms.end());
  return 1e3 * ms[reps / 2];
}

}  // namespace moekit::cuda::bench_timing
