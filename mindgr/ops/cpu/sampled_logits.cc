// Fused sampled scoring for the sampled-softmax loss, with MindSpore's custom AOT signature.
//   MindgrSampledLogits(out [T, D] f32, table [V1, D] f32, ids [T, R] int32|int64) -> logits [T, R] f32
//     logits[t, r] = out[t] . table[ids[t, r]]
//   MindgrSampledLogitsBwd(out, table, ids, dlogits [T, R] f32) -> d_out [T, D], d_table [V1, D]
//     d_out[t]   = sum_r dlogits[t, r] * table[ids[t, r]]                    (r ascending)
//     d_table[v] = sum_{(t, r): ids[t, r] == v} dlogits[t, r] * out[t]       ((t, r) ascending)
//   MindgrSampledLse / MindgrSampledLseBwd: the sampled-softmax loss tail fused with the scoring
//     (accidental-hit mask, log-sum-exp with the positive logit, their gradients; see below). The
//     forward also writes, for the backward, the negatives' softmax weights probs [T, R] and
//     u = d lse / d x [T, D] (summed over the rows the scoring has just loaded): so the backward
//     neither rescores nor gathers a table row; it only forms d_table.
// Never materialises [T, V1] or [T, R, D]; the loss tail's only [T, R] tensor is probs.
// Scoring (a gather-GEMM): per token, blocks of VL gathered table rows against the token's row held
// in registers, one accumulator per row summed vertically over D, one transposed reduction per
// block for its VL dots. Rows are read from a 64-byte aligned, zero-padded copy of the table when
// D is not a whole number of vectors and the copy is small against the gathers (same result bits).
// Backward: one pass over the tokens (parallel over fixed token blocks) giving d_x (the loss tail:
// from u; the scoring: from the gathered rows) and appending each (t, w, id) to its id partition's stream;
// then d_table per id partition (L1-sized) block by block. Every sum runs in an order fixed by the
// shapes (d_table[v]: one chain in (t, r) order; d_x: r ascending, alternate rows in two chains
// where NV <= 4): results are bitwise reproducible and independent of the thread count (no atomics,
// no partial tables); they depend on the ISA (VL) only through the dots' reduction order.
// Return codes: 10 wrong argument count, 11 wrong ranks, 12 wrong dtypes, 13 inconsistent shapes
// (or T * R >= 2^31, or V1 >= 2^31), 17 an id outside [0, V1), 99 out of memory or threads unavailable.
#include <cmath>
#include <type_traits>
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
  int nv = 0;    // vectors per row: ceil(D / VL)
  int last = 0;  // valid lanes of a row's last vector (1..VL)
  void derive() {
    nv = static_cast<int>((D + VL - 1) / VL);
    last = static_cast<int>(D - int64_t(nv > 0 ? nv - 1 : 0) * VL);
  }
};

// ---------------------------------------------------------------------------------------------
// The last vector of a row: its n (1..VL) leading lanes, the others zero; never touches p + n on.
struct Last {
  int n;
#if defined(MINDGR_ISA_AVX512)
  __mmask16 k;
  explicit Last(int n_) : n(n_), k(static_cast<__mmask16>((1u << n_) - 1u)) {}
  vf load(const float* p) const { return (vf)_mm512_maskz_loadu_ps(k, p); }
  void store(float* p, vf v) const { _mm512_mask_storeu_ps(p, k, (__m512)v); }
#elif defined(MINDGR_ISA_AVX2)
  __m256i m;
  explicit Last(int n_)
      : n(n_), m(_mm256_cmpgt_epi32(_mm256_set1_epi32(n_), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7))) {}
  // A whole vector (the padded table view's rows) without a mask; stores never masked (store_lanes_avx2).
  vf load(const float* p) const { return n == VL ? vload(p) : (vf)_mm256_maskload_ps(p, m); }
  void store(float* p, vf v) const { store_lanes_avx2(p, v, n); }
#else
  explicit Last(int n_) : n(n_) {}
  vf load(const float* p) const {
    vf r = vzero();
    std::memcpy(&r, p, sizeof(float) * size_t(n));
    return r;
  }
  void store(float* p, vf v) const { std::memcpy(p, &v, sizeof(float) * size_t(n)); }
#endif
};

// Lane g of the result = sum of the lanes of v[g], for VL vectors v: log2(VL) rounds of "sum of
// adjacent lanes of two vectors, a's sums then b's" (a fixed order, no trip through memory).
template <size_t... I>
inline vf pair_sums(vf a, vf b, std::index_sequence<I...>) {
  return __builtin_shufflevector(a, b, (2 * I)...) + __builtin_shufflevector(a, b, (2 * I + 1)...);
}
inline vf transpose_sum(vf* v) {
#if defined(MINDGR_ISA_AVX2)
  // The same tree of additions by in-lane hadds (Zen 3: cross-lane permutes are the slow part):
  // hadd(hadd(v0, v1), hadd(v2, v3)) holds v0..v3's sums of lanes 0-3 in the low half and of lanes
  // 4-7 in the high half; one exchange of halves and an add finish the tree.
  const __m256 a = _mm256_hadd_ps(_mm256_hadd_ps((__m256)v[0], (__m256)v[1]), _mm256_hadd_ps((__m256)v[2], (__m256)v[3]));
  const __m256 b = _mm256_hadd_ps(_mm256_hadd_ps((__m256)v[4], (__m256)v[5]), _mm256_hadd_ps((__m256)v[6], (__m256)v[7]));
  return (vf)_mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
#endif
#pragma GCC unroll 8
  for (int n = VL; n > 1; n /= 2)
#pragma GCC unroll 8
    for (int g = 0; g < n / 2; ++g) v[g] = pair_sums(v[2 * g], v[2 * g + 1], std::make_index_sequence<VL>());
  return v[0];
}

inline float hmax(vf v) {
  float a[VL];
  std::memcpy(a, &v, sizeof(a));
  float m = a[0];
  for (int i = 1; i < VL; ++i) m = a[i] > m ? a[i] : m;
  return m;
}

// Rows of NV vectors (NV = 0: the run-time s.nv) held in registers when they fit beside the VL
// accumulators of a block (else the block runs D-outer with VL row pointers).
template <int NV>
constexpr bool kXInRegs = NV > 0 && NV + VL + 3 <= kVecRegs;
// Two accumulator chains (alternate rows) where one chain of NV FMAs would wait on FMA latency.
template <int NV>
constexpr int kChains = (NV > 0 && NV <= 4 && 2 * NV + 2 <= kVecRegs) ? 2 : 1;

template <int NV>
inline int nvecs(const Shape& s) { return NV ? NV : s.nv; }

// x row (D floats) into nv vectors, lanes past D zero.
inline void load_row(const float* p, int nv, const Last& last, vf* xv) {
  for (int c = 0; c + 1 < nv; ++c) xv[c] = vload(p + c * VL);
  if (nv > 0) xv[nv - 1] = last.load(p + (nv - 1) * VL);
}

// Dots of the row xv with table rows ids[0..n) (n <= VL), lane g = row g; lanes past n are
// garbage (row 0 again). Ids are known to be in range.
template <int NV>
inline vf block_dots(const vf* xv, int nv, const Last& last, const float* table, int64_t D, const int32_t* ids,
                     int n) {
  const int nvr = NV ? NV : nv;
  vf acc[VL];
  if constexpr (kXInRegs<NV>) {
#pragma GCC unroll 16
    for (int g = 0; g < VL; ++g) {
      const float* p = table + int64_t(ids[g < n ? g : 0]) * D;
      vf a;
      if (nvr == 1) {
        a = xv[0] * last.load(p);
      } else {
        a = xv[0] * vload(p);
#pragma GCC unroll 8
        for (int c = 1; c + 1 < nvr; ++c) a += xv[c] * vload(p + c * VL);
        a += xv[nvr - 1] * last.load(p + (nvr - 1) * VL);
      }
      acc[g] = a;
    }
  } else {
    const float* rp[VL];
#pragma GCC unroll 16
    for (int g = 0; g < VL; ++g) {
      rp[g] = table + int64_t(ids[g < n ? g : 0]) * D;
      acc[g] = vzero();
    }
    for (int c = 0; c + 1 < nvr; ++c) {
      const vf xc = xv[c];
#pragma GCC unroll 16
      for (int g = 0; g < VL; ++g) acc[g] += xc * vload(rp[g] + c * VL);
    }
    if (nvr > 0) {
      const vf xc = xv[nvr - 1];
#pragma GCC unroll 16
      for (int g = 0; g < VL; ++g) acc[g] += xc * last.load(rp[g] + (nvr - 1) * VL);
    }
  }
  return transpose_sum(acc);
}

inline bool any_lane(vi m) {
#if defined(MINDGR_ISA_AVX2)
  return !_mm256_testz_si256((__m256i)m, (__m256i)m);
#else
  int32_t o = 0;
  for (int g = 0; g < VL; ++g) o |= m[g];
  return o != 0;
#endif
}

// True when every id of ids[0..n) is in [0, V1).
inline bool ids_in_range(const int32_t* ids, int64_t n, int64_t V1) {
  const uint32_t v = static_cast<uint32_t>(V1);
  typedef uint32_t vu __attribute__((vector_size(VL * sizeof(uint32_t))));
  // whole vectors by unsigned compares (a scalar loop was ~7 % of the lse forward on Zen 3)
  const vu vv = (vu)vbcast_i(int32_t(v));
  vi bad = vi{};
  int64_t i = 0;
  for (; i + VL <= n; i += VL) bad |= (vi)((vu)vload_i(ids + i) >= vv);
  bool ok = !any_lane(bad);
  for (; i < n; ++i) ok &= static_cast<uint32_t>(ids[i]) < v;
  return ok;
}

// Lanes g >= n or with ids[g] == target (accidental hits): -1.
inline vi hit_lanes(const int32_t* ids, int n, int32_t target) {
  vi idv = vi{} - 1;  // -1 is never a target (targets > 0)
  // a whole block by one load: a run-time-sized memcpy is a `rep movsl` (slow to start on Zen 3)
  if (n == VL) idv = vload_i(ids);
  else std::memcpy(&idv, ids, sizeof(int32_t) * size_t(n));
  const vi tv = vi{} + target;
  return (idv == tv) | (iota() >= (vi{} + n));
}

inline vf select_ninf(vi mask, vf v) {
  vi bits;
  std::memcpy(&bits, &v, sizeof(bits));
  const float ninf = -INFINITY;
  int32_t nb;
  std::memcpy(&nb, &ninf, sizeof(nb));
  bits = (bits & ~mask) | ((vi{} + nb) & mask);
  vf r;
  std::memcpy(&r, &bits, sizeof(r));
  return r;
}

template <class Fn>
void with_nv(int nv, Fn&& fn) {
  switch (nv) {
    case 1: fn(std::integral_constant<int, 1>()); break;
    case 2: fn(std::integral_constant<int, 2>()); break;
    case 3: fn(std::integral_constant<int, 3>()); break;
    case 4: fn(std::integral_constant<int, 4>()); break;
    case 5: fn(std::integral_constant<int, 5>()); break;
    case 6: fn(std::integral_constant<int, 6>()); break;
    case 7: fn(std::integral_constant<int, 7>()); break;
    case 8: fn(std::integral_constant<int, 8>()); break;
    default: fn(std::integral_constant<int, 0>()); break;
  }
}

// Per-thread row buffer of nv vectors: registers for a compile-time NV, else heap.
template <int NV>
struct RowBuf {
  vf v[NV];
  explicit RowBuf(int) {}
  vf* data() { return v; }
};
template <>
struct RowBuf<0> {
  std::vector<vf> v;
  explicit RowBuf(int nv) : v(static_cast<size_t>(std::max(nv, 1))) {}
  vf* data() { return v.data(); }
};

inline float* aligned64(float* q) { return q + (16 - (reinterpret_cast<uintptr_t>(q) / sizeof(float)) % 16) % 16; }

// The table as rows of nv whole vectors (stride nv * VL, 64-byte aligned, zero lanes past D)
// when that copy costs little against the gathers: every row load is then one aligned vector
// (no cache-line splits, no masks). Results are the same bits either way (the padding is zero and
// x's lanes past D are zero). Else the table itself.
struct TableView {
  const float* p;
  int64_t ld;
  Last last;
  std::unique_ptr<Scratch> buf;
  // Whether the view of these shapes is a padded copy.
  static bool pads(const Shape& s) {
    return s.nv != 0 && s.last != VL && s.V1 * int64_t(s.nv) * VL * 4 <= s.T * s.R * s.D;
  }
  TableView(const Shape& s, const float* table) : p(table), ld(s.D), last(s.last) {
    const int64_t Dp = int64_t(s.nv) * VL;
    if (!pads(s)) return;
    buf.reset(new Scratch(static_cast<size_t>(s.V1 * Dp + 16)));
    float* q = aligned64(buf->data());
    for (int64_t v = 0; v < s.V1; ++v) {
      std::memcpy(q + v * Dp, table + v * s.D, sizeof(float) * size_t(s.D));
      std::memset(q + v * Dp + s.D, 0, sizeof(float) * size_t(Dp - s.D));
    }
    p = q;
    ld = Dp;
    last = Last(VL);
  }
};

// ---------------------------------------------------------------------------------------------
// Forward: logits[t, r] = out[t] . table[ids[t, r]].
template <int NV>
void forward_nv(const Shape& s, const float* out, const float* table, const int32_t* ids, float* logits,
                bool* bad) {
  const int64_t T = s.T, D = s.D, R = s.R;
  const int nt = threads_for(T * R * D, T);
  std::vector<char> bad_t(size_t(nt), 0);
  const TableView tv(s, table);
  parallel_run(nt, [&](int tid) {
    const int64_t t0 = T * tid / nt, t1 = T * (tid + 1) / nt;
    const Last last(s.last);
    const int nv = nvecs<NV>(s);
    RowBuf<NV> xb(nv);
    vf* xv = xb.data();
    bool ok = true;
    for (int64_t t = t0; t < t1; ++t) {
      const int32_t* it = ids + t * R;
      if (!ids_in_range(it, R, s.V1)) {
        ok = false;
        continue;
      }
      load_row(out + t * D, nv, last, xv);
      float* lt = logits + t * R;
      for (int64_t r = 0; r < R; r += VL) {
        const int n = static_cast<int>(std::min<int64_t>(VL, R - r));
        const vf res = block_dots<NV>(xv, nv, tv.last, tv.p, tv.ld, it + r, n);
        if (n == VL) vstore(lt + r, res);
        else vstore_tail(lt + r, res, n);
      }
    }
    bad_t[size_t(tid)] = !ok;
  });
  for (char b : bad_t) *bad |= b != 0;
}

// d_x[t] = sum_r w[r] table[it[r]] (r ascending; chain k takes the rows r = k mod kChains, the
// chains added at the end); acc: kChains * nv vectors of scratch.
template <int NV>
inline void dx_row(const TableView& tv, const Last& last, int nv, const int32_t* it, const float* w, int64_t R,
                   vf* acc, float* dt) {
  constexpr int CH = kChains<NV>;
  for (int i = 0; i < CH * nv; ++i) acc[i] = vzero();
  int64_t r = 0;
  for (; r + CH <= R; r += CH) {
#pragma GCC unroll 2
    for (int k = 0; k < CH; ++k) {
      const float* p = tv.p + int64_t(it[r + k]) * tv.ld;
      vf* a = acc + k * nv;
      const vf wr = vbcast(w[r + k]);
      for (int cc = 0; cc + 1 < nv; ++cc) a[cc] += wr * vload(p + cc * VL);
      if (nv > 0) a[nv - 1] += wr * tv.last.load(p + (nv - 1) * VL);
    }
  }
  for (; r < R; ++r) {
    const float* p = tv.p + int64_t(it[r]) * tv.ld;
    const vf wr = vbcast(w[r]);
    for (int cc = 0; cc + 1 < nv; ++cc) acc[cc] += wr * vload(p + cc * VL);
    if (nv > 0) acc[nv - 1] += wr * tv.last.load(p + (nv - 1) * VL);
  }
  for (int cc = 0; cc < nv; ++cc) {
    vf v = acc[cc];
    if (CH == 2) v += acc[nv + cc];
    if (cc + 1 < nv) vstore(dt + cc * VL, v);
    else last.store(dt + cc * VL, v);
  }
}

// ---------------------------------------------------------------------------------------------
// The sampled-softmax loss tail fused with the scoring (never a [T, R] tensor outside the kernel):
//   lse[t] = log(exp(pos[t]) + sum_{r: ids[t, r] != targets[t]} exp(x[t] . table[ids[t, r]]))  (targets[t] > 0)
//          = 0                                                                                  (otherwise)
//   probs[t, r] = exp(x[t] . table[ids[t, r]] - lse[t]) on kept pairs, 0 on accidental hits and on
//          tokens without a target (the backward's weights before the upstream gradient);
//   u[t] = sum_r probs[t, r] table[ids[t, r]] (d lse[t] / d x[t]: the backward's d_x is dlse[t] u[t]).
// Per token, chunks of kChunk rows with a running max m (from pos[t]): the chunk's logits (blocks of VL;
// accidental hits and a partial block's spare lanes at -inf), then m = max(m, the chunk's), the sum and u
// so far rescaled by exp(m_old - m) when m grew, e = exp(l - m) for the chunk, and u += e_r row_r over
// the chunk's rows while they are still in L1 (all R = 128 rows of 224 B do not fit: a pass over them
// after the scoring read most from L2). Then lse = m + log(sum + exp(pos - m)), probs = e exp(m_chunk -
// lse), u *= exp(m - lse): one exponential per logit. Every sum's order is fixed by the shapes.
constexpr int kChunk = 32;

template <int NV>
void lse_forward_nv(const Shape& s, const float* x, const float* table, const int32_t* ids, const int32_t* targets,
                    const float* pos, float* lse, float* probs, float* u, bool* bad) {
  const int64_t T = s.T, D = s.D, R = s.R;
  const int64_t Rp = (R + VL - 1) / VL * VL;
  const int64_t nch = (R + kChunk - 1) / kChunk;
  const int nt = threads_for(T * R * D, T);
  std::vector<char> bad_t(size_t(nt), 0);
  const TableView tv(s, table);
  std::atomic<int64_t> next_t(0);
  constexpr int CH = kChains<NV>;
  parallel_run(nt, [&](int tid) {
    const Last last(s.last);
    const int nv = nvecs<NV>(s);
    RowBuf<NV> xb(nv);
    vf* xv = xb.data();
    RowBuf<NV * CH> ub(CH * nv);
    vf* ua = ub.data();
    std::vector<float> l(static_cast<size_t>(std::max<int64_t>(Rp, 1)));
    std::vector<float> mc(static_cast<size_t>(std::max<int64_t>(nch, 1)));
    const vf ninf = vbcast(-INFINITY);
    bool ok = true;
    // tokens in blocks of 64 from a shared counter (each token is computed alone: same results)
    for (;;) {
      const int64_t t0 = next_t.fetch_add(64, std::memory_order_relaxed);
      if (t0 >= T) break;
      const int64_t t1 = std::min<int64_t>(T, t0 + 64);
      for (int64_t t = t0; t < t1; ++t) {
        const int32_t* it = ids + t * R;
        float* pt = probs + t * R;
        float* ut = u + t * D;
        if (!ids_in_range(it, R, s.V1)) {
          ok = false;
          std::fill(pt, pt + R, 0.0f);
          std::fill(ut, ut + D, 0.0f);
          continue;
        }
        const int32_t tg = targets[t];
        if (tg <= 0) {
          lse[t] = 0.0f;
          std::fill(pt, pt + R, 0.0f);
          std::fill(ut, ut + D, 0.0f);
          continue;
        }
        load_row(x + t * D, nv, last, xv);
        for (int c = 0; c < CH * nv; ++c) ua[c] = vzero();
        float m = pos[t];
        vf vs = vzero();
        for (int64_t ch = 0; ch < nch; ++ch) {
          const int64_t c0 = ch * kChunk, c1 = std::min<int64_t>(R, c0 + kChunk);
          vf vmax = ninf;
          for (int64_t r = c0; r < c1; r += VL) {
            const int n = static_cast<int>(std::min<int64_t>(VL, R - r));
            const vf v = select_ninf(hit_lanes(it + r, n, tg), block_dots<NV>(xv, nv, tv.last, tv.p, tv.ld, it + r, n));
            vstore(l.data() + r, v);
            vmax = v > vmax ? v : vmax;
          }
          const float cm = hmax(vmax);
          if (cm > m) {  // rescale what was summed against the old max
            const float sc = std::exp(m - cm);
            vs *= sc;
            for (int c = 0; c < CH * nv; ++c) ua[c] *= sc;
            m = cm;
          }
          mc[size_t(ch)] = m;
          const vf vm = vbcast(m);
          const int64_t c1p = std::min<int64_t>(Rp, c0 + kChunk);
          for (int64_t r = c0; r < c1p; r += VL) {
            const vf v = vload(l.data() + r);
            const vf ev = vselect(v > ninf, vexp(v - vm));
            vstore(l.data() + r, ev);
            vs += ev;
          }
          // u += e_r row_r over the chunk (r ascending, chains alternating rows)
          int64_t r = c0;
          for (; r + CH <= c1; r += CH) {
  #pragma GCC unroll 2
            for (int k = 0; k < CH; ++k) {
              const float* p = tv.p + int64_t(it[r + k]) * tv.ld;
              vf* a = ua + k * nv;
              const vf wr = vbcast(l[size_t(r + k)]);
              for (int cc = 0; cc + 1 < nv; ++cc) a[cc] += wr * vload(p + cc * VL);
              if (nv > 0) a[nv - 1] += wr * tv.last.load(p + (nv - 1) * VL);
            }
          }
          for (; r < c1; ++r) {
            const float* p = tv.p + int64_t(it[r]) * tv.ld;
            const vf wr = vbcast(l[size_t(r)]);
            for (int cc = 0; cc + 1 < nv; ++cc) ua[cc] += wr * vload(p + cc * VL);
            if (nv > 0) ua[nv - 1] += wr * tv.last.load(p + (nv - 1) * VL);
          }
        }
        const float lt = m + std::log(vsum(vs) + std::exp(pos[t] - m));
        lse[t] = lt;
        const float fm = std::exp(m - lt);
        for (int64_t ch = 0; ch < nch; ++ch) {
          const float mr = mc[size_t(ch)];
          const vf f = vbcast(mr == m ? fm : std::exp(mr - lt));
          const int64_t c0 = ch * kChunk, c1 = std::min<int64_t>(R, c0 + kChunk);
          for (int64_t r = c0; r < c1; r += VL) {
            const vf pv = vload(l.data() + r) * f;
            if (R - r >= VL) vstore(pt + r, pv);
            else vstore_tail(pt + r, pv, static_cast<int>(R - r));
          }
        }
        const vf vfm = vbcast(fm);
        for (int c = 0; c < nv; ++c) {
          vf v = ua[c];
          if (CH == 2) v += ua[nv + c];
          v *= vfm;
          if (c + 1 < nv) vstore(ut + c * VL, v);
          else last.store(ut + c * VL, v);
        }
      }
    }
    bad_t[size_t(tid)] = !ok;
  });
  for (char b : bad_t) *bad |= b != 0;
}

// ---------------------------------------------------------------------------------------------
// Backward, shared by the scoring (w = dlogits) and the loss tail (w = probs dlse):
//   d_x[t]     = sum_r w[t, r] table[ids[t, r]]                 (r ascending; kChains chains: r even / odd)
//   d_table[v] = sum_{(t, r): ids[t, r] == v} w[t, r] x[t]      ((t, r) ascending, one chain)
// Ids fall into P partitions of 2^shift consecutive ids (a partition's d_table rows fit in L1);
// tokens into nb blocks of Tb (a block's x rows fit in L2); both from the shapes only. Blocks are
// processed in groups of a few (about 2 MB of entries, so that they stay in cache), group by group:
// Pass 1 (parallel over the group's blocks): per block, its ids checked and counted per partition;
// per token, the weights w (the loss tail: the forward's probs times dlse), d_x from the gathered rows,
// and every pair appended as (t, id, w) to its partition's segment of the block (P sequential
// streams, in (t, r) order). Pass 2 (parallel over partitions): for each block of the group in
// order, each partition's segment in order: d_table[id] += w x[t] (rows in L1, x rows of one
// block). So each d_table row is one chain over its pairs in (t, r) order, whatever the blocks,
// groups and threads: bitwise reproducible and independent of the thread count (no atomics, no
// partial tables).
struct Entry {  // one (t, r) pair: (t - block start) << shift | (id - partition start), and w
  uint32_t key;
  float w;
};
struct Layout {
  int64_t nb = 1, Tb = 0, P = 1;
  int shift = 0;
  Layout(int64_t T, int64_t D, int64_t V1) {
    Tb = std::max<int64_t>(64, (int64_t(128) << 10) / (4 * std::max<int64_t>(D, 1)));  // x block ~128 KB
    Tb = std::min<int64_t>(Tb, int64_t(1) << 15);                                       // 15 bits of a key
    nb = std::max<int64_t>(1, (T + Tb - 1) / Tb);
    Tb = (T + nb - 1) / nb;
    const int64_t rows = std::max<int64_t>(1, (int64_t(16) << 10) / (4 * std::max<int64_t>(D, 1)));  // ~16 KB
    while ((int64_t(2) << shift) <= rows) ++shift;
    // at most 1024 streams (while the id part of a key has room: 17 bits)
    while (((V1 + (int64_t(1) << shift) - 1) >> shift) > 1024 && shift < 17) ++shift;
    P = std::max<int64_t>(1, (V1 + (int64_t(1) << shift) - 1) >> shift);
  }
  int64_t begin(int64_t b, int64_t T) const { return std::min(T, b * Tb); }
};

// w source for pass 1.
struct FromGrad {  // the scoring's backward: w = dlogits
  const float* g;
};
struct FromLse {  // the loss tail: w = probs dlse, d_x = u dlse (probs, u from the forward)
  const int32_t* targets;
  const float* pos;
  const float* lse;
  const float* probs;
  const float* u;
  const float* dlse;
  float* d_pos;
};

// The loss tail's weights of token t: w[r] = probs[t, r] dlse[t] (r < R; wl has Rp floats).
inline void lse_weights(const FromLse& src, int64_t t, int64_t R, float* wl) {
  const vf vg = vbcast(src.dlse[t]);
  const float* pr = src.probs + t * R;
  for (int64_t r = 0; r < R; r += VL) {
    const int nr = static_cast<int>(std::min<int64_t>(VL, R - r));
    vstore(wl + r, (nr == VL ? vload(pr + r) : vload_tail(pr + r, nr)) * vg);
  }
}

// The loss tail's d_x[t] = dlse[t] u[t] and d_pos[t] = dlse[t] exp(pos[t] - lse[t]).
inline void lse_dx(const FromLse& src, int64_t t, int64_t D, float* dt) {
  const float gt = src.dlse[t];
  const float* ut = src.u + t * D;
  for (int64_t d = 0; d < D; ++d) dt[d] = gt * ut[d];
  src.d_pos[t] = gt * std::exp(src.pos[t] - src.lse[t]);
}

// Lane bits of an integer mask of -1/0 lanes (bit g = lane g).
inline uint32_t lane_bits(vi m) {
#if defined(MINDGR_ISA_AVX512)
  return _mm512_cmplt_epi32_mask((__m512i)m, _mm512_setzero_si512());
#elif defined(MINDGR_ISA_AVX2)
  return static_cast<uint32_t>(_mm256_movemask_ps((__m256)m));
#else
  uint32_t b = 0;
  for (int g = 0; g < VL; ++g) b |= uint32_t(m[g] != 0) << g;
  return b;
#endif
}

// Appends r0 + g for the set bits g of `bits` (g < VL) to list[cnt..), in g order; returns the new count.
// list needs VL free entries past cnt (AVX2 stores a whole vector).
#if defined(MINDGR_ISA_AVX2)
struct CompressLut {
  int32_t idx[256][8];
  CompressLut() {
    for (int m = 0; m < 256; ++m) {
      int k = 0;
      for (int g = 0; g < 8; ++g)
        if (m >> g & 1) idx[m][k++] = g;
      for (; k < 8; ++k) idx[m][k] = 0;
    }
  }
};
const CompressLut kCompress;
inline int compress_lanes(uint32_t bits, int32_t r0, int32_t* list, int cnt) {
  const __m256i pos = _mm256_add_epi32(_mm256_set1_epi32(r0), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  const __m256i perm = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kCompress.idx[bits]));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(list + cnt), _mm256_permutevar8x32_epi32(pos, perm));
  return cnt + __builtin_popcount(bits);
}
#else
inline int compress_lanes(uint32_t bits, int32_t r0, int32_t* list, int cnt) {
  for (int g = 0; g < VL; ++g) {
    list[cnt] = r0 + g;
    cnt += static_cast<int>(bits >> g & 1u);
  }
  return cnt;
}
#endif

// Which d_table pass (below): MINDGR_CPU_DTABLE=owners|entries forces one (tests compare them; both give
// the same bits), else owners when the table's gradient fits in L2 (about 2 MB) and at most 4 threads
// would share it (every owner reads all the pairs, so the owners pass reads them once per thread).
inline bool use_owners(int64_t V1, int64_t dld, int threads) {
  const char* env = std::getenv("MINDGR_CPU_DTABLE");
  if (env != nullptr && std::strcmp(env, "owners") == 0) return true;
  if (env != nullptr && std::strcmp(env, "entries") == 0) return false;
  return V1 * dld * int64_t(sizeof(float)) <= (int64_t(2) << 20) && threads <= 4;
}

// Backward for a table whose gradient fits in L2: pass 1 (parallel over token ranges) checks the ids,
// gives d_x (and d_pos) per token; pass 2 (parallel over id ranges, thread k owning ids
// [V1 k / n, V1 (k + 1) / n)): every thread walks all pairs in (t, r) order with the token's x row in
// registers and adds w x[t] to the rows it owns. No entries to write and read back; each d_table row is
// still one chain over its pairs in (t, r) order, so the result has the same bits as the entries pass
// (and as for any thread count).
template <int NV, class Src>
int backward_owners_nv(const Shape& s, const float* x, const float* table, const int32_t* ids, const Src& src,
                       float* d_x, float* d_table) {
  constexpr bool kLse = std::is_same<Src, FromLse>::value;
  const int64_t T = s.T, D = s.D, R = s.R, V1 = s.V1;
  auto active = [&](int64_t t) -> bool {
    if constexpr (kLse) return src.targets[t] > 0;
    else return true;
  };
  const TableView tv(s, table);
  const bool padded = tv.buf != nullptr;
  const int64_t Dp = int64_t(s.nv) * VL;
  const int64_t dld = padded ? Dp : D;
  std::unique_ptr<Scratch> dpad_buf;
  float* dacc = d_table;
  if (padded) {
    dpad_buf.reset(new Scratch(static_cast<size_t>(V1 * Dp + 16)));
    dacc = aligned64(dpad_buf->data());
  }
  std::memset(dacc, 0, sizeof(float) * size_t(V1 * dld));
  const int64_t Rp = (R + VL - 1) / VL * VL;
  constexpr int CH = kChains<NV>;
  const int nt = threads_for(T * R * D, T);
  std::vector<char> bad_t(size_t(nt), 0);
  // Pass 1: checks, d_x, d_pos.
  parallel_run(nt, [&](int tid) {
    const Last last(s.last);
    const int nv = nvecs<NV>(s);
    RowBuf<NV * CH> ab(CH * nv);
    bool ok = true;
    for (int64_t t = T * tid / nt; t < T * (tid + 1) / nt; ++t) {
      const int32_t* it = ids + t * R;
      float* dt = d_x + t * D;
      if (!ids_in_range(it, R, V1)) {
        ok = false;
        continue;
      }
      if (!active(t)) {
        std::fill(dt, dt + D, 0.0f);
        if constexpr (kLse) src.d_pos[t] = 0.0f;
        continue;
      }
      if constexpr (kLse) {
        lse_dx(src, t, D, dt);
      } else {
        dx_row<NV>(tv, last, nv, it, src.g + t * R, R, ab.data(), dt);
      }
    }
    bad_t[size_t(tid)] = !ok;
  });
  for (char b : bad_t)
    MINDGR_REJECT_IF(b, kIndexRange);
  // Pass 2: d_table by id ranges.
  const int nt2 = threads_for(T * R * D, V1);
  parallel_run(nt2, [&](int tid) {
    const int nv = nvecs<NV>(s);
    if (nv == 0) return;
    const Last xlast(s.last), dlast(padded ? VL : s.last);
    RowBuf<NV> xb(nv);
    vf* xv = xb.data();
    const uint32_t v0 = static_cast<uint32_t>(V1 * tid / nt2);
    const uint32_t span = static_cast<uint32_t>(V1 * (tid + 1) / nt2) - v0;
    typedef uint32_t vu __attribute__((vector_size(VL * sizeof(uint32_t))));
    const vu vv0 = (vu)vbcast_i(int32_t(v0)), vspan = (vu)vbcast_i(int32_t(span));
    std::vector<int32_t> own_buf(static_cast<size_t>(R + VL));
    int32_t* const own = own_buf.data();
    // locals, not the captured references: the row stores below could alias those, so every pair reloaded them
    float* const acc = dacc;
    const int64_t ld = dld;
    for (int64_t t = 0; t < T; ++t) {
      if (!active(t)) continue;
      const int32_t* it = ids + t * R;
      load_row(x + t * D, nv, xlast, xv);
      const float* wr = nullptr;
      float gt = 0.0f;
      if constexpr (kLse) {
        wr = src.probs + t * R;
        gt = src.dlse[t];
      } else {
        wr = src.g + t * R;
      }
      // the token's owned pairs first listed (branch-free), then updated in r order: a loop over each
      // block's set bits mispredicted about once per block
      int cnt = 0;
      for (int64_t r = 0; r < R; r += VL) {
        const int n = static_cast<int>(std::min<int64_t>(VL, R - r));
        vi idv = vbcast_i(-1);
        if (n == VL) idv = vload_i(it + r);
        else std::memcpy(&idv, it + r, sizeof(int32_t) * size_t(n));  // lanes past n: -1, never owned
        const uint32_t bits = lane_bits((vi)(((vu)idv - vv0) < vspan));
        cnt = compress_lanes(bits, static_cast<int32_t>(r), own, cnt);
      }
      for (int e = 0; e < cnt; ++e) {
        const int64_t q = own[e];
        float w = wr[q];
        if constexpr (kLse) w = w * gt;
        const vf we = vbcast(w);
        float* dv = acc + int64_t(it[q]) * ld;
        for (int cc = 0; cc + 1 < nv; ++cc) vstore(dv + cc * VL, vload(dv + cc * VL) + we * xv[cc]);
        dlast.store(dv + (nv - 1) * VL, dlast.load(dv + (nv - 1) * VL) + we * xv[nv - 1]);
      }
    }
  });
  if (padded)
    for (int64_t v = 0; v < V1; ++v) std::memcpy(d_table + v * D, dacc + v * Dp, sizeof(float) * size_t(D));
  return 0;
}

template <int NV, class Src>
int backward_nv(const Shape& s, const float* x, const float* table, const int32_t* ids, const Src& src,
                float* d_x, float* d_table) {
  if (use_owners(s.V1, TableView::pads(s) ? int64_t(s.nv) * VL : s.D, threads_for(s.T * s.R * s.D, s.V1)))
    return backward_owners_nv<NV>(s, x, table, ids, src, d_x, d_table);
  constexpr bool kLse = std::is_same<Src, FromLse>::value;
  const int64_t T = s.T, D = s.D, R = s.R, V1 = s.V1;
  const Layout lay(T, D, V1);
  const int64_t nb = lay.nb, P = lay.P;
  const int shift = lay.shift;
  const uint32_t id_mask = (uint32_t(1) << shift) - 1u;
  auto active = [&](int64_t t) -> bool {
    if constexpr (kLse) return src.targets[t] > 0;
    else return true;
  };
  // Where each block's entries start (R per active token), and the groups of blocks.
  std::vector<int64_t> base(size_t(nb + 1), 0);
  for (int64_t b = 0; b < nb; ++b) {
    int64_t na = 0;
    for (int64_t t = lay.begin(b, T); t < lay.begin(b + 1, T); ++t) na += active(t) ? 1 : 0;
    base[size_t(b + 1)] = base[size_t(b)] + na * R;
  }
  const int nt = threads_for(T * R * D, nb);
  const int64_t per_block = std::max<int64_t>(1, lay.Tb * R * int64_t(sizeof(Entry)));
  const int64_t gsize = std::min<int64_t>(nb, std::max<int64_t>(nt, (int64_t(2) << 20) / per_block));
  int64_t cap = 1;  // entries of the largest group
  for (int64_t g0 = 0; g0 < nb; g0 += gsize)
    cap = std::max(cap, base[size_t(std::min(nb, g0 + gsize))] - base[size_t(g0)]);
  Scratch ent_buf(static_cast<size_t>(2 * cap));
  Entry* ent = reinterpret_cast<Entry*>(ent_buf.data());
  std::vector<int64_t> seg(size_t(gsize * (P + 1)), 0);  // block g0 + j, partition p: [seg[j][p], seg[j][p + 1])
  const TableView tv(s, table);
  // Pass 2 works on whole aligned vectors when the table view is padded: d_table accumulated in
  // a padded copy (copied out at the end) and the group's x rows padded by pass 1.
  const bool padded = tv.buf != nullptr;
  const int64_t Dp = int64_t(s.nv) * VL;
  const int64_t dld = padded ? Dp : D;
  std::unique_ptr<Scratch> dpad_buf, xpad_buf;
  float* dacc = d_table;
  float* xpad = nullptr;
  if (padded) {
    dpad_buf.reset(new Scratch(static_cast<size_t>(V1 * Dp + 16)));
    xpad_buf.reset(new Scratch(static_cast<size_t>(gsize * lay.Tb * Dp + 16)));
    dacc = aligned64(dpad_buf->data());
    xpad = aligned64(xpad_buf->data());
  }
  std::memset(dacc, 0, sizeof(float) * size_t(V1 * dld));
  const int64_t Rp = (R + VL - 1) / VL * VL;
  constexpr int CH = kChains<NV>;
  std::vector<char> bad_t(size_t(nt), 0);
  // (pass 2 runs up to P threads, more than pass 1 when the blocks are fewer than the partitions)
  std::vector<int64_t> pb(static_cast<size_t>(P + 1)), tot(static_cast<size_t>(P));

  for (int64_t g0 = 0; g0 < nb; g0 += gsize) {
    const int64_t g1 = std::min(nb, g0 + gsize), ng = g1 - g0, e0 = base[size_t(g0)];
    const int nt1 = static_cast<int>(std::min<int64_t>(nt, ng));
    // Pass 1: checks, weights, d_x, entries.
    parallel_run(nt1, [&](int tid) {
      const Last last(s.last);
      const int nv = nvecs<NV>(s);
      RowBuf<NV> xb(nv);
      vf* xv = xb.data();
      RowBuf<NV * CH> ab(CH * nv);
      vf* acc = ab.data();
      std::vector<float> wl(static_cast<size_t>(std::max<int64_t>(Rp, 1)));
      std::vector<int64_t> put(static_cast<size_t>(P));
      bool ok = true;
      for (int64_t b = g0 + ng * tid / nt1; b < g0 + ng * (tid + 1) / nt1 && ok; ++b) {
        const int64_t tb0 = lay.begin(b, T), tb1 = lay.begin(b + 1, T);
        int64_t* sg = seg.data() + (b - g0) * (P + 1);
        std::fill(put.begin(), put.end(), 0);
        for (int64_t t = tb0; t < tb1; ++t) {
          const int32_t* it = ids + t * R;
          if (!ids_in_range(it, R, V1)) ok = false;
          else if (active(t))
            for (int64_t r = 0; r < R; ++r) ++put[size_t(it[r] >> shift)];
        }
        if (!ok) break;
        int64_t run = base[size_t(b)] - e0;
        for (int64_t p = 0; p < P; ++p) {
          sg[p] = run;
          run += put[size_t(p)];
          put[size_t(p)] = sg[p];
        }
        sg[P] = run;
        for (int64_t t = tb0; t < tb1; ++t) {
          const int32_t* it = ids + t * R;
          float* dt = d_x + t * D;
          if (!active(t)) {
            std::fill(dt, dt + D, 0.0f);
            if constexpr (kLse) src.d_pos[t] = 0.0f;
            continue;
          }
          const float* w = wl.data();
          if (padded) load_row(x + t * D, nv, last, xv);
          if (padded) {
            float* xp = xpad + (t - lay.begin(g0, T)) * Dp;
            for (int cc = 0; cc < nv; ++cc) vstore(xp + cc * VL, xv[cc]);
          }
          if constexpr (kLse) {
            lse_weights(src, t, R, wl.data());
            lse_dx(src, t, D, dt);
          } else {
            w = src.g + t * R;
            dx_row<NV>(tv, last, nv, it, w, R, acc, dt);
          }
          // entries in their partition's segment
          const uint32_t tl = static_cast<uint32_t>(t - tb0) << shift;
          for (int64_t q = 0; q < R; ++q) {
            const uint32_t id = static_cast<uint32_t>(it[q]);
            ent[put[size_t(id >> shift)]++] = Entry{tl | (id & id_mask), w[q]};
          }
        }
      }
      bad_t[size_t(tid)] = !ok;
    });
    for (char b : bad_t)
      MINDGR_REJECT_IF(b, kIndexRange);

    // Pass 2: d_table over partition ranges with about the same number of entries each.
    const int64_t ne = base[size_t(g1)] - e0;
    const int nt2 = static_cast<int>(std::min<int64_t>(threads_for(ne * D, P), P));
    pb[0] = 0;
    for (int k = 1; k <= nt2; ++k) pb[size_t(k)] = P;
    if (nt2 > 1) {
      std::fill(tot.begin(), tot.end(), 0);
      for (int64_t j = 0; j < ng; ++j)
        for (int64_t p = 0; p < P; ++p) tot[size_t(p)] += seg[size_t(j * (P + 1) + p + 1)] - seg[size_t(j * (P + 1) + p)];
      int64_t p = 0, run = 0;
      for (int k = 1; k < nt2; ++k) {
        const int64_t target = ne * k / nt2;
        while (p < P && run < target) run += tot[size_t(p++)];
        pb[size_t(k)] = p;
      }
    }
    parallel_run(nt2, [&](int tid) {
      const Last last(padded ? VL : s.last);
      const int nv = nvecs<NV>(s);
      if (nv == 0) return;
      const int64_t p0 = pb[size_t(tid)], p1 = pb[size_t(tid + 1)];
      for (int64_t b = g0; b < g1; ++b) {
        const int64_t* sg = seg.data() + (b - g0) * (P + 1);
        const float* xb0 = padded ? xpad + (lay.begin(b, T) - lay.begin(g0, T)) * Dp : x + lay.begin(b, T) * D;
        for (int64_t p = p0; p < p1; ++p) {
          float* dp = dacc + (p << shift) * dld;
          for (int64_t e = sg[p]; e < sg[p + 1]; ++e) {
            const Entry en = ent[e];
            const float* xr = xb0 + int64_t(en.key >> shift) * dld;
            float* dv = dp + int64_t(en.key & id_mask) * dld;
            const vf we = vbcast(en.w);
            for (int cc = 0; cc + 1 < nv; ++cc) vstore(dv + cc * VL, vload(dv + cc * VL) + we * vload(xr + cc * VL));
            last.store(dv + (nv - 1) * VL, last.load(dv + (nv - 1) * VL) + we * last.load(xr + (nv - 1) * VL));
          }
        }
      }
    });
  }
  if (padded)
    for (int64_t v = 0; v < V1; ++v) std::memcpy(d_table + v * D, dacc + v * Dp, sizeof(float) * size_t(D));
  return 0;
}

// Ids as int32 (int64 ids converted, range-checked): nullptr and *rc = 17 on an id out of range.
struct Ids32 {
  const int32_t* p = nullptr;
  std::unique_ptr<Scratch> buf;
};
inline int ids32(const void* raw, const Shape& s, Ids32* out) {
  if (!s.ids64) {
    out->p = static_cast<const int32_t*>(raw);
    return 0;
  }
  const int64_t* ids = static_cast<const int64_t*>(raw);
  const int64_t n = s.T * s.R;
  out->buf.reset(new Scratch(static_cast<size_t>(std::max<int64_t>(n, 1))));
  int32_t* d = reinterpret_cast<int32_t*>(out->buf->data());
  bool ok = true;
  for (int64_t i = 0; i < n; ++i) {
    ok &= (ids[i] >= 0) & (ids[i] < s.V1);
    d[i] = static_cast<int32_t>(ids[i]);
  }
  MINDGR_REJECT_IF(!ok, kIndexRange);
  out->p = d;
  return 0;
}

int check(int nparam, int want, int* ndims, int64_t** shapes, const char** dtypes, Shape* s) {
  MINDGR_REJECT_IF(nparam != want, kArgCount);
  for (int i = 0; i < nparam; ++i)
    MINDGR_REJECT_IF(ndims[i] != 2, kRank);
  MINDGR_REJECT_IF(!is_f32(dtypes[0]) || !is_f32(dtypes[1]), kDtype);
  if (is_dtype(dtypes[2], "int64")) s->ids64 = true;
  else MINDGR_REJECT_IF(!(is_dtype(dtypes[2], "int32") || is_dtype(dtypes[2], "int")), kDtype);
  for (int i = 3; i < nparam; ++i)
    MINDGR_REJECT_IF(!is_f32(dtypes[i]), kDtype);
  s->T = shapes[0][0];
  s->D = shapes[0][1];
  s->V1 = shapes[1][0];
  s->R = shapes[2][1];
  MINDGR_REJECT_IF(shapes[1][1] != s->D || shapes[2][0] != s->T, kShape);
  MINDGR_REJECT_IF(s->T * s->R >= (int64_t(1) << 31) || s->V1 >= (int64_t(1) << 31), kTooLarge);
  s->derive();
  return 0;
}

// The first five arguments: x [T, D], table [V1, D] f32, ids [T, R] int32|int64, targets [T] int32,
// pos [T] f32 (the callers check the rest).
int check_lse(int nparam, int want, int* ndims, int64_t** shapes, const char** dtypes, Shape* s) {
  MINDGR_REJECT_IF(nparam != want, kArgCount);
  MINDGR_REJECT_IF(ndims[0] != 2 || ndims[1] != 2 || ndims[2] != 2 || ndims[3] != 1 || ndims[4] != 1, kRank);
  MINDGR_REJECT_IF(!is_f32(dtypes[0]) || !is_f32(dtypes[1]) || !is_f32(dtypes[4]), kDtype);
  if (is_dtype(dtypes[2], "int64")) s->ids64 = true;
  else MINDGR_REJECT_IF(!(is_dtype(dtypes[2], "int32") || is_dtype(dtypes[2], "int")), kDtype);
  MINDGR_REJECT_IF(!(is_dtype(dtypes[3], "int32") || is_dtype(dtypes[3], "int")), kDtype);
  s->T = shapes[0][0];
  s->D = shapes[0][1];
  s->V1 = shapes[1][0];
  s->R = shapes[2][1];
  MINDGR_REJECT_IF(shapes[1][1] != s->D || shapes[2][0] != s->T || shapes[3][0] != s->T || shapes[4][0] != s->T, kShape);
  MINDGR_REJECT_IF(s->T * s->R >= (int64_t(1) << 31) || s->V1 >= (int64_t(1) << 31), kTooLarge);
  s->derive();
  return 0;
}

// (lse, probs, u) = sampled_lse(x, table, ids, targets, pos)
int run_lse_forward(int nparam, void** params, int* ndims, int64_t** shapes, const char** dtypes) try {
  Shape s;
  if (int rc = check_lse(nparam, 8, ndims, shapes, dtypes, &s)) return rc;
  MINDGR_REJECT_IF(ndims[5] != 1 || !is_f32(dtypes[5]) || shapes[5][0] != s.T, kOutput);
  MINDGR_REJECT_IF(ndims[6] != 2 || !is_f32(dtypes[6]) || shapes[6][0] != s.T || shapes[6][1] != s.R, kOutput);
  MINDGR_REJECT_IF(ndims[7] != 2 || !is_f32(dtypes[7]) || shapes[7][0] != s.T || shapes[7][1] != s.D, kOutput);
  const float* x = static_cast<const float*>(params[0]);
  const float* table = static_cast<const float*>(params[1]);
  const int32_t* tg = static_cast<const int32_t*>(params[3]);
  const float* pos = static_cast<const float*>(params[4]);
  float* lse = static_cast<float*>(params[5]);
  float* probs = static_cast<float*>(params[6]);
  float* u = static_cast<float*>(params[7]);
  Ids32 ids;
  if (int rc = ids32(params[2], s, &ids)) return rc;
  bool bad = false;
  with_nv(s.nv, [&](auto k) { lse_forward_nv<decltype(k)::value>(s, x, table, ids.p, tg, pos, lse, probs, u, &bad); });
  MINDGR_REJECT_IF(bad, kIndexRange);
  return 0;
} catch (...) {
  MINDGR_FAIL(kResources);
}

// (d_x, d_table, d_pos) from (x, table, ids, targets, pos, lse, probs, u, dlse)
int run_lse_backward(int nparam, void** params, int* ndims, int64_t** shapes, const char** dtypes) try {
  Shape s;
  if (int rc = check_lse(nparam, 12, ndims, shapes, dtypes, &s)) return rc;
  for (int i : {5, 11})
    MINDGR_REJECT_IF(ndims[i] != 1 || shapes[i][0] != s.T || !is_f32(dtypes[i]), kOutput);
  MINDGR_REJECT_IF(ndims[8] != 1 || shapes[8][0] != s.T || !is_f32(dtypes[8]), kGradient);
  MINDGR_REJECT_IF(ndims[6] != 2 || shapes[6][0] != s.T || shapes[6][1] != s.R || !is_f32(dtypes[6]), kOutput);
  for (int i : {7, 9})
    MINDGR_REJECT_IF(ndims[i] != 2 || shapes[i][0] != s.T || shapes[i][1] != s.D || !is_f32(dtypes[i]), kOutput);
  MINDGR_REJECT_IF(ndims[10] != 2 || shapes[10][0] != s.V1 || shapes[10][1] != s.D || !is_f32(dtypes[10]), kOutput);
  const float* x = static_cast<const float*>(params[0]);
  const float* table = static_cast<const float*>(params[1]);
  FromLse src{static_cast<const int32_t*>(params[3]), static_cast<const float*>(params[4]),
              static_cast<const float*>(params[5]), static_cast<const float*>(params[6]),
              static_cast<const float*>(params[7]), static_cast<const float*>(params[8]),
              static_cast<float*>(params[11])};
  float* d_x = static_cast<float*>(params[9]);
  float* d_table = static_cast<float*>(params[10]);
  Ids32 ids;
  if (int rc = ids32(params[2], s, &ids)) return rc;
  int rc = 0;
  with_nv(s.nv, [&](auto k) { rc = backward_nv<decltype(k)::value>(s, x, table, ids.p, src, d_x, d_table); });
  return rc;
} catch (...) {
  MINDGR_FAIL(kResources);
}

int run_forward(int nparam, void** params, int* ndims, int64_t** shapes, const char** dtypes) try {
  Shape s;
  if (int rc = check(nparam, 4, ndims, shapes, dtypes, &s)) return rc;
  MINDGR_REJECT_IF(shapes[3][0] != s.T || shapes[3][1] != s.R, kOutput);
  const float* out = static_cast<const float*>(params[0]);
  const float* table = static_cast<const float*>(params[1]);
  float* logits = static_cast<float*>(params[3]);
  Ids32 ids;
  if (int rc = ids32(params[2], s, &ids)) return rc;
  bool bad = false;
  with_nv(s.nv, [&](auto k) { forward_nv<decltype(k)::value>(s, out, table, ids.p, logits, &bad); });
  MINDGR_REJECT_IF(bad, kIndexRange);
  return 0;
} catch (...) {
  MINDGR_FAIL(kResources);
}

int run_backward(int nparam, void** params, int* ndims, int64_t** shapes, const char** dtypes) try {
  Shape s;
  if (int rc = check(nparam, 6, ndims, shapes, dtypes, &s)) return rc;
  MINDGR_REJECT_IF(shapes[3][0] != s.T || shapes[3][1] != s.R, kGradient);
  MINDGR_REJECT_IF(shapes[4][0] != s.T || shapes[4][1] != s.D || shapes[5][0] != s.V1 || shapes[5][1] != s.D, kOutput);
  const float* out = static_cast<const float*>(params[0]);
  const float* table = static_cast<const float*>(params[1]);
  const FromGrad src{static_cast<const float*>(params[3])};
  float* d_out = static_cast<float*>(params[4]);
  float* d_table = static_cast<float*>(params[5]);
  Ids32 ids;
  if (int rc = ids32(params[2], s, &ids)) return rc;
  int rc = 0;
  with_nv(s.nv, [&](auto k) { rc = backward_nv<decltype(k)::value>(s, out, table, ids.p, src, d_out, d_table); });
  return rc;
} catch (...) {
  MINDGR_FAIL(kResources);
}

}  // namespace
}  // namespace mindgr

// logits = sampled_logits(out, table, ids)
MINDGR_AOT_OP(MindgrSampledLogits, mindgr::run_forward)

// (d_out, d_table) from (out, table, ids, dlogits)
MINDGR_AOT_OP(MindgrSampledLogitsBwd, mindgr::run_backward)

// (lse, probs, u) = sampled_lse(x, table, ids, targets, pos)
MINDGR_AOT_OP(MindgrSampledLse, mindgr::run_lse_forward)

// (d_x, d_table, d_pos) from (x, table, ids, targets, pos, lse, probs, u, dlse)
MINDGR_AOT_OP(MindgrSampledLseBwd, mindgr::run_lse_backward)
