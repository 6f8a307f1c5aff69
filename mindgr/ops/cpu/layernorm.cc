// Row LayerNorms of the HSTU block glue (no learned scale or shift), with MindSpore's custom AOT
// signature. Rows are the last axis of D floats; R = numel / D rows; eps is a [1] float32 input.
//   MindgrLayerNorm(x [.., D], eps [1]) -> y = (x - mean) * rstd,  rstd = 1 / sqrt(var + eps)
//   MindgrLayerNormBwd(x, eps, dy) -> dx = rstd * (dy - mean(dy) - y * mean(dy * y))
//   MindgrGatedLayerNorm(u [.., D], a [.., D], eps [1]) -> o = u * LayerNorm(a)
//   MindgrGatedLayerNormBwd(u, a, eps, do) -> du = do * LayerNorm(a), da = LayerNormBwd(a, do * u)
//   MindgrL2Normalize(x [.., D], eps [1]) -> y = x / n,  n = sqrt(sum(x^2) + eps^2)   (the L2 norm of
//       mindgr.models.layers.l2_normalize, the encoders' output and the item table)
//   MindgrL2NormalizeBwd(x, eps, dy) -> dx = (dy - y * sum(dy * y)) / n
// mean and var = mean((x - mean)^2) are the two-pass statistics of the reference (mindgr.ops.reference
// layer_norm). The backward recomputes them from x (one row of D floats stays in L1), so forward and
// backward each read their [R, D] inputs once and write their outputs once; nothing is saved in
// between. Every row is computed alone in a fixed order (vector lanes over D, then a fixed pairwise
// lane sum, hsum), so results are bitwise reproducible and independent of the thread count.
// Return codes: 10 wrong argument count, 11 wrong ranks, 12 wrong dtypes, 13 inconsistent shapes,
// 99 threads unavailable.
#include <cmath>

#include "common.h"

namespace mindgr {
namespace {

struct Rows {
  int64_t R = 0, D = 0;
};

// Every tensor argument but eps (index `eps_at`) has the same shape [.., D] and is float32.
int check(int nparam, int want, int eps_at, int* ndims, int64_t** shapes, const char** dtypes, Rows* s) {
  MINDGR_REJECT_IF(nparam != want, kArgCount);
  for (int i = 0; i < nparam; ++i)
    MINDGR_REJECT_IF(!is_f32(dtypes[i]), kDtype);
  MINDGR_REJECT_IF(ndims[eps_at] != 1 || shapes[eps_at][0] != 1, kShape);
  const int ref = eps_at == 0 ? 1 : 0;
  const int nd = ndims[ref];
  MINDGR_REJECT_IF(nd < 1, kRank);
  for (int i = 0; i < nparam; ++i) {
    if (i == eps_at) continue;
    MINDGR_REJECT_IF(ndims[i] != nd, kRank);
    for (int k = 0; k < nd; ++k)
      MINDGR_REJECT_IF(shapes[i][k] != shapes[ref][k], kShape);
  }
  s->D = shapes[ref][nd - 1];
  s->R = s->D > 0 ? numel(nd, shapes[ref]) / s->D : 0;
  return 0;
}

// fn(row) for every row, in blocks of 512 rows taken by up to num_threads() threads; one thread below 128K
// floats. (The limit was 2M floats when every call started fresh threads; with the persistent
// workers of workers.cc, ML-1M's [13824, 50] ops on 2 threads took 1.2-1.4x less wall time on Zen 3.)
template <class Fn>
void for_rows(const Rows& s, Fn&& fn) {
  int nt = num_threads();
  if (s.R * s.D < (int64_t(1) << 17)) nt = 1;
  nt = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(nt, s.R)));
  parallel_blocks(nt, s.R, 512, [&](int, int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) fn(r);
  });
}

// Sum of the VL lanes in a fixed order per ISA, in registers (common.h's vsum goes through memory,
// which costs more than the rest of a short row): halves added until one lane is left.
inline float hsum(vf v) {
#if defined(MINDGR_ISA_AVX512) || defined(MINDGR_ISA_AVX2)
#if defined(MINDGR_ISA_AVX512)
  const __m512 z = (__m512)v;
  const __m256 s = _mm256_add_ps(_mm512_castps512_ps256(z),
                                 _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(z), 1)));
#else
  const __m256 s = (__m256)v;
#endif
  __m128 a = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
  a = _mm_add_ps(a, _mm_movehl_ps(a, a));
  a = _mm_add_ss(a, _mm_shuffle_ps(a, a, 1));
  return _mm_cvtss_f32(a);
#else
  return vsum(v);
#endif
}

// One row of D floats as `full` whole vectors plus a tail of `tail` lanes (zeros past D on load).
struct RowShape {
  int64_t full;
  int tail;
  explicit RowShape(int64_t D) : full(D / VL), tail(static_cast<int>(D % VL)) {}
};

inline vf load_at(const float* p, int64_t c, const RowShape& rs) {
  return c < rs.full ? vload(p + c * VL) : vload_tail(p + c * VL, rs.tail);
}
inline void store_at(float* p, int64_t c, vf v, const RowShape& rs) {
  if (c < rs.full) vstore(p + c * VL, v);
  else vstore_tail(p + c * VL, v, rs.tail);
}

// mean and rstd of one row (the tail lanes load as zeros and are masked out of the variance).
inline void row_stats(const float* x, int64_t D, const RowShape& rs, float eps, float* mean, float* rstd) {
  const int64_t nvec = rs.full + (rs.tail ? 1 : 0);
  vf acc = vzero();
  for (int64_t c = 0; c < nvec; ++c) acc += load_at(x, c, rs);
  const float m = hsum(acc) / float(D);
  const vf mv = vbcast(m);
  vf sq = vzero();
  for (int64_t c = 0; c < rs.full; ++c) {
    const vf d = vload(x + c * VL) - mv;
    sq += d * d;
  }
  if (rs.tail) {
    const vi in = iota() < rs.tail;
    const vf d = vselect(in, vload_tail(x + rs.full * VL, rs.tail) - mv);
    sq += d * d;
  }
  const float var = hsum(sq) / float(D);
  *mean = m;
  *rstd = 1.0f / std::sqrt(var + eps);
}

// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) for one row, xhat = (x - mean) * rstd; g is
// produced per vector by gfn(c) (zero in the tail lanes).
template <class G>
inline void row_backward(const float* x, int64_t D, const RowShape& rs, float mean, float rstd, G&& gfn,
                         float* dx) {
  const int64_t nvec = rs.full + (rs.tail ? 1 : 0);
  const vf mv = vbcast(mean), rv = vbcast(rstd);
  vf sg = vzero(), sgx = vzero();
  for (int64_t c = 0; c < nvec; ++c) {
    const vf g = gfn(c);
    const vf xh = (load_at(x, c, rs) - mv) * rv;
    sg += g;
    sgx += g * xh;
  }
  const vf a = vbcast(hsum(sg) / float(D)), b = vbcast(hsum(sgx) / float(D));
  for (int64_t c = 0; c < nvec; ++c) {
    const vf xh = (load_at(x, c, rs) - mv) * rv;
    store_at(dx, c, rv * (gfn(c) - a - xh * b), rs);
  }
}

int layer_norm_fwd(int nparam, void** params, int* ndims, int64_t** shapes, const char** dtypes) try {
  Rows s;
  if (int rc = check(nparam, 3, 1, ndims, shapes, dtypes, &s)) return rc;
  const float* x = static_cast<const float*>(params[0]);
  const float eps = *static_cast<const float*>(params[1]);
  float* y = static_cast<float*>(params[2]);
  const int64_t D = s.D;
  const RowShape rs(D);
  const int64_t nvec = rs.full + (rs.tail ? 1 : 0);
  for_rows(s, [&](int64_t r) {
    const float* xr = x + r * D;
    float m, rstd;
    row_stats(xr, D, rs, eps, &m, &rstd);
    const vf mv = vbcast(m), rv = vbcast(rstd);
    for (int64_t c = 0; c < nvec; ++c) store_at(y + r * D, c, (load_at(xr, c, rs) - mv) * rv, rs);
  });
  return 0;
} catch (...) {
  MINDGR_FAIL(kResources);
}

int layer_norm_bwd(int nparam, void** params, int* ndims, int64_t** shapes, const char** dtypes) try {
  Rows s;
  if (int rc = check(nparam, 4, 1, ndims, shapes, dtypes, &s)) return rc;
  const float* x = static_cast<const float*>(params[0]);
  const float eps = *static_cast<const float*>(params[1]);
  const float* dy = static_cast<const float*>(params[2]);
  float* dx = static_cast<float*>(params[3]);
  const int64_t D = s.D;
  const RowShape rs(D);
  for_rows(s, [&](int64_t r) {
    const float* xr = x + r * D;
    const float* gr = dy + r * D;
    float m, rstd;
    row_stats(xr, D, rs, eps, &m, &rstd);
    row_backward(xr, D, rs, m, rstd, [&](int64_t c) { return load_at(gr, c, rs); }, dx + r * D);
  });
  return 0;
} catch (...) {
  MINDGR_FAIL(kResources);
}

int gated_fwd(int nparam, void** params, int* ndims, int64_t** shapes, const char** dtypes) try {
  Rows s;
  if (int rc = check(nparam, 4, 2, ndims, shapes, dtypes, &s)) return rc;
  const float* u = static_cast<const float*>(params[0]);
  const float* a = static_cast<const float*>(params[1]);
  const float eps = *static_cast<const float*>(params[2]);
  float* o = static_cast<float*>(params[3]);
  const int64_t D = s.D;
  const RowShape rs(D);
  const int64_t nvec = rs.full + (rs.tail ? 1 : 0);
  for_rows(s, [&](int64_t r) {
    const float* ar = a + r * D;
    const float* ur = u + r * D;
    float m, rstd;
    row_stats(ar, D, rs, eps, &m, &rstd);
    const vf mv = vbcast(m), rv = vbcast(rstd);
    for (int64_t c = 0; c < nvec; ++c)
      store_at(o + r * D, c, load_at(ur, c, rs) * ((load_at(ar, c, rs) - mv) * rv), rs);
  });
  return 0;
} catch (...) {
  MINDGR_FAIL(kResources);
}

int gated_bwd(int nparam, void** params, int* ndims, int64_t** shapes, const char** dtypes) try {
  Rows s;
  if (int rc = check(nparam, 6, 2, ndims, shapes, dtypes, &s)) return rc;
  const float* u = static_cast<const float*>(params[0]);
  const float* a = static_cast<const float*>(params[1]);
  const float eps = *static_cast<const float*>(params[2]);
  const float* dout = static_cast<const float*>(params[3]);
  float* du = static_cast<float*>(params[4]);
  float* da = static_cast<float*>(params[5]);
  const int64_t D = s.D;
  const RowShape rs(D);
  const int64_t nvec = rs.full + (rs.tail ? 1 : 0);
  for_rows(s, [&](int64_t r) {
    const float* ar = a + r * D;
    const float* ur = u + r * D;
    const float* gr = dout + r * D;
    float m, rstd;
    row_stats(ar, D, rs, eps, &m, &rstd);
    const vf mv = vbcast(m), rv = vbcast(rstd);
    for (int64_t c = 0; c < nvec; ++c)
      store_at(du + r * D, c, load_at(gr, c, rs) * ((load_at(ar, c, rs) - mv) * rv), rs);
    row_backward(ar, D, rs, m, rstd, [&](int64_t c) { return load_at(gr, c, rs) * load_at(ur, c, rs); },
                 da + r * D);
  });
  return 0;
} catch (...) {
  MINDGR_FAIL(kResources);
}

// sum(x^2) of one row and, with g, sum(g * x) (tail lanes load as zeros).
template <bool WithG>
inline void row_dots(const float* x, const float* g, const RowShape& rs, float* ss, float* sgx) {
  const int64_t nvec = rs.full + (rs.tail ? 1 : 0);
  vf a = vzero(), b = vzero();
  for (int64_t c = 0; c < nvec; ++c) {
    const vf xv = load_at(x, c, rs);
    a += xv * xv;
    if (WithG) b += load_at(g, c, rs) * xv;
  }
  *ss = hsum(a);
  if (WithG) *sgx = hsum(b);
}

int l2_fwd(int nparam, void** params, int* ndims, int64_t** shapes, const char** dtypes) try {
  Rows s;
  if (int rc = check(nparam, 3, 1, ndims, shapes, dtypes, &s)) return rc;
  const float* x = static_cast<const float*>(params[0]);
  const float eps = *static_cast<const float*>(params[1]);
  float* y = static_cast<float*>(params[2]);
  const int64_t D = s.D;
  const RowShape rs(D);
  const int64_t nvec = rs.full + (rs.tail ? 1 : 0);
  for_rows(s, [&](int64_t r) {
    const float* xr = x + r * D;
    float ss, unused;
    row_dots<false>(xr, nullptr, rs, &ss, &unused);
    const vf inv = vbcast(1.0f / std::sqrt(ss + eps * eps));
    for (int64_t c = 0; c < nvec; ++c) store_at(y + r * D, c, load_at(xr, c, rs) * inv, rs);
  });
  return 0;
} catch (...) {
  MINDGR_FAIL(kResources);
}

int l2_bwd(int nparam, void** params, int* ndims, int64_t** shapes, const char** dtypes) try {
  Rows s;
  if (int rc = check(nparam, 4, 1, ndims, shapes, dtypes, &s)) return rc;
  const float* x = static_cast<const float*>(params[0]);
  const float eps = *static_cast<const float*>(params[1]);
  const float* dy = static_cast<const float*>(params[2]);
  float* dx = static_cast<float*>(params[3]);
  const int64_t D = s.D;
  const RowShape rs(D);
  const int64_t nvec = rs.full + (rs.tail ? 1 : 0);
  for_rows(s, [&](int64_t r) {
    const float* xr = x + r * D;
    const float* gr = dy + r * D;
    float ss, sgx;
    row_dots<true>(xr, gr, rs, &ss, &sgx);
    const float inv = 1.0f / std::sqrt(ss + eps * eps);
    // dx = g / n - x * sum(g x) / n^3
    const vf iv = vbcast(inv), k = vbcast(sgx * inv * inv * inv);
    for (int64_t c = 0; c < nvec; ++c)
      store_at(dx + r * D, c, load_at(gr, c, rs) * iv - load_at(xr, c, rs) * k, rs);
  });
  return 0;
} catch (...) {
  MINDGR_FAIL(kResources);
}

}  // namespace
}  // namespace mindgr

MINDGR_AOT_OP(MindgrLayerNorm, mindgr::layer_norm_fwd)

MINDGR_AOT_OP(MindgrLayerNormBwd, mindgr::layer_norm_bwd)

MINDGR_AOT_OP(MindgrGatedLayerNorm, mindgr::gated_fwd)

MINDGR_AOT_OP(MindgrGatedLayerNormBwd, mindgr::gated_bwd)

MINDGR_AOT_OP(MindgrL2Normalize, mindgr::l2_fwd)

MINDGR_AOT_OP(MindgrL2NormalizeBwd, mindgr::l2_bwd)
