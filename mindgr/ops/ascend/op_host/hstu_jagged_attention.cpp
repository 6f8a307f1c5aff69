/*
 * HstuJaggedAttention (forward): host side — tiling, shape/dtype inference, operator definition.
 *
 *   out[t, h, :] = sum_{j <= i} SiLU(q_i . k_j + w_pos[N-1+j-i] + w_ts[bucket(tq_i - t_j)]) / N * v_j
 *   for the token t = s + i of each row [s, e) of `offsets` (rows cut to N = max_len); zero for
 *   tokens of no row (the tail) and for tokens past position N of a row.
 *
 * Inputs : q [T,H,dqk], k [T,H,dqk], v [T,H,dv] (float32 | float16 | bfloat16, all the same),
 *          offsets [B+1] int32, timestamps [T] int64, request_times [B] int64 (the query time of
 *          each row's last position; elsewhere tq_i = t_{i+1}), w_pos [>= 2N-1] float32, w_ts [nb+1] float32
 * Attr   : max_len (int, required) = N
 * Output : out [T,H,dv], dtype of q
 * No time bias: pass w_ts = [0.0] (nb = 0): every pair then adds w_ts[0] = 0, exactly the reference.
 */
#include "hstu_attention_tiling.h"
#include "register/op_def_registry.h"

namespace optiling {

REGISTER_TILING_DATA_CLASS(HstuJaggedAttention, HstuAttnTilingData)

static ge::graphStatus HstuJaggedAttentionTiling(gert::TilingContext* context) {
  HstuAttnTilingData td;
  uint32_t blockDim = 0;
  if (hstu::CommonTiling(context, td, blockDim, false) != ge::GRAPH_SUCCESS) return ge::GRAPH_FAILED;

  // Per worker: the score block S [BLOCK, kvPad] float32, the weights P [BLOCK, kvPad] in the
  // input dtype (the A operand of P.V), and the row's split timestamps (4 x kvPad int32).
  const uint64_t elem = (context->GetInputDesc(0)->GetDataType() == ge::DT_FLOAT) ? 4 : 2;
  const uint64_t kv = td.get_kvPad();
  const uint64_t perWorker = hstu::BLOCK * kv * 4 + hstu::BLOCK * kv * elem + 4 * kv * 4;
  td.set_wsPerWorker(hstu::RoundUp(static_cast<uint32_t>(perWorker), 512));
  td.set_wsSharedOffset(td.get_wsPerWorker() * td.get_numWorkers());
  return hstu::SaveTiling(context, td, blockDim, td.get_wsSharedOffset());
}

}  // namespace optiling

namespace ge {

static ge::graphStatus HstuJaggedAttentionInferShape(gert::InferShapeContext* context) {
  const gert::Shape* q = context->GetInputShape(0);
  const gert::Shape* v = context->GetInputShape(2);
  gert::Shape* out = context->GetOutputShape(0);
  if (q == nullptr || v == nullptr || out == nullptr || q->GetDimNum() != 3 || v->GetDimNum() != 3) {
    return GRAPH_FAILED;
  }
  out->SetDimNum(3);
  out->SetDim(0, q->GetDim(0));
  out->SetDim(1, q->GetDim(1));
  out->SetDim(2, v->GetDim(2));
  return GRAPH_SUCCESS;
}

static ge::graphStatus HstuJaggedAttentionInferDataType(gert::InferDataTypeContext* context) {
  context->SetOutputDataType(0, context->GetInputDataType(0));
  return GRAPH_SUCCESS;
}

}  // namespace ge

namespace ops {

class HstuJaggedAttention : public OpDef {
 public:
  explicit HstuJaggedAttention(const char* name) : OpDef(name) {
    // Three supported combinations, one per column: float32, float16, bfloat16 activations.
    const std::vector<ge::DataType> act = {ge::DT_FLOAT, ge::DT_FLOAT16, ge::DT_BF16};
    const std::vector<ge::DataType> i32 = {ge::DT_INT32, ge::DT_INT32, ge::DT_INT32};
    const std::vector<ge::DataType> i64 = {ge::DT_INT64, ge::DT_INT64, ge::DT_INT64};
    const std::vector<ge::DataType> f32 = {ge::DT_FLOAT, ge::DT_FLOAT, ge::DT_FLOAT};
    const std::vector<ge::Format> nd = {ge::FORMAT_ND, ge::FORMAT_ND, ge::FORMAT_ND};

    this->Input("q").ParamType(REQUIRED).DataType(act).Format(nd).UnknownShapeFormat(nd);
    this->Input("k").ParamType(REQUIRED).DataType(act).Format(nd).UnknownShapeFormat(nd);
    this->Input("v").ParamType(REQUIRED).DataType(act).Format(nd).UnknownShapeFormat(nd);
    this->Input("offsets").ParamType(REQUIRED).DataType(i32).Format(nd).UnknownShapeFormat(nd);
    this->Input("timestamps").ParamType(REQUIRED).DataType(i64).Format(nd).UnknownShapeFormat(nd);
    this->Input("request_times").ParamType(REQUIRED).DataType(i64).Format(nd).UnknownShapeFormat(nd);
    this->Input("w_pos").ParamType(REQUIRED).DataType(f32).Format(nd).UnknownShapeFormat(nd);
    this->Input("w_ts").ParamType(REQUIRED).DataType(f32).Format(nd).UnknownShapeFormat(nd);
    this->Output("out").ParamType(REQUIRED).DataType(act).Format(nd).UnknownShapeFormat(nd);
    this->Attr("max_len").AttrType(REQUIRED).Int();

    this->SetInferShape(ge::HstuJaggedAttentionInferShape).SetInferDataType(ge::HstuJaggedAttentionInferDataType);
    this->AICore().SetTiling(optiling::HstuJaggedAttentionTiling);
    this->AICore().AddConfig("ascend910b");
    this->AICore().AddConfig("ascend910_93");
  }
};

OP_ADD(HstuJaggedAttention);

}  // namespace ops
