// Fused jagged HSTU attention for CPU: forward and backward, entry points with MindSpore's custom
// AOT signature.  Per row b (tokens s..s+L-1) and head h, for query i and key j <= i:
//   s_ij  = q_i.k_j + w_pos[N-1+j-i] + w_ts[bucket(tq_i - t_j)]
//   (tq_i = t_{i+1}; at the row's last position, i = L - 1 with L cut to N, the row's request time)
//   out_i = sum_j SiLU(s_ij) / N * v_j
// The [L, L] score matrix is never stored: it is recomputed tile by tile (TILE x TILE) in both
// passes, from operands packed contiguously (k transposed per tile; rows zero-padded to a multiple
// of VL floats).  Q K^T (and dO V^T) of a tile run as MR x NR register-tiled micro-kernels sized
// to the build's ISA (common.h), skipping the key vectors past the causal limit of each block of
// queries; SiLU and the masks run on the tile in registers, with the bias added inside it.  The
// relative bias of a tile is built once and shared by all heads.  The backward recomputes s_ij
// on the forward's tiling and, per tile, accumulates dq, dk, dv with register-blocked rank updates.
//
// Forward work items are (row, query tile) with every head inside; they write disjoint outputs,
// so threads take them in order of decreasing cost from a shared counter.  Backward work items
// are (row, group of heads), each done start to end by one thread (dq, dk, dv of a row belong to
// one item), assigned statically by cost (longest first, to the least loaded thread); the
// weight gradients are summed per thread in double and the partial sums reduced in thread order.
// So every result is bitwise reproducible, and out, dq, dk, dv do not even depend on the number
// of threads (dw_pos, dw_ts do, by rounding, through the per-thread partial sums).
#include <atomic>
#include <cmath>
#include <mutex>
#include <numeric>

#include "common.h"

namespace mindgr {
namespace {

constexpr int TILE = 64;        // queries and keys per tile
constexpr int TV = TILE / VL;   // vectors per tile row
constexpr int WPAD = TILE;      // zero padding on both sides of the copied w_pos

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

  // bucket_out[j] = bucket(|tq - tk[j]|) and row[j] += wts[bucket] for j < n (vectorises: gathers).
  void row(int64_t tq, const int64_t* __restrict tk, int n, const float* __restrict wts,
           float* __restrict row_out, int32_t* __restrict bucket_out) const {
    if (!exact_table) {
      for (int j = 0; j < n; ++j) {
        int64_t dt = tq - tk[j];
        int b = bucket_formula(dt < 0 ? -dt : dt, nb);
        bucket_out[j] = b;
        row_out[j] += wts[b];
      }
      return;
    }
    const int32_t* __restrict s0 = step[0];
    const int32_t* __restrict s1 = step[1];
    const int32_t* __restrict s2 = step[2];
    for (int j = 0; j < n; ++j) {
      int64_t dt = tq - tk[j];
      int64_t gap = dt < 0 ? -dt : dt;
      gap = gap < 1 ? 1 : gap;
      float g = static_cast<float>(gap);
      int32_t bits;
      std::memcpy(&bits, &g, sizeof(bits));
      const int e = (bits >> 23) & 255;
      const int b = base[e] + (bits >= s0[e]) + (bits >= s1[e]) + (bits >= s2[e]);
      bucket_out[j] = b;
      row_out[j] += wts[b];
    }
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

// ---------------------------------------------------------------------------------------------
// Problem description shared by both passes.
struct Problem {
  int64_t T = 0;         // tokens (rows of q/k/v)
  int H = 0, DQ = 0, DV = 0;
  int N = 0;             // max_len
  int B = 0;             // rows
  std::vector<int64_t> off;  // [B+1]
  const float *q = nullptr, *k = nullptr, *v = nullptr;
  const int64_t* ts = nullptr;  // [T] or null (no time bias); converted to int64
  const int64_t* req = nullptr; // [B] request time of each row (the last position's query time)
  const float* wts = nullptr;   // [nb+1] or null
  int nb = 0;
  std::vector<float> wpos;      // padded copy: wpos[WPAD + r] = w_pos[r], r in [0, 2N-2]
  const BucketTable* buckets = nullptr;

  int64_t row_start(int b) const { return off[b]; }
  int row_len(int b) const { return static_cast<int>(std::min<int64_t>(off[b + 1] - off[b], N)); }
  int64_t qstride() const { return int64_t(H) * DQ; }
  int64_t vstride() const { return int64_t(H) * DV; }
};

// Relative bias of the tile (queries i0.., keys j0..), for a row at token s with length L:
// bias[i][j] for j < TILE (only j < limit[i] is meaningful), the number of valid keys per query
// (j <= i and inside the row) and, with a time bias, the time bucket of each valid pair.
void build_bias(const Problem& p, int b, int64_t s, int L, int i0, int bq, int j0, float* bias, int* limit,
                int32_t* bucket) {
  const int N = p.N;
  const int bk = std::min(TILE, L - j0);
  for (int i = 0; i < bq; ++i) {
    const int ig = i0 + i;
    const int lim = std::max(0, std::min(bk, ig - j0 + 1));
    limit[i] = lim;
    const float* wp = p.wpos.data() + WPAD + (N - 1 - ig + j0);
    float* row = bias + i * TILE;
    for (int c = 0; c < TV; ++c) vstore(row + c * VL, vload(wp + c * VL));
    if (p.ts != nullptr && lim > 0) {
      const int64_t tq = ig + 1 < L ? p.ts[s + ig + 1] : p.req[b];
      p.buckets->row(tq, p.ts + s + j0, lim, p.wts, row, bucket + i * TILE);
    }
  }
}

// Register tile of the score micro-kernel: MR query rows x NR vectors of keys, sized so that the
// MR * NR accumulators, the NR key vectors and one broadcast fit the ISA's vector registers
// (AVX-512 / NEON: 32 registers, 4 x 4 = 16 + 4 + 1; AVX2 / generic: 16 registers, 4 x 2 = 8 + 2 + 1).
constexpr int MR = 4;
constexpr int NR = kVecRegs >= 32 ? 4 : 2;
static_assert(TV % NR == 0, "tile columns must be whole register tiles");

// One MR' x NR register tile: out[r][c0*VL + ..NR*VL) = sum_x a[r*lda + x] * bt[x*TILE + c0*VL + ..].
template <int R>
inline void micro_nt(const float* __restrict a, int64_t lda, const float* __restrict bt, int d, int c0,
                     float* __restrict out) {
  vf acc[R][NR];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < NR; ++c) acc[r][c] = vzero();
  const float* b = bt + c0 * VL;
  for (int x = 0; x < d; ++x) {
    vf bv[NR];
    for (int c = 0; c < NR; ++c) bv[c] = vload(b + x * TILE + c * VL);
    for (int r = 0; r < R; ++r) {
      const vf av = vbcast(a[r * lda + x]);
      for (int c = 0; c < NR; ++c) acc[r][c] += av * bv[c];
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < NR; ++c) vstore(out + r * TILE + (c0 + c) * VL, acc[r][c]);
}

// out[i][0..TILE) = sum_x a[i*lda + x] * bt[x*TILE + ..] for i < rows; bt is [d][TILE] packed.
// Causal at tile level: a block of rows only computes the key vectors below the largest limit of
// its rows (limit[i] = keys query i sees; null: all); out is left unwritten past that.
void tile_nt(const float* a, int64_t lda, int rows, const float* bt, int d, float* out, const int* limit) {
  auto cols = [&](int last_row) {  // register tiles of columns the rows up to last_row need
    if (limit == nullptr) return TV / NR;
    return (limit[last_row] + NR * VL - 1) / (NR * VL);
  };
  int i = 0;
  for (; i + MR <= rows; i += MR) {
    const int nc = cols(i + MR - 1);
    for (int c = 0; c < nc; ++c) micro_nt<MR>(a + i * lda, lda, bt, d, c * NR, out + i * TILE);
  }
  for (; i + 2 <= rows; i += 2) {
    const int nc = cols(i + 1);
    for (int c = 0; c < nc; ++c) micro_nt<2>(a + i * lda, lda, bt, d, c * NR, out + i * TILE);
  }
  for (; i < rows; ++i) {
    const int nc = cols(i);
    for (int c = 0; c < nc; ++c) micro_nt<1>(a + i * lda, lda, bt, d, c * NR, out + i * TILE);
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
      for (int c = 0; c < NC; ++c) xv[c] = vload(x + m * ldx + c * VL);
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
      case 5: return rank_update<5, 2>;
      case 6: return rank_update<6, 2>;
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
    const int block = kVecRegs >= 32 ? 4 : kMaxNC;
    for (int c0 = 0; c0 < nvec; c0 += block) {
      const int nc = std::min(block, nvec - c0);
      rank_update_for(nc)(dst + c0 * VL, ldd, rows, w, wr, wm, x + c0 * VL, ldx, lo, hi);
    }
  }
};

// Packs rows [0, bk) of x (row stride `stride`, d values each) transposed as [d][TILE], zero in
// the columns past bk (they only meet masked pairs, but must not hold NaN or denormals).
void pack_t(const float* __restrict x, int64_t stride, int d, int bk, float* __restrict out) {
  for (int j = 0; j < bk; ++j) {
    const float* row = x + j * stride;
    for (int e = 0; e < d; ++e) out[e * TILE + j] = row[e];
  }
  if (bk < TILE)
    for (int e = 0; e < d; ++e) std::fill(out + e * TILE + bk, out + (e + 1) * TILE, 0.0f);
}

// Packs `rows` rows of d values as [rows][width], zero in the padding columns [d, width).  Rows
// past `rows` are never read.
void pack_rows(const float* __restrict x, int64_t stride, int d, int rows, int width, float* __restrict out) {
  for (int j = 0; j < rows; ++j) {
    const float* src = x + j * stride;
    float* dst = out + j * width;
    for (int e = 0; e < d; ++e) dst[e] = src[e];
    for (int e = d; e < width; ++e) dst[e] = 0.0f;
  }
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

// Splits [0, n) into nt contiguous chunks and runs fn(begin, end) on each.
template <class Fn>
void parallel_chunks(int nt, int64_t n, Fn&& fn) {
  nt = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(nt, n)));
  parallel_run(nt, [&](int t) { fn(n * t / nt, n * (t + 1) / nt); });
}

// ---------------------------------------------------------------------------------------------
// Forward.
void forward(const Problem& p, float* out) {
  zero_uncovered(p, out, p.vstride());
  struct Item { int b, qt; double cost; };
  std::vector<Item> items;
  std::vector<int64_t> tile_base(p.B + 1, 0);
  double total = 0.0;
  for (int b = 0; b < p.B; ++b) {
    const int L = p.row_len(b);
    tile_base[b + 1] = tile_base[b] + (L + TILE - 1) / TILE;
    for (int qt = 0; qt * TILE < L; ++qt) {
      const int i0 = qt * TILE, bq = std::min(TILE, L - i0);
      // pairs (i, j <= i) in the tile's queries, plus a per-query overhead
      double cost = double(bq) * (i0 + 0.5 * (bq + 1)) + 8.0 * bq;
      items.push_back({b, qt, cost});
      total += cost * p.H;
    }
  }
  std::stable_sort(items.begin(), items.end(), [](const Item& a, const Item& c) { return a.cost > c.cost; });
  int nthreads = std::min<int64_t>(num_threads(), int64_t(items.size()));
  if (total * (p.DQ + p.DV) < 2.0e5) nthreads = 1;  // too small to pay for a thread
  nthreads = std::max(nthreads, 1);

  // Per (key tile, head), packed once: k transposed [DQ][TILE] and v as contiguous rows [TILE][DVP]
  // (contiguous operands: rows of the [T, H, d] tensors are H*d apart, and strides that are a
  // multiple of 1 KB make the loads of a tile collide in the L1 cache).  Rows of a single tile
  // are packed by their only work item instead (no reuse, so no extra pass over memory).
  const int DVP = round_up(p.DV, VL);
  const int64_t kt_size = int64_t(p.DQ) * TILE, vp_size = int64_t(TILE) * DVP;
  std::vector<int64_t> shared_base(p.B + 1, 0);  // tiles of rows with >= 2 tiles
  for (int b = 0; b < p.B; ++b) {
    const int64_t nt = tile_base[b + 1] - tile_base[b];
    shared_base[b + 1] = shared_base[b] + (nt >= 2 ? nt : 0);
  }
  Scratch ktg(shared_base[p.B] * p.H * kt_size), vpg(shared_base[p.B] * p.H * vp_size);
  parallel_chunks(nthreads, p.B, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      if (shared_base[b + 1] == shared_base[b]) continue;
      const int64_t s = p.row_start(int(b));
      const int L = p.row_len(int(b));
      for (int t = 0; t * TILE < L; ++t)
        for (int h = 0; h < p.H; ++h) {
          const int64_t tile = (shared_base[b] + t) * p.H + h, tok = s + int64_t(t) * TILE;
          const int bk = std::min(TILE, L - t * TILE);
          pack_t(p.k + tok * p.qstride() + h * p.DQ, p.qstride(), p.DQ, bk, ktg.data() + tile * kt_size);
          pack_rows(p.v + tok * p.vstride() + h * p.DV, p.vstride(), p.DV, bk, DVP, vpg.data() + tile * vp_size);
        }
    }
  });

  std::atomic<size_t> next(0);
  const RankUpdater pv(DVP);
  const float inv_n = 1.0f / static_cast<float>(p.N);

  parallel_run(nthreads, [&](int) {
    std::vector<float> bias(TILE * TILE), S(TILE * TILE), acc(int64_t(p.H) * TILE * DVP);
    std::vector<float> kt_own(kt_size), vp_own(vp_size);
    std::vector<int32_t> bucket(TILE * TILE);
    std::vector<int> limit(TILE), zeros(TILE, 0);
    const vi lane = iota();
    for (;;) {
      size_t idx = next.fetch_add(1);
      if (idx >= items.size()) break;
      const int b = items[idx].b, qt = items[idx].qt;
      const int64_t s = p.row_start(b);
      const int L = p.row_len(b);
      const int i0 = qt * TILE, bq = std::min(TILE, L - i0);
      for (int h = 0; h < p.H; ++h)
        std::fill(acc.begin() + int64_t(h) * TILE * DVP, acc.begin() + (int64_t(h) * TILE + bq) * DVP, 0.0f);
      for (int j0 = 0; j0 <= i0 + bq - 1; j0 += TILE) {
        build_bias(p, b, s, L, i0, bq, j0, bias.data(), limit.data(), bucket.data());
        const bool shared = shared_base[b + 1] > shared_base[b];
        for (int h = 0; h < p.H; ++h) {
          const float* kt = kt_own.data();
          const float* vp = vp_own.data();
          if (shared) {
            const int64_t tile = (shared_base[b] + j0 / TILE) * p.H + h;
            kt = ktg.data() + tile * kt_size;
            vp = vpg.data() + tile * vp_size;
          } else {
            const int64_t tok = s + j0;
            pack_t(p.k + tok * p.qstride() + h * p.DQ, p.qstride(), p.DQ, L - j0, kt_own.data());
            pack_rows(p.v + tok * p.vstride() + h * p.DV, p.vstride(), p.DV, L - j0, DVP, vp_own.data());
          }
          tile_nt(p.q + (s + i0) * p.qstride() + h * p.DQ, p.qstride(), bq, kt, p.DQ, S.data(), limit.data());
          // SiLU on the key vectors a query sees; zeros up to the tile's last query's limit (the
          // rank update reads a group of rows over the union of their ranges)
          const int nv_all = (limit[bq - 1] + VL - 1) / VL;
          for (int i = 0; i < bq; ++i) {
            float* srow = S.data() + i * TILE;
            const float* brow = bias.data() + i * TILE;
            const int nv = (limit[i] + VL - 1) / VL;
            for (int c = 0; c < nv; ++c) {
              vf x = vload(srow + c * VL) + vload(brow + c * VL);
              vf a = x * vsigmoid(x) * inv_n;
              vstore(srow + c * VL, vselect((lane + c * VL) < limit[i], a));
            }
            for (int c = nv; c < nv_all; ++c) vstore(srow + c * VL, vzero());
          }
          pv(acc.data() + int64_t(h) * TILE * DVP, DVP, bq, S.data(), TILE, 1, vp, DVP, zeros.data(), limit.data());
        }
      }
      float* out_rows = out + (s + i0) * p.vstride();
      for (int i = 0; i < bq; ++i)
        for (int h = 0; h < p.H; ++h)
          copy_floats(out_rows + i * p.vstride() + h * p.DV, acc.data() + (int64_t(h) * TILE + i) * DVP, p.DV);
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

  const int nthreads_max = num_threads();
  // Items: (row, heads [h0, h1)).  One group of all heads when that balances; else one per head.
  struct Item { int b, h0, h1; double cost; };
  auto make_items = [&](int groups) {
    std::vector<Item> items;
    for (int b = 0; b < p.B; ++b) {
      const int L = p.row_len(b);
      if (L == 0) continue;
      for (int gi = 0; gi < groups; ++gi) {
        int h0 = p.H * gi / groups, h1 = p.H * (gi + 1) / groups;
        if (h1 > h0) items.push_back({b, h0, h1, (0.5 * L * (L + 1) + 8.0 * L) * (h1 - h0)});
      }
    }
    std::stable_sort(items.begin(), items.end(), [](const Item& a, const Item& c) { return a.cost > c.cost; });
    return items;
  };
  auto assign = [&](const std::vector<Item>& items, int nt, std::vector<std::vector<int>>* lists) {
    std::vector<double> load(nt, 0.0);
    lists->assign(nt, {});
    for (size_t i = 0; i < items.size(); ++i) {
      int best = int(std::min_element(load.begin(), load.end()) - load.begin());
      load[best] += items[i].cost;
      (*lists)[best].push_back(int(i));
    }
    double mx = *std::max_element(load.begin(), load.end());
    double sum = std::accumulate(load.begin(), load.end(), 0.0);
    return sum > 0 ? mx * nt / sum : 1.0;  // imbalance: 1 is perfect
  };
  std::vector<Item> items = make_items(1);
  double total = 0.0;
  int max_len = 0;
  for (const Item& it : items) total += it.cost;
  for (int b = 0; b < p.B; ++b) max_len = std::max(max_len, p.row_len(b));
  int nthreads = std::max(1, std::min<int>(nthreads_max, int(items.size()) * p.H));
  if (total * (p.DQ + p.DV) < 1.0e5) nthreads = 1;
  std::vector<std::vector<int>> lists;
  if (nthreads > 1 && assign(items, nthreads, &lists) > 1.1 && p.H > 1) items = make_items(p.H);
  assign(items, nthreads, &lists);

  const int DQP = round_up(p.DQ, VL), DVP = round_up(p.DV, VL);
  const RankUpdater upd_q(DQP), upd_v(DVP);
  const float inv_n = 1.0f / static_cast<float>(p.N);
  const int64_t npos_pad = int64_t(2) * p.N - 1 + 2 * WPAD;
  std::vector<std::vector<double>> part_pos(nthreads), part_ts(nthreads);

  parallel_run(nthreads, [&](int tid) {
    std::vector<double>& dpos = part_pos[tid];
    std::vector<double>& dts = part_ts[tid];
    dpos.assign(npos_pad, 0.0);
    if (p.ts != nullptr) dts.assign(p.nb + 1, 0.0);
    const int H = p.H;
    const int64_t Lm = max_len;
    std::vector<float> bias(TILE * TILE), S(TILE * TILE), G(TILE * TILE), dsum(TILE * TILE);
    std::vector<int32_t> bucket(TILE * TILE);
    std::vector<float> P(TILE * TILE), dS(TILE * TILE);
    std::vector<float> kt(int64_t(H) * p.DQ * TILE), vt(int64_t(H) * p.DV * TILE);
    std::vector<float> dkacc(int64_t(H) * TILE * DQP), dvacc(int64_t(H) * TILE * DVP);
    Scratch dqacc(int64_t(H) * Lm * DQP);
    // q, k, dout rows of the item as contiguous zero-padded rows [L][DQP or DVP] (see forward)
    Scratch qpack(int64_t(H) * Lm * DQP), kpack(int64_t(H) * Lm * DQP), dopack(int64_t(H) * Lm * DVP);
    std::vector<int> limit(TILE), zeros(TILE, 0), first(TILE), qcount(TILE);
    const vi lane = iota();

    for (int idx : lists[tid]) {
      const Item& it = items[idx];
      const int64_t s = p.row_start(it.b);
      const int L = p.row_len(it.b);
      const int nh = it.h1 - it.h0;
      for (int hh = 0; hh < nh; ++hh) {
        const int h = it.h0 + hh;
        pack_rows(p.q + s * p.qstride() + h * p.DQ, p.qstride(), p.DQ, L, DQP, qpack.data() + hh * Lm * DQP);
        pack_rows(p.k + s * p.qstride() + h * p.DQ, p.qstride(), p.DQ, L, DQP, kpack.data() + hh * Lm * DQP);
        pack_rows(dout + s * p.vstride() + h * p.DV, p.vstride(), p.DV, L, DVP, dopack.data() + hh * Lm * DVP);
        std::fill(dqacc.data() + hh * Lm * DQP, dqacc.data() + (hh * Lm + L) * DQP, 0.0f);
      }
      for (int j0 = 0; j0 < L; j0 += TILE) {
        const int bk = std::min(TILE, L - j0);
        for (int hh = 0; hh < nh; ++hh) {
          const int h = it.h0 + hh;
          pack_t(p.k + (s + j0) * p.qstride() + h * p.DQ, p.qstride(), p.DQ, bk, kt.data() + int64_t(hh) * p.DQ * TILE);
          pack_t(p.v + (s + j0) * p.vstride() + h * p.DV, p.vstride(), p.DV, bk, vt.data() + int64_t(hh) * p.DV * TILE);
          std::fill(dkacc.begin() + int64_t(hh) * TILE * DQP, dkacc.begin() + (int64_t(hh) * TILE + bk) * DQP, 0.0f);
          std::fill(dvacc.begin() + int64_t(hh) * TILE * DVP, dvacc.begin() + (int64_t(hh) * TILE + bk) * DVP, 0.0f);
        }
        for (int i0 = j0; i0 < L; i0 += TILE) {
          const int bq = std::min(TILE, L - i0);
          build_bias(p, it.b, s, L, i0, bq, j0, bias.data(), limit.data(), bucket.data());
          first_queries(limit.data(), bq, bk, first.data());
          std::fill(qcount.begin(), qcount.end(), bq);
          std::fill(dsum.begin(), dsum.begin() + bq * TILE, 0.0f);
          for (int hh = 0; hh < nh; ++hh) {
            const int h = it.h0 + hh;
            tile_nt(qpack.data() + (hh * Lm + i0) * DQP, DQP, bq, kt.data() + int64_t(hh) * p.DQ * TILE, p.DQ, S.data(),
                    limit.data());
            tile_nt(dopack.data() + (hh * Lm + i0) * DVP, DVP, bq, vt.data() + int64_t(hh) * p.DV * TILE, p.DV, G.data(),
                    limit.data());
            // key vectors past a query's limit: P = dS = 0 up to the tile's keys (read by the
            // transposed updates over groups of keys)
            const int nv_keys = (bk + VL - 1) / VL;
            for (int i = 0; i < bq; ++i) {
              const int nv = (limit[i] + VL - 1) / VL;
              for (int c = nv; c < nv_keys; ++c) {
                vstore(P.data() + i * TILE + c * VL, vzero());
                vstore(dS.data() + i * TILE + c * VL, vzero());
              }
              for (int c = 0; c < nv; ++c) {
                const int o = i * TILE + c * VL;
                vf x = vload(S.data() + o) + vload(bias.data() + o);
                vf sg = vsigmoid(x);
                vi m = (lane + c * VL) < limit[i];
                vf a = vselect(m, x * sg * inv_n);
                vf ds = vselect(m, vload(G.data() + o) * (sg * (1.0f + x * (1.0f - sg))) * inv_n);
                vstore(P.data() + o, a);
                vstore(dS.data() + o, ds);
                vstore(dsum.data() + o, vload(dsum.data() + o) + ds);
              }
            }
            // dq[i] += sum_j dS[i][j] k[j];  dk[j] += sum_i dS[i][j] q[i];  dv[j] += sum_i P[i][j] dout[i]
            upd_q(dqacc.data() + (hh * Lm + i0) * DQP, DQP, bq, dS.data(), TILE, 1, kpack.data() + (hh * Lm + j0) * DQP,
                  DQP, zeros.data(), limit.data());
            upd_q(dkacc.data() + int64_t(hh) * TILE * DQP, DQP, bk, dS.data(), 1, TILE, qpack.data() + (hh * Lm + i0) * DQP,
                  DQP, first.data(), qcount.data());
            upd_v(dvacc.data() + int64_t(hh) * TILE * DVP, DVP, bk, P.data(), 1, TILE, dopack.data() + (hh * Lm + i0) * DVP,
                  DVP, first.data(), qcount.data());
          }
          // weight gradients: sum over heads of dS, by relative position and by time bucket
          for (int i = 0; i < bq; ++i) {
            const int ig = i0 + i;
            double* dp = dpos.data() + WPAD + (p.N - 1 - ig + j0);
            const float* drow = dsum.data() + i * TILE;
            for (int j = 0; j < limit[i]; ++j) dp[j] += drow[j];
            if (p.ts != nullptr) {
              const int32_t* brow = bucket.data() + i * TILE;
              for (int j = 0; j < limit[i]; ++j) dts[brow[j]] += drow[j];
            }
          }
        }
        for (int hh = 0; hh < nh; ++hh) {
          const int h = it.h0 + hh;
          for (int j = 0; j < bk; ++j) {
            copy_floats(g.dk + (s + j0 + j) * p.qstride() + h * p.DQ, dkacc.data() + (int64_t(hh) * TILE + j) * DQP, p.DQ);
            copy_floats(g.dv + (s + j0 + j) * p.vstride() + h * p.DV, dvacc.data() + (int64_t(hh) * TILE + j) * DVP, p.DV);
          }
        }
      }
      for (int hh = 0; hh < nh; ++hh)
        for (int i = 0; i < L; ++i)
          copy_floats(g.dq + (s + i) * p.qstride() + (it.h0 + hh) * p.DQ, dqacc.data() + (hh * Lm + i) * DQP, p.DQ);
    }
  });

  const int64_t nrel = std::min<int64_t>(int64_t(2) * p.N - 1, g.npos);
  for (int64_t r = 0; r < nrel; ++r) {
    double acc = 0.0;
    for (int t = 0; t < nthreads; ++t) acc += part_pos[t][WPAD + r];
    g.dwpos[r] = static_cast<float>(acc);
  }
  if (g.dwts != nullptr && p.ts != nullptr) {
    for (int64_t r = 0; r <= p.nb && r < g.nts; ++r) {
      double acc = 0.0;
      for (int t = 0; t < nthreads; ++t) acc += part_ts[t][r];
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
  if (nparam != nin + expected_outputs) return 10;
  int iq = 0, ik = 1, iv = 2, ioff = 3;
  int its = with_ts ? 4 : -1;
  int ireq = with_ts ? 5 : -1;
  int iwp = with_ts ? 6 : 4;
  int iwt = with_ts ? 7 : -1;
  int icar = with_ts ? 8 : 5;
  if (ndims[iq] != 3 || ndims[ik] != 3 || ndims[iv] != 3) return 11;
  for (int i : {iq, ik, iv, iwp}) if (!is_f32(dtypes[i])) return 12;
  p->T = shapes[iq][0];
  p->H = static_cast<int>(shapes[iq][1]);
  p->DQ = static_cast<int>(shapes[iq][2]);
  p->DV = static_cast<int>(shapes[iv][2]);
  if (shapes[ik][0] != p->T || shapes[ik][1] != p->H || shapes[ik][2] != p->DQ) return 13;
  if (shapes[iv][0] != p->T || shapes[iv][1] != p->H) return 13;
  if (ndims[icar] < 1) return 14;
  p->N = static_cast<int>(shapes[icar][0]);
  if (p->N < 1) return 14;
  if (ndims[ioff] != 1 || shapes[ioff][0] < 1) return 15;
  p->B = static_cast<int>(shapes[ioff][0] - 1);
  if (!read_ints(params[ioff], dtypes[ioff], shapes[ioff][0], &p->off)) return 16;
  if (!offsets_ok(p->off, p->T)) return 17;
  p->q = static_cast<const float*>(params[iq]);
  p->k = static_cast<const float*>(params[ik]);
  p->v = static_cast<const float*>(params[iv]);
  const int64_t npos = numel(ndims[iwp], shapes[iwp]);
  if (npos < int64_t(2) * p->N - 1) return 18;
  p->wpos.assign(int64_t(2) * p->N - 1 + 2 * WPAD, 0.0f);
  std::memcpy(p->wpos.data() + WPAD, params[iwp], sizeof(float) * (2 * p->N - 1));
  if (with_ts) {
    if (!is_dtype(dtypes[its], "int64") || numel(ndims[its], shapes[its]) != p->T) return 19;
    if (!is_f32(dtypes[iwt])) return 12;
    if (!is_dtype(dtypes[ireq], "int64") || numel(ndims[ireq], shapes[ireq]) != p->B) return 24;
    p->ts = static_cast<const int64_t*>(params[its]);
    p->req = static_cast<const int64_t*>(params[ireq]);
    p->wts = static_cast<const float*>(params[iwt]);
    const int64_t nts = numel(ndims[iwt], shapes[iwt]);
    if (nts < 1) return 20;
    p->nb = static_cast<int>(nts - 1);
    p->buckets = &bucket_table(p->nb);
  }
  if (with_dout) {
    const int idout = nin - 1;
    if (!is_f32(dtypes[idout]) || numel(ndims[idout], shapes[idout]) != p->T * p->vstride()) return 21;
  }
  return 0;
}

int run_forward(int nparam, void** params, int* ndims, int64_t** shapes, const char** dtypes, bool with_ts) try {
  Problem p;
  int rc = parse(nparam, params, ndims, shapes, dtypes, with_ts, false, 1, &p);
  if (rc != 0) return rc;
  float* out = static_cast<float*>(params[nparam - 1]);
  if (!is_f32(dtypes[nparam - 1]) || numel(ndims[nparam - 1], shapes[nparam - 1]) != p.T * p.vstride()) return 22;
  forward(p, out);
  return 0;
} catch (...) {  // e.g. std::bad_alloc, or a thread that could not start: MindSpore reports the failure
  return 99;
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
    return 23;
  backward(p, dout, g);
  return 0;
} catch (...) {
  return 99;
}

}  // namespace
}  // namespace mindgr

extern "C" {

// out = hstu_attention(q, k, v, offsets, timestamps, request_times, w_pos, w_ts; N = len(carrier))
int MindgrHstuFwd(int nparam, void** params, int* ndims, int64_t** shapes, const char** dtypes,
                  void* /*stream*/, void* /*extra*/) {
  return mindgr::run_forward(nparam, params, ndims, shapes, dtypes, true);
}

// out = hstu_attention(q, k, v, offsets, w_pos; N = len(carrier)), no time bias
int MindgrHstuFwdNoTs(int nparam, void** params, int* ndims, int64_t** shapes, const char** dtypes,
                      void* /*stream*/, void* /*extra*/) {
  return mindgr::run_forward(nparam, params, ndims, shapes, dtypes, false);
}

// (dq, dk, dv, dw_pos, dw_ts) from (q, k, v, offsets, timestamps, request_times, w_pos, w_ts, carrier, dout)
int MindgrHstuBwd(int nparam, void** params, int* ndims, int64_t** shapes, const char** dtypes,
                  void* /*stream*/, void* /*extra*/) {
  return mindgr::run_backward(nparam, params, ndims, shapes, dtypes, true);
}

// (dq, dk, dv, dw_pos) from (q, k, v, offsets, w_pos, carrier, dout)
int MindgrHstuBwdNoTs(int nparam, void** params, int* ndims, int64_t** shapes, const char** dtypes,
                      void* /*stream*/, void* /*extra*/) {
  return mindgr::run_backward(nparam, params, ndims, shapes, dtypes, false);
}

// For tests: the time bucket the kernels use for a gap, and the thread count they would use.
int mindgr_time_bucket(int64_t dt, int num_buckets) {
  return mindgr::bucket_table(num_buckets)(dt < 0 ? -dt : dt);
}

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
