// y[M, N] = x[M, K] @ w[K, N] (and x @ w^T for w stored [N, K], the tied LM head) for a few
// rows (decode steps, verification blocks), float32, as XLA FFI custom calls for the CPU.
//
// Why: XLA:CPU multiplies one row by a weight matrix at about memory speed, but 2-16 rows go
// to a GEMM path (YNNPACK/Eigen) that streams the weights far slower: on a 2-core Xeon,
// SmolLM2's 30 MLP blocks took 12 ms at 1 row and 26 ms at 6, so a 6-token verification cost
// ~1.7x a decode step. Register-blocked FMAs are not the limit (this kernel reaches ~180
// GFLOP/s at 6 rows when w sits in L2); keeping the memory system busy is:
// - w is read row by row, each thread streaming its own contiguous range of K (partial sums
//   added at the end), never a strided column walk that defeats the hardware prefetcher;
// - up to 6 x-rows x 4 vectors of accumulators stay in registers;
// - the rows kRowBlock ahead are prefetched in software, which alone took the 6-row case from
//   24 to 30 GB/s streamed.
// 6 rows then cost ~1.1x one row.
//
// Row invariance: every output element is accumulated in the same order whatever M is and
// whichever other rows are in the call (k ascending inside each K part, parts added in order;
// lane sums in one fixed order), so a row's result is bitwise the same in a 1-row step and in
// a 6-row verification.
//
// Vector width follows the compiler's target (-march=native): GCC vector extensions lower to
// AVX-512, AVX2 or SSE.

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <type_traits>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

#if defined(__AVX512F__)
constexpr int kLanes = 16;
#elif defined(__AVX__)
constexpr int kLanes = 8;
#else
constexpr int kLanes = 4;
#endif
constexpr int kVecs = 4;                       // vectors per column tile
constexpr int kTile = kLanes * kVecs;          // columns per tile
constexpr int kRowsInRegisters = 6;            // x-rows whose accumulators fit at once
constexpr int kRowBlock = 8;                   // w rows per register pass over a tile

typedef float Vec __attribute__((vector_size(kLanes * sizeof(float)), aligned(4)));

// aligned(4): unaligned vector loads and stores through the pointer.
inline Vec Load(const float* p) { return *reinterpret_cast<const Vec*>(p); }
inline void Store(float* p, Vec v) { *reinterpret_cast<Vec*>(p) = v; }

// acc[R rows][tile] of y += x[R, k0:k1] @ w[k0:k1, tile columns], for every full tile.
template <int R>
void TilesPart(int64_t K, int64_t N, const float* x, const float* w, float* y, int64_t k0,
               int64_t k1) {
  const int64_t full = N / kTile * kTile;
  for (int64_t kb = k0; kb < k1; kb += kRowBlock) {
    const int64_t ke = std::min(kb + kRowBlock, k1);
    for (int64_t c = 0; c < full; c += kTile) {
      // Fully unrolled so the R x kVecs accumulators stay in registers.
      Vec acc[R][kVecs];
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
        for (int j = 0; j < kVecs; ++j) acc[r][j] = Load(y + r * N + c + j * kLanes);
      for (int64_t k = kb; k < ke; ++k) {
        const float* wk = w + k * N + c;
        // The same tile kRowBlock rows down is what this thread reads next; asking for it now
        // keeps the memory system busy while the FMAs run (6 rows: 24 -> 30 GB/s streamed).
        if (k + kRowBlock < k1) {
          const char* ahead = reinterpret_cast<const char*>(wk + kRowBlock * N);
          for (int b = 0; b < kTile * static_cast<int>(sizeof(float)); b += 64)
            __builtin_prefetch(ahead + b);
        }
        Vec wv[kVecs];
#pragma GCC unroll 4
        for (int j = 0; j < kVecs; ++j) wv[j] = Load(wk + j * kLanes);
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
          const float xs = x[r * K + k];
#pragma GCC unroll 4
          for (int j = 0; j < kVecs; ++j) acc[r][j] += xs * wv[j];
        }
      }
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
        for (int j = 0; j < kVecs; ++j) Store(y + r * N + c + j * kLanes, acc[r][j]);
    }
  }
  // Columns past the last full tile (N not a multiple of kTile): same k order, scalar.
  for (int r = 0; r < R; ++r)
    for (int64_t n = full; n < N; ++n) {
      float acc = y[r * N + n];
      for (int64_t k = k0; k < k1; ++k) acc += x[r * K + k] * w[k * N + n];
      y[r * N + n] = acc;
    }
}

// Calls body(xm, ym, std::integral_constant<int, R>) for the rows of x and y in groups of
// kRowsInRegisters, R being the group's size, so each group gets its register-blocked code.
template <typename Body>
void ForRowGroups(int64_t M, int64_t K, int64_t N, const float* x, float* y, Body body) {
  for (int64_t m = 0; m < M; m += kRowsInRegisters) {
    const float* xm = x + m * K;
    float* ym = y + m * N;
    switch (std::min<int64_t>(M - m, kRowsInRegisters)) {
      case 1: body(xm, ym, std::integral_constant<int, 1>{}); break;
      case 2: body(xm, ym, std::integral_constant<int, 2>{}); break;
      case 3: body(xm, ym, std::integral_constant<int, 3>{}); break;
      case 4: body(xm, ym, std::integral_constant<int, 4>{}); break;
      case 5: body(xm, ym, std::integral_constant<int, 5>{}); break;
      default: body(xm, ym, std::integral_constant<int, 6>{}); break;
    }
  }
}
static_assert(kRowsInRegisters == 6, "ForRowGroups spells out the group sizes 1..6");

// y[M, N] += x[M, k0:k1] @ w[k0:k1, :].
void Part(int64_t M, int64_t K, int64_t N, const float* x, const float* w, float* y, int64_t k0,
          int64_t k1) {
  ForRowGroups(M, K, N, x, y, [&](const float* xm, float* ym, auto rows) {
    TilesPart<decltype(rows)::value>(K, N, xm, w, ym, k0, k1);
  });
}

// Lane sum in one fixed pairwise order (halves added until one lane is left), so a row's
// result never depends on its neighbours.
typedef float Lanes16 __attribute__((vector_size(64)));
typedef float Lanes8 __attribute__((vector_size(32)));
typedef float Lanes4 __attribute__((vector_size(16)));
typedef float Lanes2 __attribute__((vector_size(8)));

// Halves are taken with register shuffles: going through memory (a 64-byte store, 32-byte
// loads) stalls store forwarding on every lane sum, which cost the LM head ~40%.
inline float LaneSum(Vec v) {
  Lanes4 v4;
  if constexpr (kLanes == 16) {
    Lanes16 v16;
    std::memcpy(&v16, &v, sizeof(v16));
    const Lanes8 v8 = __builtin_shufflevector(v16, v16, 0, 1, 2, 3, 4, 5, 6, 7) +
                      __builtin_shufflevector(v16, v16, 8, 9, 10, 11, 12, 13, 14, 15);
    v4 = __builtin_shufflevector(v8, v8, 0, 1, 2, 3) + __builtin_shufflevector(v8, v8, 4, 5, 6, 7);
  } else if constexpr (kLanes == 8) {
    Lanes8 v8;
    std::memcpy(&v8, &v, sizeof(v8));
    v4 = __builtin_shufflevector(v8, v8, 0, 1, 2, 3) + __builtin_shufflevector(v8, v8, 4, 5, 6, 7);
  } else {
    std::memcpy(&v4, &v, sizeof(v4));
  }
  const Lanes2 v2 = __builtin_shufflevector(v4, v4, 0, 1) + __builtin_shufflevector(v4, v4, 2, 3);
  return v2[0] + v2[1];
}

// y[R rows, n0:n0+NB] = x[R, :] . w[n, :] for w stored [N, K] (the tied LM head, logits = h E^T).
template <int R, int NB>
void RowDotsBlock(int64_t K, int64_t N, const float* x, const float* w, float* y, int64_t n0) {
  Vec acc[R][NB];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int i = 0; i < NB; ++i) acc[r][i] = Vec{};
  const int64_t full = K / kLanes * kLanes;
  const float* wn = w + n0 * K;
  for (int64_t k = 0; k < full; k += kLanes) {
    Vec wv[NB];
#pragma GCC unroll 8
    for (int i = 0; i < NB; ++i) {
      __builtin_prefetch(wn + (NB + i) * K + k);   // the next block's rows (see TilesPart)
      wv[i] = Load(wn + i * K + k);
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const Vec xv = Load(x + r * K + k);
#pragma GCC unroll 8
      for (int i = 0; i < NB; ++i) acc[r][i] += xv * wv[i];
    }
  }
  for (int r = 0; r < R; ++r)
    for (int i = 0; i < NB; ++i) {
      float sum = LaneSum(acc[r][i]);
      for (int64_t k = full; k < K; ++k) sum += x[r * K + k] * wn[i * K + k];
      y[r * N + n0 + i] = sum;
    }
}

template <int R>
void RowDotsRange(int64_t K, int64_t N, const float* x, const float* w, float* y, int64_t n0,
                  int64_t n1) {
  constexpr int kBlock = R <= 2 ? 8 : R <= 4 ? 5 : 4;   // R * kBlock accumulators in registers
  int64_t n = n0;
  for (; n + kBlock <= n1; n += kBlock) RowDotsBlock<R, kBlock>(K, N, x, w, y, n);
  for (; n < n1; ++n) RowDotsBlock<R, 1>(K, N, x, w, y, n);
}

// y[M, n0:n1] = x[M, :] @ w[n0:n1, :]^T.
void RowDots(int64_t M, int64_t K, int64_t N, const float* x, const float* w, float* y,
             int64_t n0, int64_t n1) {
  ForRowGroups(M, K, N, x, y, [&](const float* xm, float* ym, auto rows) {
    RowDotsRange<decltype(rows)::value>(K, N, xm, w, ym, n0, n1);
  });
}

// Splits `parts` pieces of work over the calling thread and the XLA intra-op pool. Threads
// claim pieces from a counter, so the caller never waits for a task the pool has not started
// (no deadlock when every pool thread is busy); a task that starts late finds nothing to do.
struct Parallel {
  int parts;
  std::atomic<int> next{0};
  std::atomic<int> done{0};

  template <typename F>
  static void Run(ffi::ThreadPool& pool, int parts, F work) {
    auto state = std::make_shared<Parallel>();
    state->parts = parts;
    auto claim = [state, work] {
      for (int p = state->next.fetch_add(1); p < state->parts; p = state->next.fetch_add(1)) {
        work(p);
        state->done.fetch_add(1, std::memory_order_release);
      }
    };
    for (int t = 1; t < parts; ++t) pool.Schedule([claim] { claim(); });
    claim();
    while (state->done.load(std::memory_order_acquire) < parts) {
    }
  }
};

// Below this many weights a second thread costs more than it saves.
constexpr int64_t kMinWeightsPerThread = 1 << 16;

int Parts(ffi::ThreadPool& pool, int64_t weights, int64_t max_parts) {
  return static_cast<int>(std::min<int64_t>(
      {std::max<int64_t>(1, pool.num_threads()),
       std::max<int64_t>(1, weights / kMinWeightsPerThread), std::max<int64_t>(1, max_parts)}));
}

// x[M, K] @ w[K, N]: K split into contiguous parts (each streams its rows of w); part 0
// accumulates into y, the others into scratch, added in part order at the end.
ffi::Error FewRowsMatmul(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> w,
                         ffi::ResultBuffer<ffi::F32> y) {
  const auto xd = x.dimensions();
  const auto wd = w.dimensions();
  if (xd.size() != 2 || wd.size() != 2 || xd[1] != wd[0])
    return ffi::Error::InvalidArgument("few_rows_matmul: expects x[M, K] and w[K, N]");
  const int64_t M = xd[0], K = xd[1], N = wd[1];
  const float* xp = x.typed_data();
  const float* wp = w.typed_data();
  float* yp = y->typed_data();
  const int64_t blocks = (K + kRowBlock - 1) / kRowBlock;
  const int parts = Parts(pool, K * N, blocks);
  // Part boundaries on kRowBlock multiples, independent of M (row invariance).
  auto k_begin = [&](int p) { return std::min(K, blocks * p / parts * kRowBlock); };
  std::memset(yp, 0, sizeof(float) * M * N);
  std::vector<float> scratch((parts - 1) * M * N, 0.0f);
  Parallel::Run(pool, parts, [&](int p) {
    float* out = p == 0 ? yp : scratch.data() + (p - 1) * M * N;
    Part(M, K, N, xp, wp, out, k_begin(p), k_begin(p + 1));
  });
  for (int p = 1; p < parts; ++p) {
    const float* s = scratch.data() + (p - 1) * M * N;
    for (int64_t i = 0; i < M * N; ++i) yp[i] += s[i];
  }
  return ffi::Error::Success();
}

// x[M, K] @ w[N, K]^T: N split into contiguous parts; every element is one thread's work.
ffi::Error FewRowsMatmulTransposed(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x,
                                   ffi::Buffer<ffi::F32> w, ffi::ResultBuffer<ffi::F32> y) {
  const auto xd = x.dimensions();
  const auto wd = w.dimensions();
  if (xd.size() != 2 || wd.size() != 2 || xd[1] != wd[1])
    return ffi::Error::InvalidArgument("few_rows_matmul: expects x[M, K] and w[N, K]");
  const int64_t M = xd[0], K = xd[1], N = wd[0];
  const float* xp = x.typed_data();
  const float* wp = w.typed_data();
  float* yp = y->typed_data();
  const int parts = Parts(pool, K * N, N);
  Parallel::Run(pool, parts, [&](int p) {
    RowDots(M, K, N, xp, wp, yp, N * p / parts, N * (p + 1) / parts);
  });
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(AsdFewRowsMatmul, FewRowsMatmul,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(AsdFewRowsMatmulTransposed, FewRowsMatmulTransposed,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());
