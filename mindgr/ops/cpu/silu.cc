// SiLU of a projection split along its last axis (HSTU's u, v, q, k = split(SiLU(LN(x) W_uvqk))), with
// MindSpore's custom AOT signature. x is [.., W]; the K outputs (K >= 1) are [.., w_k] with sum w_k = W,
// their widths read from the output shapes (the forward's inputs carry them as K vectors of length w_k,
// which only the op's shape inference reads).
//   MindgrSiluSplit(x, car_0 .. car_{K-1}, out_0 .. out_{K-1}):    out_k = SiLU(x[.., o_k : o_k + w_k]),  SiLU(a) = a * s(a)
//   MindgrSiluSplitBwd(x, d_0 .. d_{K-1}, dx):   dx[.., o_k + j] = d_k[.., j] * s(a) * (1 + a * (1 - s(a)))
// with s = sigmoid = 1 / (1 + exp(-a)) (common.h: vexp about 1 ulp, vrecip within 4e-7 relative, so SiLU
// within ~5e-7 of max(|SiLU|, 1)). One pass over x forward, one over (x, d) backward, each element
// alone: bitwise reproducible and independent of the thread count. Widths that are not whole vectors
// (ML-1M: 4 x 50) go through a row buffer, so that a row costs one partial vector, not one per
// segment. This replaces, per projection, the generic Sigmoid + Mul forward and Mul, Mul,
// SigmoidGrad, Add backward, and the split's gradient (zero-filled [.., W] buffers summed) by one
// write of dx.
// Return codes: 10 wrong argument count, 11 wrong ranks, 12 wrong dtypes, 13 inconsistent shapes,
// 99 threads unavailable.
#include <cstring>
#include <vector>

#include "common.h"

namespace mindgr {
namespace {

struct Split {
  int64_t R = 0, W = 0;
  std::vector<int64_t> width;  // per output
};

// params: x, `skip` tensors not checked here (the forward's width carriers), then K tensors [.., w_k]
// (outputs forward; gradients backward), then `extra` tensors [.., W] (backward: dx).
int check(int nparam, int K, int skip, int extra, int* ndims, int64_t** shapes, const char** dtypes,
          Split* s) {
  MINDGR_REJECT_IF(K < 1 || nparam != 1 + skip + K + extra, kArgCount);
  for (int i = 0; i < nparam; ++i)
    MINDGR_REJECT_IF(!is_f32(dtypes[i]), kDtype);
  const int nd = ndims[0];
  MINDGR_REJECT_IF(nd < 1, kRank);
  for (int i = 0; i < nparam; ++i) {
    if (i >= 1 && i <= skip) continue;
    MINDGR_REJECT_IF(ndims[i] != nd, kRank);
    for (int k = 0; k + 1 < nd; ++k)
      MINDGR_REJECT_IF(shapes[i][k] != shapes[0][k], kShape);
  }
  s->W = shapes[0][nd - 1];
  int64_t sum = 0;
  for (int k = 0; k < K; ++k) {
    s->width.push_back(shapes[1 + skip + k][nd - 1]);
    sum += s->width.back();
  }
  MINDGR_REJECT_IF(sum != s->W, kShape);
  MINDGR_REJECT_IF(extra == 1 && shapes[nparam - 1][nd - 1] != s->W, kShape);
  s->R = s->W > 0 ? numel(nd, shapes[0]) / s->W : 0;
  return 0;
}

// fn(r0, r1) over blocks of 512 rows taken by up to num_threads() threads (common.h parallel_blocks);
// one thread below 128K floats (as layernorm.cc).
template <class Fn>
void for_chunks(const Split& s, Fn&& fn) {
  int nt = num_threads();
  if (s.R * s.W < (int64_t(1) << 17)) nt = 1;
  nt = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(nt, s.R)));
  parallel_blocks(nt, s.R, 512, [&](int, int64_t r0, int64_t r1) { fn(r0, r1); });
}

inline vf silu(vf a) { return a * vsigmoid(a); }

inline vf silu_grad(vf a, vf d) {
  const vf s = vsigmoid(a);
  return d * (s * (1.0f + a * (1.0f - s)));
}

// Whether some width is not a whole number of vectors: then each row is computed in one pass over its
// W floats (one partial vector per row instead of one per segment), through a row buffer that the
// segments are copied from (forward) or into (backward). The same per-element formula either way.
inline bool ragged(const Split& s) {
  for (int64_t w : s.width)
    if (w % VL != 0) return true;
  return false;
}

// dst[0..n) = src[0..n) (no overlap): whole vectors, the last one ending at n (it may rewrite a few
// floats with the same values), so no tail; short copies by memcpy. A libc memcpy call per 200-byte
// segment cost more than the copy (about 5 core-ms of an ML-1M step on Zen 3).
inline void copy_row(float* __restrict dst, const float* __restrict src, int64_t n) {
  if (n < VL) {
    std::memcpy(dst, src, sizeof(float) * size_t(n));
    return;
  }
  int64_t j = 0;
  for (; j + VL <= n; j += VL) vstore(dst + j, vload(src + j));
  if (j < n) vstore(dst + n - VL, vload(src + n - VL));
}

// fn(src_offset_in_row, k, j, n): segment k, lanes j .. j+n of its width (n = VL or the tail).
template <class Fn>
inline void segments(const Split& s, Fn&& fn) {
  int64_t o = 0;
  for (size_t k = 0; k < s.width.size(); ++k) {
    const int64_t w = s.width[k];
    int64_t j = 0;
    for (; j + VL <= w; j += VL) fn(o + j, k, j, VL);
    if (j < w) fn(o + j, k, j, static_cast<int>(w - j));
    o += w;
  }
}

int silu_split_fwd(int nparam, void** params, int* ndims, int64_t** shapes, const char** dtypes) try {
  Split s;
  const int K = (nparam - 1) / 2;
  if (int rc = check(nparam, K, K, 0, ndims, shapes, dtypes, &s)) return rc;
  const float* x = static_cast<const float*>(params[0]);
  std::vector<float*> out;
  for (int i = 1 + K; i < nparam; ++i) out.push_back(static_cast<float*>(params[i]));
  const int64_t W = s.W, full = W / VL * VL;
  const bool flat = ragged(s);
  for_chunks(s, [&](int64_t r0, int64_t r1) {
    std::vector<float> yb(static_cast<size_t>(flat ? full + VL : 0));
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = x + r * W;
      if (flat) {
        for (int64_t j = 0; j < full; j += VL) vstore(yb.data() + j, silu(vload(xr + j)));
        if (full < W) vstore(yb.data() + full, silu(vload_tail(xr + full, static_cast<int>(W - full))));
        int64_t o = 0;
        for (size_t k = 0; k < s.width.size(); ++k) {
          copy_row(out[k] + r * s.width[k], yb.data() + o, s.width[k]);
          o += s.width[k];
        }
        continue;
      }
      segments(s, [&](int64_t o, size_t k, int64_t j, int n) {
        float* dst = out[k] + r * s.width[k] + j;
        if (n == VL) vstore(dst, silu(vload(xr + o)));
        else vstore_tail(dst, silu(vload_tail(xr + o, n)), n);
      });
    }
  });
  return 0;
} catch (...) {
  MINDGR_FAIL(kResources);
}

int silu_split_bwd(int nparam, void** params, int* ndims, int64_t** shapes, const char** dtypes) try {
  Split s;
  if (int rc = check(nparam, nparam - 2, 0, 1, ndims, shapes, dtypes, &s)) return rc;
  const float* x = static_cast<const float*>(params[0]);
  std::vector<const float*> d;
  for (int i = 1; i + 1 < nparam; ++i) d.push_back(static_cast<const float*>(params[i]));
  float* dx = static_cast<float*>(params[nparam - 1]);
  const int64_t W = s.W, full = W / VL * VL;
  const bool flat = ragged(s);
  for_chunks(s, [&](int64_t r0, int64_t r1) {
    std::vector<float> gb(static_cast<size_t>(flat ? full + VL : 0), 0.0f);
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = x + r * W;
      float* dr = dx + r * W;
      if (flat) {
        int64_t o = 0;
        for (size_t k = 0; k < s.width.size(); ++k) {
          copy_row(gb.data() + o, d[k] + r * s.width[k], s.width[k]);
          o += s.width[k];
        }
        for (int64_t j = 0; j < full; j += VL) vstore(dr + j, silu_grad(vload(xr + j), vload(gb.data() + j)));
        if (full < W) {
          const int n = static_cast<int>(W - full);
          vstore_tail(dr + full, silu_grad(vload_tail(xr + full, n), vload(gb.data() + full)), n);
        }
        continue;
      }
      segments(s, [&](int64_t o, size_t k, int64_t j, int n) {
        const float* g = d[k] + r * s.width[k] + j;
        if (n == VL) vstore(dr + o, silu_grad(vload(xr + o), vload(g)));
        else vstore_tail(dr + o, silu_grad(vload_tail(xr + o, n), vload_tail(g, n)), n);
      });
    }
  });
  return 0;
} catch (...) {
  MINDGR_FAIL(kResources);
}

}  // namespace
}  // namespace mindgr

MINDGR_AOT_OP(MindgrSiluSplit, mindgr::silu_split_fwd)

MINDGR_AOT_OP(MindgrSiluSplitBwd, mindgr::silu_split_bwd)
