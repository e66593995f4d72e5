// What the native CPU kernels share: the vector type for this CPU and the split of a call's
// work over the XLA intra-op thread pool.
#ifndef ASD_JAX_NATIVE_CPU_COMMON_H_
#define ASD_JAX_NATIVE_CPU_COMMON_H_

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>

#include "xla/ffi/api/ffi.h"

namespace asd_native {

// Vector width follows the compiler's target (-march=native): GCC vector extensions lower to
// AVX-512, AVX2 or SSE.
#if defined(__AVX512F__)
constexpr int kLanes = 16;
#elif defined(__AVX__)
constexpr int kLanes = 8;
#else
constexpr int kLanes = 4;
#endif

typedef float Vec __attribute__((vector_size(kLanes * sizeof(float)), aligned(4)));
typedef int32_t Ints __attribute__((vector_size(kLanes * sizeof(int32_t))));

// aligned(4): unaligned vector loads and stores through the pointer.
inline Vec Load(const float* p) { return *reinterpret_cast<const Vec*>(p); }
inline void Store(float* p, Vec v) { *reinterpret_cast<Vec*>(p) = v; }

// Below this much work (weights read, or multiply-adds) a second thread costs more than it
// saves.
constexpr int64_t kMinWorkPerThread = 1 << 16;

// How many parts to split `work` into: at most one per pool thread and `max_parts`, and none
// smaller than kMinWorkPerThread.
inline int Parts(xla::ffi::ThreadPool& pool, int64_t work, int64_t max_parts) {
  return static_cast<int>(std::min<int64_t>(
      {std::max<int64_t>(1, pool.num_threads()), std::max<int64_t>(1, work / kMinWorkPerThread),
       std::max<int64_t>(1, max_parts)}));
}

// Runs work(p) for p in [0, parts) on the calling thread and the XLA intra-op pool. Threads
// claim pieces from a counter, so the caller never waits for a task the pool has not started
// (no deadlock when every pool thread is busy); a task that starts late finds nothing to do.
template <typename F>
void RunParts(xla::ffi::ThreadPool& pool, int parts, F work) {
  struct State {
    std::atomic<int> next{0};
    std::atomic<int> done{0};
  };
  auto state = std::make_shared<State>();
  auto claim = [state, parts, work] {
    for (int p = state->next.fetch_add(1); p < parts; p = state->next.fetch_add(1)) {
      work(p);
      state->done.fetch_add(1, std::memory_order_release);
    }
  };
  for (int t = 1; t < parts; ++t) pool.Schedule([claim] { claim(); });
  claim();
  while (state->done.load(std::memory_order_acquire) < parts) {
  }
}

}  // namespace asd_native

#endif  // ASD_JAX_NATIVE_CPU_COMMON_H_
