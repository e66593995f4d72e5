// Attention of a short block of T new queries over the KV cache as it was plus the block's own
// keys and values (models/cached_attention.py, attend_then_write), float32, as an XLA FFI
// custom call for the CPU.
//
// Why: XLA:CPU runs each of the block's einsums, the masking and the softmax as separate small
// ops over the whole allocated cache (a SmolLM2 decode step: ~62 attention einsums of ~32 us
// each, plus the softmax pieces, ~2.5 ms of a 10.6 ms step). Here one call per layer computes
// every head, and only up to the last visible slot of each query.
//
// Semantics are attend_then_write's: scores = q . k * scale where the masks say visible
// (old_visible over cache slots, new_visible over the block's own entries), one softmax over
// both, then probabilities times values. Masked entries are never read (a NaN key or value in
// a masked slot changes nothing). A query that sees nothing gets the mean of every value, as
// the -1e30 fill of the XLA version gives: never the case in a decode loop.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "cpu_common.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

// Inside asd_native: the shared vector type and thread split of cpu_common.h by name.
namespace asd_native {
namespace {

inline Vec Splat(float x) { return Vec{} + x; }

// exp(x) for x <= 0 (scores minus their maximum): 2^n * p(r), |r| <= ln2 / 2, a degree-6
// polynomial (relative error ~2e-7); below -87 it is 0, as float32's exp is there.
inline Vec ExpNonPositive(Vec x) {
  const Vec clamped = x < Splat(-87.0f) ? Splat(-87.0f) : x;
  const Vec n = __builtin_convertvector(
      __builtin_convertvector(clamped * 1.44269504f + Splat(-0.5f), Ints), Vec);
  const Vec r = (clamped - n * 0.693359375f) - n * -2.12194440e-4f;
  Vec p = Splat(1.0f / 720);
  p = p * r + 1.0f / 120;
  p = p * r + 1.0f / 24;
  p = p * r + 1.0f / 6;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const Ints scale = (__builtin_convertvector(n, Ints) + 127) << 23;
  Vec two_n;
  std::memcpy(&two_n, &scale, sizeof(two_n));
  const Vec result = p * two_n;
  return x < Splat(-87.0f) ? Vec{} : result;
}

struct Shapes {
  int64_t B, T, K, G, H, S;
};

// One (row b, kv head k, query t): all G query heads of the group share the key and value
// reads. scores has room for G x (S_pad + T_pad) floats, S and T rounded up to whole vectors.
void QueryGroup(const Shapes& d, const float* q, const float* k_cache, const float* v_cache,
                const float* new_k, const float* new_v, const bool* old_visible,
                const bool* new_visible, float* out, float* scores, const float* keys_t,
                int64_t t_pad, int64_t b, int64_t k, int64_t t, float scale) {
  const int64_t S = d.S, T = d.T, H = d.H, G = d.G, K = d.K;
  const bool* old_vis = old_visible + (b * T + t) * S;
  const bool* new_vis = new_visible + (b * T + t) * T;
  int64_t s_end = S;
  while (s_end > 0 && !old_vis[s_end - 1]) --s_end;
  const int64_t s_tiles = (s_end + kLanes - 1) / kLanes * kLanes;
  const int64_t s_pad = (S + kLanes - 1) / kLanes * kLanes;
  const float* keys = k_cache + (b * K + k) * H * S;      // [H, S]
  const float* values = v_cache + (b * K + k) * S * H;    // [S, H]
  // q for query head (k, g) at token t: q[b, t, k * G + g, :]
  const int64_t stride = s_pad + t_pad;
  for (int64_t g = 0; g < G; ++g) {
    const float* qg = q + ((b * T + t) * K * G + k * G + g) * H;
    float* sc = scores + g * stride;       // old slots in [0, s_pad), the block's after
    float* sc_new = sc + s_pad;
    // Old slots, kLanes at a time (the key layout [H, S] makes them contiguous).
    int64_t s = 0;
    for (; s + kLanes <= s_tiles && s + kLanes <= S; s += kLanes) {
      Vec acc{};
      for (int64_t h = 0; h < H; ++h) acc += qg[h] * Load(keys + h * S + s);
      Store(sc + s, acc * scale);
    }
    for (; s < s_end; ++s) {
      float acc = 0.0f;
      for (int64_t h = 0; h < H; ++h) acc += qg[h] * keys[h * S + s];
      sc[s] = acc * scale;
    }
    // The block's own keys, with the same lane-wise arithmetic as the cache's (keys_t holds
    // them [H, T_pad] like the cache's [H, S]): a key scores the same bits whether a query
    // meets it in its block or, after a single step wrote it, in the cache.
    for (int64_t j = 0; j < T; j += kLanes) {
      Vec acc{};
      for (int64_t h = 0; h < H; ++h) acc += qg[h] * Load(keys_t + h * t_pad + j);
      Store(sc_new + j, acc * scale);
    }
    // Softmax over the visible entries only.
    float m = -INFINITY;
    for (int64_t i = 0; i < s_end; ++i)
      if (old_vis[i]) m = std::max(m, sc[i]);
    for (int64_t j = 0; j < T; ++j)
      if (new_vis[j]) m = std::max(m, sc_new[j]);
    float* o = out + ((b * T + t) * K * G + k * G + g) * H;
    if (m == -INFINITY) {  // sees nothing: uniform weights over every entry, as -1e30 fills give
      for (int64_t h = 0; h < H; ++h) {
        double acc = 0.0;
        for (int64_t i = 0; i < S; ++i) acc += values[i * H + h];
        for (int64_t j = 0; j < T; ++j) acc += new_v[((b * T + j) * K + k) * H + h];
        o[h] = static_cast<float>(acc / static_cast<double>(S + T));
      }
      continue;
    }
    // One exp for every entry (whole vectors; entries past s_end and T are never used).
    for (int64_t i = 0; i < s_tiles; i += kLanes) Store(sc + i, ExpNonPositive(Load(sc + i) - m));
    for (int64_t j = 0; j < T; j += kLanes)
      Store(sc_new + j, ExpNonPositive(Load(sc_new + j) - m));
    for (int64_t j = 0; j < T; ++j)
      if (!new_vis[j]) sc_new[j] = 0.0f;
    float sum = 0.0f;
    for (int64_t i2 = 0; i2 < s_end; ++i2) sum += old_vis[i2] ? sc[i2] : 0.0f;
    for (int64_t j = 0; j < T; ++j) sum += sc_new[j];
    const float inv = 1.0f / sum;
    for (int64_t h = 0; h < H; ++h) o[h] = 0.0f;
    const bool full_vectors = H % kLanes == 0;
    auto add_value = [&](float p, const float* v) {
      if (full_vectors) {
        for (int64_t h = 0; h < H; h += kLanes) Store(o + h, Load(o + h) + p * Load(v + h));
      } else {
        for (int64_t h = 0; h < H; ++h) o[h] += p * v[h];
      }
    };
    for (int64_t i2 = 0; i2 < s_end; ++i2)
      if (old_vis[i2]) add_value(sc[i2] * inv, values + i2 * H);
    for (int64_t j = 0; j < T; ++j)
      if (new_vis[j]) add_value(sc_new[j] * inv, new_v + ((b * T + j) * K + k) * H);
  }
}

// q [B, T, K*G, H], k_cache [B, K, H, S], v_cache [B, K, S, H], new_k / new_v [B, T, K, H],
// old_visible [B, T, S], new_visible [B, T, T] -> out [B, T, K*G, H].
ffi::Error BlockAttention(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q,
                          ffi::Buffer<ffi::F32> k_cache, ffi::Buffer<ffi::F32> v_cache,
                          ffi::Buffer<ffi::F32> new_k, ffi::Buffer<ffi::F32> new_v,
                          ffi::Buffer<ffi::PRED> old_visible, ffi::Buffer<ffi::PRED> new_visible,
                          ffi::ResultBuffer<ffi::F32> out) {
  const auto qd = q.dimensions(), kd = k_cache.dimensions(), vd = v_cache.dimensions();
  const auto nkd = new_k.dimensions(), nvd = new_v.dimensions();
  const auto od = old_visible.dimensions(), nd = new_visible.dimensions();
  if (qd.size() != 4 || kd.size() != 4 || vd.size() != 4 || nkd.size() != 4 ||
      nvd.size() != 4 || od.size() != 3 || nd.size() != 3)
    return ffi::Error::InvalidArgument("block_attention: wrong ranks");
  Shapes d{qd[0], qd[1], kd[1], 0, kd[2], kd[3]};
  if (d.K == 0 || qd[2] % d.K || qd[3] != d.H || vd[0] != d.B || vd[1] != d.K ||
      vd[2] != d.S || vd[3] != d.H || kd[0] != d.B || nkd[0] != d.B || nkd[1] != d.T ||
      nkd[2] != d.K || nkd[3] != d.H || nvd[0] != d.B || nvd[1] != d.T || nvd[2] != d.K ||
      nvd[3] != d.H || od[0] != d.B || od[1] != d.T || od[2] != d.S || nd[0] != d.B ||
      nd[1] != d.T || nd[2] != d.T)
    return ffi::Error::InvalidArgument("block_attention: inconsistent shapes");
  d.G = qd[2] / d.K;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d.H));
  const int64_t units = d.B * d.K * d.T;
  // One unit (b, k, t) reads the group's keys and values up to its last visible slot.
  const int64_t work = units * d.G * d.S * d.H;
  const int parts = Parts(pool, work, units);
  const float* qp = q.typed_data();
  const float* kp = k_cache.typed_data();
  const float* vp = v_cache.typed_data();
  const float* nkp = new_k.typed_data();
  const float* nvp = new_v.typed_data();
  const bool* ovp = old_visible.typed_data();
  const bool* nvisp = new_visible.typed_data();
  float* op = out->typed_data();
  RunParts(pool, parts, [&](int p) {
    const int64_t s_pad = (d.S + kLanes - 1) / kLanes * kLanes;
    const int64_t t_pad = (d.T + kLanes - 1) / kLanes * kLanes;
    std::vector<float> scores(d.G * (s_pad + t_pad));
    std::vector<float> keys_t(d.H * t_pad, 0.0f);   // the block's keys of (b, k), [H, T_pad]
    int64_t keys_of = -1;
    for (int64_t u = units * p / parts; u < units * (p + 1) / parts; ++u) {
      const int64_t t = u % d.T, k = u / d.T % d.K, b = u / (d.T * d.K);
      if (keys_of != b * d.K + k) {
        keys_of = b * d.K + k;
        for (int64_t j = 0; j < d.T; ++j)
          for (int64_t h = 0; h < d.H; ++h)
            keys_t[h * t_pad + j] = nkp[((b * d.T + j) * d.K + k) * d.H + h];
      }
      QueryGroup(d, qp, kp, vp, nkp, nvp, ovp, nvisp, op, scores.data(), keys_t.data(), t_pad,
                 b, k, t, scale);
    }
  });
  return ffi::Error::Success();
}

}  // namespace
}  // namespace asd_native

XLA_FFI_DEFINE_HANDLER_SYMBOL(AsdBlockAttention, asd_native::BlockAttention,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::PRED>>()
                                  .Arg<ffi::Buffer<ffi::PRED>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());
