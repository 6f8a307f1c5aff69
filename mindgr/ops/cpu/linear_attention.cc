// Fused jagged causal linear attention with a fixed per-head decay, for CPU: forward and backward as
// MindSpore custom AOT entry points.  Per row b (tokens s..e-1) and head h, with g = exp(log_decay[h]):
//   S_t = g S_{t-1} + k_t v_t^T   (S = 0 before the row's first token),   out_t = S_t^T q_t
// The recurrent form: on a CPU the (row, head) pairs are the parallelism, and a scan costs
// 2 * dqk * dv multiply-adds per token each way, against the chunked form's C x C products, mask
// building and transposes as composed graph ops (mindgr.ops.reference.linear_attention: the same
// function, which the tests compare this kernel with).  The backward runs two scans per (row, head):
//   forward again:  dq_t = S_t dout_t
//   in reverse:     G_t = q_t dout_t^T + g G_{t+1};  dk_t = G_t v_t;  dv_t = G_t^T k_t
// The state (one [dqk][dv] matrix per item, its rows padded to whole vectors) lives in a per-thread
// scratch buffer; the scans run over dv in blocks of at most 8 vectors of the build's ISA, the count a
// compile-time constant so that the accumulators over dv stay in registers.
// Tokens past offsets[-1] get zero outputs and gradients.  An item writes only its own tokens' slice of
// head h, and its arithmetic does not depend on which thread runs it: results are independent of the
// thread count.
#include <cmath>
#include <type_traits>

#include "common.h"

namespace mindgr {
namespace {

struct Problem {
  int64_t T = 0;
  int H = 0, D = 0, DV = 0;
  int B = 0;
  std::vector<int64_t> off;
  std::vector<float> gamma;
  const float *q = nullptr, *k = nullptr, *v = nullptr;
};

bool dims_are(int ndim, const int64_t* shape, std::initializer_list<int64_t> want) {
  if (ndim != static_cast<int>(want.size())) return false;
  int i = 0;
  for (int64_t w : want)
    if (shape[i++] != w) return false;
  return true;
}

// Reads q, k, v, offsets, log_decay (params 0..4).  Returns 0 or an error code.
int read_inputs(int nparam, void** params, int* ndims, int64_t** shapes, const char** dtypes, int expected,
                Problem* p) {
  MINDGR_REJECT_IF(nparam != expected, kArgCount);
  for (int x = 0; x < 3; ++x) {
    MINDGR_REJECT_IF(ndims[x] != 3, kRank);
    MINDGR_REJECT_IF(!is_f32(dtypes[x]), kDtype);
  }
  MINDGR_REJECT_IF(ndims[3] != 1 || shapes[3][0] < 1, kOffsets);
  p->T = shapes[0][0];
  p->H = static_cast<int>(shapes[0][1]);
  p->D = static_cast<int>(shapes[0][2]);
  p->DV = static_cast<int>(shapes[2][2]);
  MINDGR_REJECT_IF(!dims_are(ndims[1], shapes[1], {p->T, p->H, p->D}) || shapes[2][0] != p->T || shapes[2][1] != p->H, kShape);
  MINDGR_REJECT_IF(p->D < 1 || p->DV < 1 || p->H < 1, kShape);
  MINDGR_REJECT_IF(!is_f32(dtypes[4]), kDtype);
  MINDGR_REJECT_IF(!dims_are(ndims[4], shapes[4], {p->H}), kShape);
  p->B = static_cast<int>(shapes[3][0] - 1);
  MINDGR_REJECT_IF(!read_ints(params[3], dtypes[3], shapes[3][0], &p->off), kOffsets);
  MINDGR_REJECT_IF(!offsets_ok(p->off, p->T), kIndexRange);
  const float* lg = static_cast<const float*>(params[4]);
  p->gamma.resize(p->H);
  for (int h = 0; h < p->H; ++h) p->gamma[h] = std::exp(lg[h]);
  p->q = static_cast<const float*>(params[0]);
  p->k = static_cast<const float*>(params[1]);
  p->v = static_cast<const float*>(params[2]);
  return 0;
}

inline int round_up(int x, int m) { return (x + m - 1) / m * m; }

// Per-thread scratch of one item: the state S and its gradient G ([D][DVP], DVP = DV rounded up to whole
// vectors, the padding lanes kept zero) and three DVP rows (a padded v_t, dout_t, and an accumulator).
struct Work {
  float *S, *G, *vrow, *grow, *acc;
};

// fn(b, h, work) over every (row, head) item, longest rows first, on the kernels' threads.
template <class Fn>
void for_items(const Problem& p, Fn&& fn) {
  std::vector<std::pair<int64_t, int>> items;
  items.reserve(size_t(p.B) * p.H);
  for (int b = 0; b < p.B; ++b)
    if (p.off[b + 1] > p.off[b])
      for (int h = 0; h < p.H; ++h) items.emplace_back(-(p.off[b + 1] - p.off[b]), b * p.H + h);
  std::stable_sort(items.begin(), items.end());
  const int nt = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(num_threads(), int64_t(items.size()))));
  const int DVP = round_up(p.DV, VL);
  const size_t state = size_t(p.D) * DVP, per = 2 * state + 3 * size_t(DVP);
  Scratch scratch(per * size_t(nt));
  parallel_blocks(nt, int64_t(items.size()), 1, [&](int tid, int64_t i0, int64_t i1) {
    float* base = scratch.data() + per * size_t(tid);
    Work w{base, base + state, base + 2 * state, base + 2 * state + DVP, base + 2 * state + 2 * DVP};
    for (int64_t i = i0; i < i1; ++i) fn(items[i].second / p.H, items[i].second % p.H, w);
  });
}

// dst[0..DVP) = src[0..DV) then zeros
inline void load_row(const float* src, int DV, int DVP, float* dst) {
  std::memcpy(dst, src, sizeof(float) * DV);
  std::fill(dst + DV, dst + DVP, 0.0f);
}

// zeros for the tokens outside every row: before offsets[0] and past offsets[-1]
void zero_tail(const Problem& p, float* x, int w) {
  const size_t width = size_t(p.H) * w;
  std::fill(x, x + p.off[0] * width, 0.0f);
  std::fill(x + p.off[p.B] * width, x + p.T * width, 0.0f);
}

// The widest column block: 8 vectors of accumulators plus 8 of v_t (or dout_t) stay in registers.
constexpr int kMaxBlock = 8;

// fn(block, c0) for the state's columns in blocks of at most kMaxBlock vectors, the block width a
// compile-time constant (a runtime count sends the accumulators through memory: a store-to-load chain
// per state row). Column blocks of the state evolve independently, so a scan may run block by block.
template <class Fn>
void for_column_blocks(int nv, Fn&& fn) {
  for (int c0 = 0; c0 < nv; c0 += kMaxBlock) {
    switch (std::min(kMaxBlock, nv - c0)) {
      case 1: fn(std::integral_constant<int, 1>{}, c0); break;
      case 2: fn(std::integral_constant<int, 2>{}, c0); break;
      case 3: fn(std::integral_constant<int, 3>{}, c0); break;
      case 4: fn(std::integral_constant<int, 4>{}, c0); break;
      case 5: fn(std::integral_constant<int, 5>{}, c0); break;
      case 6: fn(std::integral_constant<int, 6>{}, c0); break;
      case 7: fn(std::integral_constant<int, 7>{}, c0); break;
      default: fn(std::integral_constant<int, 8>{}, c0);
    }
  }
}

// One (row, head) of the forward over the state's vectors [c0, c0 + NV): S = g S + k v^T; out = S^T q.
template <int NV>
void forward_block(const Problem& p, int b, int h, const Work& w, int c0, float* out) {
  const int H = p.H, D = p.D, DV = p.DV, DVP = round_up(DV, VL), o0 = c0 * VL;
  const int width = std::min(NV * VL, DV - o0);
  const vf g = vbcast(p.gamma[h]);
  for (int64_t t = p.off[b]; t < p.off[b + 1]; ++t) {
    const float* qt = p.q + (t * H + h) * size_t(D);
    const float* kt = p.k + (t * H + h) * size_t(D);
    load_row(p.v + (t * H + h) * size_t(DV), DV, DVP, w.vrow);
    vf acc[NV], vr[NV];
    for (int c = 0; c < NV; ++c) {
      acc[c] = vzero();
      vr[c] = vload(w.vrow + o0 + c * VL);
    }
    for (int i = 0; i < D; ++i) {
      float* Si = w.S + size_t(i) * DVP + o0;
      const vf ki = vbcast(kt[i]), qi = vbcast(qt[i]);
      for (int c = 0; c < NV; ++c) {
        const vf sv = g * vload(Si + c * VL) + ki * vr[c];
        vstore(Si + c * VL, sv);
        acc[c] = acc[c] + qi * sv;
      }
    }
    for (int c = 0; c < NV; ++c) vstore(w.acc + c * VL, acc[c]);
    std::memcpy(out + (t * H + h) * size_t(DV) + o0, w.acc, sizeof(float) * width);
  }
}

void forward(const Problem& p, float* out) {
  const int nv = round_up(p.DV, VL) / VL;
  for_items(p, [&](int b, int h, const Work& w) {
    std::fill(w.S, w.S + size_t(p.D) * nv * VL, 0.0f);
    for_column_blocks(nv, [&](auto block, int c0) { forward_block<decltype(block)::value>(p, b, h, w, c0, out); });
  });
  zero_tail(p, out, p.DV);
}

// One (row, head) of the backward over the state's vectors [c0, c0 + NV), two scans:
//   forward, the state rebuilt:  dq_t += S_t dout_t (this block's share; dq, dk start at zero)
//   in reverse:  G_t = q_t dout_t^T + g G_{t+1};  dv_t = G_t^T k_t (this block's columns);
//                dk_t += G_t v_t (this block's share)
template <int NV>
void backward_block(const Problem& p, int b, int h, const Work& w, int c0, const float* dout, float* dq,
                    float* dk, float* dv) {
  const int H = p.H, D = p.D, DV = p.DV, DVP = round_up(DV, VL), o0 = c0 * VL;
  const int width = std::min(NV * VL, DV - o0);
  const vf g = vbcast(p.gamma[h]);
  for (int64_t t = p.off[b]; t < p.off[b + 1]; ++t) {
    const float* kt = p.k + (t * H + h) * size_t(D);
    load_row(p.v + (t * H + h) * size_t(DV), DV, DVP, w.vrow);
    load_row(dout + (t * H + h) * size_t(DV), DV, DVP, w.grow);
    float* dqt = dq + (t * H + h) * size_t(D);
    for (int i = 0; i < D; ++i) {
      float* Si = w.S + size_t(i) * DVP + o0;
      const vf ki = vbcast(kt[i]);
      vf acc = vzero();
      for (int c = 0; c < NV; ++c) {
        const int o = o0 + c * VL;
        const vf sv = g * vload(Si + c * VL) + ki * vload(w.vrow + o);
        vstore(Si + c * VL, sv);
        acc += sv * vload(w.grow + o);
      }
      dqt[i] += vsum(acc);
    }
  }
  for (int64_t t = p.off[b + 1] - 1; t >= p.off[b]; --t) {
    const float* qt = p.q + (t * H + h) * size_t(D);
    const float* kt = p.k + (t * H + h) * size_t(D);
    load_row(p.v + (t * H + h) * size_t(DV), DV, DVP, w.vrow);
    load_row(dout + (t * H + h) * size_t(DV), DV, DVP, w.grow);
    float* dkt = dk + (t * H + h) * size_t(D);
    vf dvt[NV];
    for (int c = 0; c < NV; ++c) dvt[c] = vzero();
    for (int i = 0; i < D; ++i) {
      float* Gi = w.G + size_t(i) * DVP + o0;
      const vf qi = vbcast(qt[i]), ki = vbcast(kt[i]);
      vf acc = vzero();
      for (int c = 0; c < NV; ++c) {
        const int o = o0 + c * VL;
        const vf gv = g * vload(Gi + c * VL) + qi * vload(w.grow + o);
        vstore(Gi + c * VL, gv);
        acc += gv * vload(w.vrow + o);
        dvt[c] = dvt[c] + gv * ki;
      }
      dkt[i] += vsum(acc);
    }
    for (int c = 0; c < NV; ++c) vstore(w.acc + c * VL, dvt[c]);
    std::memcpy(dv + (t * H + h) * size_t(DV) + o0, w.acc, sizeof(float) * width);
  }
}

void backward(const Problem& p, const float* dout, float* dq, float* dk, float* dv) {
  const int nv = round_up(p.DV, VL) / VL;
  for_items(p, [&](int b, int h, const Work& w) {
    std::fill(w.S, w.S + size_t(p.D) * nv * VL, 0.0f);
    std::fill(w.G, w.G + size_t(p.D) * nv * VL, 0.0f);
    for (int64_t t = p.off[b]; t < p.off[b + 1]; ++t) {   // the blocks add their shares of dq_t and dk_t
      std::fill_n(dq + (t * p.H + h) * size_t(p.D), p.D, 0.0f);
      std::fill_n(dk + (t * p.H + h) * size_t(p.D), p.D, 0.0f);
    }
    for_column_blocks(nv, [&](auto block, int c0) {
      backward_block<decltype(block)::value>(p, b, h, w, c0, dout, dq, dk, dv);
    });
  });
  zero_tail(p, dq, p.D);
  zero_tail(p, dk, p.D);
  zero_tail(p, dv, p.DV);
}

// (q, k, v, offsets, log_decay) -> out [T, H, dv]
int run_forward(int nparam, void** params, int* ndims, int64_t** shapes, const char** dtypes) {
  Problem p;
  int err = read_inputs(nparam, params, ndims, shapes, dtypes, 6, &p);
  if (err != 0) return err;
  MINDGR_REJECT_IF(!is_f32(dtypes[5]) || !dims_are(ndims[5], shapes[5], {p.T, p.H, p.DV}), kOutput);
  try {
    forward(p, static_cast<float*>(params[5]));
  } catch (...) {
    MINDGR_FAIL(kResources);
  }
  return 0;
}

// (q, k, v, offsets, log_decay, dout) -> dq, dk, dv
int run_backward(int nparam, void** params, int* ndims, int64_t** shapes, const char** dtypes) {
  Problem p;
  int err = read_inputs(nparam, params, ndims, shapes, dtypes, 9, &p);
  if (err != 0) return err;
  MINDGR_REJECT_IF(!is_f32(dtypes[5]) || !dims_are(ndims[5], shapes[5], {p.T, p.H, p.DV}), kGradient);
  MINDGR_REJECT_IF(!is_f32(dtypes[6]) || !dims_are(ndims[6], shapes[6], {p.T, p.H, p.D}), kOutput);
  MINDGR_REJECT_IF(!is_f32(dtypes[7]) || !dims_are(ndims[7], shapes[7], {p.T, p.H, p.D}), kOutput);
  MINDGR_REJECT_IF(!is_f32(dtypes[8]) || !dims_are(ndims[8], shapes[8], {p.T, p.H, p.DV}), kOutput);
  try {
    backward(p, static_cast<const float*>(params[5]), static_cast<float*>(params[6]),
             static_cast<float*>(params[7]), static_cast<float*>(params[8]));
  } catch (...) {
    MINDGR_FAIL(kResources);
  }
  return 0;
}

}  // namespace
}  // namespace mindgr

// (q, k, v, offsets, log_decay) -> out [T, H, dv]
MINDGR_AOT_OP(MindgrLinAttnFwd, mindgr::run_forward)

// (q, k, v, offsets, log_decay, dout) -> dq, dk, dv
MINDGR_AOT_OP(MindgrLinAttnBwd, mindgr::run_backward)
