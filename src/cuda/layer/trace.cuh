// Kernel timeline of a forward (`moekit bench --device cuda --trace`): with a trace buffer set
// (GpuMoeLayer::set_trace), the router GEMM's dot and split-K kernels, the routing kernel and the
// bulk expert kernels record, for each event below, the earliest and the latest %globaltimer over
// their CTAs: when the first and the last CTA started, came out of griddepcontrol.wait, and
// finished. This is what ncu cannot show: ncu serialises the kernels, so it sees neither the
// PDL overlaps nor the gaps between launches.
// Cost when unset: one predictable branch per CTA and event.
// Layout: kTraceEvents earliest times (UINT64_MAX before the first record), then kTraceEvents
// latest times (0 before), in ns.
#pragma once

#include <cuda_runtime.h>

namespace moekit::cuda {

enum TraceEvent : int {
  kTraceRouterStart,   // the router GEMM (dot and split-K kernels; not cuBLAS)
  kTraceRouterWaited,  // its griddepcontrol.wait returned (CTA thread 0)
  kTraceRouterSummed,  // CTA thread 0's products summed (x loaded from L2 after the wait)
  kTraceRouterEnd,     // a CTA's output stored (or its cluster partial published)
  kTraceRoutingStart,
  kTraceRoutingWaited,
  kTraceRoutingKeyed,   // token 0's scores and selection keys computed (logits read)
  kTraceRoutingGrouped,  // token 0's groups kept (grouped top-k only)
  kTraceRoutingPicked,  // token 0's top-k ids picked
  kTraceRoutingRouted,  // ids and weights written (each CTA, before the dispatch)
  kTraceRoutingEnd,     // the dispatch is written (the last CTA)
  kTraceGateUpStart,
  kTraceGateUpWaited,  // the producer passed griddepcontrol.wait
  kTraceGateUpEnd,     // the epilogue warp wrote its last output
  kTraceDownStart,
  kTraceDownIssued,  // the producer issued its first stage's weight copies (before its wait)
  kTraceDownWaited,
  kTraceDownConsumed,  // the consumers handed their last item to the epilogue
  kTraceDownEnd,       // the epilogue warp wrote (and combined) its last output
  kTraceEvents
};
constexpr int kTraceWords = 2 * kTraceEvents;

#ifdef __CUDACC__
// The GPU's global nanosecond timer (the same on every SM).
__device__ __forceinline__ unsigned long long global_timer_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ __forceinline__ void trace_mark(unsigned long long* trace, int event) {
  if (trace == nullptr) return;
  const unsigned long long t = global_timer_ns();
  atomicMin(trace + event, t);
  atomicMax(trace + kTraceEvents + event, t);
}
#endif

}  // namespace moekit::cuda
