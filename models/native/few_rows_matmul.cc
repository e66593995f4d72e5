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
// Block-quantised weights: a GGUF target's Q4_1 projections and Q8_0 tied head are also read
// as stored (FewRowsMatmulQ4_1, FewRowsMatmulTransposedQ8_0; layouts in models/block_quant.py).
// Each weight is rebuilt exactly in registers and accumulated in the float32 kernels' order,
// so the results are the float32 kernels' bits while ~6x fewer bytes stream per step (SmolLM2:
// 540 -> 84 MB). One row is then no longer memory-bound: the dequantisation and the FMAs are.
//
// Vector width follows the compiler's target (-march=native): GCC vector extensions lower to
// AVX-512, AVX2 or SSE.

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>  // only under the x86 feature macros below
#endif

#include "cpu_common.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

// Inside asd_native: the shared vector type and thread split of cpu_common.h by name.
namespace asd_native {
namespace {

constexpr int kVecs = 4;                       // vectors per column tile
constexpr int kTile = kLanes * kVecs;          // columns per tile
constexpr int kRowsInRegisters = 6;            // x-rows whose accumulators fit at once
constexpr int kRowBlock = 8;                   // w rows per register pass over a tile
// K parts start on multiples of the GGUF block (32 weights), so a block-quantised matrix and
// its float32 copy are split identically and give the same bits.
constexpr int kQuantBlock = 32;


// kLanes bytes or fp16 values widened to a vector. GCC 12 scalarises __builtin_convertvector
// from narrow element types (a move and an insert per lane), so the widening instructions are
// spelled out where the CPU has them.
inline Ints WidenUnsigned(const uint8_t* p) {
#if defined(__AVX512F__)
  return (Ints)_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
#elif defined(__AVX2__)
  return (Ints)_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
#else
  Ints v;
  for (int i = 0; i < kLanes; ++i) v[i] = p[i];
  return v;
#endif
}

inline Ints WidenSigned(const int8_t* p) {
#if defined(__AVX512F__)
  return (Ints)_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
#elif defined(__AVX2__)
  return (Ints)_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
#else
  Ints v;
  for (int i = 0; i < kLanes; ++i) v[i] = p[i];
  return v;
#endif
}

// IEEE fp16 -> float32 (exact).
inline Vec WidenHalves(const uint8_t* p) {
#if defined(__AVX512F__)
  return (Vec)_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
#elif defined(__AVX__) && defined(__F16C__)
  return (Vec)_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
#else
  Vec v;
  for (int i = 0; i < kLanes; ++i) {
    _Float16 h;
    std::memcpy(&h, p + 2 * i, 2);
    v[i] = static_cast<float>(h);
  }
  return v;
#endif
}

// x * w + acc rounded as the vector code does (-ffp-contract=fast makes that one FMA where the
// CPU has it), so a column in the scalar tail gets the same bits as one in a full tile.
inline float MulAdd(float x, float w, float acc) {
#if defined(__FMA__)
  return __builtin_fmaf(x, w, acc);
#else
  return x * w + acc;
#endif
}

// x * w + acc lane by lane as one FMA where the CPU has it. Spelled out rather than left to
// -ffp-contract: on an AVX2 CPU GCC 12 contracted `acc += x * w` for some rows of a
// register-blocked group and not for others, so a row's bits depended on its neighbours.
inline Vec VecMulAdd(Vec x, Vec w, Vec acc) {
#if defined(__AVX512F__)
  return (Vec)_mm512_fmadd_ps((__m512)x, (__m512)w, (__m512)acc);
#elif defined(__AVX__) && defined(__FMA__)
  return (Vec)_mm256_fmadd_ps((__m256)x, (__m256)w, (__m256)acc);
#else
  return x * w + acc;
#endif
}

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
      for (int64_t k = k0; k < k1; ++k) acc = MulAdd(x[r * K + k], w[k * N + n], acc);
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

// GGUF Q4_1 weights in the layout `models/block_quant.py` packs for this kernel: for every
// block of 32 rows of w[K, N] and every 32 columns, one kQ4Tile-byte record holding the
// columns' fp16 scales d, fp16 minima m, then 16 row pairs of 32 bytes (low nibble: the even
// row, high nibble: the odd one). w[k, n] = d * q + m; d * q is exact in float32 (11 + 4
// significant bits), so the one rounding of the FMA is numpy's d * q + m: the float32 weight,
// bit for bit, and the same accumulation order as TilesPart gives the same bits as the
// float32 kernel at a fifth of the bytes.
constexpr int kQ4Cols = 32;
constexpr int kQ4Vecs = kQ4Cols / kLanes;
constexpr int kQ4Tile = 2 * kQ4Cols * 2 + kQuantBlock / 2 * kQ4Cols;   // 640 bytes
constexpr int kQ4AheadTiles = 4;                                      // prefetch distance

template <int R>
void Q4_1TilesPart(int64_t K, int64_t N, const float* x, const uint8_t* blocks, float* y,
                   int64_t k0, int64_t k1) {
  const int64_t tiles = N / kQ4Cols;
  const uint8_t* end = blocks + K / kQuantBlock * tiles * kQ4Tile;
  for (int64_t kb = k0; kb < k1; kb += kQuantBlock) {
    for (int64_t t = 0; t < tiles; ++t) {
      const uint8_t* tile = blocks + (kb / kQuantBlock * tiles + t) * kQ4Tile;
      // Records are contiguous in the order this thread reads them (see TilesPart).
      const uint8_t* ahead = tile + kQ4AheadTiles * kQ4Tile;
      if (ahead < end)
        for (int b = 0; b < kQ4Tile; b += 64) __builtin_prefetch(ahead + b);
      const int64_t c = t * kQ4Cols;
      Vec d[kQ4Vecs], m[kQ4Vecs], acc[R][kQ4Vecs];
#pragma GCC unroll 8
      for (int v = 0; v < kQ4Vecs; ++v) {
        d[v] = WidenHalves(tile + 2 * (v * kLanes));
        m[v] = WidenHalves(tile + 2 * kQ4Cols + 2 * (v * kLanes));
      }
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
        for (int v = 0; v < kQ4Vecs; ++v) acc[r][v] = Load(y + r * N + c + v * kLanes);
      const uint8_t* nibbles = tile + 4 * kQ4Cols;
      for (int j = 0; j < kQuantBlock / 2; ++j) {
        const float* xk = x + kb + 2 * j;
#pragma GCC unroll 8
        for (int v = 0; v < kQ4Vecs; ++v) {
          const Ints q = WidenUnsigned(nibbles + j * kQ4Cols + v * kLanes);
          const Vec even = d[v] * __builtin_convertvector(q & 15, Vec) + m[v];
          const Vec odd = d[v] * __builtin_convertvector(q >> 4, Vec) + m[v];
#pragma GCC unroll 8
          for (int r = 0; r < R; ++r) acc[r][v] += xk[r * K] * even;
#pragma GCC unroll 8
          for (int r = 0; r < R; ++r) acc[r][v] += xk[r * K + 1] * odd;
        }
      }
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
        for (int v = 0; v < kQ4Vecs; ++v) Store(y + r * N + c + v * kLanes, acc[r][v]);
    }
  }
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

// Weight sources for the [N, K] kernels: Load(n, k) is w[n, k:k+kLanes] as float32.
struct Float32Rows {
  const float* w;
  int64_t K;
  Vec Load(int64_t n, int64_t k) const { return asd_native::Load(w + n * K + k); }
  float At(int64_t n, int64_t k) const { return w[n * K + k]; }
  // One line of the row kLanes ahead per call (a line is 16 floats).
  void Prefetch(int64_t n, int64_t k) const { __builtin_prefetch(w + n * K + k); }
};

// GGUF Q8_0 rows: w[n, k] = d[n, k / 32] * q[n, k], int8 q and fp16-born d. The product is
// exact in float32 (8 + 11 significant bits), so this is the float32 weight bit for bit.
struct Q8_0Rows {
  const int8_t* q;
  const float* d;
  int64_t K;
  Vec Load(int64_t n, int64_t k) const {
    return __builtin_convertvector(WidenSigned(q + n * K + k), Vec) * d[(n * K + k) / kQuantBlock];
  }
  float At(int64_t n, int64_t k) const {
    return static_cast<float>(q[n * K + k]) * d[(n * K + k) / kQuantBlock];
  }
  // A line holds 64 int8s: prefetch once per 64 weights.
  void Prefetch(int64_t n, int64_t k) const {
    if (k % 64 == 0) __builtin_prefetch(q + n * K + k);
  }
};

// y[R rows, n0:n0+NB] = x[R, :] . w[n, :] for w stored [N, K] (the tied LM head, logits = h E^T).
template <int R, int NB, typename Rows>
void RowDotsBlock(int64_t K, int64_t N, const float* x, const Rows& w, float* y, int64_t n0) {
  Vec acc[R][NB];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int i = 0; i < NB; ++i) acc[r][i] = Vec{};
  const int64_t full = K / kLanes * kLanes;
  for (int64_t k = 0; k < full; k += kLanes) {
    Vec wv[NB];
#pragma GCC unroll 8
    for (int i = 0; i < NB; ++i) {
      w.Prefetch(n0 + NB + i, k);   // the next block's rows (see TilesPart)
      wv[i] = w.Load(n0 + i, k);
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const Vec xv = Load(x + r * K + k);
#pragma GCC unroll 8
      for (int i = 0; i < NB; ++i) acc[r][i] = VecMulAdd(xv, wv[i], acc[r][i]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int i = 0; i < NB; ++i) {
      float sum = LaneSum(acc[r][i]);
      for (int64_t k = full; k < K; ++k) sum = MulAdd(x[r * K + k], w.At(n0 + i, k), sum);
      y[r * N + n0 + i] = sum;
    }
}

template <int R, typename Rows>
void RowDotsRange(int64_t K, int64_t N, const float* x, const Rows& w, float* y, int64_t n0,
                  int64_t n1) {
  constexpr int kBlock = R <= 2 ? 8 : R <= 4 ? 5 : 4;   // R * kBlock accumulators in registers
  int64_t n = n0;
  for (; n + kBlock <= n1; n += kBlock) RowDotsBlock<R, kBlock>(K, N, x, w, y, n);
  for (; n < n1; ++n) RowDotsBlock<R, 1>(K, N, x, w, y, n);
}

// y[M, n0:n1] = x[M, :] @ w[n0:n1, :]^T.
template <typename Rows>
void RowDots(int64_t M, int64_t K, int64_t N, const float* x, const Rows& w, float* y,
             int64_t n0, int64_t n1) {
  ForRowGroups(M, K, N, x, y, [&](const float* xm, float* ym, auto rows) {
    RowDotsRange<decltype(rows)::value>(K, N, xm, w, ym, n0, n1);
  });
}

// K split into `parts` contiguous ranges on kQuantBlock multiples, independent of M (row
// invariance) and of the weights' storage (quantised or not: the same bits).
struct KSplit {
  int64_t K;
  int parts;
  KSplit(ffi::ThreadPool& pool, int64_t K, int64_t N)
      : K(K), parts(Parts(pool, K * N, (K + kQuantBlock - 1) / kQuantBlock)) {}
  int64_t Begin(int p) const {
    const int64_t blocks = (K + kQuantBlock - 1) / kQuantBlock;
    return std::min(K, blocks * p / parts * kQuantBlock);
  }
};

// Runs part(p, out, k0, k1) for every K range; part 0 accumulates into y, the others into
// scratch, added in part order at the end.
template <typename PartFn>
void OverKParts(ffi::ThreadPool& pool, int64_t M, int64_t K, int64_t N, float* y, PartFn part) {
  const KSplit split(pool, K, N);
  std::memset(y, 0, sizeof(float) * M * N);
  std::vector<float> scratch((split.parts - 1) * M * N, 0.0f);
  RunParts(pool, split.parts, [&](int p) {
    float* out = p == 0 ? y : scratch.data() + (p - 1) * M * N;
    part(out, split.Begin(p), split.Begin(p + 1));
  });
  for (int p = 1; p < split.parts; ++p) {
    const float* s = scratch.data() + (p - 1) * M * N;
    for (int64_t i = 0; i < M * N; ++i) y[i] += s[i];
  }
}

// x[M, K] @ w[K, N].
ffi::Error FewRowsMatmul(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> w,
                         ffi::ResultBuffer<ffi::F32> y) {
  const auto xd = x.dimensions();
  const auto wd = w.dimensions();
  if (xd.size() != 2 || wd.size() != 2 || xd[1] != wd[0])
    return ffi::Error::InvalidArgument("few_rows_matmul: expects x[M, K] and w[K, N]");
  const int64_t M = xd[0], K = xd[1], N = wd[1];
  const float* xp = x.typed_data();
  const float* wp = w.typed_data();
  OverKParts(pool, M, K, N, y->typed_data(), [&](float* out, int64_t k0, int64_t k1) {
    Part(M, K, N, xp, wp, out, k0, k1);
  });
  return ffi::Error::Success();
}

// x[M, K] @ w[K, N] for w in Q4_1 records blocks[K / 32, N / 32, kQ4Tile].
ffi::Error FewRowsMatmulQ4_1(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x,
                             ffi::Buffer<ffi::U8> blocks, ffi::ResultBuffer<ffi::F32> y) {
  const auto xd = x.dimensions();
  const auto bd = blocks.dimensions();
  if (xd.size() != 2 || bd.size() != 3 || bd[2] != kQ4Tile || xd[1] != bd[0] * kQuantBlock)
    return ffi::Error::InvalidArgument(
        "few_rows_matmul_q4_1: expects x[M, K] and blocks[K / 32, N / 32, 640]");
  const int64_t M = xd[0], K = xd[1], N = bd[1] * kQ4Cols;
  if (y->dimensions().size() != 2 || y->dimensions()[1] != N)
    return ffi::Error::InvalidArgument("few_rows_matmul_q4_1: result must be [M, N]");
  const float* xp = x.typed_data();
  const uint8_t* bp = blocks.typed_data();
  OverKParts(pool, M, K, N, y->typed_data(), [&](float* out, int64_t k0, int64_t k1) {
    ForRowGroups(M, K, N, xp, out, [&](const float* xm, float* ym, auto rows) {
      Q4_1TilesPart<decltype(rows)::value>(K, N, xm, bp, ym, k0, k1);
    });
  });
  return ffi::Error::Success();
}

// x[M, K] @ w[N, K]^T: N split into contiguous parts; every element is one thread's work.
template <typename Rows>
void TransposedOverNParts(ffi::ThreadPool& pool, int64_t M, int64_t K, int64_t N,
                          const float* x, const Rows& w, float* y) {
  const int parts = Parts(pool, K * N, N);
  RunParts(pool, parts, [&](int p) {
    RowDots(M, K, N, x, w, y, N * p / parts, N * (p + 1) / parts);
  });
}

ffi::Error FewRowsMatmulTransposed(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x,
                                   ffi::Buffer<ffi::F32> w, ffi::ResultBuffer<ffi::F32> y) {
  const auto xd = x.dimensions();
  const auto wd = w.dimensions();
  if (xd.size() != 2 || wd.size() != 2 || xd[1] != wd[1])
    return ffi::Error::InvalidArgument("few_rows_matmul: expects x[M, K] and w[N, K]");
  const int64_t K = xd[1];
  TransposedOverNParts(pool, xd[0], K, wd[0], x.typed_data(), Float32Rows{w.typed_data(), K},
                       y->typed_data());
  return ffi::Error::Success();
}

// x[M, K] @ w[N, K]^T for w in Q8_0: q int8 [N, K], d float32 [N, K / 32].
ffi::Error FewRowsMatmulTransposedQ8_0(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x,
                                       ffi::Buffer<ffi::S8> q, ffi::Buffer<ffi::F32> d,
                                       ffi::ResultBuffer<ffi::F32> y) {
  const auto xd = x.dimensions();
  const auto qd = q.dimensions();
  const auto dd = d.dimensions();
  if (xd.size() != 2 || qd.size() != 2 || dd.size() != 2 || xd[1] != qd[1] ||
      qd[1] % kQuantBlock || dd[0] != qd[0] || dd[1] != qd[1] / kQuantBlock)
    return ffi::Error::InvalidArgument(
        "few_rows_matmul_q8_0: expects x[M, K], q[N, K] and d[N, K / 32]");
  const int64_t K = xd[1];
  TransposedOverNParts(pool, xd[0], K, qd[0], x.typed_data(),
                       Q8_0Rows{q.typed_data(), d.typed_data(), K}, y->typed_data());
  return ffi::Error::Success();
}

}  // namespace
}  // namespace asd_native

XLA_FFI_DEFINE_HANDLER_SYMBOL(AsdFewRowsMatmul, asd_native::FewRowsMatmul,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(AsdFewRowsMatmulTransposed, asd_native::FewRowsMatmulTransposed,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(AsdFewRowsMatmulQ4_1, asd_native::FewRowsMatmulQ4_1,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::U8>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(AsdFewRowsMatmulTransposedQ8_0, asd_native::FewRowsMatmulTransposedQ8_0,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S8>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());
