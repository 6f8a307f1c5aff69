// FuXi-alpha's bias-only attention channels on jagged rows, forward and backward, as MindSpore custom
// AOT entry points.  Per row b (tokens s..s+L-1, L cut to N) and query i, over the same v [T, H, dv]:
//   positional: out[i, h, 0, :] = sum_{j<=i} w_pos[N-1+j-i] * v[j, h, :]
//   temporal:   out[i, h, 1, :] = sum_{j<=i} w_ts[bucket(|tq_i - t_j|)] * v[j, h, :]
//               (tq_i = t_{i+1}; the last position, i = L - 1, the row's request time: HSTU's convention)
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
#include <climits>
#include <cmath>
#include <mutex>
#include <numeric>

#include "common.h"

namespace mindgr {
namespace {

// clamp(floor(logf(float(max(gap, 1))) / 0.301f), 0, nb): the bucket formula of the reference.
inline int bucket_formula(int64_t gap, int nb) {
  if (gap < 1) gap = 1;
  const float b = std::floor(std::log(static_cast<float>(gap)) / 0.301f);
  if (!(b > 0.0f)) return 0;
  if (b > static_cast<float>(nb)) return nb;
  return static_cast<int>(b);
}

// The formula without a logarithm per pair.  It is non-decreasing in the gap, and an octave of gaps
// [2^e, 2^(e+1)) spans ln 2 / 0.301 < 3 buckets, so there it is the bucket at 2^e plus the number of
// (at most 3) step gaps passed.  The steps are found by binary search on the formula itself, so the
// table and the formula agree on every integer gap.
struct Buckets {
  static constexpr int kSteps = 3;
  int nb = 0;
  int base[64];
  int64_t step[64][kSteps];  // the last gap before each step up; INT64_MAX where there is none

  explicit Buckets(int num_buckets) : nb(num_buckets) {
    base[63] = nb;  // no gap reaches 2^63
    for (int k = 0; k < kSteps; ++k) step[63][k] = INT64_MAX;
    for (int e = 0; e < 63; ++e) {
      const int64_t lo = int64_t(1) << e;
      const int64_t hi = e == 62 ? INT64_MAX : (int64_t(1) << (e + 1)) - 1;
      base[e] = bucket_formula(lo, nb);
      int n = 0;
      for (int want = base[e] + 1; want <= nb && n < kSteps && bucket_formula(hi, nb) >= want; ++want) {
        int64_t a = lo, c = hi;  // the smallest gap in [a, c] whose bucket is >= want
        while (a < c) {
          const int64_t mid = a + (c - a) / 2;
          if (bucket_formula(mid, nb) >= want) c = mid; else a = mid + 1;
        }
        step[e][n++] = a - 1;
      }
      for (; n < kSteps; ++n) step[e][n] = INT64_MAX;
    }
  }

  inline int operator()(int64_t dt) const {
    int64_t gap = dt < 0 ? -dt : dt;
    if (gap < 1) gap = 1;
    const int e = 63 - __builtin_clzll(static_cast<unsigned long long>(gap));
    const int64_t* st = step[e];
    return base[e] + (gap > st[0]) + (gap > st[1]) + (gap > st[2]);
  }
};

const Buckets& buckets_for(int nb) {
  static std::mutex mu;
  static std::vector<Buckets*> cache;  // kept for the life of the process
  std::lock_guard<std::mutex> lock(mu);
  for (const Buckets* b : cache)
    if (b->nb == nb) return *b;
  cache.push_back(new Buckets(nb));
  return *cache.back();
}

inline int round_up(int x, int m) { return (x + m - 1) / m * m; }

// Sum of the 16 lanes, as a fixed tree.
inline float hsum(vf x) {
  float t[VL];
  vstore(t, x);
  for (int w = VL / 2; w >= 1; w /= 2)
    for (int k = 0; k < w; ++k) t[k] += t[k + w];
  return t[0];
}

struct Rows {
  int64_t T = 0;
  int H = 0, DV = 0, W = 0;  // W = H * DV, the width of one token's v
  int WP = 0;                // W rounded up to whole vectors (scratch rows are zero-padded)
  int N = 0, B = 0;
  int C = 1;                 // channels: 1 (positional) or 2 (positional, temporal)
  std::vector<int64_t> off;
  const float* v = nullptr;
  const int64_t* ts = nullptr;  // null without the temporal channel
  const int64_t* req = nullptr; // [B] request time of each row (the last position's query time)
  const float* wpos = nullptr;
  const float* wts = nullptr;
  int nb = 0;                   // w_ts has nb + 1 entries
  const Buckets* bucket = nullptr;

  int64_t start(int b) const { return off[b]; }
  int len(int b) const { return static_cast<int>(std::min<int64_t>(off[b + 1] - off[b], N)); }
  // bk[j] = the time bucket of (query i, key j) for j <= i
  void buckets_of(int b, int i, int32_t* bk) const {
    const int64_t s = start(b);
    const int64_t tq = i + 1 < len(b) ? ts[s + i + 1] : req[b];
    for (int j = 0; j <= i; ++j) bk[j] = (*bucket)(tq - ts[s + j]);
  }
  // rows s..s+L-1 of v into [L][WP], zero-padded
  void copy_v(int b, float* vp) const {
    const int64_t s = start(b);
    for (int j = 0, L = len(b); j < L; ++j) {
      std::memcpy(vp + size_t(j) * WP, v + (s + j) * W, sizeof(float) * W);
      std::fill(vp + size_t(j) * WP + W, vp + size_t(j + 1) * WP, 0.0f);
    }
  }
};

// Runs fn(row, scratch, buckets) for every non-empty row, longest first, on up to num_threads() threads.
template <class Fn>
bool for_rows(const Rows& r, size_t scratch_floats, Fn&& fn) {
  std::vector<int> order;
  for (int b = 0; b < r.B; ++b)
    if (r.len(b) > 0) order.push_back(b);
  std::stable_sort(order.begin(), order.end(), [&](int a, int c) { return r.len(a) > r.len(c); });
  const int threads = std::max(1, std::min<int>(num_threads(), static_cast<int>(order.size())));
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  try {
    parallel_run(threads, [&](int) {
      try {
        Scratch scratch(scratch_floats);
        std::vector<int32_t> bk(static_cast<size_t>(r.N));
        for (size_t k = next++; k < order.size(); k = next++) fn(order[k], scratch.data(), bk.data());
      } catch (...) {
        failed = true;
      }
    });
  } catch (...) {
    return false;
  }
  return !failed;
}

bool forward(const Rows& r, float* out) {
  std::memset(out, 0, sizeof(float) * size_t(r.T) * r.W * r.C);
  const int W = r.W, WP = r.WP, NV = r.WP / VL, C = r.C, DV = r.DV, H = r.H, N = r.N;
  return for_rows(r, size_t(r.N) * WP + size_t(C) * WP, [&](int b, float* scratch, int32_t* bk) {
    const int64_t s = r.start(b);
    const int L = r.len(b);
    float* vp = scratch;
    float* acc = scratch + size_t(N) * WP;  // [C][WP]
    r.copy_v(b, vp);
    for (int i = 0; i < L; ++i) {
      std::fill(acc, acc + size_t(C) * WP, 0.0f);
      float* ap = acc;
      float* at = acc + WP;
      if (C == 2) {
        r.buckets_of(b, i, bk);
        for (int j = 0; j <= i; ++j) {
          const float* vj = vp + size_t(j) * WP;
          const vf wp = vbcast(r.wpos[N - 1 + j - i]), wt = vbcast(r.wts[bk[j]]);
          for (int c = 0; c < NV; ++c) {
            const vf x = vload(vj + c * VL);
            vstore(ap + c * VL, vload(ap + c * VL) + wp * x);
            vstore(at + c * VL, vload(at + c * VL) + wt * x);
          }
        }
      } else {
        for (int j = 0; j <= i; ++j) {
          const float* vj = vp + size_t(j) * WP;
          const vf wp = vbcast(r.wpos[N - 1 + j - i]);
          for (int c = 0; c < NV; ++c) vstore(ap + c * VL, vload(ap + c * VL) + wp * vload(vj + c * VL));
        }
      }
      float* o = out + (s + i) * int64_t(W) * C;  // [H, C, DV] for this token
      for (int h = 0; h < H; ++h)
        for (int c = 0; c < C; ++c)
          std::memcpy(o + (h * C + c) * DV, acc + c * WP + h * DV, sizeof(float) * DV);
    }
  });
}

// dv [T, H, DV]; dwp [len_wpos]; dwt [nb + 1] or null.
bool backward(const Rows& r, const float* dout, int64_t len_wpos, float* dv, float* dwp, float* dwt) {
  std::memset(dv, 0, sizeof(float) * size_t(r.T) * r.W);
  const int W = r.W, WP = r.WP, NV = r.WP / VL, C = r.C, DV = r.DV, H = r.H, N = r.N;
  const int npos = 2 * N - 1, nts = C == 2 ? r.nb + 1 : 0;
  const size_t per_row = size_t(npos) + nts;
  std::vector<double> partial;
  try {
    partial.assign(per_row * r.B, 0.0);
  } catch (...) {
    return false;
  }
  const size_t scratch = 2 * size_t(N) * WP + size_t(C) * WP;
  const bool ok = for_rows(r, scratch, [&](int b, float* buf, int32_t* bk) {
    const int64_t s = r.start(b);
    const int L = r.len(b);
    float* vp = buf;                          // [L][WP]
    float* dvp = buf + size_t(N) * WP;        // [L][WP]
    float* g = buf + 2 * size_t(N) * WP;      // [C][WP]: this query's cotangents
    double* pp = partial.data() + per_row * b;
    double* pt = pp + npos;
    r.copy_v(b, vp);
    std::fill(dvp, dvp + size_t(L) * WP, 0.0f);
    std::fill(g, g + size_t(C) * WP, 0.0f);
    for (int i = 0; i < L; ++i) {
      const float* d = dout + (s + i) * int64_t(W) * C;
      for (int h = 0; h < H; ++h)
        for (int c = 0; c < C; ++c) std::memcpy(g + c * WP + h * DV, d + (h * C + c) * DV, sizeof(float) * DV);
      const float* gp = g;
      const float* gt = g + WP;
      if (C == 2) {
        r.buckets_of(b, i, bk);
        for (int j = 0; j <= i; ++j) {
          const float* vj = vp + size_t(j) * WP;
          float* dvj = dvp + size_t(j) * WP;
          const int rel = N - 1 + j - i;
          const vf wp = vbcast(r.wpos[rel]), wt = vbcast(r.wts[bk[j]]);
          vf sp = vzero(), st = vzero();
          for (int c = 0; c < NV; ++c) {
            const vf x = vload(vj + c * VL), a = vload(gp + c * VL), t = vload(gt + c * VL);
            vstore(dvj + c * VL, vload(dvj + c * VL) + wp * a + wt * t);
            sp += a * x;
            st += t * x;
          }
          pp[rel] += hsum(sp);
          pt[bk[j]] += hsum(st);
        }
      } else {
        for (int j = 0; j <= i; ++j) {
          const float* vj = vp + size_t(j) * WP;
          float* dvj = dvp + size_t(j) * WP;
          const int rel = N - 1 + j - i;
          const vf wp = vbcast(r.wpos[rel]);
          vf sp = vzero();
          for (int c = 0; c < NV; ++c) {
            const vf x = vload(vj + c * VL), a = vload(gp + c * VL);
            vstore(dvj + c * VL, vload(dvj + c * VL) + wp * a);
            sp += a * x;
          }
          pp[rel] += hsum(sp);
        }
      }
    }
    for (int j = 0; j < L; ++j) std::memcpy(dv + (s + j) * W, dvp + size_t(j) * WP, sizeof(float) * W);
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

// Reads v, offsets, (timestamps, request_times), w_pos, (w_ts), carrier into r.  Returns 0 or an error code.
int read_inputs(int nparam, void** params, int* ndims, int64_t** shapes, const char** dtypes, bool with_ts,
                int expected, Rows* r, int64_t* len_wpos) {
  MINDGR_REJECT_IF(nparam != expected, kArgCount);
  const int iv = 0, io = 1, it = with_ts ? 2 : -1, ir = with_ts ? 3 : -1, ip = with_ts ? 4 : 2,
            iw = with_ts ? 5 : -1, ic = with_ts ? 6 : 3;
  MINDGR_REJECT_IF(ndims[iv] != 3, kRank);
  MINDGR_REJECT_IF(!is_f32(dtypes[iv]), kDtype);
  MINDGR_REJECT_IF(ndims[io] != 1 || shapes[io][0] < 1, kOffsets);
  MINDGR_REJECT_IF(ndims[ip] != 1, kRank);
  MINDGR_REJECT_IF(!is_f32(dtypes[ip]), kDtype);
  MINDGR_REJECT_IF(ndims[ic] != 1, kCarrier);
  r->T = shapes[iv][0];
  r->H = static_cast<int>(shapes[iv][1]);
  r->DV = static_cast<int>(shapes[iv][2]);
  r->W = r->H * r->DV;
  r->WP = round_up(std::max(r->W, 1), VL);
  r->N = static_cast<int>(shapes[ic][0]);
  r->B = static_cast<int>(shapes[io][0] - 1);
  MINDGR_REJECT_IF(r->N < 1, kCarrier);
  MINDGR_REJECT_IF(!read_ints(params[io], dtypes[io], shapes[io][0], &r->off), kOffsets);
  MINDGR_REJECT_IF(!offsets_ok(r->off, r->T), kIndexRange);
  *len_wpos = shapes[ip][0];
  MINDGR_REJECT_IF(*len_wpos < 2 * int64_t(r->N) - 1, kPosTable);
  r->v = static_cast<const float*>(params[iv]);
  r->wpos = static_cast<const float*>(params[ip]);
  r->C = 1;
  if (with_ts) {
    MINDGR_REJECT_IF(ndims[it] != 1 || shapes[it][0] != r->T || !is_dtype(dtypes[it], "int64"), kTimestamps);
    MINDGR_REJECT_IF(ndims[iw] != 1, kRank);
    MINDGR_REJECT_IF(!is_f32(dtypes[iw]), kDtype);
    MINDGR_REJECT_IF(shapes[iw][0] < 1, kTimeTable);
    MINDGR_REJECT_IF(ndims[ir] != 1 || shapes[ir][0] != r->B || !is_dtype(dtypes[ir], "int64"), kRequestTimes);
    r->ts = static_cast<const int64_t*>(params[it]);
    r->req = static_cast<const int64_t*>(params[ir]);
    r->wts = static_cast<const float*>(params[iw]);
    r->nb = static_cast<int>(shapes[iw][0] - 1);
    r->bucket = &buckets_for(r->nb);
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
  const int nin = with_ts ? 7 : 4;
  Rows r;
  int64_t len_wpos = 0;
  int err = read_inputs(nparam, params, ndims, shapes, dtypes, with_ts, nin + 1, &r, &len_wpos);
  if (err != 0) return err;
  MINDGR_REJECT_IF(!is_f32(dtypes[nin]) || !shape_is(ndims[nin], shapes[nin], {r.T, r.H, r.C, r.DV}), kOutput);
  try {
    MINDGR_REJECT_IF(!forward(r, static_cast<float*>(params[nin])), kResources);
  } catch (...) {
    MINDGR_FAIL(kResources);
  }
  return 0;
}

int run_backward(int nparam, void** params, int* ndims, int64_t** shapes, const char** dtypes, bool with_ts) {
  const int nin = with_ts ? 7 : 4;  // then dout, then the gradients
  Rows r;
  int64_t len_wpos = 0;
  int err = read_inputs(nparam, params, ndims, shapes, dtypes, with_ts, nin + 1 + (with_ts ? 3 : 2), &r,
                        &len_wpos);
  if (err != 0) return err;
  const int id = nin, idv = nin + 1, idp = nin + 2, idt = nin + 3;
  MINDGR_REJECT_IF(!is_f32(dtypes[id]) || !shape_is(ndims[id], shapes[id], {r.T, r.H, r.C, r.DV}), kGradient);
  MINDGR_REJECT_IF(!is_f32(dtypes[idv]) || !shape_is(ndims[idv], shapes[idv], {r.T, r.H, r.DV}), kOutput);
  MINDGR_REJECT_IF(!is_f32(dtypes[idp]) || !shape_is(ndims[idp], shapes[idp], {len_wpos}), kOutput);
  MINDGR_REJECT_IF(with_ts && (!is_f32(dtypes[idt]) || !shape_is(ndims[idt], shapes[idt], {int64_t(r.nb) + 1})), kOutput);
  try {
    if (!backward(r, static_cast<const float*>(params[id]), len_wpos, static_cast<float*>(params[idv]),
                  static_cast<float*>(params[idp]), with_ts ? static_cast<float*>(params[idt]) : nullptr))
      MINDGR_FAIL(kResources);
  } catch (...) {
    MINDGR_FAIL(kResources);
  }
  return 0;
}

}  // namespace
}  // namespace mindgr

// (v, offsets, timestamps, request_times, w_pos, w_ts, carrier_N) -> out [T, H, 2, dv]
MINDGR_AOT_OP(MindgrBiasAttnFwd, mindgr::run_forward, true)

// (v, offsets, w_pos, carrier_N) -> out [T, H, 1, dv]
MINDGR_AOT_OP(MindgrBiasAttnFwdNoTs, mindgr::run_forward, false)

// (v, offsets, timestamps, request_times, w_pos, w_ts, carrier_N, dout) -> dv, dw_pos, dw_ts
MINDGR_AOT_OP(MindgrBiasAttnBwd, mindgr::run_backward, true)

// (v, offsets, w_pos, carrier_N, dout) -> dv, dw_pos
MINDGR_AOT_OP(MindgrBiasAttnBwdNoTs, mindgr::run_backward, false)

// For tests: the bucket the kernels assign to a gap (table), and the formula it must equal.
extern "C" int mindgr_bias_time_bucket(int64_t dt, int nb) { return mindgr::buckets_for(nb)(dt); }
extern "C" int mindgr_bias_time_bucket_formula(int64_t dt, int nb) {
  return mindgr::bucket_formula(dt < 0 ? -dt : dt, nb);
}
