// Fused jagged HSTU attention for CPU: forward and backward, entry points with MindSpore's custom
// AOT signature.  Per row b (tokens s..s+L-1) and head h, for query i and key j <= i:
//   s_ij  = q_i.k_j + w_pos[N-1+j-i] + w_ts[bucket(tq_i - t_j)]
//   (tq_i = t_{i+1}; at the row's last position, i = L - 1 with L cut to N, the row's request time)
//   out_i = sum_j SiLU(s_ij) / N * v_j
// The [L, L] score matrix is never stored.  Both passes work on packed, zero-padded copies of a
// row's operands (k and v transposed per block of keys) and compute scores as MR x NR register
// tiles (common.h sizes them to the ISA's registers), causal at the granularity of one vector of
// keys: a block of MR queries computes only the key vectors up to its last query, and only the
// last such vector of each query is masked.  The bias is computed in the elementwise pass right
// after a tile's scores, never stored: the positional part is a vector load of w_pos, the time
// part a vectorised bucket (CellTable: float32 bits of the gap -> a 256-entry table, one gather,
// one compare) and a gather of w_ts, on time stamps made relative to the row (int32) once per
// row; in rows whose keys are in time order, a vector of keys whose first and last gap share a
// bucket (bursts of ratings, distant keys) takes that bucket's w_ts by one broadcast instead.
// Rows whose times span 2^31 s or more use the exact scalar BucketTable instead.
//
// Forward work items are whole rows (or, with few rows, blocks of QB queries of a row), heads
// inside; they write disjoint outputs.  Backward work items are (row, head), each done start to end by one thread: per key
// tile (TILE keys) and query tile at or below it, it recomputes the scores and dO V^T, forms P
// and dS in registers and accumulates dq, dk, dv by register-blocked rank updates; the weight
// gradients are summed per item in float, then per fixed chunk of items in double, and the
// chunks are added in chunk order.  Threads take items (chunks) from a shared counter, longest
// first.  So every result is bitwise reproducible and independent of the number of threads.
#include <atomic>
#include <climits>
#include <cmath>
#include <mutex>
#include <numeric>
#include <type_traits>

#include "common.h"

namespace mindgr {
namespace {

constexpr int TILE = 64;        // backward: queries and keys per tile
constexpr int QB = 64;          // forward: queries per work item
constexpr int WPAD = 2 * TILE;  // zero padding on both sides of the copied w_pos

inline int round_up(int x, int m) { return (x + m - 1) / m * m; }

// ---------------------------------------------------------------------------------------------
// Time buckets: exactly clamp(floor(logf(float(max(|dt|, 1))) / 0.301f), 0, nb), computed in
// float32 like the reference, but without a logarithm per pair (see BucketTable).  logf is the C
// library's (glibc: < 1 ulp).  MindSpore's CPU Log used by the reference is a ~3 ulp SIMD
// approximation on full vectors and std::log on the remainder, so for gaps within a few ulps of a
// bucket boundary the reference's bucket depends on where the pair sits in its padded tensor; the
// kernels' bucket is a function of the gap alone.
inline int bucket_formula(int64_t gap, int nb) {
  if (gap < 1) gap = 1;
  float g = static_cast<float>(gap);
  float b = std::floor(std::log(g) / 0.301f);
  if (!(b > 0.0f)) return 0;
  if (b > static_cast<float>(nb)) return nb;
  return static_cast<int>(b);
}

inline float float_from_bits(int32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

// The formula depends on the gap only through float(gap), and is monotone in the bit pattern of that
// (positive) float.  Per float exponent e we keep the bucket of 2^(e-127) and the bit patterns
// where the bucket steps up inside that octave (a bucket spans ln 2^2.3 > 1 octave, so at most 3).
struct BucketTable {
  static constexpr int kSteps = 3;
  int nb = 0;
  bool exact_table = true;          // false if an octave held more steps than kSteps (never seen)
  int32_t base[256];
  int32_t step[kSteps][256];        // INT32_MAX where there is no step

  static int formula_bits(int32_t bits, int nb) {
    float b = std::floor(std::log(float_from_bits(bits)) / 0.301f);
    if (!(b > 0.0f)) return 0;
    if (b > static_cast<float>(nb)) return nb;
    return static_cast<int>(b);
  }

  explicit BucketTable(int num_buckets) : nb(num_buckets) {
    for (int e = 0; e < 256; ++e) {
      base[e] = 0;
      for (int k = 0; k < kSteps; ++k) step[k][e] = INT32_MAX;
    }
    // gaps are integers >= 1, so float(gap) is in [2^0, 2^64]: exponents 127..191
    for (int e = 127; e <= 191; ++e) {
      const int32_t lo = int32_t(e) << 23, hi = (int32_t(e + 1) << 23) - 1;
      base[e] = formula_bits(lo, nb);
      int n = 0;
      for (int want = base[e] + 1; want <= nb && formula_bits(hi, nb) >= want; ++want) {
        int32_t a = lo, c = hi;  // smallest bits in [a, c] with bucket >= want
        while (a < c) {
          int32_t mid = a + (c - a) / 2;
          if (formula_bits(mid, nb) >= want) c = mid; else a = mid + 1;
        }
        if (n == kSteps) { exact_table = false; break; }
        step[n++][e] = a;
      }
    }
  }

  // Bucket of a gap (dt already made non-negative), same as bucket_formula(gap, nb).
  inline int operator()(int64_t gap) const {
    if (gap < 1) gap = 1;
    if (!exact_table) return bucket_formula(gap, nb);
    float g = static_cast<float>(gap);
    int32_t bits;
    std::memcpy(&bits, &g, sizeof(bits));
    const int e = (bits >> 23) & 255;
    return base[e] + (bits >= step[0][e]) + (bits >= step[1][e]) + (bits >= step[2][e]);
  }
};

const BucketTable& bucket_table(int nb) {
  static std::mutex mu;
  static std::vector<BucketTable*> cache;  // kept for the life of the process
  std::lock_guard<std::mutex> lock(mu);
  for (const BucketTable* t : cache)
    if (t->nb == nb) return *t;
  cache.push_back(new BucketTable(nb));
  return *cache.back();
}


// The same buckets for gaps in [0, 2^31), vectorised.  float(gap) for such a gap has exponent
// 127..158; a cell is one exponent and the top 3 mantissa bits (1/8 octave at most log2(9/8) =
// 0.17 octave wide, a bucket 0.434 octave), so the formula steps at most once inside a cell.
// entry = (bucket at the cell's first float << 21) | (low 20 bits of the first float with the
// next bucket, or 1 << 20 when the bucket does not step in the cell); bucket(bits) = (entry >> 21)
// + ((bits & 0xFFFFF) >= (entry & 0x1FFFFF)).  Built from the formula itself, so exact on every gap.
struct CellTable {
  static constexpr int kCells = 256;
  int nb = 0;
  bool ok = true;  // false if a cell held two steps or nb does not fit (never for nb < 1023)
  int32_t entry[kCells];
  std::vector<int32_t> upper;  // [nb + 1]: the largest gap < 2^31 whose bucket is <= b

  explicit CellTable(int num_buckets) : nb(num_buckets) {
    for (int c = 0; c < kCells; ++c) entry[c] = 0;
    if (nb < 0 || nb >= 1023) {
      ok = false;
      return;
    }
    for (int c = 0; c < kCells; ++c) {
      const int32_t lo = (int32_t(127 * 8 + c)) << 20, hi = lo + (int32_t(1) << 20) - 1;
      const int b0 = BucketTable::formula_bits(lo, nb), b1 = BucketTable::formula_bits(hi, nb);
      if (b1 == b0) {
        entry[c] = (b0 << 21) | (1 << 20);
      } else if (b1 == b0 + 1) {
        int32_t a = lo, e = hi;  // the smallest bits in [a, e] with bucket b1
        while (a < e) {
          const int32_t mid = a + (e - a) / 2;
          if (BucketTable::formula_bits(mid, nb) >= b1) e = mid; else a = mid + 1;
        }
        entry[c] = (b0 << 21) | (a - lo);
      } else {
        ok = false;
      }
    }
    if (!ok) return;
    // the bucket never falls as the gap grows (it is the formula's, monotone in the float's bits)
    upper.assign(nb + 1, INT32_MAX);
    for (int b = 0; b < nb; ++b) {
      int32_t a = 1, e = INT32_MAX;  // the largest gap in [a, e] with bucket <= b
      while (a < e) {
        const int32_t mid = a + (e - a) / 2 + 1;
        if ((*this)(mid) <= b) a = mid; else e = mid - 1;
      }
      upper[b] = a;
    }
  }

  // Scalar form of the vector lookup below (tests use it through mindgr_time_bucket).
  int operator()(int32_t gap) const {
    gap = gap < 1 ? 1 : gap;
    int32_t bits;
    const float g = static_cast<float>(gap);
    std::memcpy(&bits, &g, sizeof(bits));
    const int32_t e = entry[(bits >> 20) - 127 * 8];
    return (e >> 21) + ((bits & 0xFFFFF) >= (e & 0x1FFFFF));
  }
};

// Bucket of every lane's gap (|gap| < 2^31).
inline vi cell_buckets(const int32_t* __restrict entry, vi gap) {
  const vi one = vbcast_i(1);
  gap = gap < 0 ? -gap : gap;
  gap = gap < one ? one : gap;
  const vi bits = vbits(__builtin_convertvector(gap, vf));
  const vi e = vtable_i(entry, CellTable::kCells, (bits >> 20) - 127 * 8);
  return (e >> 21) - ((bits & 0xFFFFF) >= (e & 0x1FFFFF));  // a true comparison is -1
}

const CellTable& cell_table(int nb) {
  static std::mutex mu;
  static std::vector<CellTable*> cache;  // kept for the life of the process
  std::lock_guard<std::mutex> lock(mu);
  for (const CellTable* t : cache)
    if (t->nb == nb) return *t;
  cache.push_back(new CellTable(nb));
  return *cache.back();
}

// ---------------------------------------------------------------------------------------------
// Problem description shared by both passes.
struct Problem {
  int64_t T = 0;         // tokens (rows of q/k/v)
  int H = 0, DQ = 0, DV = 0;
  int N = 0;             // max_len
  int B = 0;             // rows
  std::vector<int64_t> off;  // [B+1]
  const float *q = nullptr, *k = nullptr, *v = nullptr;
  const int64_t* ts = nullptr;  // [T] or null (no time bias)
  const int64_t* req = nullptr; // [B] request time of each row (the last position's query time)
  const float* wts = nullptr;   // [nb+1] or null
  int nb = 0;
  std::vector<float> wts_pad;   // w_ts padded with zeros to a multiple of 32 entries (vtable_f)
  std::vector<float> wpos;      // padded copy: wpos[WPAD + r] = w_pos[r], r in [0, 2N-2]
  const BucketTable* buckets = nullptr;
  const CellTable* cells = nullptr;

  int64_t row_start(int b) const { return off[b]; }
  int row_len(int b) const { return static_cast<int>(std::min<int64_t>(off[b + 1] - off[b], N)); }
  int64_t qstride() const { return int64_t(H) * DQ; }
  int64_t vstride() const { return int64_t(H) * DV; }
};

// Time stamps of one row for the time bias.  fast: the row's times and request time span less than
// 2^31, so gaps are int32 differences of times relative to the row's earliest (tk padded with
// zeros, which keeps every padded gap in range); else the exact int64 scalar path.
struct RowTimes {
  bool on = false, fast = false;
  bool uniform = false;  // every gap of the row is 0 (e.g. rows without time data): one bucket, no lookups
  bool monotone = false; // fast, keys in time order and the request time after them: along the keys a
                         // query sees, gaps only fall (see vector_bucket)
  int ubucket = 0;
  float uweight = 0.0f;
  int L = 0;
  std::vector<int32_t> tk, tq;
  std::vector<int64_t> tq64;
  const int64_t* tk64 = nullptr;

  void set(const Problem& p, int b, int64_t s, int len) {
    on = p.ts != nullptr;
    uniform = monotone = false;
    L = len;
    if (!on || L == 0) return;
    int64_t lo = p.req[b], hi = p.req[b];
    for (int j = 0; j < L; ++j) {
      lo = std::min(lo, p.ts[s + j]);
      hi = std::max(hi, p.ts[s + j]);
    }
    fast = p.cells->ok && static_cast<uint64_t>(hi) - static_cast<uint64_t>(lo) < (uint64_t(1) << 31);
    uniform = fast && hi == lo;
    if (uniform) {
      ubucket = (*p.cells)(0);
      uweight = p.wts_pad[ubucket];
    }
    auto query_time = [&](int i) { return i + 1 < L ? p.ts[s + i + 1] : p.req[b]; };
    if (fast) {
      tk.assign(round_up(L, VL) + 2 * VL, 0);
      tq.resize(L);
      for (int j = 0; j < L; ++j) tk[j] = static_cast<int32_t>(p.ts[s + j] - lo);
      for (int i = 0; i < L; ++i) tq[i] = static_cast<int32_t>(query_time(i) - lo);
      monotone = tq[L - 1] >= tk[L - 1];
      for (int j = 0; monotone && j + 1 < L; ++j) monotone = tk[j] <= tk[j + 1];
    } else {
      tk64 = p.ts + s;
      tq64.resize(L);
      for (int i = 0; i < L; ++i) tq64[i] = query_time(i);
    }
  }

  // 0: no time bias, 1: one bucket for the whole row, 2: a bucket per pair (the backward's elementwise
  // pass is compiled per mode; in the forward a mode-1 copy did not pay: its mode 2 got slower)
  int mode() const { return !on ? 0 : uniform ? 1 : 2; }

  // Mode 2, keys j..j+VL-1 all seen by query i (j + VL - 1 <= i): their one bucket when the row is
  // monotone and the first and last key share it, else -1. In a monotone row the gaps tq_i - t_j >= 0
  // fall as j grows and the bucket is a non-decreasing function of the gap (tests check it), so equal
  // ends mean equal lanes: a broadcast of w_ts instead of two gathers, and one bucket for dw_ts.
  // The first key shares the last one's bucket b iff its (larger) gap is at most upper[b].
  inline int vector_bucket(const Problem& p, int i, int j) const {
    if (!monotone) return -1;
    const int b = (*p.cells)(tq[i] - tk[j + VL - 1]);
    return tq[i] - tk[j] <= p.cells->upper[b] ? b : -1;
  }

  // w_ts[bucket] of query i against keys j..j+VL-1 (lanes past L: bucket 0), and the buckets.
  inline vf bias(const Problem& p, int i, int j, vi* bucket) const {
    if (fast) {
      const vi bk = cell_buckets(p.cells->entry, vbcast_i(tq[i]) - vload_i(tk.data() + j));
      *bucket = bk;
      return vtable_f(p.wts_pad.data(), p.nb + 1, bk);
    }
    int32_t bb[VL];
    float w[VL];
    for (int l = 0; l < VL; ++l) {
      int b = 0;
      if (j + l < L) {
        const int64_t dt = tq64[i] - tk64[j + l];
        b = (*p.buckets)(dt < 0 ? -dt : dt);
      }
      bb[l] = b;
      w[l] = p.wts[b];
    }
    *bucket = vload_i(bb);
    return vload(w);
  }
};

// Register tile of the score micro-kernel: MR query rows x NR vectors of keys, sized so that the
// MR * NR accumulators, the NR key vectors and one broadcast fit the ISA's vector registers
// (AVX-512 / NEON: 32 registers, 4 x 4 = 16 + 4 + 1; AVX2 / generic: 16 registers, 4 x 2 = 8 + 2 + 1).
constexpr int MR = 4;
constexpr int NR = kVecRegs >= 32 ? 4 : 2;

// out[r*ldo + c*VL ..] = sum_x a[r*lda + x] * bt[x*ldb + c*VL ..] for r < R, c < NC.
template <int R, int NC>
inline void micro_nt(const float* __restrict a, int64_t lda, const float* __restrict bt, int64_t ldb, int d,
                     float* __restrict out, int64_t ldo) {
  vf acc[R][NC];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < NC; ++c) acc[r][c] = vzero();
  for (int x = 0; x < d; ++x) {
    vf bv[NC];
    for (int c = 0; c < NC; ++c) {
      bv[c] = vload(bt + x * ldb + c * VL);
      pin_reg(bv[c]);
    }
    for (int r = 0; r < R; ++r) {
      const vf av = vbcast(a[r * lda + x]);
      for (int c = 0; c < NC; ++c) acc[r][c] += av * bv[c];
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < NC; ++c) vstore(out + r * ldo + c * VL, acc[r][c]);
}

typedef void (*MicroFn)(const float*, int64_t, const float*, int64_t, int, float*, int64_t);

template <int R>
MicroFn micro_for_cols(int nc) {
  switch (nc) {
    case 1: return micro_nt<R, 1>;
    case 2: return micro_nt<R, 2>;
    case 3: return micro_nt<R, NR >= 3 ? 3 : 1>;
    default: return micro_nt<R, NR>;
  }
}
MicroFn micro_for(int rows, int nc) {
  switch (rows) {
    case 1: return micro_for_cols<1>(nc);
    case 2: return micro_for_cols<2>(nc);
    case 3: return micro_for_cols<3>(nc);
    default: return micro_for_cols<MR>(nc);
  }
}

// out[r][0 .. nvec*VL) = a[r] . bt[:, ..] for r < rows (rows <= MR), bt packed [d][ldb].
inline void scores_block(const float* a, int64_t lda, int rows, const float* bt, int64_t ldb, int d, int nvec,
                         float* out, int64_t ldo) {
  for (int c0 = 0; c0 < nvec; c0 += NR) {
    const int nc = std::min(NR, nvec - c0);
    micro_for(rows, nc)(a, lda, bt + c0 * VL, ldb, d, out + c0 * VL, ldo);
  }
}

// Scores of a tile: out[i][..] for i < rows, in blocks of MR rows; a block computes the key vectors
// up to the largest limit of its rows (limit: non-decreasing keys per query; null: ncols_all).
void tile_nt(const float* a, int64_t lda, int rows, const float* bt, int64_t ldb, int d, float* out, int64_t ldo,
             const int* limit, int nvec_all) {
  for (int i = 0; i < rows; i += MR) {
    const int r = std::min(MR, rows - i);
    const int nvec = limit == nullptr ? nvec_all : (limit[i + r - 1] + VL - 1) / VL;
    if (nvec > 0) scores_block(a + i * lda, lda, r, bt, ldb, d, nvec, out + i * ldo, ldo);
  }
}

// dst[r][0..NC*VL) += sum_{m in [lo[r], hi[r])} w[r*wr + m*wm] * x[m][0..NC*VL) for r < rows;
// dst rows have stride ldd, x rows stride ldx.  R rows are updated together over the union of
// their ranges: the caller guarantees w is exactly zero outside each row's own range (masked
// pairs), and acc + 0 * x == acc for finite x, so the result is that of the per-row sums.
template <int NC, int R>
void rank_update(float* __restrict dst, int64_t ldd, int rows, const float* __restrict w, int64_t wr,
                 int64_t wm, const float* __restrict x, int64_t ldx, const int* lo, const int* hi) {
  int r = 0;
  for (; r + R <= rows; r += R) {
    int a = lo[r], b = hi[r];
    for (int rr = 1; rr < R; ++rr) {
      a = std::min(a, lo[r + rr]);
      b = std::max(b, hi[r + rr]);
    }
    if (a >= b) continue;
    vf acc[R][NC];
    for (int rr = 0; rr < R; ++rr)
      for (int c = 0; c < NC; ++c) acc[rr][c] = vload(dst + (r + rr) * ldd + c * VL);
    for (int m = a; m < b; ++m) {
      vf xv[NC];
      for (int c = 0; c < NC; ++c) {
        xv[c] = vload(x + m * ldx + c * VL);
        pin_reg(xv[c]);
      }
      for (int rr = 0; rr < R; ++rr) {
        vf sv = vbcast(w[(r + rr) * wr + m * wm]);
        for (int c = 0; c < NC; ++c) acc[rr][c] += sv * xv[c];
      }
    }
    for (int rr = 0; rr < R; ++rr)
      for (int c = 0; c < NC; ++c) vstore(dst + (r + rr) * ldd + c * VL, acc[rr][c]);
  }
  for (; r < rows; ++r) {
    vf acc[NC];
    for (int c = 0; c < NC; ++c) acc[c] = vload(dst + r * ldd + c * VL);
    for (int m = lo[r]; m < hi[r]; ++m) {
      vf sv = vbcast(w[r * wr + m * wm]);
      for (int c = 0; c < NC; ++c) acc[c] += sv * vload(x + m * ldx + c * VL);
    }
    for (int c = 0; c < NC; ++c) vstore(dst + r * ldd + c * VL, acc[c]);
  }
}

typedef void (*RankUpdateFn)(float*, int64_t, int, const float*, int64_t, int64_t, const float*, int64_t,
                             const int*, const int*);

// Widest column block one call handles, and its rows per pass: R * NC accumulators + NC x
// vectors + 1 broadcast within the ISA's registers (32: up to 8 x 2 or 4 x 4; 16: up to 4 x 2 or 2 x 4).
constexpr int kMaxNC = kVecRegs >= 32 ? 8 : 4;

RankUpdateFn rank_update_for(int nvec) {
  if (kVecRegs >= 32) {
    switch (nvec) {
      case 1: return rank_update<1, 4>;
      case 2: return rank_update<2, 4>;
      case 3: return rank_update<3, 4>;
      case 4: return rank_update<4, 4>;
      case 5: return rank_update<5, 4>;
      case 6: return rank_update<6, 4>;
      case 7: return rank_update<7, 2>;
      case 8: return rank_update<8, 2>;
      default: return nullptr;
    }
  }
  switch (nvec) {
    case 1: return rank_update<1, 4>;
    case 2: return rank_update<2, 4>;
    case 3: return rank_update<3, 2>;
    case 4: return rank_update<4, 2>;
    default: return nullptr;
  }
}

// Rank update over `width` columns (a multiple of VL): one call up to kMaxNC vectors wide, else
// column blocks of kMaxNC vectors (the last one narrower).
struct RankUpdater {
  int width;
  explicit RankUpdater(int w) : width(w) {}
  void operator()(float* dst, int64_t ldd, int rows, const float* w, int64_t wr, int64_t wm, const float* x,
                  int64_t ldx, const int* lo, const int* hi) const {
    const int nvec = width / VL;
    if (nvec <= kMaxNC) {
      rank_update_for(nvec)(dst, ldd, rows, w, wr, wm, x, ldx, lo, hi);
      return;
    }
    const int block = kVecRegs >= 32 ? 6 : kMaxNC;
    for (int c0 = 0; c0 < nvec; c0 += block) {
      const int nc = std::min(block, nvec - c0);
      rank_update_for(nc)(dst + c0 * VL, ldd, rows, w, wr, wm, x + c0 * VL, ldx, lo, hi);
    }
  }
};

// Packs rows [0, n) of x (row stride `stride`, d values each) transposed as [d][ld], zero in the
// columns [n, cols) (they only meet masked pairs, but must not hold NaN or denormals).  Blocks of
// 8 rows: their d values stay in L1 while the block's 8 columns of every output row are written.
void pack_t(const float* __restrict x, int64_t stride, int d, int n, int cols, int64_t ld, float* __restrict out) {
  int j0 = 0;
  for (; j0 + 8 <= n; j0 += 8) {
    const float* r = x + j0 * stride;
    for (int e = 0; e < d; ++e) {
      float* o = out + e * ld + j0;
      for (int jj = 0; jj < 8; ++jj) o[jj] = r[jj * stride + e];
    }
  }
  for (int e = 0; e < d; ++e) {
    float* o = out + e * ld;
    for (int j = j0; j < n; ++j) o[j] = x[j * stride + e];
    for (int j = n; j < cols; ++j) o[j] = 0.0f;
  }
}

// Packs `rows` rows of d values as [rows][width], zero in the padding columns [d, width), then
// zero rows up to `rows_pad`.
void pack_rows(const float* __restrict x, int64_t stride, int d, int rows, int width, float* __restrict out,
               int rows_pad = 0) {
  for (int j = 0; j < rows; ++j) {
    const float* src = x + j * stride;
    float* dst = out + j * width;
    for (int e = 0; e < d; ++e) dst[e] = src[e];
    for (int e = d; e < width; ++e) dst[e] = 0.0f;
  }
  for (int j = rows; j < rows_pad; ++j) std::fill(out + j * width, out + (j + 1) * width, 0.0f);
}

// For the transposed updates: first query of the tile that sees key j (limit is non-decreasing).
void first_queries(const int* limit, int bq, int bk, int* first) {
  int i = 0;
  for (int j = 0; j < bk; ++j) {
    while (i < bq && limit[i] <= j) ++i;
    first[j] = i;
  }
}

// Zeroes the tokens that no row computes: before the first row, after the last (the unused tail)
// and past N in rows longer than N.  Tokens inside rows are fully written by the kernels.
void zero_uncovered(const Problem& p, float* buf, int64_t width) {
  int64_t prev = 0;
  for (int b = 0; b <= p.B; ++b) {
    const int64_t s = b < p.B ? p.off[b] : p.T;
    if (s > prev) std::fill(buf + prev * width, buf + s * width, 0.0f);
    if (b < p.B) prev = std::max(prev, s + p.row_len(b));
  }
}

inline void copy_floats(float* __restrict dst, const float* __restrict src, int n) {
  for (int e = 0; e < n; ++e) dst[e] = src[e];
}

// x = s + w_pos[N-1+j-i] (+ w_ts[bucket]) for query i (row-relative) and keys j..j+VL-1.
inline vf biased(const Problem& p, const RowTimes& rt, vf s, int i, int j, vi* bucket) {
  vf x = s + vload(p.wpos.data() + WPAD + (p.N - 1 - i + j));
  if (rt.on) x += rt.bias(p, i, j, bucket);
  return x;
}

// The same when all VL keys share one bucket, whose weight is w.
inline vf biased_one(const Problem& p, vf s, int i, int j, float w) {
  vf x = s + vload(p.wpos.data() + WPAD + (p.N - 1 - i + j));
  x += vbcast(w);
  return x;
}

// The same for M = rt.mode() known at compile time (mode 1: the row's one w_ts, no lookups).
template <int M>
inline vf biased_m(const Problem& p, const RowTimes& rt, vf s, int i, int j, vi* bucket) {
  vf x = s + vload(p.wpos.data() + WPAD + (p.N - 1 - i + j));
  if constexpr (M == 1) x += vbcast(rt.uweight);
  if constexpr (M == 2) x += rt.bias(p, i, j, bucket);
  return x;
}

template <class F>
inline void with_mode(int m, F&& f) {
  if (m == 0) f(std::integral_constant<int, 0>());
  else if (m == 1) f(std::integral_constant<int, 1>());
  else f(std::integral_constant<int, 2>());
}

// ---------------------------------------------------------------------------------------------
// Forward.
void forward(const Problem& p, float* out) {
  zero_uncovered(p, out, p.vstride());
  // Items: a row's query blocks [i0, i1), longest first.  Whole rows (operands packed once per
  // row) when there are enough rows to balance the threads, else one block of QB queries each.
  struct Item { int b, i0, i1; double cost; };
  auto pairs = [](int i0, int i1) { return double(i1 - i0) * (0.5 * (i0 + i1 + 1)) + 8.0 * (i1 - i0); };
  int nonempty = 0;
  double total = 0.0;
  for (int b = 0; b < p.B; ++b) {
    const int L = p.row_len(b);
    nonempty += L > 0;
    total += pairs(0, L) * p.H;
  }
  int nthreads = std::max(1, num_threads());
  if (total * (p.DQ + p.DV) < 2.0e5) nthreads = 1;  // too small to pay for a thread
  const bool whole_rows = nonempty >= 8 * nthreads;
  std::vector<Item> items;
  for (int b = 0; b < p.B; ++b) {
    const int L = p.row_len(b);
    if (whole_rows && L > 0) items.push_back({b, 0, L, pairs(0, L)});
    if (!whole_rows)
      for (int i0 = 0; i0 < L; i0 += QB) items.push_back({b, i0, std::min(L, i0 + QB), pairs(i0, std::min(L, i0 + QB))});
  }
  std::stable_sort(items.begin(), items.end(), [](const Item& a, const Item& c) { return a.cost > c.cost; });
  nthreads = std::max<int>(1, std::min<int64_t>(nthreads, int64_t(items.size())));

  const int DVP = round_up(p.DV, VL);
  const int KPmax = round_up(p.N, VL);
  std::atomic<size_t> next(0);
  const RankUpdater pv(DVP);
  const float inv_n = 1.0f / static_cast<float>(p.N);

  parallel_run(nthreads, [&](int) {
    std::vector<float> kt(int64_t(p.DQ) * KPmax), vp(int64_t(KPmax) * DVP), S(int64_t(MR) * KPmax);
    std::vector<float> acc(int64_t(MR) * DVP);
    std::vector<int> zeros(MR, 0), hi(MR);
    RowTimes rt;
    const vi lane = iota();
    for (;;) {
      const size_t idx = next.fetch_add(1);
      if (idx >= items.size()) break;
      const int b = items[idx].b, i0 = items[idx].i0, i1 = items[idx].i1;
      const int64_t s = p.row_start(b);
      const int L = p.row_len(b);
      const int keys = i1, KP = round_up(keys, VL);
      rt.set(p, b, s, L);
      for (int h = 0; h < p.H; ++h) {
        pack_t(p.k + s * p.qstride() + h * p.DQ, p.qstride(), p.DQ, keys, KP, KP, kt.data());
        pack_rows(p.v + s * p.vstride() + h * p.DV, p.vstride(), p.DV, keys, DVP, vp.data(), KP);
        for (int ifirst = i0; ifirst < i1; ifirst += MR) {
          const int R = std::min(MR, i1 - ifirst), ilast = ifirst + R - 1;
          const int nvec = (ilast + VL) / VL;  // key vectors up to the block's last query
          scores_block(p.q + (s + ifirst) * p.qstride() + h * p.DQ, p.qstride(), R, kt.data(), KP, p.DQ, nvec,
                       S.data(), KP);
          for (int r = 0; r < R; ++r) {
            const int i = ifirst + r;
            float* srow = S.data() + r * KP;
            vi bucket = vi{};
            for (int c = 0; c < nvec; ++c) {
              const int j = c * VL;
              const int ub = rt.on && j + VL <= i + 1 ? rt.vector_bucket(p, i, j) : -1;
              const vf x = ub >= 0 ? biased_one(p, vload(srow + j), i, j, p.wts_pad[ub])
                                   : biased(p, rt, vload(srow + j), i, j, &bucket);
              vf a = x * vsigmoid(x) * inv_n;
              if (j + VL > i + 1) a = vselect((lane + j) <= i, a);  // the diagonal vector, and past it
              vstore(srow + j, a);
            }
            hi[r] = nvec * VL;
          }
          std::fill(acc.begin(), acc.begin() + int64_t(R) * DVP, 0.0f);
          pv(acc.data(), DVP, R, S.data(), KP, 1, vp.data(), DVP, zeros.data(), hi.data());
          float* out_rows = out + (s + ifirst) * p.vstride() + h * p.DV;
          for (int r = 0; r < R; ++r) copy_floats(out_rows + r * p.vstride(), acc.data() + int64_t(r) * DVP, p.DV);
        }
      }
    }
  });
}

// ---------------------------------------------------------------------------------------------
// Backward.
struct Grads {
  float *dq, *dk, *dv, *dwpos, *dwts;
  int64_t npos, nts;  // lengths of dwpos / dwts
};

void backward(const Problem& p, const float* dout, const Grads& g) {
  zero_uncovered(p, g.dq, p.qstride());
  zero_uncovered(p, g.dk, p.qstride());
  zero_uncovered(p, g.dv, p.vstride());
  std::fill(g.dwpos, g.dwpos + g.npos, 0.0f);
  if (g.dwts != nullptr) std::fill(g.dwts, g.dwts + g.nts, 0.0f);

  // Items: (row, head), longest first; a fixed partition into chunks (independent of threads).
  struct Item { int b, h; double cost; };
  std::vector<Item> items;
  double total = 0.0;
  int max_len = 0;
  for (int b = 0; b < p.B; ++b) {
    const int L = p.row_len(b);
    max_len = std::max(max_len, L);
    if (L == 0) continue;
    for (int h = 0; h < p.H; ++h) {
      items.push_back({b, h, 0.5 * L * (L + 1) + 8.0 * L});
      total += items.back().cost;
    }
  }
  std::stable_sort(items.begin(), items.end(), [](const Item& a, const Item& c) { return a.cost > c.cost; });
  const int nchunks = static_cast<int>(std::min<size_t>(items.size(), 64));
  int nthreads = std::max(1, std::min(num_threads(), nchunks));
  if (total * (p.DQ + p.DV) < 1.0e5) nthreads = 1;

  const int DQP = round_up(p.DQ, VL), DVP = round_up(p.DV, VL);
  const RankUpdater upd_q(DQP), upd_v(DVP);
  const float inv_n = 1.0f / static_cast<float>(p.N);
  const int npos_pad = 2 * p.N - 1 + 2 * WPAD;
  const int nts = p.ts != nullptr ? p.nb + 1 : 0;
  std::vector<std::vector<double>> chunk_pos(nchunks), chunk_ts(nchunks);
  std::atomic<int> next(0);

  parallel_run(nthreads, [&](int) {
    const int64_t Lm = std::max(max_len, 1);
    std::vector<float> S(TILE * TILE), G(TILE * TILE), P(TILE * TILE), dS(TILE * TILE);
    std::vector<float> kt(int64_t(p.DQ) * TILE), vt(int64_t(p.DV) * TILE);
    std::vector<float> dkacc(int64_t(TILE) * DQP), dvacc(int64_t(TILE) * DVP);
    Scratch dqacc(Lm * DQP), qpack(Lm * DQP), kpack(Lm * DQP), dopack(Lm * DVP);
    std::vector<float> dposf(npos_pad), dtsf(4 * int64_t(std::max(nts, 1)));
    std::vector<int> limit(TILE), zeros(TILE, 0), first(TILE), qcount(TILE);
    int32_t bk_lanes[VL];
    float ds_lanes[VL];
    RowTimes rt;
    const vi lane = iota();

    for (;;) {
      const int chunk = next.fetch_add(1);
      if (chunk >= nchunks) break;
      std::vector<double>& cpos = chunk_pos[chunk];
      std::vector<double>& cts = chunk_ts[chunk];
      cpos.assign(2 * p.N - 1, 0.0);
      cts.assign(nts, 0.0);
      const size_t it0 = items.size() * chunk / nchunks, it1 = items.size() * (chunk + 1) / nchunks;
      for (size_t idx = it0; idx < it1; ++idx) {
        const int b = items[idx].b, h = items[idx].h;
        const int64_t s = p.row_start(b);
        const int L = p.row_len(b);
        rt.set(p, b, s, L);
        std::fill(dposf.begin(), dposf.end(), 0.0f);
        std::fill(dtsf.begin(), dtsf.end(), 0.0f);
        float uts[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        pack_rows(p.q + s * p.qstride() + h * p.DQ, p.qstride(), p.DQ, L, DQP, qpack.data());
        pack_rows(p.k + s * p.qstride() + h * p.DQ, p.qstride(), p.DQ, L, DQP, kpack.data());
        pack_rows(dout + s * p.vstride() + h * p.DV, p.vstride(), p.DV, L, DVP, dopack.data());
        std::fill(dqacc.data(), dqacc.data() + int64_t(L) * DQP, 0.0f);
        for (int j0 = 0; j0 < L; j0 += TILE) {
          const int bk = std::min(TILE, L - j0);
          const int nv_keys = (bk + VL - 1) / VL;
          pack_t(p.k + (s + j0) * p.qstride() + h * p.DQ, p.qstride(), p.DQ, bk, TILE, TILE, kt.data());
          pack_t(p.v + (s + j0) * p.vstride() + h * p.DV, p.vstride(), p.DV, bk, TILE, TILE, vt.data());
          std::fill(dkacc.begin(), dkacc.begin() + int64_t(bk) * DQP, 0.0f);
          std::fill(dvacc.begin(), dvacc.begin() + int64_t(bk) * DVP, 0.0f);
          for (int i0 = j0; i0 < L; i0 += TILE) {
            const int bq = std::min(TILE, L - i0);
            for (int i = 0; i < bq; ++i) limit[i] = std::max(0, std::min(bk, i0 + i - j0 + 1));
            first_queries(limit.data(), bq, bk, first.data());
            std::fill(qcount.begin(), qcount.end(), bq);
            tile_nt(qpack.data() + int64_t(i0) * DQP, DQP, bq, kt.data(), TILE, p.DQ, S.data(), TILE, limit.data(), 0);
            tile_nt(dopack.data() + int64_t(i0) * DVP, DVP, bq, vt.data(), TILE, p.DV, G.data(), TILE, limit.data(), 0);
            with_mode(rt.mode(), [&](auto mc) __attribute__((noinline)) {
              constexpr int M = decltype(mc)::value;
              float ul[4];  // mode 1: dtsf's four copies of the row's one bucket, in registers
              std::memcpy(ul, uts, sizeof(ul));
              for (int i = 0; i < bq; ++i) {
                const int ig = i0 + i;
                const int nv = (limit[i] + VL - 1) / VL;
                // key vectors past the query's limit: P = dS = 0 up to the tile's keys (read by the
                // transposed updates over groups of keys)
                for (int c = nv; c < nv_keys; ++c) {
                  vstore(P.data() + i * TILE + c * VL, vzero());
                  vstore(dS.data() + i * TILE + c * VL, vzero());
                }
                float* dp = dposf.data() + WPAD + (p.N - 1 - ig + j0);
                for (int c = 0; c < nv; ++c) {
                  const int o = i * TILE + c * VL, j = j0 + c * VL;
                  vi bucket = vi{};
                  const int valid = limit[i] - c * VL;  // keys of this vector the query sees
                  int ub = -1;                          // mode 2: the vector's one bucket, if it has one
                  if constexpr (M == 2) ub = valid >= VL ? rt.vector_bucket(p, ig, j) : -1;
                  const vf x = ub >= 0 ? biased_one(p, vload(S.data() + o), ig, j, p.wts_pad[ub])
                                       : biased_m<M>(p, rt, vload(S.data() + o), ig, j, &bucket);
                  const vf sg = vsigmoid(x);
                  vf a = x * sg * inv_n;
                  vf ds = vload(G.data() + o) * (sg * (1.0f + x * (1.0f - sg))) * inv_n;
                  if (valid < VL) {
                    const vi m = lane < valid;
                    a = vselect(m, a);
                    ds = vselect(m, ds);
                  }
                  vstore(P.data() + o, a);
                  vstore(dS.data() + o, ds);
                  vstore(dp + c * VL, vload(dp + c * VL) + ds);
                  if constexpr (M == 1) {
                    // the scatter below with every lane in one bucket: the same additions in the same
                    // order (lanes past `valid` are +0, a no-op on a sum that starts at +0)
#pragma GCC unroll 4
                    for (int q = 0; q < VL / 4; ++q)
#pragma GCC unroll 4
                      for (int e = 0; e < 4; ++e) ul[e] += ds[4 * q + e];
                  }
                  if (M == 2 && ub >= 0) {
                    // the scatter below with every lane in bucket ub: the same additions in the same order
                    float* d = dtsf.data() + ub;
                    float u4[4] = {d[0], d[nts], d[2 * nts], d[3 * nts]};
#pragma GCC unroll 4
                    for (int q = 0; q < VL / 4; ++q)
#pragma GCC unroll 4
                      for (int e = 0; e < 4; ++e) u4[e] += ds[4 * q + e];
                    for (int e = 0; e < 4; ++e) d[e * nts] = u4[e];
                  } else if constexpr (M == 2) {
                    vstore_i(bk_lanes, bucket);
                    vstore(ds_lanes, ds);
                    const int n = std::min(valid, VL);
                    for (int l = 0; l < n; ++l) dtsf[(l & 3) * nts + bk_lanes[l]] += ds_lanes[l];
                  }
                }
              }
              std::memcpy(uts, ul, sizeof(ul));
            });
            // dq[i] += sum_j dS[i][j] k[j];  dk[j] += sum_i dS[i][j] q[i];  dv[j] += sum_i P[i][j] dout[i]
            upd_q(dqacc.data() + int64_t(i0) * DQP, DQP, bq, dS.data(), TILE, 1, kpack.data() + int64_t(j0) * DQP,
                  DQP, zeros.data(), limit.data());
            upd_q(dkacc.data(), DQP, bk, dS.data(), 1, TILE, qpack.data() + int64_t(i0) * DQP, DQP, first.data(),
                  qcount.data());
            upd_v(dvacc.data(), DVP, bk, P.data(), 1, TILE, dopack.data() + int64_t(i0) * DVP, DVP, first.data(),
                  qcount.data());
          }
          for (int j = 0; j < bk; ++j) {
            copy_floats(g.dk + (s + j0 + j) * p.qstride() + h * p.DQ, dkacc.data() + int64_t(j) * DQP, p.DQ);
            copy_floats(g.dv + (s + j0 + j) * p.vstride() + h * p.DV, dvacc.data() + int64_t(j) * DVP, p.DV);
          }
        }
        for (int i = 0; i < L; ++i)
          copy_floats(g.dq + (s + i) * p.qstride() + h * p.DQ, dqacc.data() + int64_t(i) * DQP, p.DQ);
        if (rt.uniform)
          for (int c = 0; c < 4; ++c) dtsf[c * nts + rt.ubucket] = uts[c];
        for (int r = 0; r < 2 * p.N - 1; ++r) cpos[r] += dposf[WPAD + r];
        for (int r = 0; r < nts; ++r)
          cts[r] += (double(dtsf[r]) + double(dtsf[nts + r])) + (double(dtsf[2 * nts + r]) + double(dtsf[3 * nts + r]));
      }
    }
  });

  const int64_t nrel = std::min<int64_t>(int64_t(2) * p.N - 1, g.npos);
  for (int64_t r = 0; r < nrel; ++r) {
    double acc = 0.0;
    for (int c = 0; c < nchunks; ++c) acc += chunk_pos[c][r];
    g.dwpos[r] = static_cast<float>(acc);
  }
  if (g.dwts != nullptr && p.ts != nullptr) {
    for (int64_t r = 0; r <= p.nb && r < g.nts; ++r) {
      double acc = 0.0;
      for (int c = 0; c < nchunks; ++c) acc += chunk_ts[c][r];
      g.dwts[r] = static_cast<float>(acc);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Argument parsing. Inputs: q, k, v, offsets, [timestamps, request_times], w_pos, [w_ts], carrier
// (shape [N]), [dout]; then outputs.
int parse(int nparam, void** params, int* ndims, int64_t** shapes, const char** dtypes, bool with_ts,
          bool with_dout, int expected_outputs, Problem* p) {
  const int nin = 6 + (with_ts ? 3 : 0) + (with_dout ? 1 : 0);
  MINDGR_REJECT_IF(nparam != nin + expected_outputs, kArgCount);
  int iq = 0, ik = 1, iv = 2, ioff = 3;
  int its = with_ts ? 4 : -1;
  int ireq = with_ts ? 5 : -1;
  int iwp = with_ts ? 6 : 4;
  int iwt = with_ts ? 7 : -1;
  int icar = with_ts ? 8 : 5;
  MINDGR_REJECT_IF(ndims[iq] != 3 || ndims[ik] != 3 || ndims[iv] != 3, kRank);
  for (int i : {iq, ik, iv, iwp}) MINDGR_REJECT_IF(!is_f32(dtypes[i]), kDtype);
  p->T = shapes[iq][0];
  p->H = static_cast<int>(shapes[iq][1]);
  p->DQ = static_cast<int>(shapes[iq][2]);
  p->DV = static_cast<int>(shapes[iv][2]);
  MINDGR_REJECT_IF(shapes[ik][0] != p->T || shapes[ik][1] != p->H || shapes[ik][2] != p->DQ, kShape);
  MINDGR_REJECT_IF(shapes[iv][0] != p->T || shapes[iv][1] != p->H, kShape);
  MINDGR_REJECT_IF(ndims[icar] < 1, kCarrier);
  p->N = static_cast<int>(shapes[icar][0]);
  MINDGR_REJECT_IF(p->N < 1, kCarrier);
  MINDGR_REJECT_IF(ndims[ioff] != 1 || shapes[ioff][0] < 1, kOffsets);
  p->B = static_cast<int>(shapes[ioff][0] - 1);
  MINDGR_REJECT_IF(!read_ints(params[ioff], dtypes[ioff], shapes[ioff][0], &p->off), kOffsets);
  MINDGR_REJECT_IF(!offsets_ok(p->off, p->T), kIndexRange);
  p->q = static_cast<const float*>(params[iq]);
  p->k = static_cast<const float*>(params[ik]);
  p->v = static_cast<const float*>(params[iv]);
  const int64_t npos = numel(ndims[iwp], shapes[iwp]);
  MINDGR_REJECT_IF(npos < int64_t(2) * p->N - 1, kPosTable);
  p->wpos.assign(int64_t(2) * p->N - 1 + 2 * WPAD, 0.0f);
  std::memcpy(p->wpos.data() + WPAD, params[iwp], sizeof(float) * (2 * p->N - 1));
  if (with_ts) {
    MINDGR_REJECT_IF(!is_dtype(dtypes[its], "int64") || numel(ndims[its], shapes[its]) != p->T, kTimestamps);
    MINDGR_REJECT_IF(!is_f32(dtypes[iwt]), kDtype);
    MINDGR_REJECT_IF(!is_dtype(dtypes[ireq], "int64") || numel(ndims[ireq], shapes[ireq]) != p->B, kRequestTimes);
    p->ts = static_cast<const int64_t*>(params[its]);
    p->req = static_cast<const int64_t*>(params[ireq]);
    p->wts = static_cast<const float*>(params[iwt]);
    const int64_t nts = numel(ndims[iwt], shapes[iwt]);
    MINDGR_REJECT_IF(nts < 1, kTimeTable);
    p->nb = static_cast<int>(nts - 1);
    p->wts_pad.assign(round_up(int(nts), 32), 0.0f);
    std::memcpy(p->wts_pad.data(), p->wts, sizeof(float) * nts);
    p->buckets = &bucket_table(p->nb);
    p->cells = &cell_table(p->nb);
  }
  if (with_dout) {
    const int idout = nin - 1;
    MINDGR_REJECT_IF(!is_f32(dtypes[idout]) || numel(ndims[idout], shapes[idout]) != p->T * p->vstride(), kGradient);
  }
  return 0;
}

int run_forward(int nparam, void** params, int* ndims, int64_t** shapes, const char** dtypes, bool with_ts) try {
  Problem p;
  int rc = parse(nparam, params, ndims, shapes, dtypes, with_ts, false, 1, &p);
  if (rc != 0) return rc;
  float* out = static_cast<float*>(params[nparam - 1]);
  MINDGR_REJECT_IF(!is_f32(dtypes[nparam - 1]) || numel(ndims[nparam - 1], shapes[nparam - 1]) != p.T * p.vstride(), kOutput);
  forward(p, out);
  return 0;
} catch (...) {  // e.g. std::bad_alloc, or a thread that could not start: MindSpore reports the failure
  MINDGR_FAIL(kResources);
}

int run_backward(int nparam, void** params, int* ndims, int64_t** shapes, const char** dtypes, bool with_ts) try {
  Problem p;
  const int nout = with_ts ? 5 : 4;
  int rc = parse(nparam, params, ndims, shapes, dtypes, with_ts, true, nout, &p);
  if (rc != 0) return rc;
  const int o = nparam - nout;
  const float* dout = static_cast<const float*>(params[o - 1]);
  Grads g;
  g.dq = static_cast<float*>(params[o]);
  g.dk = static_cast<float*>(params[o + 1]);
  g.dv = static_cast<float*>(params[o + 2]);
  g.dwpos = static_cast<float*>(params[o + 3]);
  g.npos = numel(ndims[o + 3], shapes[o + 3]);
  g.dwts = with_ts ? static_cast<float*>(params[o + 4]) : nullptr;
  g.nts = with_ts ? numel(ndims[o + 4], shapes[o + 4]) : 0;
  if (numel(ndims[o], shapes[o]) != p.T * p.qstride() || numel(ndims[o + 1], shapes[o + 1]) != p.T * p.qstride() ||
      numel(ndims[o + 2], shapes[o + 2]) != p.T * p.vstride())
    MINDGR_FAIL(kOutput);
  backward(p, dout, g);
  return 0;
} catch (...) {
  MINDGR_FAIL(kResources);
}

}  // namespace
}  // namespace mindgr

extern "C" {

// out = hstu_attention(q, k, v, offsets, timestamps, request_times, w_pos, w_ts; N = len(carrier))
MINDGR_AOT_OP(MindgrHstuFwd, mindgr::run_forward, true)

// out = hstu_attention(q, k, v, offsets, w_pos; N = len(carrier)), no time bias
MINDGR_AOT_OP(MindgrHstuFwdNoTs, mindgr::run_forward, false)

// (dq, dk, dv, dw_pos, dw_ts) from (q, k, v, offsets, timestamps, request_times, w_pos, w_ts, carrier, dout)
MINDGR_AOT_OP(MindgrHstuBwd, mindgr::run_backward, true)

// (dq, dk, dv, dw_pos) from (q, k, v, offsets, w_pos, carrier, dout)
MINDGR_AOT_OP(MindgrHstuBwdNoTs, mindgr::run_backward, false)

// For tests: the time bucket the kernels use for a gap, and the thread count they would use.
// Gaps below 2^31 go through the vectorised kernels' cell table (scalar form), others the octave table.
int mindgr_time_bucket(int64_t dt, int num_buckets) {
  const int64_t gap = dt < 0 ? -dt : dt;
  const mindgr::CellTable& cells = mindgr::cell_table(num_buckets);
  if (cells.ok && gap < (int64_t(1) << 31)) return cells(static_cast<int32_t>(gap));
  return mindgr::bucket_table(num_buckets)(gap);
}

// 1 if the vectorised cell table is exact for num_buckets (else rows fall back to the scalar table).
int mindgr_time_bucket_cells_ok(int num_buckets) { return mindgr::cell_table(num_buckets).ok ? 1 : 0; }

// The same bucket straight from the float32 formula (one logf per call), to check the table.
int mindgr_time_bucket_formula(int64_t dt, int num_buckets) {
  return mindgr::bucket_formula(dt < 0 ? -dt : dt, num_buckets);
}

int mindgr_num_threads() { return mindgr::num_threads(); }

// The vector ISA this library was built for (build.py) and its lanes per vector.
const char* mindgr_isa() { return mindgr::kIsaName; }
int mindgr_vector_lanes() { return mindgr::VL; }

// For tests: y[i] = vrecip(x[i]) and z[i] = x[i] * sigmoid(x[i]) as the attention kernels compute them.
void mindgr_recip_probe(const float* x, float* y, float* z, int64_t n) {
  using namespace mindgr;
  for (int64_t i = 0; i < n; i += VL) {
    float buf[VL] = {0}, r[VL], s[VL];
    const int m = static_cast<int>(std::min<int64_t>(VL, n - i));
    for (int e = 0; e < VL; ++e) buf[e] = e < m ? x[i + e] : 1.0f;
    const vf xv = vload(buf);
    vstore(r, vrecip(xv));
    vstore(s, xv * vsigmoid(xv));
    for (int e = 0; e < m; ++e) {
      y[i + e] = r[e];
      z[i + e] = s[e];
    }
  }
}

}  // extern "C"
