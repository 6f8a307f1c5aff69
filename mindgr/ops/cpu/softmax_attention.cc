// Fused jagged causal softmax attention (SASRec's) for CPU: forward and backward as MindSpore custom
// AOT entry points.  Per row b (tokens s..s+L-1, L cut to N) and head h, for query i and key j <= i:
//   s_ij = q_i.k_j / sqrt(d),   out_i = sum_j softmax_j(s_i.) v_j,   lse_i = log sum_j exp(s_ij)
// No [L, L] (let alone padded [B, N, N]) matrix is stored.  The forward is an online softmax over
// blocks of KB keys: a block's scores are computed into a KB-float buffer, the running maximum and
// sum are updated and the accumulated output is rescaled when the maximum grows.  It also returns
// lse [T, H], which the backward uses to recompute the weights exactly (p_ij = exp(s_ij - lse_i)):
//   D_i = dout_i.out_i,  dp_ij = dout_i.v_j,  ds_ij = p_ij (dp_ij - D_i)
//   dq_i = sum_j ds_ij k_j / sqrt(d),  dk_j = sum_i ds_ij q_i / sqrt(d),  dv_j = sum_i p_ij dout_i
// Both passes work on packed, zero-padded copies of one (row, head): q, k, v, dout as [L][d rounded
// up to vectors], and k (and v for the backward) transposed, [d][L rounded up], so that the scores of
// VL keys are one vector FMA per feature.
//
// Work items are (row, head) pairs, taken by threads from a shared counter, longest rows first.  An
// item writes only its own tokens' slice of head h (outputs and gradients alike; there are no weights
// to reduce), and its arithmetic does not depend on which thread runs it: every result is bitwise
// reproducible and independent of the number of threads.
#include <atomic>
#include <cmath>
#include <limits>

#include "common.h"

namespace mindgr {
namespace {

constexpr int KB = 64;  // keys per block of the online softmax (a multiple of every VL)

inline int round_up(int x, int m) { return (x + m - 1) / m * m; }

inline float hsum(vf v) { return vsum(v); }

struct Problem {
  int64_t T = 0;
  int H = 0, D = 0, DV = 0;  // heads, q/k features, v features
  int DP = 0, DVP = 0;       // D and DV rounded up to whole vectors
  int N = 0, B = 0;
  float scale = 1.0f;        // 1 / sqrt(D)
  std::vector<int64_t> off;
  const float *q = nullptr, *k = nullptr, *v = nullptr;

  int len(int b) const { return static_cast<int>(std::min<int64_t>(off[b + 1] - off[b], N)); }
  int NP() const { return round_up(std::max(N, 1), KB); }
  // rows s..s+L-1 of head h of x [T, H, w] into [L][wp], zero-padded
  void pack(const float* x, int w, int wp, int b, int h, float* dst) const {
    const int64_t s = off[b];
    for (int j = 0, L = len(b); j < L; ++j) {
      std::memcpy(dst + size_t(j) * wp, x + ((s + j) * H + h) * size_t(w), sizeof(float) * w);
      std::fill(dst + size_t(j) * wp + w, dst + size_t(j + 1) * wp, 0.0f);
    }
  }
  // the same rows transposed: [w][np], keys past L zero
  void pack_t(const float* x, int w, int np, int b, int h, float* dst) const {
    const int64_t s = off[b];
    const int L = len(b);
    std::fill(dst, dst + size_t(w) * np, 0.0f);
    for (int j = 0; j < L; ++j) {
      const float* src = x + ((s + j) * H + h) * size_t(w);
      for (int c = 0; c < w; ++c) dst[size_t(c) * np + j] = src[c];
    }
  }
  void unpack(const float* src, int w, int wp, int b, int h, float* x) const {
    const int64_t s = off[b];
    for (int j = 0, L = len(b); j < L; ++j)
      std::memcpy(x + ((s + j) * H + h) * size_t(w), src + size_t(j) * wp, sizeof(float) * w);
  }
};

// scores[j0 .. j0 + n) = (q . k_j) * scale for the packed query qi [D] and transposed keys kt [D][np]; n a
// multiple of VL (keys past the row are zero and masked by the caller).
inline void block_scores(const float* qi, const float* kt, int D, int np, int j0, int n, float scale,
                         float* scores) {
  for (int j = 0; j < n; j += VL) {
    vf acc = vzero();
    const float* kc = kt + j0 + j;
    for (int c = 0; c < D; ++c) acc += vbcast(qi[c]) * vload(kc + size_t(c) * np);
    vstore(scores + j, acc * vbcast(scale));
  }
}

// Runs fn(b, h, scratch) for every (non-empty row, head), longest rows first, on up to num_threads() threads.
template <class Fn>
bool for_items(const Problem& p, size_t scratch_floats, Fn&& fn) {
  std::vector<int> rows;
  for (int b = 0; b < p.B; ++b)
    if (p.len(b) > 0) rows.push_back(b);
  std::stable_sort(rows.begin(), rows.end(), [&](int a, int c) { return p.len(a) > p.len(c); });
  const size_t items = rows.size() * size_t(p.H);
  const int threads = std::max(1, static_cast<int>(std::min<size_t>(num_threads(), items)));
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  try {
    parallel_run(threads, [&](int) {
      try {
        Scratch scratch(scratch_floats);
        for (size_t k = next++; k < items; k = next++) fn(rows[k / p.H], static_cast<int>(k % p.H), scratch.data());
      } catch (...) {
        failed = true;
      }
    });
  } catch (...) {
    return false;
  }
  return !failed;
}

bool forward(const Problem& p, float* out, float* lse) {
  std::memset(out, 0, sizeof(float) * size_t(p.T) * p.H * p.DV);
  std::memset(lse, 0, sizeof(float) * size_t(p.T) * p.H);
  const int N = p.N, NP = p.NP(), D = p.D, DP = p.DP, DVP = p.DVP, NVV = DVP / VL;
  const size_t scratch = size_t(N) * DP + size_t(D) * NP + size_t(N) * DVP + size_t(N) * DVP + KB;
  const float neg_inf = -std::numeric_limits<float>::infinity();  // the running maximum before any key
  return for_items(p, scratch, [&](int b, int h, float* sc) {
    const int L = p.len(b);
    const int64_t s = p.off[b];
    float* qs = sc;                            // [N][DP]
    float* kt = qs + size_t(N) * DP;           // [D][NP]
    float* vs = kt + size_t(D) * NP;           // [N][DVP]
    float* os = vs + size_t(N) * DVP;          // [N][DVP]
    float* scores = os + size_t(N) * DVP;      // [KB]
    p.pack(p.q, D, DP, b, h, qs);
    p.pack_t(p.k, D, NP, b, h, kt);
    p.pack(p.v, p.DV, DVP, b, h, vs);
    for (int i = 0; i < L; ++i) {
      float* acc = os + size_t(i) * DVP;
      std::fill(acc, acc + DVP, 0.0f);
      float m = neg_inf, l = 0.0f;
      for (int j0 = 0; j0 <= i; j0 += KB) {
        const int n = std::min(KB, round_up(i + 1 - j0, VL));    // whole vectors; keys > i masked below
        block_scores(qs + size_t(i) * DP, kt, D, NP, j0, n, p.scale, scores);
        const int last = std::min(i + 1 - j0, n);                // keys j0 .. j0 + last - 1 are causal
        float m_new = m;
        for (int j = 0; j < last; ++j) m_new = std::max(m_new, scores[j]);
        const float alpha = std::exp(m - m_new);                 // 0 on the first block (m = -inf)
        const vf mb = vbcast(m_new);
        for (int j = 0; j < n; j += VL) vstore(scores + j, vexp(vload(scores + j) - mb));
        for (int j = last; j < n; ++j) scores[j] = 0.0f;        // masked keys weigh exactly 0
        vf lv = vzero();
        for (int j = 0; j < n; j += VL) lv += vload(scores + j);
        l = l * alpha + hsum(lv);
        const vf av = vbcast(alpha);
        for (int c = 0; c < NVV; ++c) vstore(acc + c * VL, vload(acc + c * VL) * av);
        for (int j = 0; j < last; ++j) {
          const vf w = vbcast(scores[j]);
          const float* vj = vs + size_t(j0 + j) * DVP;
          for (int c = 0; c < NVV; ++c) vstore(acc + c * VL, vload(acc + c * VL) + w * vload(vj + c * VL));
        }
        m = m_new;
      }
      const vf inv = vbcast(1.0f / l);
      for (int c = 0; c < NVV; ++c) vstore(acc + c * VL, vload(acc + c * VL) * inv);
      lse[(s + i) * p.H + h] = m + std::log(l);
    }
    p.unpack(os, p.DV, DVP, b, h, out);
  });
}

bool backward(const Problem& p, const float* out, const float* lse, const float* dout, float* dq, float* dk,
              float* dv) {
  std::memset(dq, 0, sizeof(float) * size_t(p.T) * p.H * p.D);
  std::memset(dk, 0, sizeof(float) * size_t(p.T) * p.H * p.D);
  std::memset(dv, 0, sizeof(float) * size_t(p.T) * p.H * p.DV);
  const int N = p.N, NP = p.NP(), D = p.D, DP = p.DP, DV = p.DV, DVP = p.DVP, NV = DP / VL, NVV = DVP / VL;
  const size_t scratch = 3 * size_t(N) * DP + size_t(D) * NP + size_t(DV) * NP + 3 * size_t(N) * DVP + 2 * size_t(NP);
  return for_items(p, scratch, [&](int b, int h, float* sc) {
    const int L = p.len(b);
    const int64_t s = p.off[b];
    float* qs = sc;                            // [N][DP]
    float* ks = qs + size_t(N) * DP;           // [N][DP]
    float* dks = ks + size_t(N) * DP;          // [N][DP] dk
    float* kt = dks + size_t(N) * DP;          // [D][NP]
    float* vt = kt + size_t(D) * NP;           // [DV][NP]
    float* gs = vt + size_t(DV) * NP;          // [N][DVP] dout
    float* os = gs + size_t(N) * DVP;          // [N][DVP] out
    float* dvs = os + size_t(N) * DVP;         // [N][DVP]
    float* pr = dvs + size_t(N) * DVP;         // [NP] weights p_ij of one query
    float* ds = pr + NP;                       // [NP] dp_ij, then ds_ij
    p.pack(p.q, D, DP, b, h, qs);
    p.pack(p.k, D, DP, b, h, ks);
    p.pack_t(p.k, D, NP, b, h, kt);
    p.pack_t(p.v, DV, NP, b, h, vt);
    p.pack(dout, DV, DVP, b, h, gs);
    p.pack(out, DV, DVP, b, h, os);
    std::fill(dks, dks + size_t(L) * DP, 0.0f);
    std::fill(dvs, dvs + size_t(L) * DVP, 0.0f);
    std::vector<float> dqi(DP);
    const vf scale = vbcast(p.scale);
    for (int i = 0; i < L; ++i) {
      const float* gi = gs + size_t(i) * DVP;
      vf dd = vzero();
      for (int c = 0; c < NVV; ++c) dd += vload(gi + c * VL) * vload(os + size_t(i) * DVP + c * VL);
      const float di = hsum(dd);
      const int n = round_up(i + 1, VL);
      block_scores(qs + size_t(i) * DP, kt, D, NP, 0, n, p.scale, pr);
      const vf li = vbcast(lse[(s + i) * p.H + h]);
      for (int j = 0; j < n; j += VL) vstore(pr + j, vexp(vload(pr + j) - li));
      for (int j = i + 1; j < n; ++j) pr[j] = 0.0f;
      // dp_j = dout_i . v_j for the keys' vectors, from the transposed v
      for (int j = 0; j < n; j += VL) {
        vf acc = vzero();
        for (int c = 0; c < DV; ++c) acc += vbcast(gi[c]) * vload(vt + size_t(c) * NP + j);
        vstore(ds + j, vload(pr + j) * (acc - vbcast(di)));
      }
      std::fill(dqi.begin(), dqi.end(), 0.0f);
      const float* qi = qs + size_t(i) * DP;
      for (int j = 0; j <= i; ++j) {
        const vf w = vbcast(ds[j]), pw = vbcast(pr[j]);
        const float* kj = ks + size_t(j) * DP;
        float* dkj = dks + size_t(j) * DP;
        for (int c = 0; c < NV; ++c) {
          vstore(dqi.data() + c * VL, vload(dqi.data() + c * VL) + w * vload(kj + c * VL));
          vstore(dkj + c * VL, vload(dkj + c * VL) + w * vload(qi + c * VL));
        }
        float* dvj = dvs + size_t(j) * DVP;
        for (int c = 0; c < NVV; ++c) vstore(dvj + c * VL, vload(dvj + c * VL) + pw * vload(gi + c * VL));
      }
      float* dst = dq + ((s + i) * p.H + h) * size_t(D);
      for (int c = 0; c < NV; ++c) vstore(dqi.data() + c * VL, vload(dqi.data() + c * VL) * scale);
      std::memcpy(dst, dqi.data(), sizeof(float) * D);
    }
    for (int j = 0; j < L; ++j)
      for (int c = 0; c < NV; ++c) vstore(dks + size_t(j) * DP + c * VL, vload(dks + size_t(j) * DP + c * VL) * scale);
    p.unpack(dks, D, DP, b, h, dk);
    p.unpack(dvs, DV, DVP, b, h, dv);
  });
}

bool shape_is(int ndim, const int64_t* shape, std::initializer_list<int64_t> want) {
  if (ndim != static_cast<int>(want.size())) return false;
  int k = 0;
  for (int64_t w : want)
    if (shape[k++] != w) return false;
  return true;
}

// Reads q, k, v, offsets, carrier_N (params 0..4).  Returns 0 or an error code.
int read_inputs(int nparam, void** params, int* ndims, int64_t** shapes, const char** dtypes, int expected,
                Problem* p) {
  if (nparam != expected) return 10;
  for (int x = 0; x < 3; ++x)
    if (ndims[x] != 3 || !is_f32(dtypes[x])) return 11;
  if (ndims[3] != 1 || shapes[3][0] < 1) return 12;
  if (ndims[4] != 1 || shapes[4][0] < 1) return 14;
  p->T = shapes[0][0];
  p->H = static_cast<int>(shapes[0][1]);
  p->D = static_cast<int>(shapes[0][2]);
  p->DV = static_cast<int>(shapes[2][2]);
  if (!shape_is(ndims[1], shapes[1], {p->T, p->H, p->D}) || shapes[2][0] != p->T || shapes[2][1] != p->H) return 11;
  if (p->D < 1 || p->DV < 1) return 11;
  p->DP = round_up(p->D, VL);
  p->DVP = round_up(p->DV, VL);
  p->N = static_cast<int>(shapes[4][0]);
  p->B = static_cast<int>(shapes[3][0] - 1);
  p->scale = 1.0f / std::sqrt(static_cast<float>(p->D));
  if (!read_ints(params[3], dtypes[3], shapes[3][0], &p->off)) return 12;
  if (!offsets_ok(p->off, p->T)) return 17;
  p->q = static_cast<const float*>(params[0]);
  p->k = static_cast<const float*>(params[1]);
  p->v = static_cast<const float*>(params[2]);
  return 0;
}

int run_forward(int nparam, void** params, int* ndims, int64_t** shapes, const char** dtypes) {
  Problem p;
  int err = read_inputs(nparam, params, ndims, shapes, dtypes, 7, &p);
  if (err != 0) return err;
  if (!is_f32(dtypes[5]) || !shape_is(ndims[5], shapes[5], {p.T, p.H, p.DV})) return 21;
  if (!is_f32(dtypes[6]) || !shape_is(ndims[6], shapes[6], {p.T, p.H})) return 21;
  try {
    if (!forward(p, static_cast<float*>(params[5]), static_cast<float*>(params[6]))) return 99;
  } catch (...) {
    return 99;
  }
  return 0;
}

// (q, k, v, offsets, carrier_N, out, lse, dout) -> dq, dk, dv
int run_backward(int nparam, void** params, int* ndims, int64_t** shapes, const char** dtypes) {
  Problem p;
  int err = read_inputs(nparam, params, ndims, shapes, dtypes, 11, &p);
  if (err != 0) return err;
  if (!is_f32(dtypes[5]) || !shape_is(ndims[5], shapes[5], {p.T, p.H, p.DV})) return 21;
  if (!is_f32(dtypes[6]) || !shape_is(ndims[6], shapes[6], {p.T, p.H})) return 21;
  if (!is_f32(dtypes[7]) || !shape_is(ndims[7], shapes[7], {p.T, p.H, p.DV})) return 21;
  if (!is_f32(dtypes[8]) || !shape_is(ndims[8], shapes[8], {p.T, p.H, p.D})) return 22;
  if (!is_f32(dtypes[9]) || !shape_is(ndims[9], shapes[9], {p.T, p.H, p.D})) return 22;
  if (!is_f32(dtypes[10]) || !shape_is(ndims[10], shapes[10], {p.T, p.H, p.DV})) return 22;
  try {
    if (!backward(p, static_cast<const float*>(params[5]), static_cast<const float*>(params[6]),
                  static_cast<const float*>(params[7]), static_cast<float*>(params[8]),
                  static_cast<float*>(params[9]), static_cast<float*>(params[10])))
      return 99;
  } catch (...) {
    return 99;
  }
  return 0;
}

}  // namespace
}  // namespace mindgr

// (q, k, v, offsets, carrier_N) -> out [T, H, dv], lse [T, H]
MINDGR_AOT_OP(MindgrSoftmaxAttnFwd, mindgr::run_forward)

// (q, k, v, offsets, carrier_N, out, lse, dout) -> dq, dk, dv
MINDGR_AOT_OP(MindgrSoftmaxAttnBwd, mindgr::run_backward)
