// FuXi-alpha's bias-only attention channels on jagged rows, forward and backward, as MindSpore custom
// AOT entry points.  Per row b (tokens s..s+L-1, L cut to N) and query i, over the same v [T, H, dv]:
//   positional: out[i, h, 0, :] = sum_{j<=i} w_pos[N-1+j-i] * v[j, h, :]
//   temporal:   out[i, h, 1, :] = sum_{j<=i} w_ts[bucket(|tq_i - t_j|)] * v[j, h, :]
//               (tq_i = t_{i+1}, the last position its own t_i: HSTU's convention in MindGR)
// The weights are the raw biases (no SiLU, no 1/N) and shared by all heads, so a pair (i, j) is one
// scaled add of the whole token vector v[j] (H*dv floats).  No [L, L] matrix is stored.
// Backward: dv[j] = sum_{i>=j} w_pos[..] dpos[i] + w_ts[..] dts[i]; dw_pos[N-1+j-i] += dpos[i].v[j];
// dw_ts[bucket] += dts[i].v[j] (dots over all heads).
//
// Work items are rows, taken by threads from a shared counter, longest first.  Everything a row
// produces depends on that row alone: out and dv rows are disjoint, and the weight gradients are
// summed per row in double, then the rows are added in row order.  So every result is bitwise
// reproducible and independent of the number of threads.
#include <atomic>
#include <cmath>
#include <numeric>

#include "common.h"

namespace mindgr {
namespace {

// clamp(floor(logf(float(max(gap, 1))) / 0.301f), 0, nb): the bucket formula of the reference.
inline int time_bucket(int64_t dt, int nb) {
  int64_t gap = dt < 0 ? -dt : dt;
  if (gap < 1) gap = 1;
  const float b = std::floor(std::log(static_cast<float>(gap)) / 0.301f);
  if (!(b > 0.0f)) return 0;
  if (b > static_cast<float>(nb)) return nb;
  return static_cast<int>(b);
}

struct Rows {
  int64_t T = 0;
  int H = 0, DV = 0, W = 0;  // W = H * DV, the width of one token's v
  int N = 0, B = 0;
  int C = 1;                 // channels: 1 (positional) or 2 (positional, temporal)
  std::vector<int64_t> off;
  const float* v = nullptr;
  const int64_t* ts = nullptr;  // null without the temporal channel
  const float* wpos = nullptr;
  const float* wts = nullptr;
  int nb = 0;                   // w_ts has nb + 1 entries

  int64_t start(int b) const { return off[b]; }
  int len(int b) const { return static_cast<int>(std::min<int64_t>(off[b + 1] - off[b], N)); }
  int64_t query_time(int b, int i) const {
    const int L = len(b);
    return ts[start(b) + (i + 1 < L ? i + 1 : i)];
  }
};

// Runs fn(row, scratch) for every non-empty row, longest rows first, on up to num_threads() threads.
template <class Fn>
bool for_rows(const Rows& r, size_t scratch_floats, Fn&& fn) {
  std::vector<int> order;
  for (int b = 0; b < r.B; ++b)
    if (r.len(b) > 0) order.push_back(b);
  std::stable_sort(order.begin(), order.end(), [&](int a, int c) { return r.len(a) > r.len(c); });
  const int threads = std::max(1, std::min<int>(num_threads(), static_cast<int>(order.size())));
  std::atomic<size_t> next{0};
  try {
    parallel_run(threads, [&](int) {
      Scratch scratch(scratch_floats);
      for (size_t k = next++; k < order.size(); k = next++) fn(order[k], scratch.data());
    });
  } catch (...) {
    return false;
  }
  return true;
}

bool forward(const Rows& r, float* out) {
  std::memset(out, 0, sizeof(float) * size_t(r.T) * r.W * r.C);
  const int W = r.W, C = r.C, DV = r.DV, H = r.H, N = r.N;
  return for_rows(r, size_t(C) * W, [&](int b, float* acc) {
    const int64_t s = r.start(b);
    const int L = r.len(b);
    for (int i = 0; i < L; ++i) {
      float* ap = acc;
      float* at = acc + W;
      std::fill(acc, acc + size_t(C) * W, 0.0f);
      const int64_t tq = r.ts != nullptr ? r.query_time(b, i) : 0;
      for (int j = 0; j <= i; ++j) {
        const float* vj = r.v + (s + j) * W;
        const float wp = r.wpos[N - 1 + j - i];
        for (int x = 0; x < W; ++x) ap[x] += wp * vj[x];
        if (r.ts != nullptr) {
          const float wt = r.wts[time_bucket(tq - r.ts[s + j], r.nb)];
          for (int x = 0; x < W; ++x) at[x] += wt * vj[x];
        }
      }
      float* o = out + (s + i) * int64_t(W) * C;  // [H, C, DV] for this token
      for (int h = 0; h < H; ++h)
        for (int c = 0; c < C; ++c)
          std::memcpy(o + (h * C + c) * DV, acc + c * W + h * DV, sizeof(float) * DV);
    }
  });
}

// dv [T, H, DV]; dwp [len_wpos]; dwt [nb + 1] or null.
bool backward(const Rows& r, const float* dout, int64_t len_wpos, float* dv, float* dwp, float* dwt) {
  std::memset(dv, 0, sizeof(float) * size_t(r.T) * r.W);
  const int W = r.W, C = r.C, DV = r.DV, H = r.H, N = r.N;
  const int npos = 2 * N - 1, nts = r.ts != nullptr ? r.nb + 1 : 0;
  const size_t per_row = size_t(npos) + nts;
  std::vector<double> partial;
  try {
    partial.assign(per_row * r.B, 0.0);
  } catch (...) {
    return false;
  }
  const bool ok = for_rows(r, size_t(C) * W, [&](int b, float* g) {
    const int64_t s = r.start(b);
    const int L = r.len(b);
    double* pp = partial.data() + per_row * b;
    double* pt = pp + npos;
    for (int i = 0; i < L; ++i) {
      // this query's cotangents, one contiguous [W] vector per channel
      const float* d = dout + (s + i) * int64_t(W) * C;
      for (int h = 0; h < H; ++h)
        for (int c = 0; c < C; ++c) std::memcpy(g + c * W + h * DV, d + (h * C + c) * DV, sizeof(float) * DV);
      const float* gp = g;
      const float* gt = g + W;
      const int64_t tq = r.ts != nullptr ? r.query_time(b, i) : 0;
      for (int j = 0; j <= i; ++j) {
        const float* vj = r.v + (s + j) * W;
        float* dvj = dv + (s + j) * W;
        const int rel = N - 1 + j - i;
        const float wp = r.wpos[rel];
        float dot = 0.0f;
        for (int x = 0; x < W; ++x) {
          dvj[x] += wp * gp[x];
          dot += gp[x] * vj[x];
        }
        pp[rel] += dot;
        if (r.ts != nullptr) {
          const int bk = time_bucket(tq - r.ts[s + j], r.nb);
          const float wt = r.wts[bk];
          float dt = 0.0f;
          for (int x = 0; x < W; ++x) {
            dvj[x] += wt * gt[x];
            dt += gt[x] * vj[x];
          }
          pt[bk] += dt;
        }
      }
    }
  });
  if (!ok) return false;
  // rows added in row order: the same bits whatever thread did which row
  std::vector<double> sum(per_row, 0.0);
  for (int b = 0; b < r.B; ++b) {
    const double* p = partial.data() + per_row * b;
    for (size_t x = 0; x < per_row; ++x) sum[x] += p[x];
  }
  std::memset(dwp, 0, sizeof(float) * len_wpos);
  for (int x = 0; x < npos; ++x) dwp[x] = static_cast<float>(sum[x]);
  for (int x = 0; x < nts; ++x) dwt[x] = static_cast<float>(sum[npos + x]);
  return true;
}

// Reads v, offsets, (timestamps), w_pos, (w_ts), carrier into r.  Returns 0 or an error code.
int read_inputs(int nparam, void** params, int* ndims, int64_t** shapes, const char** dtypes, bool with_ts,
                int expected, Rows* r, int64_t* len_wpos) {
  if (nparam != expected) return 10;
  const int iv = 0, io = 1, it = with_ts ? 2 : -1, ip = with_ts ? 3 : 2, iw = with_ts ? 4 : -1,
            ic = with_ts ? 5 : 3;
  if (ndims[iv] != 3 || !is_f32(dtypes[iv])) return 11;
  if (ndims[io] != 1 || shapes[io][0] < 1) return 12;
  if (ndims[ip] != 1 || !is_f32(dtypes[ip])) return 13;
  if (ndims[ic] != 1) return 14;
  r->T = shapes[iv][0];
  r->H = static_cast<int>(shapes[iv][1]);
  r->DV = static_cast<int>(shapes[iv][2]);
  r->W = r->H * r->DV;
  r->N = static_cast<int>(shapes[ic][0]);
  r->B = static_cast<int>(shapes[io][0] - 1);
  if (r->N < 1) return 14;
  if (!read_ints(params[io], dtypes[io], shapes[io][0], &r->off)) return 12;
  if (!offsets_ok(r->off, r->T)) return 17;
  *len_wpos = shapes[ip][0];
  if (*len_wpos < 2 * int64_t(r->N) - 1) return 18;
  r->v = static_cast<const float*>(params[iv]);
  r->wpos = static_cast<const float*>(params[ip]);
  r->C = 1;
  if (with_ts) {
    if (ndims[it] != 1 || shapes[it][0] != r->T || !is_dtype(dtypes[it], "int64")) return 19;
    if (ndims[iw] != 1 || !is_f32(dtypes[iw])) return 15;
    if (shapes[iw][0] < 1) return 20;
    r->ts = static_cast<const int64_t*>(params[it]);
    r->wts = static_cast<const float*>(params[iw]);
    r->nb = static_cast<int>(shapes[iw][0] - 1);
    r->C = 2;
  }
  return 0;
}

bool shape_is(int ndim, const int64_t* shape, std::initializer_list<int64_t> want) {
  if (ndim != static_cast<int>(want.size())) return false;
  int k = 0;
  for (int64_t w : want)
    if (shape[k++] != w) return false;
  return true;
}

int run_forward(int nparam, void** params, int* ndims, int64_t** shapes, const char** dtypes, bool with_ts) {
  const int nin = with_ts ? 6 : 4;
  Rows r;
  int64_t len_wpos = 0;
  int err = read_inputs(nparam, params, ndims, shapes, dtypes, with_ts, nin + 1, &r, &len_wpos);
  if (err != 0) return err;
  if (!is_f32(dtypes[nin]) || !shape_is(ndims[nin], shapes[nin], {r.T, r.H, r.C, r.DV})) return 21;
  try {
    if (!forward(r, static_cast<float*>(params[nin]))) return 99;
  } catch (...) {
    return 99;
  }
  return 0;
}

int run_backward(int nparam, void** params, int* ndims, int64_t** shapes, const char** dtypes, bool with_ts) {
  const int nin = with_ts ? 6 : 4;  // then dout, then the gradients
  Rows r;
  int64_t len_wpos = 0;
  int err = read_inputs(nparam, params, ndims, shapes, dtypes, with_ts, nin + 1 + (with_ts ? 3 : 2), &r,
                        &len_wpos);
  if (err != 0) return err;
  const int id = nin, idv = nin + 1, idp = nin + 2, idt = nin + 3;
  if (!is_f32(dtypes[id]) || !shape_is(ndims[id], shapes[id], {r.T, r.H, r.C, r.DV})) return 21;
  if (!is_f32(dtypes[idv]) || !shape_is(ndims[idv], shapes[idv], {r.T, r.H, r.DV})) return 22;
  if (!is_f32(dtypes[idp]) || !shape_is(ndims[idp], shapes[idp], {len_wpos})) return 23;
  if (with_ts && (!is_f32(dtypes[idt]) || !shape_is(ndims[idt], shapes[idt], {int64_t(r.nb) + 1}))) return 23;
  try {
    if (!backward(r, static_cast<const float*>(params[id]), len_wpos, static_cast<float*>(params[idv]),
                  static_cast<float*>(params[idp]), with_ts ? static_cast<float*>(params[idt]) : nullptr))
      return 99;
  } catch (...) {
    return 99;
  }
  return 0;
}

}  // namespace
}  // namespace mindgr

extern "C" {

// (v, offsets, timestamps, w_pos, w_ts, carrier_N) -> out [T, H, 2, dv]
int MindgrBiasAttnFwd(int nparam, void** params, int* ndims, int64_t** shapes, const char** dtypes, void*,
                      void*) {
  return mindgr::run_forward(nparam, params, ndims, shapes, dtypes, true);
}

// (v, offsets, w_pos, carrier_N) -> out [T, H, 1, dv]
int MindgrBiasAttnFwdNoTs(int nparam, void** params, int* ndims, int64_t** shapes, const char** dtypes, void*,
                          void*) {
  return mindgr::run_forward(nparam, params, ndims, shapes, dtypes, false);
}

// (v, offsets, timestamps, w_pos, w_ts, carrier_N, dout) -> dv, dw_pos, dw_ts
int MindgrBiasAttnBwd(int nparam, void** params, int* ndims, int64_t** shapes, const char** dtypes, void*,
                      void*) {
  return mindgr::run_backward(nparam, params, ndims, shapes, dtypes, true);
}

// (v, offsets, w_pos, carrier_N, dout) -> dv, dw_pos
int MindgrBiasAttnBwdNoTs(int nparam, void** params, int* ndims, int64_t** shapes, const char** dtypes, void*,
                          void*) {
  return mindgr::run_backward(nparam, params, ndims, shapes, dtypes, false);
}

}  // extern "C"
