// Jagged <-> padded conversions for CPU with MindSpore's custom AOT signature.  Any dtype: rows are
// copied as bytes.  Each op is the transpose of the other, so each one's gradient is the other op.
//   MindgrJaggedToPadded(values [T, *F], offsets [B+1], carrier [N, ...]) -> [B, N, *F]
//     row b, position n < min(L_b, N) holds values[offsets[b] + n]; everything else is zero.
//   MindgrPaddedToJagged(padded [B, N, *F], offsets [B+1], carrier [T, ...]) -> [T, *F]
//     token offsets[b] + n (n < min(L_b, N)) holds padded[b, n]; other tokens are zero.
#include "common.h"

namespace mindgr {
namespace {

// Splits rows [0, B) into contiguous chunks and copies them on up to num_threads() threads.
template <class Fn>
void for_rows(int64_t B, int64_t bytes, Fn&& fn) {
  int nt = num_threads();
  if (bytes < (int64_t(8) << 20)) nt = 1;  // below ~8 MB a thread costs more than it saves
  nt = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(nt, B)));
  parallel_run(nt, [&](int t) {
    int64_t b0 = B * t / nt, b1 = B * (t + 1) / nt;
    for (int64_t b = b0; b < b1; ++b) fn(b);
  });
}

int jagged_to_padded(int nparam, void** params, int* ndims, int64_t** shapes, const char** dtypes) try {
  MINDGR_REJECT_IF(nparam != 4, kArgCount);
  const int esize = dtype_size(dtypes[0]);
  MINDGR_REJECT_IF(esize == 0 || dtype_size(dtypes[3]) != esize, kDtype);
  MINDGR_REJECT_IF(ndims[0] < 1 || ndims[1] != 1 || ndims[2] < 1 || ndims[3] != ndims[0] + 1, kRank);
  const int64_t T = shapes[0][0];
  const int64_t feat = numel(ndims[0] - 1, shapes[0] + 1);
  const int64_t B = shapes[1][0] - 1;
  const int64_t N = shapes[2][0];
  MINDGR_REJECT_IF(B < 0 || shapes[3][0] != B || shapes[3][1] != N || numel(ndims[3], shapes[3]) != B * N * feat, kShape);
  std::vector<int64_t> off;
  MINDGR_REJECT_IF(!read_ints(params[1], dtypes[1], B + 1, &off), kOffsets);
  MINDGR_REJECT_IF(!offsets_ok(off, T), kIndexRange);
  const char* src = static_cast<const char*>(params[0]);
  char* dst = static_cast<char*>(params[3]);
  const int64_t row_bytes = feat * esize;
  for_rows(B, B * N * row_bytes, [&](int64_t b) {
    const int64_t len = std::min(off[b + 1] - off[b], N);
    char* out = dst + b * N * row_bytes;
    if (len > 0) std::memcpy(out, src + off[b] * row_bytes, size_t(len * row_bytes));
    std::memset(out + len * row_bytes, 0, size_t((N - len) * row_bytes));
  });
  return 0;
} catch (...) {  // a thread that could not start, or out of memory
  MINDGR_FAIL(kResources);
}

int padded_to_jagged(int nparam, void** params, int* ndims, int64_t** shapes, const char** dtypes) try {
  MINDGR_REJECT_IF(nparam != 4, kArgCount);
  const int esize = dtype_size(dtypes[0]);
  MINDGR_REJECT_IF(esize == 0 || dtype_size(dtypes[3]) != esize, kDtype);
  MINDGR_REJECT_IF(ndims[0] < 2 || ndims[1] != 1 || ndims[2] < 1 || ndims[3] != ndims[0] - 1, kRank);
  const int64_t B = shapes[0][0];
  const int64_t N = shapes[0][1];
  const int64_t feat = numel(ndims[0] - 2, shapes[0] + 2);
  const int64_t T = shapes[2][0];
  MINDGR_REJECT_IF(shapes[1][0] != B + 1 || shapes[3][0] != T || numel(ndims[3], shapes[3]) != T * feat, kShape);
  std::vector<int64_t> off;
  MINDGR_REJECT_IF(!read_ints(params[1], dtypes[1], B + 1, &off), kOffsets);
  MINDGR_REJECT_IF(!offsets_ok(off, T), kIndexRange);
  const char* src = static_cast<const char*>(params[0]);
  char* dst = static_cast<char*>(params[3]);
  const int64_t row_bytes = feat * esize;
  // Tokens before the first row and after the last one belong to no row.
  std::memset(dst, 0, size_t(off[0] * row_bytes));
  std::memset(dst + off[B] * row_bytes, 0, size_t((T - off[B]) * row_bytes));
  for_rows(B, T * row_bytes, [&](int64_t b) {
    const int64_t len = off[b + 1] - off[b];
    const int64_t kept = std::min(len, N);
    char* out = dst + off[b] * row_bytes;
    if (kept > 0) std::memcpy(out, src + b * N * row_bytes, size_t(kept * row_bytes));
    if (len > kept) std::memset(out + kept * row_bytes, 0, size_t((len - kept) * row_bytes));
  });
  return 0;
} catch (...) {
  MINDGR_FAIL(kResources);
}

}  // namespace
}  // namespace mindgr

MINDGR_AOT_OP(MindgrJaggedToPadded, mindgr::jagged_to_padded)

MINDGR_AOT_OP(MindgrPaddedToJagged, mindgr::padded_to_jagged)
