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
// VL keys are one vector FMA per feature.  Queries go in groups of QT = 4: each vector of transposed
// keys loaded serves the 4 queries (4 independent FMA chains), and the backward adds the group's 4
// rank-1 updates to a key's dk and dv rows in one read-modify-write.
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

// The scores of QT queries at once: out[r * ostride + j] = (q_r . k_{j0 + j}) * scale for r < QT, j < n (a
// multiple of VL).  Each vector of keys loaded from kt serves all QT queries (the transposed keys are
// read once per QT queries instead of once per query), and the QT sums are independent FMA chains.
constexpr int QT = 4;
inline void tile_scores(const float* const* q, const float* kt, int D, int np, int j0, int n, float scale,
                        float* out, size_t ostride) {
  const vf sv = vbcast(scale);
  for (int j = 0; j < n; j += VL) {
    vf a0 = vzero(), a1 = vzero(), a2 = vzero(), a3 = vzero();
    const float* kc = kt + j0 + j;
    for (int c = 0; c < D; ++c) {
      const vf x = vload(kc + size_t(c) * np);
      a0 += vbcast(q[0][c]) * x;
      a1 += vbcast(q[1][c]) * x;
      a2 += vbcast(q[2][c]) * x;
      a3 += vbcast(q[3][c]) * x;
    }
    vstore(out + j, a0 * sv);
    vstore(out + ostride + j, a1 * sv);
    vstore(out + 2 * ostride + j, a2 * sv);
    vstore(out + 3 * ostride + j, a3 * sv);
  }
}

// out[0 .. nv * VL) += sum_{j < n} w[j] * rows[j * stride ..]: per vector of features, four partial sums
// over the keys (independent chains), added in a fixed order.
inline void add_weighted_rows(const float* w, const float* rows, size_t stride, int n, int nv, float* out) {
  for (int c = 0; c < nv; ++c) {
    vf a0 = vzero(), a1 = vzero(), a2 = vzero(), a3 = vzero();
    const float* r = rows + c * VL;
    int j = 0;
    for (; j + 4 <= n; j += 4) {
      a0 += vbcast(w[j]) * vload(r + j * stride);
      a1 += vbcast(w[j + 1]) * vload(r + (j + 1) * stride);
      a2 += vbcast(w[j + 2]) * vload(r + (j + 2) * stride);
      a3 += vbcast(w[j + 3]) * vload(r + (j + 3) * stride);
    }
    for (; j < n; ++j) a0 += vbcast(w[j]) * vload(r + j * stride);
    vstore(out + c * VL, vload(out + c * VL) + ((a0 + a1) + (a2 + a3)));
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
  const size_t scratch = size_t(N) * DP + size_t(D) * NP + size_t(N) * DVP + size_t(N) * DVP + size_t(QT) * KB;
  const float neg_inf = -std::numeric_limits<float>::infinity();  // the running maximum before any key
  return for_items(p, scratch, [&](int b, int h, float* sc) {
    const int L = p.len(b);
    const int64_t s = p.off[b];
    float* qs = sc;                            // [N][DP]
    float* kt = qs + size_t(N) * DP;           // [D][NP]
    float* vs = kt + size_t(D) * NP;           // [N][DVP]
    float* os = vs + size_t(N) * DVP;          // [N][DVP]
    float* scores = os + size_t(N) * DVP;      // [QT][KB]
    p.pack(p.q, D, DP, b, h, qs);
    p.pack_t(p.k, D, NP, b, h, kt);
    p.pack(p.v, p.DV, DVP, b, h, vs);
    for (int i0 = 0; i0 < L; i0 += QT) {
      const int nq = std::min(QT, L - i0), ilast = i0 + nq - 1;
      const float* qrow[QT];
      float m[QT], l[QT];
      for (int r = 0; r < QT; ++r) {
        qrow[r] = qs + size_t(i0 + std::min(r, nq - 1)) * DP;   // a missing query repeats the last (unused)
        m[r] = neg_inf;
        l[r] = 0.0f;
        if (r < nq) std::fill(os + size_t(i0 + r) * DVP, os + size_t(i0 + r + 1) * DVP, 0.0f);
      }
      for (int j0 = 0; j0 <= ilast; j0 += KB) {
        const int n = std::min(KB, round_up(ilast + 1 - j0, VL));
        tile_scores(qrow, kt, D, NP, j0, n, p.scale, scores, KB);
        for (int r = 0; r < nq; ++r) {
          const int i = i0 + r;
          if (j0 > i) continue;
          float* sr = scores + r * KB;
          float* acc = os + size_t(i) * DVP;
          const int last = std::min(i + 1 - j0, n);              // keys j0 .. j0 + last - 1 are causal
          const int nv = round_up(last, VL);
          float m_new = m[r];
          for (int j = 0; j < last; ++j) m_new = std::max(m_new, sr[j]);
          const float alpha = std::exp(m[r] - m_new);            // 0 on the first block (m = -inf)
          const vf mb = vbcast(m_new);
          for (int j = 0; j < nv; j += VL) vstore(sr + j, vexp(vload(sr + j) - mb));
          for (int j = last; j < nv; ++j) sr[j] = 0.0f;          // masked keys weigh exactly 0
          vf lv = vzero();
          for (int j = 0; j < nv; j += VL) lv += vload(sr + j);
          l[r] = l[r] * alpha + hsum(lv);
          const vf av = vbcast(alpha);
          for (int c = 0; c < NVV; ++c) vstore(acc + c * VL, vload(acc + c * VL) * av);
          add_weighted_rows(sr, vs + size_t(j0) * DVP, DVP, last, NVV, acc);
          m[r] = m_new;
        }
      }
      for (int r = 0; r < nq; ++r) {
        float* acc = os + size_t(i0 + r) * DVP;
        const vf inv = vbcast(1.0f / l[r]);
        for (int c = 0; c < NVV; ++c) vstore(acc + c * VL, vload(acc + c * VL) * inv);
        lse[(s + i0 + r) * p.H + h] = m[r] + std::log(l[r]);
      }
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
  const size_t scratch = 3 * size_t(N) * DP + size_t(D) * NP + size_t(DV) * NP + 3 * size_t(N) * DVP + 2 * size_t(QT) * NP;
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
    float* prt = dvs + size_t(N) * DVP;        // [QT][NP] s_ij, then p_ij, of QT queries
    float* dst = prt + size_t(QT) * NP;        // [QT][NP] dp_ij, then ds_ij
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
    for (int i0 = 0; i0 < L; i0 += QT) {
      const int nq = std::min(QT, L - i0), ilast = i0 + nq - 1;
      const float *qrow[QT], *grow[QT];
      for (int r = 0; r < QT; ++r) {
        const int i = i0 + std::min(r, nq - 1);                  // a missing query repeats the last (unused)
        qrow[r] = qs + size_t(i) * DP;
        grow[r] = gs + size_t(i) * DVP;
      }
      const int n = round_up(ilast + 1, VL);
      tile_scores(qrow, kt, D, NP, 0, n, p.scale, prt, NP);     // s_ij
      tile_scores(grow, vt, DV, NP, 0, n, 1.0f, dst, NP);       // dp_ij = dout_i . v_j
      for (int r = 0; r < nq; ++r) {
        const int i = i0 + r;
        const float* gi = grow[r];
        float* pr = prt + size_t(r) * NP;
        float* ds = dst + size_t(r) * NP;
        vf dd = vzero();
        for (int c = 0; c < NVV; ++c) dd += vload(gi + c * VL) * vload(os + size_t(i) * DVP + c * VL);
        const vf di = vbcast(hsum(dd));                          // D_i = dout_i . out_i
        const vf li = vbcast(lse[(s + i) * p.H + h]);
        const int ni = round_up(i + 1, VL);
        for (int j = 0; j < ni; j += VL) {
          const vf pj = vexp(vload(pr + j) - li);
          vstore(pr + j, pj);
          vstore(ds + j, pj * (vload(ds + j) - di));             // ds_ij = p_ij (dp_ij - D_i)
        }
        for (int j = i + 1; j < n; ++j) pr[j] = ds[j] = 0.0f;   // keys after i (and the group's) weigh 0
        std::fill(dqi.begin(), dqi.end(), 0.0f);
        add_weighted_rows(ds, ks, DP, i + 1, NV, dqi.data());
        float* dst_q = dq + ((s + i) * p.H + h) * size_t(D);
        for (int c = 0; c < NV; ++c) vstore(dqi.data() + c * VL, vload(dqi.data() + c * VL) * scale);
        std::memcpy(dst_q, dqi.data(), sizeof(float) * D);
      }
      for (int r = nq; r < QT; ++r) {                            // missing queries weigh 0
        std::fill(prt + size_t(r) * NP, prt + size_t(r) * NP + n, 0.0f);
        std::fill(dst + size_t(r) * NP, dst + size_t(r) * NP + n, 0.0f);
      }
      // dk_j += sum_r ds_rj q_r and dv_j += sum_r p_rj dout_r over the group's QT queries: one
      // read-modify-write of each key row per group instead of one per query
      for (int j = 0; j <= ilast; ++j) {
        const vf w0 = vbcast(dst[j]), w1 = vbcast(dst[NP + j]), w2 = vbcast(dst[2 * NP + j]),
                 w3 = vbcast(dst[3 * NP + j]);
        float* dkj = dks + size_t(j) * DP;
        for (int c = 0; c < NV; ++c) {
          const int o = c * VL;
          vstore(dkj + o, vload(dkj + o) + ((w0 * vload(qrow[0] + o) + w1 * vload(qrow[1] + o)) +
                                            (w2 * vload(qrow[2] + o) + w3 * vload(qrow[3] + o))));
        }
        const vf p0 = vbcast(prt[j]), p1 = vbcast(prt[NP + j]), p2 = vbcast(prt[2 * NP + j]),
                 p3 = vbcast(prt[3 * NP + j]);
        float* dvj = dvs + size_t(j) * DVP;
        for (int c = 0; c < NVV; ++c) {
          const int o = c * VL;
          vstore(dvj + o, vload(dvj + o) + ((p0 * vload(grow[0] + o) + p1 * vload(grow[1] + o)) +
                                            (p2 * vload(grow[2] + o) + p3 * vload(grow[3] + o))));
        }
      }
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
  MINDGR_REJECT_IF(nparam != expected, kArgCount);
  for (int x = 0; x < 3; ++x)
    {
    MINDGR_REJECT_IF(ndims[x] != 3, kRank);
    MINDGR_REJECT_IF(!is_f32(dtypes[x]), kDtype);
  }
  MINDGR_REJECT_IF(ndims[3] != 1 || shapes[3][0] < 1, kOffsets);
  MINDGR_REJECT_IF(ndims[4] != 1 || shapes[4][0] < 1, kCarrier);
  p->T = shapes[0][0];
  p->H = static_cast<int>(shapes[0][1]);
  p->D = static_cast<int>(shapes[0][2]);
  p->DV = static_cast<int>(shapes[2][2]);
  MINDGR_REJECT_IF(!shape_is(ndims[1], shapes[1], {p->T, p->H, p->D}) || shapes[2][0] != p->T || shapes[2][1] != p->H, kShape);
  MINDGR_REJECT_IF(p->D < 1 || p->DV < 1, kShape);
  p->DP = round_up(p->D, VL);
  p->DVP = round_up(p->DV, VL);
  p->N = static_cast<int>(shapes[4][0]);
  p->B = static_cast<int>(shapes[3][0] - 1);
  p->scale = 1.0f / std::sqrt(static_cast<float>(p->D));
  MINDGR_REJECT_IF(!read_ints(params[3], dtypes[3], shapes[3][0], &p->off), kOffsets);
  MINDGR_REJECT_IF(!offsets_ok(p->off, p->T), kIndexRange);
  p->q = static_cast<const float*>(params[0]);
  p->k = static_cast<const float*>(params[1]);
  p->v = static_cast<const float*>(params[2]);
  return 0;
}

int run_forward(int nparam, void** params, int* ndims, int64_t** shapes, const char** dtypes) {
  Problem p;
  int err = read_inputs(nparam, params, ndims, shapes, dtypes, 7, &p);
  if (err != 0) return err;
  MINDGR_REJECT_IF(!is_f32(dtypes[5]) || !shape_is(ndims[5], shapes[5], {p.T, p.H, p.DV}), kOutput);
  MINDGR_REJECT_IF(!is_f32(dtypes[6]) || !shape_is(ndims[6], shapes[6], {p.T, p.H}), kOutput);
  try {
    MINDGR_REJECT_IF(!forward(p, static_cast<float*>(params[5]), static_cast<float*>(params[6])), kResources);
  } catch (...) {
    MINDGR_FAIL(kResources);
  }
  return 0;
}

// (q, k, v, offsets, carrier_N, out, lse, dout) -> dq, dk, dv
int run_backward(int nparam, void** params, int* ndims, int64_t** shapes, const char** dtypes) {
  Problem p;
  int err = read_inputs(nparam, params, ndims, shapes, dtypes, 11, &p);
  if (err != 0) return err;
  MINDGR_REJECT_IF(!is_f32(dtypes[5]) || !shape_is(ndims[5], shapes[5], {p.T, p.H, p.DV}), kOutput);
  MINDGR_REJECT_IF(!is_f32(dtypes[6]) || !shape_is(ndims[6], shapes[6], {p.T, p.H}), kOutput);
  MINDGR_REJECT_IF(!is_f32(dtypes[7]) || !shape_is(ndims[7], shapes[7], {p.T, p.H, p.DV}), kGradient);
  MINDGR_REJECT_IF(!is_f32(dtypes[8]) || !shape_is(ndims[8], shapes[8], {p.T, p.H, p.D}), kOutput);
  MINDGR_REJECT_IF(!is_f32(dtypes[9]) || !shape_is(ndims[9], shapes[9], {p.T, p.H, p.D}), kOutput);
  MINDGR_REJECT_IF(!is_f32(dtypes[10]) || !shape_is(ndims[10], shapes[10], {p.T, p.H, p.DV}), kOutput);
  try {
    if (!backward(p, static_cast<const float*>(params[5]), static_cast<const float*>(params[6]),
                  static_cast<const float*>(params[7]), static_cast<float*>(params[8]),
                  static_cast<float*>(params[9]), static_cast<float*>(params[10])))
      MINDGR_FAIL(kResources);
  } catch (...) {
    MINDGR_FAIL(kResources);
  }
  return 0;
}

}  // namespace
}  // namespace mindgr

// (q, k, v, offsets, carrier_N) -> out [T, H, dv], lse [T, H]
MINDGR_AOT_OP(MindgrSoftmaxAttnFwd, mindgr::run_forward)

// (q, k, v, offsets, carrier_N, out, lse, dout) -> dq, dk, dv
MINDGR_AOT_OP(MindgrSoftmaxAttnBwd, mindgr::run_backward)
