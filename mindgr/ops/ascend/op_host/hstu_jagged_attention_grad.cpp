/*
 * HstuJaggedAttentionGrad (backward of HstuJaggedAttention): host side.
 *
 * With s_ij recomputed (never stored), g_ij = dout_i . v_j, ds_ij = g_ij * SiLU'(s_ij) / N:
 *   dq_i = sum_j ds_ij k_j,  dk_j = sum_i ds_ij q_i,  dv_j = sum_i SiLU(s_ij) / N dout_i,
 *   dw_pos[N-1+j-i] += sum_h ds_ij,  dw_ts[bucket_ij] += sum_h ds_ij.
 * The weight gradients are reduced deterministically: each vector core accumulates its own partial
 * (in a fixed order), then, after an all-core barrier, the partials are summed in core order.
 *
 * Inputs : dout [T,H,dv], q, k [T,H,dqk], v [T,H,dv], offsets [B+1] int32, timestamps [T] int64,
 *          request_times [B] int64, w_pos [>= 2N-1] float32, w_ts [nb+1] float32      Attr: max_len (int, required)
 * Outputs: dq [T,H,dqk], dk [T,H,dqk], dv [T,H,dv] (dtype of q), dw_pos (shape of w_pos) float32,
 *          dw_ts [nb+1] float32
 */
#include "hstu_attention_tiling.h"
#include "register/op_def_registry.h"

namespace optiling {

REGISTER_TILING_DATA_CLASS(HstuJaggedAttentionGrad, HstuAttnTilingData)

static ge::graphStatus HstuJaggedAttentionGradTiling(gert::TilingContext* context) {
  HstuAttnTilingData td;
  uint32_t blockDim = 0;
  if (hstu::CommonTiling(context, td, blockDim, true) != ge::GRAPH_SUCCESS) return ge::GRAPH_FAILED;

  // Per worker: S and G [BLOCK, kvPad] float32 (scores, dout.v), two A operands [BLOCK, kvPad] in
  // the input dtype (dS and P^T), and the row's split timestamps (4 x kvPad int32).
  const uint64_t elem = (context->GetInputDesc(1)->GetDataType() == ge::DT_FLOAT) ? 4 : 2;
  const uint64_t kv = td.get_kvPad();
  const uint64_t perWorker = 2 * hstu::BLOCK * kv * 4 + 2 * hstu::BLOCK * kv * elem + 4 * kv * 4;
  td.set_wsPerWorker(hstu::RoundUp(static_cast<uint32_t>(perWorker), 512));
  td.set_wsSharedOffset(td.get_wsPerWorker() * td.get_numWorkers());

  // Shared: the barrier's flags, then per-worker dw_pos and dw_ts partials (float32).
  const uint64_t workers = td.get_numWorkers();
  const uint64_t shared = workers * hstu::SYNC_BYTES_PER_CORE +
                          workers * td.get_wPosPad() * 4 + workers * td.get_wTsPad() * 4;
  return hstu::SaveTiling(context, td, blockDim, td.get_wsSharedOffset() + shared);
}

}  // namespace optiling

namespace ge {

static ge::graphStatus HstuJaggedAttentionGradInferShape(gert::InferShapeContext* context) {
  // outputs take the shapes of q, k, v, w_pos, w_ts (inputs 1, 2, 3, 7, 8)
  const int inputOf[5] = {1, 2, 3, 7, 8};
  for (int o = 0; o < 5; ++o) {
    const gert::Shape* in = context->GetInputShape(inputOf[o]);
    gert::Shape* out = context->GetOutputShape(o);
    if (in == nullptr || out == nullptr) return GRAPH_FAILED;
    *out = *in;
  }
  return GRAPH_SUCCESS;
}

static ge::graphStatus HstuJaggedAttentionGradInferDataType(gert::InferDataTypeContext* context) {
  const ge::DataType act = context->GetInputDataType(1);
  context->SetOutputDataType(0, act);
  context->SetOutputDataType(1, act);
  context->SetOutputDataType(2, act);
  context->SetOutputDataType(3, ge::DT_FLOAT);
  context->SetOutputDataType(4, ge::DT_FLOAT);
  return GRAPH_SUCCESS;
}

}  // namespace ge

namespace ops {

class HstuJaggedAttentionGrad : public OpDef {
 public:
  explicit HstuJaggedAttentionGrad(const char* name) : OpDef(name) {
    const std::vector<ge::DataType> act = {ge::DT_FLOAT, ge::DT_FLOAT16, ge::DT_BF16};
    const std::vector<ge::DataType> i32 = {ge::DT_INT32, ge::DT_INT32, ge::DT_INT32};
    const std::vector<ge::DataType> i64 = {ge::DT_INT64, ge::DT_INT64, ge::DT_INT64};
    const std::vector<ge::DataType> f32 = {ge::DT_FLOAT, ge::DT_FLOAT, ge::DT_FLOAT};
    const std::vector<ge::Format> nd = {ge::FORMAT_ND, ge::FORMAT_ND, ge::FORMAT_ND};

    this->Input("dout").ParamType(REQUIRED).DataType(act).Format(nd).UnknownShapeFormat(nd);
    this->Input("q").ParamType(REQUIRED).DataType(act).Format(nd).UnknownShapeFormat(nd);
    this->Input("k").ParamType(REQUIRED).DataType(act).Format(nd).UnknownShapeFormat(nd);
    this->Input("v").ParamType(REQUIRED).DataType(act).Format(nd).UnknownShapeFormat(nd);
    this->Input("offsets").ParamType(REQUIRED).DataType(i32).Format(nd).UnknownShapeFormat(nd);
    this->Input("timestamps").ParamType(REQUIRED).DataType(i64).Format(nd).UnknownShapeFormat(nd);
    this->Input("request_times").ParamType(REQUIRED).DataType(i64).Format(nd).UnknownShapeFormat(nd);
    this->Input("w_pos").ParamType(REQUIRED).DataType(f32).Format(nd).UnknownShapeFormat(nd);
    this->Input("w_ts").ParamType(REQUIRED).DataType(f32).Format(nd).UnknownShapeFormat(nd);
    this->Output("dq").ParamType(REQUIRED).DataType(act).Format(nd).UnknownShapeFormat(nd);
    this->Output("dk").ParamType(REQUIRED).DataType(act).Format(nd).UnknownShapeFormat(nd);
    this->Output("dv").ParamType(REQUIRED).DataType(act).Format(nd).UnknownShapeFormat(nd);
    this->Output("dw_pos").ParamType(REQUIRED).DataType(f32).Format(nd).UnknownShapeFormat(nd);
    this->Output("dw_ts").ParamType(REQUIRED).DataType(f32).Format(nd).UnknownShapeFormat(nd);
    this->Attr("max_len").AttrType(REQUIRED).Int();

    this->SetInferShape(ge::HstuJaggedAttentionGradInferShape)
        .SetInferDataType(ge::HstuJaggedAttentionGradInferDataType);
    this->AICore().SetTiling(optiling::HstuJaggedAttentionGradTiling);
    this->AICore().AddConfig("ascend910b");
    this->AICore().AddConfig("ascend910_93");
  }
};

OP_ADD(HstuJaggedAttentionGrad);

}  // namespace ops
