/*
 * Tiling data of the fused jagged HSTU attention (forward HstuJaggedAttention, backward
 * HstuJaggedAttentionGrad) and the host helpers both tiling functions share.
 *
 * The tiling depends on SHAPES ONLY (T, B, H, dqk, dv, N, nb, dtype, core count). The row lengths
 * live in the `offsets` tensor on the device and the kernels split the work from them
 * (op_kernel/hstu_common.h, WorkPlan); see docs/ascend_ops.md for why this is not a
 * value-dependent (ValueDepend) host tiling.
 */
#ifndef MINDGR_HSTU_ATTENTION_TILING_H
#define MINDGR_HSTU_ATTENTION_TILING_H

#include <cmath>
#include <cstdint>
#include <cstring>

#include "register/tilingdata_base.h"
#include "tiling/platform/platform_ascendc.h"
#include "tiling/tiling_api.h"

namespace optiling {

// Bucket thresholds: bucketBound[k] = smallest float32 g >= 1 with floor(logf(g) / 0.301f) >= k.
// No int64 gap reaches a bucket above 145 (ln(2^63)/0.301 = 145.08), so 148 entries cover any nb.
constexpr uint32_t HSTU_MAX_BUCKET = 146;
constexpr uint32_t HSTU_NUM_BOUNDS = HSTU_MAX_BUCKET + 2;

BEGIN_TILING_DATA_DEF(HstuAttnTilingData)
  TILING_DATA_FIELD_DEF(uint32_t, numTokens);      // T
  TILING_DATA_FIELD_DEF(uint32_t, numRows);        // B (offsets has B+1 entries)
  TILING_DATA_FIELD_DEF(uint32_t, numHeads);       // H
  TILING_DATA_FIELD_DEF(uint32_t, dimQK);          // dqk
  TILING_DATA_FIELD_DEF(uint32_t, dimV);           // dv
  TILING_DATA_FIELD_DEF(uint32_t, maxLen);         // N
  TILING_DATA_FIELD_DEF(uint32_t, numBuckets);     // nb = len(w_ts) - 1
  TILING_DATA_FIELD_DEF(uint32_t, numWorkers);     // vector cores taking work items (2 per AIC)
  TILING_DATA_FIELD_DEF(uint32_t, blockQ);         // query / key block (rows per Cube matmul)
  TILING_DATA_FIELD_DEF(uint32_t, colChunk);       // vector chunk along the partner axis
  TILING_DATA_FIELD_DEF(uint32_t, kvPad);          // row stride (elements) of the score workspaces
  TILING_DATA_FIELD_DEF(uint32_t, wPosPad);        // 2N-1 rounded up to 8 (dw_pos partial stride)
  TILING_DATA_FIELD_DEF(uint32_t, wTsPad);         // nb+1 rounded up to 8 (dw_ts partial stride)
  TILING_DATA_FIELD_DEF(uint32_t, wPosLen);        // len(w_pos) >= 2N-1 (dw_pos has this length)
  TILING_DATA_FIELD_DEF(uint64_t, wsPerWorker);    // bytes of user workspace per worker
  TILING_DATA_FIELD_DEF(uint64_t, wsSharedOffset); // bytes: start of the shared (sync, partials) area
  TILING_DATA_FIELD_DEF(float, invN);              // float32(1 / N), the reference's scale
  TILING_DATA_FIELD_DEF_ARR(float, 148, bucketBound);
  TILING_DATA_FIELD_DEF_STRUCT(TCubeTiling, mmNT); // A[m,K] x B[n,K]^T -> float (scores)
  TILING_DATA_FIELD_DEF_STRUCT(TCubeTiling, mmNN); // A[m,K] x B[K,n]   -> T (outputs, gradients)
END_TILING_DATA_DEF;

namespace hstu {

constexpr uint32_t BLOCK = 64;           // same as HSTU_BLOCK in op_kernel/hstu_common.h
constexpr uint32_t COL_CHUNK_FWD = 2048; // partner-axis chunk the vector code handles at once (UB budget)
constexpr uint32_t COL_CHUNK_BWD = 1024; // the backward keeps more chunks in UB
constexpr uint32_t SYNC_BYTES_PER_CORE = 32;

inline uint32_t RoundUp(uint32_t x, uint32_t a) { return (x + a - 1) / a * a; }

inline int BucketOf(float g) {  // the reference formula, float32 throughout (logf like the CPU kernels)
  if (g < 1.0f) g = 1.0f;
  return static_cast<int>(std::floor(std::log(g) / 0.301f));
}

inline float FloatFromBits(int32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

inline int32_t BitsOfFloat(float f) {
  int32_t b;
  std::memcpy(&b, &f, sizeof(b));
  return b;
}

// Thresholds by bisection over positive float bit patterns (order-preserving for positive floats).
inline void FillBucketBounds(float* bounds) {
  const int32_t lo0 = BitsOfFloat(1.0f);
  const int32_t hi0 = BitsOfFloat(3.4028234e38f);
  for (uint32_t k = 0; k < HSTU_NUM_BOUNDS; ++k) {
    if (BucketOf(FloatFromBits(hi0)) < static_cast<int>(k)) {
      bounds[k] = INFINITY;
      continue;
    }
    int32_t a = lo0, c = hi0;
    while (a < c) {
      int32_t mid = a + (c - a) / 2;
      if (BucketOf(FloatFromBits(mid)) >= static_cast<int>(k)) c = mid; else a = mid + 1;
    }
    bounds[k] = FloatFromBits(a);
  }
}

inline matmul_tiling::DataType MmType(ge::DataType t) {
  if (t == ge::DT_FLOAT16) return matmul_tiling::DataType::DT_FLOAT16;
  if (t == ge::DT_BF16) return matmul_tiling::DataType::DT_BF16;
  return matmul_tiling::DataType::DT_FLOAT;
}

// Single-core Matmul tiling for the largest problem a worker issues; the kernels shrink it per
// item with SetOrgShape / SetSingleShape. Returns false when the Matmul tiling API rejects it.
inline bool CubeTiling(const platform_ascendc::PlatformAscendC& plat, ge::DataType in, ge::DataType out,
                       bool transB, uint32_t m, uint32_t n, uint32_t k, TCubeTiling& dst) {
  matmul_tiling::MatmulApiTiling mm(plat);
  mm.SetAType(matmul_tiling::TPosition::GM, matmul_tiling::CubeFormat::ND, MmType(in), false);
  mm.SetBType(matmul_tiling::TPosition::GM, matmul_tiling::CubeFormat::ND, MmType(in), transB);
  mm.SetCType(matmul_tiling::TPosition::GM, matmul_tiling::CubeFormat::ND, MmType(out));
  mm.SetBias(false);
  mm.SetShape(m, n, k);
  mm.SetOrgShape(m, n, k);
  mm.SetBufferSpace(-1, -1, -1);
  return mm.GetTiling(dst) != -1;
}

// Everything but the workspace layout, which differs between forward and backward.
inline ge::graphStatus CommonTiling(gert::TilingContext* ctx, HstuAttnTilingData& td, uint32_t& blockDim,
                                    bool backward) {
  const uint32_t inBase = backward ? 1 : 0;  // the backward takes dout first
  const gert::StorageShape* q = ctx->GetInputShape(inBase + 0);
  const gert::StorageShape* v = ctx->GetInputShape(inBase + 2);
  const gert::StorageShape* off = ctx->GetInputShape(inBase + 3);
  const gert::StorageShape* wpos = ctx->GetInputShape(inBase + 6);   // after timestamps, request_times
  const gert::StorageShape* wts = ctx->GetInputShape(inBase + 7);
  const gert::RuntimeAttrs* attrs = ctx->GetAttrs();
  if (q == nullptr || v == nullptr || off == nullptr || wpos == nullptr || wts == nullptr || attrs == nullptr) {
    return ge::GRAPH_FAILED;
  }
  const int64_t* maxLenAttr = attrs->GetAttrPointer<int64_t>(0);
  if (maxLenAttr == nullptr || *maxLenAttr <= 0) return ge::GRAPH_FAILED;
  const gert::Shape& qs = q->GetStorageShape();
  const gert::Shape& vs = v->GetStorageShape();
  const uint32_t n = static_cast<uint32_t>(*maxLenAttr);
  const uint32_t posLen = static_cast<uint32_t>(wpos->GetStorageShape().GetDim(0));
  const uint32_t tsLen = static_cast<uint32_t>(wts->GetStorageShape().GetDim(0));
  if (qs.GetDimNum() != 3 || vs.GetDimNum() != 3 || posLen < 2 * n - 1 || tsLen < 1) return ge::GRAPH_FAILED;

  const ge::DataType dt = ctx->GetInputDesc(inBase + 0)->GetDataType();
  const uint32_t elem = (dt == ge::DT_FLOAT) ? 4 : 2;
  const uint32_t align = 32 / elem;  // GM rows handed to the Cube must start 32-byte aligned
  const uint32_t dqk = static_cast<uint32_t>(qs.GetDim(2));
  const uint32_t dv = static_cast<uint32_t>(vs.GetDim(2));
  if (dqk % align != 0 || dv % align != 0) return ge::GRAPH_FAILED;

  auto plat = platform_ascendc::PlatformAscendC(ctx->GetPlatformInfo());
  const uint32_t aic = plat.GetCoreNumAic();
  const uint32_t aiv = plat.GetCoreNumAiv();
  blockDim = aic < aiv / 2 ? aic : aiv / 2;  // groups of 1 AIC + 2 AIV (KERNEL_TYPE_MIX_AIC_1_2)
  if (blockDim == 0) return ge::GRAPH_FAILED;

  td.set_numTokens(static_cast<uint32_t>(qs.GetDim(0)));
  td.set_numRows(static_cast<uint32_t>(off->GetStorageShape().GetDim(0)) - 1);
  td.set_numHeads(static_cast<uint32_t>(qs.GetDim(1)));
  td.set_dimQK(dqk);
  td.set_dimV(dv);
  td.set_maxLen(n);
  td.set_numBuckets(tsLen - 1);
  td.set_numWorkers(2 * blockDim);
  td.set_blockQ(BLOCK);
  td.set_colChunk(backward ? COL_CHUNK_BWD : COL_CHUNK_FWD);
  td.set_kvPad(RoundUp(n, 16));
  td.set_wPosPad(RoundUp(2 * n - 1, 8));
  td.set_wTsPad(RoundUp(tsLen, 8));
  td.set_wPosLen(posLen);
  td.set_invN(1.0f / static_cast<float>(n));
  float bounds[HSTU_NUM_BOUNDS];
  FillBucketBounds(bounds);
  td.set_bucketBound(bounds);

  const uint32_t dmax = dqk > dv ? dqk : dv;
  const ge::DataType outT = dt;
  if (!CubeTiling(plat, dt, ge::DT_FLOAT, true, BLOCK, RoundUp(n, 16), dmax, td.mmNT)) return ge::GRAPH_FAILED;
  if (!CubeTiling(plat, dt, outT, false, BLOCK, dmax, RoundUp(n, 16), td.mmNN)) return ge::GRAPH_FAILED;
  return ge::GRAPH_SUCCESS;
}

inline ge::graphStatus SaveTiling(gert::TilingContext* ctx, HstuAttnTilingData& td, uint32_t blockDim,
                                  uint64_t userWorkspace) {
  auto plat = platform_ascendc::PlatformAscendC(ctx->GetPlatformInfo());
  ctx->SetBlockDim(blockDim);
  ctx->SetTilingKey(0);
  td.SaveToBuffer(ctx->GetRawTilingData()->GetData(), ctx->GetRawTilingData()->GetCapacity());
  ctx->GetRawTilingData()->SetDataSize(td.GetDataSize());
  size_t* ws = ctx->GetWorkspaceSizes(1);
  ws[0] = static_cast<size_t>(userWorkspace) + plat.GetLibApiWorkSpaceSize();
  return ge::GRAPH_SUCCESS;
}

}  // namespace hstu
}  // namespace optiling

#endif  // MINDGR_HSTU_ATTENTION_TILING_H
