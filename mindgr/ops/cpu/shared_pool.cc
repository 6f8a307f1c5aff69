// Fused shared-pool sampled softmax: every token's log-sum-exp against ONE candidate set, streamed
// over the candidates in cache-sized chunks with an online max/sum, so [T, K] never exists.
//   MindgrPoolLse(x [T, D] f32, cand [K, D] f32|f16, logq [K] f32, ids [K] int32, targets [T] int32,
//                 pos [T] f32) -> lse [T] f32
//     lse[t] = log(exp(pos[t]) + sum_{k: ids[k] != 0, ids[k] != targets[t]} exp(x[t] . cand[k] - logq[k]))
//     for real tokens (targets[t] > 0); 0 for targets[t] <= 0 (padding, the unused tail).
//   MindgrPoolLseBwd(x, cand, logq, ids, targets, pos, lse, dlse [T] f32)
//       -> d_x [T, D], d_cand [K, D], d_logq [K], d_pos [T] (all f32)
//     with w[t, k] = dlse[t] * exp(l[t, k] - lse[t]) (0 for masked pairs and non-real tokens):
//     d_x[t] = sum_k w cand[k], d_cand[k] = sum_t w x[t], d_logq[k] = -sum_t w,
//     d_pos[t] = dlse[t] * exp(pos[t] - lse[t]).
// Only real tokens are touched: their rows are first packed into a dense, zero-padded [Tv, Dp] copy.
// Logits of a block of 4 tokens x one chunk live in a small buffer (L1); the forward splits tokens
// over threads, the backward recomputes the chunk logits and splits the chunks into a FIXED number of
// slabs (from the shapes, never the thread count): a slab owns its candidates' d_cand / d_logq rows
// and keeps its own partial d_x, and the partials are added in slab order. Every sum therefore runs in
// an order fixed by the inputs: bitwise reproducible and independent of the thread count, no atomics.
// Return codes: 10 wrong argument count, 11 wrong ranks, 12 wrong dtypes, 13 inconsistent shapes,
// 99 out of memory or threads unavailable.
#include <cmath>

#include "common.h"

namespace mindgr {
namespace {

constexpr int TB = 4;   // tokens per micro-block (rows of the register tile)
constexpr int KV = 2 * VL;  // candidates per micro-kernel step (two vectors); chunks are multiples
constexpr int kMaxSlabs = 8;
constexpr int64_t kSlabBudgetBytes = int64_t(64) << 20;  // all slabs' partial d_x together

inline vi vload_i(const int32_t* p) {
  vi r;
  std::memcpy(&r, p, sizeof(r));
  return r;
}

// mask ? a : b for a -1/0 lane mask.
inline vf vblend(vi mask, vf a, vf b) {
  vi ia, ib;
  std::memcpy(&ia, &a, sizeof(ia));
  std::memcpy(&ib, &b, sizeof(ib));
  vi r = (ia & mask) | (ib & ~mask);
  vf out;
  std::memcpy(&out, &r, sizeof(out));
  return out;
}

// Lane sum and lane max in a fixed order (same result whatever the thread layout).
inline float lane_sum(vf v) {
  float a[VL];
  std::memcpy(a, &v, sizeof(a));
  for (int w = VL / 2; w >= 1; w /= 2)
    for (int i = 0; i < w; ++i) a[i] += a[i + w];
  return a[0];
}

inline float lane_max(vf v) {
  float a[VL];
  std::memcpy(a, &v, sizeof(a));
  float m = a[0];
  for (int i = 1; i < VL; ++i) m = a[i] > m ? a[i] : m;
  return m;
}

inline float half_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  if (exp == 0) {  // zero or subnormal: man * 2^-24
    const float f = float(man) * 5.9604644775390625e-8f;
    return sign ? -f : f;
  }
  const uint32_t bits = sign | (exp == 0x1fu ? 0x7f800000u : (exp + 112u) << 23) | (man << 13);
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

inline int threads_for(int64_t work, int64_t items) {
  int nt = num_threads();
  if (work < (int64_t(1) << 18)) nt = 1;
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(nt, items)));
}

struct Pool {
  int64_t T = 0, D = 0, K = 0, Dp = 0, KC = 0;  // Dp: D rounded up to 16; KC: candidates per chunk
  bool half = false;
  const float* x = nullptr;
  const void* cand = nullptr;
  const float* logq = nullptr;
  const int32_t* ids = nullptr;
  const int32_t* targets = nullptr;
  const float* pos = nullptr;
  int64_t chunks() const { return (K + KC - 1) / KC; }
  float cand_at(int64_t k, int64_t d) const {
    return half ? half_to_float(static_cast<const uint16_t*>(cand)[k * D + d])
                : static_cast<const float*>(cand)[k * D + d];
  }
};

// Chunk size: the transposed chunk [D, KC] in about 32 KB (L1), a multiple of KV, 32..512.
int64_t chunk_size(int64_t D) {
  const int64_t kc = (int64_t(32768) / (4 * std::max<int64_t>(D, 1))) / KV * KV;
  return std::min<int64_t>(512, std::max<int64_t>(KV, kc));
}

// Real tokens packed densely: rows of x (zero padded to Dp), targets, and where each came from. The
// count is rounded up to TB with zero rows of target -1 (they match no candidate and get weight 0).
struct Tokens {
  std::vector<int64_t> index;  // original token of each packed row (Tv entries)
  std::vector<int32_t> target; // Tvp entries
  int64_t Tv = 0, Tvp = 0;
  std::unique_ptr<Scratch> X;  // [Tvp, Dp]
};

void pack_tokens(const Pool& p, Tokens* tk) {
  for (int64_t t = 0; t < p.T; ++t)
    if (p.targets[t] > 0) tk->index.push_back(t);
  tk->Tv = int64_t(tk->index.size());
  tk->Tvp = (tk->Tv + TB - 1) / TB * TB;
  tk->target.assign(size_t(tk->Tvp), -1);
  tk->X.reset(new Scratch(size_t(std::max<int64_t>(tk->Tvp, 1) * p.Dp)));
  float* X = tk->X->data();
  std::memset(X, 0, sizeof(float) * size_t(tk->Tvp * p.Dp));
  for (int64_t j = 0; j < tk->Tv; ++j) {
    const int64_t t = tk->index[size_t(j)];
    tk->target[size_t(j)] = p.targets[t];
    std::memcpy(X + j * p.Dp, p.x + t * p.D, sizeof(float) * size_t(p.D));
  }
}

// One chunk of candidates in the layouts the kernels read: transposed [D, KC] for the logits, rows
// [KC, Dp] for d_x (only when `rows`), logq and ids. Slots past K are zero with id 0 (masked).
struct Chunk {
  int64_t k0 = 0, kc = 0;
  std::vector<float> CT, rows, logq;
  std::vector<int32_t> ids;
  Chunk(const Pool& p, bool with_rows)
      : CT(size_t(p.D * p.KC)), rows(with_rows ? size_t(p.KC * p.Dp) : 0), logq(size_t(p.KC)), ids(size_t(p.KC)) {}

  void load(const Pool& p, int64_t c) {
    k0 = c * p.KC;
    kc = std::min(p.KC, p.K - k0);
    const bool with_rows = !rows.empty();
    if (with_rows) std::fill(rows.begin(), rows.end(), 0.0f);
    for (int64_t k = 0; k < p.KC; ++k) {
      const bool real = k < kc;
      logq[size_t(k)] = real ? p.logq[k0 + k] : 0.0f;
      ids[size_t(k)] = real ? p.ids[k0 + k] : 0;
      for (int64_t d = 0; d < p.D; ++d) {
        const float v = real ? p.cand_at(k0 + k, d) : 0.0f;
        CT[size_t(d * p.KC + k)] = v;
        if (with_rows) rows[size_t(k * p.Dp + d)] = v;
      }
    }
  }
};

// L[i, k] = X[i] . cand[k] for the TB rows of X and the chunk's KC candidates (vectorised over k).
void block_logits(const float* X, int64_t Dp, const Chunk& ch, int64_t D, int64_t KC, float* L) {
  const float* CT = ch.CT.data();
  for (int64_t k = 0; k < KC; k += KV) {
    vf a[TB][2];
    for (int i = 0; i < TB; ++i) a[i][0] = a[i][1] = vzero();
    for (int64_t d = 0; d < D; ++d) {
      const vf c0 = vload(CT + d * KC + k), c1 = vload(CT + d * KC + k + VL);
      for (int i = 0; i < TB; ++i) {
        const vf xb = vbcast(X[i * Dp + d]);
        a[i][0] += xb * c0;
        a[i][1] += xb * c1;
      }
    }
    for (int i = 0; i < TB; ++i) {
      vstore(L + i * KC + k, a[i][0]);
      vstore(L + i * KC + k + VL, a[i][1]);
    }
  }
}

// Lanes of candidates that count for a token with this target: real ids, no accidental hit.
inline vi keep_mask(const int32_t* ids, vi target) {
  const vi id = vload_i(ids);
  return (id != vi{}) & (id != target);
}

// Folds one chunk's logits of one token into its running (max m, sum s of exp(l - m)).
void online_update(float* l, const Chunk& ch, int64_t KC, int32_t target, float* m, float* s) {
  const vi tg = vi{} + target;
  const vf ninf = vbcast(-INFINITY);
  vf vmax = ninf;
  for (int64_t k = 0; k < KC; k += VL) {
    const vf v = vblend(keep_mask(ch.ids.data() + k, tg), vload(l + k) - vload(ch.logq.data() + k), ninf);
    vstore(l + k, v);
    vmax = v > vmax ? v : vmax;
  }
  const float cmax = lane_max(vmax);
  if (cmax > *m) {  // rescale the sum to the new max (never for an all-masked chunk: cmax = -inf)
    *s *= std::exp(*m - cmax);
    *m = cmax;
  }
  const vf vm = vbcast(*m);
  vf acc = vzero();
  for (int64_t k = 0; k < KC; k += VL) {
    const vf v = vload(l + k);
    acc += vblend(v > ninf, vexp(v - vm), vzero());
  }
  *s += lane_sum(acc);
}

// ---------------------------------------------------------------------------------------------
void forward(const Pool& p, float* lse) {
  Tokens tk;
  pack_tokens(p, &tk);
  const int64_t nblocks = tk.Tvp / TB, nch = p.chunks();
  std::vector<float> m(size_t(tk.Tvp)), s(size_t(tk.Tvp), 1.0f);  // the positive term: exp(pos - pos)
  for (int64_t j = 0; j < tk.Tv; ++j) m[size_t(j)] = p.pos[tk.index[size_t(j)]];
  const float* X = tk.X->data();
  const int nt = threads_for(tk.Tv * p.K * p.D, nblocks);
  if (tk.Tv > 0 && nch > 0) parallel_run(nt, [&](int tid) {
    const int64_t b0 = nblocks * tid / nt, b1 = nblocks * (tid + 1) / nt;
    Chunk ch(p, false);
    std::vector<float> L(size_t(TB * p.KC));
    for (int64_t c = 0; c < nch; ++c) {  // chunk outer: the chunk stays in cache for all my tokens
      ch.load(p, c);
      for (int64_t b = b0; b < b1; ++b) {
        block_logits(X + b * TB * p.Dp, p.Dp, ch, p.D, p.KC, L.data());
        for (int i = 0; i < TB; ++i) {
          const int64_t j = b * TB + i;
          online_update(L.data() + i * p.KC, ch, p.KC, tk.target[size_t(j)], &m[size_t(j)], &s[size_t(j)]);
        }
      }
    }
  });
  std::memset(lse, 0, sizeof(float) * size_t(p.T));
  for (int64_t j = 0; j < tk.Tv; ++j) lse[tk.index[size_t(j)]] = m[size_t(j)] + std::log(s[size_t(j)]);
}

// ---------------------------------------------------------------------------------------------
// Backward micro-kernels on column groups of NV vectors (NV * 16 floats of Dp).

// P[i] += sum_k W[i, k] rows[k] (the token block's partial d_x).
template <int NV>
void acc_dx(const float* W, int64_t KC, int64_t kc, const float* rows, int64_t Dp, float* P) {
  vf a[TB][NV];
  for (int i = 0; i < TB; ++i)
    for (int v = 0; v < NV; ++v) a[i][v] = vload(P + i * Dp + v * VL);
  for (int64_t k = 0; k < kc; ++k) {
    vf c[NV];
    for (int v = 0; v < NV; ++v) c[v] = vload(rows + k * Dp + v * VL);
    for (int i = 0; i < TB; ++i) {
      const vf w = vbcast(W[i * KC + k]);
      for (int v = 0; v < NV; ++v) a[i][v] += w * c[v];
    }
  }
  for (int i = 0; i < TB; ++i)
    for (int v = 0; v < NV; ++v) vstore(P + i * Dp + v * VL, a[i][v]);
}

// dC[k] += sum_i W[i, k] X[i] (the chunk's d_cand, tokens in block order).
template <int NV>
void acc_dc(const float* W, int64_t KC, int64_t kc, const float* X, int64_t Dp, float* dC) {
  vf xr[TB][NV];
  for (int i = 0; i < TB; ++i)
    for (int v = 0; v < NV; ++v) xr[i][v] = vload(X + i * Dp + v * VL);
  for (int64_t k = 0; k < kc; ++k) {
    vf a[NV];
    for (int v = 0; v < NV; ++v) a[v] = vload(dC + k * Dp + v * VL);
    for (int i = 0; i < TB; ++i) {
      const vf w = vbcast(W[i * KC + k]);
      for (int v = 0; v < NV; ++v) a[v] += w * xr[i][v];
    }
    for (int v = 0; v < NV; ++v) vstore(dC + k * Dp + v * VL, a[v]);
  }
}

// Runs fn<NV>(column offset) over Dp in groups of up to 4 vectors (64 floats).
template <template <int> class F, class... A>
void by_column_groups(int64_t Dp, A... args) {
  for (int64_t c = 0; c < Dp; c += 4 * VL) {
    switch ((Dp - c) / VL) {
      case 1: F<1>::run(c, args...); break;
      case 2: F<2>::run(c, args...); break;
      case 3: F<3>::run(c, args...); break;
      default: F<4>::run(c, args...); break;
    }
  }
}

template <int NV>
struct DxGroup {
  static void run(int64_t c, const float* W, int64_t KC, int64_t kc, const float* rows, int64_t Dp, float* P) {
    acc_dx<NV>(W, KC, kc, rows + c, Dp, P + c);
  }
};

template <int NV>
struct DcGroup {
  static void run(int64_t c, const float* W, int64_t KC, int64_t kc, const float* X, int64_t Dp, float* dC) {
    acc_dc<NV>(W, KC, kc, X + c, Dp, dC + c);
  }
};

// Turns one token's chunk logits into weights w = g * exp(l - logq - lse), 0 where masked.
void to_weights(float* l, const Chunk& ch, int64_t KC, int32_t target, float g, float lse) {
  const vi tg = vi{} + target;
  const vf vl = vbcast(lse), vg = vbcast(g);
  for (int64_t k = 0; k < KC; k += VL) {
    const vf e = vexp(vload(l + k) - vload(ch.logq.data() + k) - vl) * vg;
    vstore(l + k, vblend(keep_mask(ch.ids.data() + k, tg), e, vzero()));
  }
}

int slab_count(int64_t nch, int64_t Tvp, int64_t Dp) {
  int64_t S = std::min<int64_t>(nch, kMaxSlabs);
  while (S > 1 && S * Tvp * Dp * int64_t(sizeof(float)) > kSlabBudgetBytes) --S;
  return static_cast<int>(std::max<int64_t>(S, 1));
}

void backward(const Pool& p, const float* lse_in, const float* dlse, float* d_x, float* d_cand, float* d_logq,
              float* d_pos) {
  Tokens tk;
  pack_tokens(p, &tk);
  const int64_t nblocks = tk.Tvp / TB, nch = p.chunks(), Dp = p.Dp;
  std::vector<float> g(size_t(tk.Tvp), 0.0f), lse(size_t(tk.Tvp), 0.0f);
  for (int64_t j = 0; j < tk.Tv; ++j) {
    g[size_t(j)] = dlse[tk.index[size_t(j)]];
    lse[size_t(j)] = lse_in[tk.index[size_t(j)]];
  }
  const float* X = tk.X->data();
  const int S = slab_count(nch, tk.Tvp, Dp);
  Scratch part_buf(size_t(S) * size_t(std::max<int64_t>(tk.Tvp, 1) * Dp));
  float* part = part_buf.data();
  const int nt = threads_for(tk.Tv * p.K * p.D, S);
  parallel_run(nt, [&](int tid) {
    Chunk ch(p, true);
    std::vector<float> L(size_t(TB * p.KC)), dC(size_t(p.KC * Dp)), dq(size_t(p.KC));
    for (int sl = tid; sl < S; sl += nt) {
      float* P = part + int64_t(sl) * tk.Tvp * Dp;
      std::memset(P, 0, sizeof(float) * size_t(tk.Tvp * Dp));
      for (int64_t c = nch * sl / S; c < nch * (sl + 1) / S; ++c) {
        ch.load(p, c);
        std::fill(dC.begin(), dC.end(), 0.0f);
        std::fill(dq.begin(), dq.end(), 0.0f);
        for (int64_t b = 0; b < nblocks; ++b) {
          const float* Xb = X + b * TB * Dp;
          block_logits(Xb, Dp, ch, p.D, p.KC, L.data());
          for (int i = 0; i < TB; ++i) {
            const int64_t j = b * TB + i;
            to_weights(L.data() + i * p.KC, ch, p.KC, tk.target[size_t(j)], g[size_t(j)], lse[size_t(j)]);
          }
          for (int64_t k = 0; k < p.KC; k += VL) {
            vf w = vzero();
            for (int i = 0; i < TB; ++i) w += vload(L.data() + i * p.KC + k);
            vstore(dq.data() + k, vload(dq.data() + k) - w);
          }
          by_column_groups<DxGroup>(Dp, (const float*)L.data(), p.KC, ch.kc, (const float*)ch.rows.data(), Dp,
                                    P + b * TB * Dp);
          by_column_groups<DcGroup>(Dp, (const float*)L.data(), p.KC, ch.kc, Xb, Dp, dC.data());
        }
        for (int64_t k = 0; k < ch.kc; ++k) {
          std::memcpy(d_cand + (ch.k0 + k) * p.D, dC.data() + k * Dp, sizeof(float) * size_t(p.D));
          d_logq[ch.k0 + k] = dq[size_t(k)];
        }
      }
    }
  });
  // d_x = partials added in slab order; rows and d_pos of non-real tokens are zero.
  std::memset(d_x, 0, sizeof(float) * size_t(p.T * p.D));
  std::memset(d_pos, 0, sizeof(float) * size_t(p.T));
  const int nr = threads_for(int64_t(S) * tk.Tv * Dp, std::max<int64_t>(tk.Tv, 1));
  parallel_run(nr, [&](int tid) {
    std::vector<float> row(static_cast<size_t>(Dp));
    for (int64_t j = tk.Tv * tid / nr; j < tk.Tv * (tid + 1) / nr; ++j) {
      for (int64_t c = 0; c < Dp; c += VL) {
        vf a = vload(part + j * Dp + c);
        for (int sl = 1; sl < S; ++sl) a += vload(part + (int64_t(sl) * tk.Tvp + j) * Dp + c);
        vstore(row.data() + c, a);
      }
      const int64_t t = tk.index[size_t(j)];
      std::memcpy(d_x + t * p.D, row.data(), sizeof(float) * size_t(p.D));
      d_pos[t] = g[size_t(j)] * std::exp(p.pos[t] - lse[size_t(j)]);
    }
  });
}

// ---------------------------------------------------------------------------------------------
bool is_i32(const char* dt) { return is_dtype(dt, "int32") || is_dtype(dt, "int"); }

// Reads and checks the six inputs shared by both ops.
int read_inputs(void** params, int* ndims, int64_t** shapes, const char** dtypes, Pool* p) {
  MINDGR_REJECT_IF(ndims[0] != 2 || ndims[1] != 2 || ndims[2] != 1 || ndims[3] != 1 || ndims[4] != 1 || ndims[5] != 1, kRank);
  MINDGR_REJECT_IF(!is_f32(dtypes[0]) || !is_f32(dtypes[2]) || !is_f32(dtypes[5]), kDtype);
  MINDGR_REJECT_IF(!is_i32(dtypes[3]) || !is_i32(dtypes[4]), kDtype);
  if (is_dtype(dtypes[1], "float16")) p->half = true;
  else MINDGR_REJECT_IF(!is_f32(dtypes[1]), kDtype);
  p->T = shapes[0][0];
  p->D = shapes[0][1];
  p->K = shapes[1][0];
  if (shapes[1][1] != p->D || shapes[2][0] != p->K || shapes[3][0] != p->K || shapes[4][0] != p->T ||
      shapes[5][0] != p->T)
    MINDGR_FAIL(kShape);
  p->Dp = (p->D + VL - 1) / VL * VL;
  p->KC = chunk_size(p->D);
  p->x = static_cast<const float*>(params[0]);
  p->cand = params[1];
  p->logq = static_cast<const float*>(params[2]);
  p->ids = static_cast<const int32_t*>(params[3]);
  p->targets = static_cast<const int32_t*>(params[4]);
  p->pos = static_cast<const float*>(params[5]);
  return 0;
}

bool is_vec(int* ndims, int64_t** shapes, const char** dtypes, int i, int64_t n) {
  return ndims[i] == 1 && shapes[i][0] == n && is_f32(dtypes[i]);
}

bool is_mat(int* ndims, int64_t** shapes, const char** dtypes, int i, int64_t r, int64_t c) {
  return ndims[i] == 2 && shapes[i][0] == r && shapes[i][1] == c && is_f32(dtypes[i]);
}

int run_forward(int nparam, void** params, int* ndims, int64_t** shapes, const char** dtypes) try {
  MINDGR_REJECT_IF(nparam != 7, kArgCount);
  Pool p;
  if (int rc = read_inputs(params, ndims, shapes, dtypes, &p)) return rc;
  MINDGR_REJECT_IF(!is_vec(ndims, shapes, dtypes, 6, p.T), kOutput);
  forward(p, static_cast<float*>(params[6]));
  return 0;
} catch (...) {
  MINDGR_FAIL(kResources);
}

int run_backward(int nparam, void** params, int* ndims, int64_t** shapes, const char** dtypes) try {
  MINDGR_REJECT_IF(nparam != 12, kArgCount);
  Pool p;
  if (int rc = read_inputs(params, ndims, shapes, dtypes, &p)) return rc;
  MINDGR_REJECT_IF(!is_vec(ndims, shapes, dtypes, 6, p.T), kOutput);  // the forward's lse
  MINDGR_REJECT_IF(!is_vec(ndims, shapes, dtypes, 7, p.T), kGradient);
  MINDGR_REJECT_IF(!is_mat(ndims, shapes, dtypes, 8, p.T, p.D) || !is_mat(ndims, shapes, dtypes, 9, p.K, p.D) ||
                       !is_vec(ndims, shapes, dtypes, 10, p.K) || !is_vec(ndims, shapes, dtypes, 11, p.T),
                   kOutput);
  float* d_cand = static_cast<float*>(params[9]);
  float* d_logq = static_cast<float*>(params[10]);
  std::memset(d_cand, 0, sizeof(float) * size_t(p.K * p.D));
  std::memset(d_logq, 0, sizeof(float) * size_t(p.K));
  backward(p, static_cast<const float*>(params[6]), static_cast<const float*>(params[7]),
           static_cast<float*>(params[8]), d_cand, d_logq, static_cast<float*>(params[11]));
  return 0;
} catch (...) {
  MINDGR_FAIL(kResources);
}

}  // namespace
}  // namespace mindgr

// lse = pool_lse(x, cand, logq, ids, targets, pos)
MINDGR_AOT_OP(MindgrPoolLse, mindgr::run_forward)

// (d_x, d_cand, d_logq, d_pos) from (x, cand, logq, ids, targets, pos, lse, dlse)
MINDGR_AOT_OP(MindgrPoolLseBwd, mindgr::run_backward)
