// Kernel timeline of a forward (`moekit bench --device cuda --trace`): with a trace buffer set
// (GpuMoeLayer::set_trace), the router GEMM's dot and split-K kernels, the routing kernel and the
// bulk expert kernels record, for each event below, the earliest and the latest %globaltimer over
// their CTAs: when the first and the last CTA started, came out of griddepcontrol.wait, and
// finished. This is what ncu cannot show: ncu serialises the kernels, so it sees neither the
// PDL overlaps nor the gaps between launches.
// The bulk expert kernels also record each CTA's end and the SM it ran on, so that a spread
// between the first and the last CTA can be told apart: a few slow SMs, or a slope.
// Cost when unset: one predictable branch per CTA and event.
// Layout: kTraceEvents earliest times (UINT64_MAX before the first record), then kTraceEvents
// latest times (0 before), in ns; then per CTA (index blockIdx.x < kTraceMaxCtas) the bulk
// gate/up kernel's end times, the bulk down kernel's (ns; 0: none), the gate/up CTAs' SMs and
// the down CTAs' SMs (%smid), kTraceMaxCtas words each.
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
enum TraceCtaKernel : int { kTraceCtaGateUp, kTraceCtaDown };
constexpr int kTraceMaxCtas = 256;  // the bulk kernels run one CTA per SM (132 on the H200)
constexpr int kTraceCtaOffset = 2 * kTraceEvents;
constexpr int kTraceWords = kTraceCtaOffset + 4 * kTraceMaxCtas;

#ifdef __CUDACC__
// The GPU's global nanosecond timer (the same on every SM).
__device__ __forceinline__ unsigned long long global_timer_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Time t into event's earliest and latest words.
__device__ __forceinline__ void trace_record(unsigned long long* trace, int event,
                                             unsigned long long t) {
  atomicMin(trace + event, t);
  atomicMax(trace + kTraceEvents + event, t);
}

__device__ __forceinline__ void trace_mark(unsigned long long* trace, int event) {
  if (trace == nullptr) return;
  trace_record(trace, event, global_timer_ns());
}

// trace_mark of a bulk kernel's end `event`, with the same time recorded as this CTA's end in
// `kernel` (TraceCtaKernel), and its SM.
__device__ __forceinline__ void trace_cta_end(unsigned long long* trace, int event, int kernel) {
  if (trace == nullptr) return;
  const unsigned long long t = global_timer_ns();
  trace_record(trace, event, t);
  if (blockIdx.x >= kTraceMaxCtas) return;
  unsigned long long* cta = trace + kTraceCtaOffset;
  unsigned sm;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
  cta[kernel * kTraceMaxCtas + blockIdx.x] = t;
  cta[(2 + kernel) * kTraceMaxCtas + blockIdx.x] = sm;
}
#endif

}  // namespace moekit::cuda
