// Fused sampled scoring for the sampled-softmax loss, with MindSpore's custom AOT signature.
//   MindgrSampledLogits(out [T, D] f32, table [V1, D] f32, ids [T, R] int32|int64) -> logits [T, R] f32
//     logits[t, r] = out[t] . table[ids[t, r]]
//   MindgrSampledLogitsBwd(out, table, ids, dlogits [T, R] f32) -> d_out [T, D], d_table [V1, D]
//     d_out[t]   = sum_r dlogits[t, r] * table[ids[t, r]]                    (r ascending)
//     d_table[v] = sum_{(t, r): ids[t, r] == v} dlogits[t, r] * out[t]       ((t, r) ascending)
// Never materialises [T, V1] or [T, R, D]. Forward: per token, blocks of VL gathered rows scored
// at once (vertical accumulation over D, one transposed reduction per block, no reduction per dot);
// backward vectorised over D (VL lanes, masked tail). Parallel over t. d_table: for catalogues with 8 * (V+1) * D floats <= 64 MB, one pass adds into 8 partial
// [V+1, D] buffers, one per fixed t-chunk (not per thread), summed in chunk order; larger catalogues
// use a stable counting sort of the (t, r) pairs by id, parallel over id ranges. Either way every sum
// runs in an order fixed by the shapes: results are bitwise reproducible and independent of the
// thread count (no atomics).
// Return codes: 10 wrong argument count, 11 wrong ranks, 12 wrong dtypes, 13 inconsistent shapes
// (or T * R >= 2^31), 17 an id outside [0, V1), 99 out of memory or threads unavailable.
#include <cmath>
#include <utility>

#include "common.h"

namespace mindgr {
namespace {

// Threads for a job of `work` multiply-adds over `items` independent items.
inline int threads_for(int64_t work, int64_t items) {
  int nt = num_threads();
  if (work < (int64_t(1) << 18)) nt = 1;
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(nt, items)));
}

struct Shape {
  int64_t T = 0, D = 0, V1 = 0, R = 0;
  bool ids64 = false;
};

int check(int nparam, int want, int* ndims, int64_t** shapes, const char** dtypes, Shape* s) {
  if (nparam != want) return 10;
  for (int i = 0; i < nparam; ++i)
    if (ndims[i] != 2) return 11;
  if (!is_f32(dtypes[0]) || !is_f32(dtypes[1])) return 12;
  if (is_dtype(dtypes[2], "int64")) s->ids64 = true;
  else if (!(is_dtype(dtypes[2], "int32") || is_dtype(dtypes[2], "int"))) return 12;
  for (int i = 3; i < nparam; ++i)
    if (!is_f32(dtypes[i])) return 12;
  s->T = shapes[0][0];
  s->D = shapes[0][1];
  s->V1 = shapes[1][0];
  s->R = shapes[2][1];
  if (shapes[1][1] != s->D || shapes[2][0] != s->T) return 13;
  if (s->T * s->R >= (int64_t(1) << 31)) return 13;
  return 0;
}

template <class I>
bool ids_ok(const I* ids, int64_t n, int64_t V1) {
  bool ok = true;
  for (int64_t i = 0; i < n; ++i) ok &= (ids[i] >= 0) & (ids[i] < V1);
  return ok;
}

// ---------------------------------------------------------------------------------------------
// Lane g of the result = sum of the lanes of v[g], for VL vectors v: log2(VL) rounds of "sum of
// adjacent lanes of two vectors, a's sums then b's" (a fixed order, no trip through memory).
template <size_t... I>
inline vf pair_sums(vf a, vf b, std::index_sequence<I...>) {
  return __builtin_shufflevector(a, b, (2 * I)...) + __builtin_shufflevector(a, b, (2 * I + 1)...);
}
inline vf transpose_sum(vf* v) {
  for (int n = VL; n > 1; n /= 2)
    for (int g = 0; g < n / 2; ++g) v[g] = pair_sums(v[2 * g], v[2 * g + 1], std::make_index_sequence<VL>());
  return v[0];
}

// logits[t, r0 + g] for g < VL: VL gathered table rows against out[t] (op, zero padded to nvec
// vectors), one accumulator per row summed over D vertically, then one transposed reduction for
// all VL dots.  Rows past n (a partial block) repeat the first row and are not stored.
template <class I>
inline void score_block(const float* __restrict op, int64_t full, int tail, const float* __restrict table,
                        int64_t D, const I* __restrict ids, int n, float* __restrict dst) {
  const float* row[VL];
  for (int g = 0; g < VL; ++g) row[g] = table + int64_t(ids[g < n ? g : 0]) * D;
  vf acc[VL];
  for (int g = 0; g < VL; ++g) acc[g] = vzero();
  for (int64_t c = 0; c < full; ++c) {
    const vf o = vload(op + c * VL);
    for (int g = 0; g < VL; ++g) acc[g] += o * vload(row[g] + c * VL);
  }
  if (tail) {
    const vf o = vload(op + full * VL);
    for (int g = 0; g < VL; ++g) acc[g] += o * vload_tail(row[g] + full * VL, tail);
  }
  const vf res = transpose_sum(acc);
  if (n == VL) vstore(dst, res);
  else vstore_tail(dst, res, n);
}

template <class I>
void forward(const Shape& s, const float* out, const float* table, const I* ids, float* logits) {
  const int64_t T = s.T, D = s.D, R = s.R;
  const int64_t full = D / VL;
  const int tail = static_cast<int>(D % VL);
  const int nt = threads_for(T * R * D, T);
  parallel_run(nt, [&](int tid) {
    const int64_t t0 = T * tid / nt, t1 = T * (tid + 1) / nt;
    std::vector<float> op(static_cast<size_t>((full + 1) * VL), 0.0f);  // out[t], zero padded
    for (int64_t t = t0; t < t1; ++t) {
      std::memcpy(op.data(), out + t * D, sizeof(float) * size_t(D));
      const I* it = ids + t * R;
      float* lt = logits + t * R;
      for (int64_t r = 0; r < R; r += VL)
        score_block(op.data(), full, tail, table, D, it + r, static_cast<int>(std::min<int64_t>(VL, R - r)), lt + r);
    }
  });
}

// d_table by a stable counting sort of the (t, r) pairs by id (any catalogue size).
template <class I>
void backward_sorted(const Shape& s, const float* out, const float* table, const I* ids, const float* g,
                     float* d_out, float* d_table) {
  const int64_t T = s.T, D = s.D, R = s.R, V1 = s.V1;
  const int64_t full = D / VL;
  const int tail = static_cast<int>(D % VL);
  const int64_t nvec = full + (tail ? 1 : 0);
  const int nt = threads_for(T * R * D, T);

  // Pass 1 (parallel over t): d_out, and a histogram of ids per thread's t-chunk.
  std::vector<std::vector<int64_t>> counts(size_t(nt), std::vector<int64_t>(size_t(V1), 0));
  parallel_run(nt, [&](int tid) {
    const int64_t t0 = T * tid / nt, t1 = T * (tid + 1) / nt;
    int64_t* cnt = counts[size_t(tid)].data();
    std::vector<vf> acc(static_cast<size_t>(nvec));
    for (int64_t t = t0; t < t1; ++t) {
      for (auto& a : acc) a = vzero();
      const I* it = ids + t * R;
      const float* gt = g + t * R;
      for (int64_t r = 0; r < R; ++r) {
        const int64_t id = it[r];
        ++cnt[id];
        const float* row = table + id * D;
        const vf w = vbcast(gt[r]);
        for (int64_t c = 0; c < full; ++c) acc[size_t(c)] += w * vload(row + c * VL);
        if (tail) acc[size_t(full)] += w * vload_tail(row + full * VL, tail);
      }
      float* dt = d_out + t * D;
      for (int64_t c = 0; c < full; ++c) vstore(dt + c * VL, acc[size_t(c)]);
      if (tail) vstore_tail(dt + full * VL, acc[size_t(full)], tail);
    }
  });

  // Stable counting sort of the (t, r) pairs by id: start[v] is where id v's entries begin;
  // thread k's entries for v follow those of threads < k, so each id's list is in (t, r) order.
  std::vector<int64_t> start(size_t(V1 + 1), 0);
  for (int64_t v = 0; v < V1; ++v) {
    int64_t pos = start[size_t(v)];
    for (int k = 0; k < nt; ++k) {
      const int64_t c = counts[size_t(k)][size_t(v)];
      counts[size_t(k)][size_t(v)] = pos;  // now: where thread k writes its next entry for v
      pos += c;
    }
    start[size_t(v + 1)] = pos;
  }
  const int64_t n = T * R;
  Scratch tok_buf(static_cast<size_t>(n)), w_buf(static_cast<size_t>(n));  // int32 and float: 4 bytes each
  int32_t* tok = reinterpret_cast<int32_t*>(tok_buf.data());  // token of each sorted entry
  float* wgt = w_buf.data();                                  // its dlogits value
  parallel_run(nt, [&](int tid) {
    const int64_t t0 = T * tid / nt, t1 = T * (tid + 1) / nt;
    int64_t* pos = counts[size_t(tid)].data();
    for (int64_t t = t0; t < t1; ++t) {
      const I* it = ids + t * R;
      const float* gt = g + t * R;
      for (int64_t r = 0; r < R; ++r) {
        const int64_t p = pos[it[r]]++;
        tok[p] = static_cast<int32_t>(t);
        wgt[p] = gt[r];
      }
    }
  });

  // Pass 2 (parallel over id ranges with about n / nt entries each): d_table.
  std::vector<int64_t> vb(size_t(nt + 1), V1);
  vb[0] = 0;
  {
    int64_t v = 0;
    for (int k = 1; k < nt; ++k) {
      const int64_t target = n * k / nt;
      while (v < V1 && start[size_t(v)] < target) ++v;
      vb[size_t(k)] = v;
    }
  }
  parallel_run(nt, [&](int tid) {
    std::vector<vf> acc(static_cast<size_t>(nvec));
    for (int64_t v = vb[size_t(tid)]; v < vb[size_t(tid + 1)]; ++v) {
      for (auto& a : acc) a = vzero();
      for (int64_t p = start[size_t(v)]; p < start[size_t(v + 1)]; ++p) {
        const float* row = out + int64_t(tok[p]) * D;
        const vf w = vbcast(wgt[p]);
        for (int64_t c = 0; c < full; ++c) acc[size_t(c)] += w * vload(row + c * VL);
        if (tail) acc[size_t(full)] += w * vload_tail(row + full * VL, tail);
      }
      float* dv = d_table + v * D;
      for (int64_t c = 0; c < full; ++c) vstore(dv + c * VL, acc[size_t(c)]);
      if (tail) vstore_tail(dv + full * VL, acc[size_t(full)], tail);
    }
  });
}

// Fixed number of t-chunks whose d_table partial sums are kept apart and added in chunk order: the
// result does not depend on how many threads process the chunks.
constexpr int kChunks = 8;
// The chunked path is used while its partial buffers stay this small (else the sorted path).
constexpr int64_t kChunkedMaxBytes = int64_t(64) << 20;

// One pass over (t, r): d_out[t] from table rows, and out[t] added into partial[chunk(t)][id].
template <class I>
void backward_chunked(const Shape& s, const float* out, const float* table, const I* ids, const float* g,
                      float* d_out, float* d_table) {
  const int64_t T = s.T, D = s.D, R = s.R, V1 = s.V1;
  const int64_t full = D / VL;
  const int tail = static_cast<int>(D % VL);
  const int64_t nvec = full + (tail ? 1 : 0);
  const int64_t Dp = nvec * VL;
  const int nt = threads_for(T * R * D, kChunks);
  Scratch part_buf(static_cast<size_t>(kChunks * V1 * Dp));
  float* part = part_buf.data();
  parallel_run(nt, [&](int tid) {
    std::vector<vf> acc(static_cast<size_t>(nvec)), o(static_cast<size_t>(nvec));
    std::vector<float> op(static_cast<size_t>(Dp), 0.0f);
    for (int k = tid; k < kChunks; k += nt) {
      float* pk = part + k * V1 * Dp;
      std::memset(pk, 0, sizeof(float) * size_t(V1 * Dp));
      const int64_t t0 = T * k / kChunks, t1 = T * (k + 1) / kChunks;
      for (int64_t t = t0; t < t1; ++t) {
        std::memcpy(op.data(), out + t * D, sizeof(float) * size_t(D));
        for (int64_t c = 0; c < nvec; ++c) {
          o[size_t(c)] = vload(op.data() + c * VL);
          acc[size_t(c)] = vzero();
        }
        const I* it = ids + t * R;
        const float* gt = g + t * R;
        for (int64_t r = 0; r < R; ++r) {
          const int64_t id = it[r];
          const float* row = table + id * D;
          float* prow = pk + id * Dp;
          const vf w = vbcast(gt[r]);
          for (int64_t c = 0; c < full; ++c) acc[size_t(c)] += w * vload(row + c * VL);
          if (tail) acc[size_t(full)] += w * vload_tail(row + full * VL, tail);
          for (int64_t c = 0; c < nvec; ++c) vstore(prow + c * VL, vload(prow + c * VL) + w * o[size_t(c)]);
        }
        float* dt = d_out + t * D;
        for (int64_t c = 0; c < full; ++c) vstore(dt + c * VL, acc[size_t(c)]);
        if (tail) vstore_tail(dt + full * VL, acc[size_t(full)], tail);
      }
    }
  });
  // d_table[v] = ((partial_0 + partial_1) + partial_2) + ... , parallel over v.
  const int nr = threads_for(kChunks * V1 * Dp, V1);
  parallel_run(nr, [&](int tid) {
    const int64_t v0 = V1 * tid / nr, v1 = V1 * (tid + 1) / nr;
    for (int64_t v = v0; v < v1; ++v) {
      float* dv = d_table + v * D;
      for (int64_t c = 0; c < nvec; ++c) {
        vf a = vload(part + v * Dp + c * VL);
        for (int k = 1; k < kChunks; ++k) a += vload(part + (k * V1 + v) * Dp + c * VL);
        if (c < full) vstore(dv + c * VL, a);
        else vstore_tail(dv + c * VL, a, tail);
      }
    }
  });
}

template <class I>
void backward(const Shape& s, const float* out, const float* table, const I* ids, const float* g,
              float* d_out, float* d_table) {
  const int64_t Dp = (s.D + VL - 1) / VL * VL;
  if (int64_t(kChunks) * s.V1 * Dp * int64_t(sizeof(float)) <= kChunkedMaxBytes)
    backward_chunked(s, out, table, ids, g, d_out, d_table);
  else
    backward_sorted(s, out, table, ids, g, d_out, d_table);
}

// ---------------------------------------------------------------------------------------------
// The sampled-softmax loss tail fused with the scoring (never a [T, R] tensor outside the kernel):
//   lse[t] = log(exp(pos[t]) + sum_{r: ids[t, r] != targets[t]} exp(x[t] . table[ids[t, r]]))  (targets[t] > 0)
//          = 0                                                                                  (otherwise)
// Backward: w[t, r] = dlse[t] exp(l[t, r] - lse[t]) on the kept pairs (0 on accidental hits and
// tokens without a target) from recomputed logits, then d_x, d_table as the scoring's backward with
// w for dlogits; d_pos[t] = dlse[t] exp(pos[t] - lse[t]).

// Logits of token t's R negatives into l (R rounded up to VL), accidental hits set to -inf.
template <class I>
inline void token_logits(const float* op, int64_t full, int tail, const float* table, int64_t D, const I* it,
                         int64_t R, int64_t target, float* l) {
  for (int64_t r = 0; r < R; r += VL)
    score_block(op, full, tail, table, D, it + r, static_cast<int>(std::min<int64_t>(VL, R - r)), l + r);
  for (int64_t r = 0; r < R; ++r)
    if (int64_t(it[r]) == target) l[r] = -INFINITY;
}

// log(exp(pos) + sum of exp(l[r]) over the r < R with l[r] > -inf): max-shifted, vectorised.
inline float masked_lse(const float* l, int64_t R, float pos) {
  float m = pos;
  for (int64_t r = 0; r < R; ++r) m = l[r] > m ? l[r] : m;
  const vf vm = vbcast(m), ninf = vbcast(-INFINITY);
  vf acc = vzero();
  int64_t r = 0;
  for (; r + VL <= R; r += VL) {
    const vf v = vload(l + r);
    acc += vselect(v > ninf, vexp(v - vm));
  }
  float sum = vsum(acc) + std::exp(pos - m);
  for (; r < R; ++r)
    if (l[r] > -INFINITY) sum += std::exp(l[r] - m);
  return m + std::log(sum);
}

template <class I>
void lse_forward(const Shape& s, const float* x, const float* table, const I* ids, const int32_t* targets,
                 const float* pos, float* lse) {
  const int64_t T = s.T, D = s.D, R = s.R;
  const int64_t full = D / VL;
  const int tail = static_cast<int>(D % VL);
  const int nt = threads_for(T * R * D, T);
  parallel_run(nt, [&](int tid) {
    const int64_t t0 = T * tid / nt, t1 = T * (tid + 1) / nt;
    std::vector<float> op(static_cast<size_t>((full + 1) * VL), 0.0f);
    std::vector<float> l(static_cast<size_t>((R + VL - 1) / VL * VL));
    for (int64_t t = t0; t < t1; ++t) {
      if (targets[t] <= 0) {
        lse[t] = 0.0f;
        continue;
      }
      std::memcpy(op.data(), x + t * D, sizeof(float) * size_t(D));
      token_logits(op.data(), full, tail, table, D, ids + t * R, R, targets[t], l.data());
      lse[t] = masked_lse(l.data(), R, pos[t]);
    }
  });
}

template <class I>
void lse_backward(const Shape& s, const float* x, const float* table, const I* ids, const int32_t* targets,
                  const float* pos, const float* lse, const float* dlse, float* d_x, float* d_table, float* d_pos) {
  const int64_t T = s.T, D = s.D, R = s.R;
  const int64_t full = D / VL;
  const int tail = static_cast<int>(D % VL);
  Scratch w_buf(static_cast<size_t>(T * R));
  float* w = w_buf.data();
  const int nt = threads_for(T * R * D, T);
  parallel_run(nt, [&](int tid) {
    const int64_t t0 = T * tid / nt, t1 = T * (tid + 1) / nt;
    std::vector<float> op(static_cast<size_t>((full + 1) * VL), 0.0f);
    std::vector<float> l(static_cast<size_t>((R + VL - 1) / VL * VL));
    for (int64_t t = t0; t < t1; ++t) {
      float* wt = w + t * R;
      if (targets[t] <= 0) {
        std::fill(wt, wt + R, 0.0f);
        d_pos[t] = 0.0f;
        continue;
      }
      std::memcpy(op.data(), x + t * D, sizeof(float) * size_t(D));
      token_logits(op.data(), full, tail, table, D, ids + t * R, R, targets[t], l.data());
      const vf vl = vbcast(lse[t]), vg = vbcast(dlse[t]), ninf = vbcast(-INFINITY);
      int64_t r = 0;
      for (; r + VL <= R; r += VL) {
        const vf v = vload(l.data() + r);
        vstore(wt + r, vselect(v > ninf, vexp(v - vl) * vg));
      }
      for (; r < R; ++r) wt[r] = l[r] > -INFINITY ? std::exp(l[r] - lse[t]) * dlse[t] : 0.0f;
      d_pos[t] = dlse[t] * std::exp(pos[t] - lse[t]);
    }
  });
  backward(s, x, table, ids, w, d_x, d_table);
}

// The first five arguments: x [T, D], table [V1, D] f32, ids [T, R] int32|int64, targets [T] int32,
// pos [T] f32 (the callers check the rest).
int check_lse(int nparam, int want, int* ndims, int64_t** shapes, const char** dtypes, Shape* s) {
  if (nparam != want) return 10;
  if (ndims[0] != 2 || ndims[1] != 2 || ndims[2] != 2 || ndims[3] != 1 || ndims[4] != 1) return 11;
  if (!is_f32(dtypes[0]) || !is_f32(dtypes[1]) || !is_f32(dtypes[4])) return 12;
  if (is_dtype(dtypes[2], "int64")) s->ids64 = true;
  else if (!(is_dtype(dtypes[2], "int32") || is_dtype(dtypes[2], "int"))) return 12;
  if (!(is_dtype(dtypes[3], "int32") || is_dtype(dtypes[3], "int"))) return 12;
  s->T = shapes[0][0];
  s->D = shapes[0][1];
  s->V1 = shapes[1][0];
  s->R = shapes[2][1];
  if (shapes[1][1] != s->D || shapes[2][0] != s->T || shapes[3][0] != s->T || shapes[4][0] != s->T) return 13;
  if (s->T * s->R >= (int64_t(1) << 31)) return 13;
  return 0;
}

// lse = sampled_lse(x, table, ids, targets, pos)
int run_lse_forward(int nparam, void** params, int* ndims, int64_t** shapes, const char** dtypes) try {
  Shape s;
  if (int rc = check_lse(nparam, 6, ndims, shapes, dtypes, &s)) return rc;
  if (ndims[5] != 1 || !is_f32(dtypes[5]) || shapes[5][0] != s.T) return 13;
  const float* x = static_cast<const float*>(params[0]);
  const float* table = static_cast<const float*>(params[1]);
  const int32_t* tg = static_cast<const int32_t*>(params[3]);
  const float* pos = static_cast<const float*>(params[4]);
  float* lse = static_cast<float*>(params[5]);
  if (s.ids64) {
    const int64_t* ids = static_cast<const int64_t*>(params[2]);
    if (!ids_ok(ids, s.T * s.R, s.V1)) return 17;
    lse_forward(s, x, table, ids, tg, pos, lse);
  } else {
    const int32_t* ids = static_cast<const int32_t*>(params[2]);
    if (!ids_ok(ids, s.T * s.R, s.V1)) return 17;
    lse_forward(s, x, table, ids, tg, pos, lse);
  }
  return 0;
} catch (...) {
  return 99;
}

// (d_x, d_table, d_pos) from (x, table, ids, targets, pos, lse, dlse)
int run_lse_backward(int nparam, void** params, int* ndims, int64_t** shapes, const char** dtypes) try {
  Shape s;
  if (int rc = check_lse(nparam, 10, ndims, shapes, dtypes, &s)) return rc;
  for (int i : {5, 6, 9})
    if (ndims[i] != 1 || shapes[i][0] != s.T || !is_f32(dtypes[i])) return 13;
  if (ndims[7] != 2 || shapes[7][0] != s.T || shapes[7][1] != s.D || ndims[8] != 2 || shapes[8][0] != s.V1 ||
      shapes[8][1] != s.D || !is_f32(dtypes[7]) || !is_f32(dtypes[8]))
    return 13;
  const float* x = static_cast<const float*>(params[0]);
  const float* table = static_cast<const float*>(params[1]);
  const int32_t* tg = static_cast<const int32_t*>(params[3]);
  const float* pos = static_cast<const float*>(params[4]);
  const float* lse = static_cast<const float*>(params[5]);
  const float* dlse = static_cast<const float*>(params[6]);
  float* d_x = static_cast<float*>(params[7]);
  float* d_table = static_cast<float*>(params[8]);
  float* d_pos = static_cast<float*>(params[9]);
  if (s.ids64) {
    const int64_t* ids = static_cast<const int64_t*>(params[2]);
    if (!ids_ok(ids, s.T * s.R, s.V1)) return 17;
    lse_backward(s, x, table, ids, tg, pos, lse, dlse, d_x, d_table, d_pos);
  } else {
    const int32_t* ids = static_cast<const int32_t*>(params[2]);
    if (!ids_ok(ids, s.T * s.R, s.V1)) return 17;
    lse_backward(s, x, table, ids, tg, pos, lse, dlse, d_x, d_table, d_pos);
  }
  return 0;
} catch (...) {
  return 99;
}

int run_forward(int nparam, void** params, int* ndims, int64_t** shapes, const char** dtypes) try {
  Shape s;
  if (int rc = check(nparam, 4, ndims, shapes, dtypes, &s)) return rc;
  if (shapes[3][0] != s.T || shapes[3][1] != s.R) return 13;
  const float* out = static_cast<const float*>(params[0]);
  const float* table = static_cast<const float*>(params[1]);
  float* logits = static_cast<float*>(params[3]);
  if (s.ids64) {
    const int64_t* ids = static_cast<const int64_t*>(params[2]);
    if (!ids_ok(ids, s.T * s.R, s.V1)) return 17;
    forward(s, out, table, ids, logits);
  } else {
    const int32_t* ids = static_cast<const int32_t*>(params[2]);
    if (!ids_ok(ids, s.T * s.R, s.V1)) return 17;
    forward(s, out, table, ids, logits);
  }
  return 0;
} catch (...) {
  return 99;
}

int run_backward(int nparam, void** params, int* ndims, int64_t** shapes, const char** dtypes) try {
  Shape s;
  if (int rc = check(nparam, 6, ndims, shapes, dtypes, &s)) return rc;
  if (shapes[3][0] != s.T || shapes[3][1] != s.R) return 13;
  if (shapes[4][0] != s.T || shapes[4][1] != s.D || shapes[5][0] != s.V1 || shapes[5][1] != s.D) return 13;
  const float* out = static_cast<const float*>(params[0]);
  const float* table = static_cast<const float*>(params[1]);
  const float* g = static_cast<const float*>(params[3]);
  float* d_out = static_cast<float*>(params[4]);
  float* d_table = static_cast<float*>(params[5]);
  if (s.ids64) {
    const int64_t* ids = static_cast<const int64_t*>(params[2]);
    if (!ids_ok(ids, s.T * s.R, s.V1)) return 17;
    backward(s, out, table, ids, g, d_out, d_table);
  } else {
    const int32_t* ids = static_cast<const int32_t*>(params[2]);
    if (!ids_ok(ids, s.T * s.R, s.V1)) return 17;
    backward(s, out, table, ids, g, d_out, d_table);
  }
  return 0;
} catch (...) {
  return 99;
}

}  // namespace
}  // namespace mindgr

extern "C" {

// logits = sampled_logits(out, table, ids)
int MindgrSampledLogits(int nparam, void** params, int* ndims, int64_t** shapes, const char** dtypes,
                        void* /*stream*/, void* /*extra*/) {
  return mindgr::run_forward(nparam, params, ndims, shapes, dtypes);
}

// (d_out, d_table) from (out, table, ids, dlogits)
int MindgrSampledLogitsBwd(int nparam, void** params, int* ndims, int64_t** shapes, const char** dtypes,
                           void* /*stream*/, void* /*extra*/) {
  return mindgr::run_backward(nparam, params, ndims, shapes, dtypes);
}

// lse = sampled_lse(x, table, ids, targets, pos)
int MindgrSampledLse(int nparam, void** params, int* ndims, int64_t** shapes, const char** dtypes,
                     void* /*stream*/, void* /*extra*/) {
  return mindgr::run_lse_forward(nparam, params, ndims, shapes, dtypes);
}

// (d_x, d_table, d_pos) from (x, table, ids, targets, pos, lse, dlse)
int MindgrSampledLseBwd(int nparam, void** params, int* ndims, int64_t** shapes, const char** dtypes,
                        void* /*stream*/, void* /*extra*/) {
  return mindgr::run_lse_backward(nparam, params, ndims, shapes, dtypes);
}

}  // extern "C"
