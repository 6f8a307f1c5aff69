/*
 * HstuJaggedAttention forward kernel (AscendC, Atlas A2 / ascend910b, Cube + Vector MIX 1:2).
 *
 * Each vector core (worker) takes the items the device-side WorkPlan gives it; one item is a
 * (row, head, query block of up to 64 tokens [i0, i0+m)):
 *   1. Cube : S = Q_blk . K_row[0 : i0+m]^T                 (Matmul API, fp32 accumulation, -> GM ws)
 *   2. Vector, per query row i, over its keys j = 0..i in chunks (double-buffered DataCopyPad):
 *        s = S + w_pos[N-1+j-i] + w_ts[bucket(tq_i - t_j)]  (tq_i = t_{i+1}; last: request time);  P = SiLU(s) * float32(1/N)
 *        (keys j > i inside the diagonal block get P = 0: the causal mask)  -> GM ws (dtype of q)
 *   3. Cube : out_blk = P . V_row[0 : i0+m]                  (written straight into `out`)
 * Tokens cut off long rows and the unused tail get zeros. Nothing [B, N, N] is ever stored: the
 * largest temporary is one [64, N] score block per worker.
 */
#include "hstu_common.h"

using namespace matmul;

template <typename T>
class HstuFwdKernel {
 public:
  using AType = MatmulType<TPosition::GM, CubeFormat::ND, T>;
  using BTransType = MatmulType<TPosition::GM, CubeFormat::ND, T, true>;
  using BType = MatmulType<TPosition::GM, CubeFormat::ND, T>;
  using ScoreType = MatmulType<TPosition::GM, CubeFormat::ND, float>;
  using OutType = MatmulType<TPosition::GM, CubeFormat::ND, T>;
  Matmul<AType, BTransType, ScoreType> mmNT;  // Q . K^T
  Matmul<AType, BType, OutType> mmNN;         // P . V

  __aicore__ inline HstuFwdKernel() {}

  __aicore__ inline void Init(GM_ADDR q, GM_ADDR k, GM_ADDR v, GM_ADDR offsets, GM_ADDR timestamps,
                              GM_ADDR requestTimes, GM_ADDR wPos, GM_ADDR wTs, GM_ADDR out, GM_ADDR user, const HstuAttnTilingData* td, TPipe* pipe) {
    td_ = td;
    pipe_ = pipe;
    me_ = GetBlockIdx();
    const uint64_t t = td->numTokens, h = td->numHeads;
    qGm_.SetGlobalBuffer((__gm__ T*)q, t * h * td->dimQK);
    kGm_.SetGlobalBuffer((__gm__ T*)k, t * h * td->dimQK);
    vGm_.SetGlobalBuffer((__gm__ T*)v, t * h * td->dimV);
    outGm_.SetGlobalBuffer((__gm__ T*)out, t * h * td->dimV);
    tsGm_.SetGlobalBuffer((__gm__ int64_t*)timestamps, t);
    reqGm_.SetGlobalBuffer((__gm__ int64_t*)requestTimes, td->numRows);
    wPosGm_.SetGlobalBuffer((__gm__ float*)wPos, 2 * td->maxLen - 1);
    wTsGm_.SetGlobalBuffer((__gm__ float*)wTs, td->numBuckets + 1);

    // worker workspace: S [BLOCK, kvPad] f32 | P [BLOCK, kvPad] T | time cache 4 x kvPad int32
    const uint64_t kv = td->kvPad;
    __gm__ uint8_t* base = (__gm__ uint8_t*)user + td->wsPerWorker * me_;
    sWs_.SetGlobalBuffer((__gm__ float*)base, HSTU_BLOCK * kv);
    pWs_.SetGlobalBuffer((__gm__ T*)(base + HSTU_BLOCK * kv * 4), HSTU_BLOCK * kv);
    timeWs_.SetGlobalBuffer((__gm__ int32_t*)(base + HSTU_BLOCK * kv * (4 + sizeof(T))), 4 * kv);

    chunk_ = td->colChunk;
    pipe->InitBuffer(inS_, 2, chunk_ * sizeof(float));
    pipe->InitBuffer(inPos_, 2, chunk_ * sizeof(float));
    pipe->InitBuffer(inTime_, 2, 2 * chunk_ * sizeof(int32_t));
    pipe->InitBuffer(outP_, 2, chunk_ * sizeof(float));
    pipe->InitBuffer(scratch_, 4 * chunk_ * sizeof(float));
    pipe->InitBuffer(bucketBuf_, chunk_ * sizeof(float));
    pipe->InitBuffer(maskBuf_, chunk_ / 8);
    pipe->InitBuffer(boundsBuf_, HSTU_BOUNDS_PAD * sizeof(float));
    pipe->InitBuffer(wtsBuf_, HSTU_BOUNDS_PAD * sizeof(float));
    pipe->InitBuffer(zeroBuf_, chunk_ * sizeof(float));
    pipe->InitBuffer(splitBuf_, 4 * chunk_ * sizeof(int32_t));

    LocalTensor<float> sc = scratch_.Get<float>();
    w_.g = sc;
    w_.f1 = sc[chunk_];
    w_.f2 = sc[2 * chunk_];
    w_.i1 = sc[3 * chunk_].template ReinterpretCast<int32_t>();
    w_.mask = maskBuf_.Get<uint8_t>();
    w_.bounds = boundsBuf_.Get<float>();
    w_.wts = wtsBuf_.Get<float>();
    for (uint32_t x = 0; x < HSTU_BOUNDS_PAD; ++x) {
      w_.bounds.SetValue(x, x < HSTU_NUM_BOUNDS ? td->bucketBound[x] : td->bucketBound[HSTU_NUM_BOUNDS - 1]);
      uint32_t b = td->numBuckets < static_cast<uint32_t>(HSTU_MAX_BUCKET) ? td->numBuckets : HSTU_MAX_BUCKET;
      w_.wts.SetValue(x, x <= b ? wTsGm_.GetValue(x) : 0.0f);
    }
    wts0_ = wTsGm_.GetValue(0);
    LocalTensor<int32_t> zeroBits = zeroBuf_.Get<int32_t>();
    Duplicate(zeroBits, 0, chunk_);  // all-zero bits: 0 in any dtype
    plan_.Init(offsets, td->numRows, td->numTokens, td->maxLen, td->numHeads, td->numWorkers, me_, false);
  }

  __aicore__ inline void Process() {
    if (me_ >= td_->numWorkers) return;
    WaitVectorForStores();
    ZeroDeadTokens();
    WorkItem it;
    uint32_t cachedRow = 0xFFFFFFFFu;
    while (plan_.Next(it)) {
      if (it.row != cachedRow && td_->numBuckets > 0) {
        LocalTensor<int32_t> sb = splitBuf_.Get<int32_t>();
        SplitRowTimes(tsGm_, it.span, reqGm_.GetValue(it.row), timeWs_, td_->kvPad, sb, chunk_);
        cachedRow = it.row;
      }
      ProcessItem(it);
    }
    mmNT.End();
    mmNN.End();
  }

 private:
  __aicore__ inline void ZeroDeadTokens() {
    DeadTokens dead;
    dead.Init(plan_, td_->numTokens, td_->numWorkers, me_);
    LocalTensor<T> zeros = zeroBuf_.Get<T>();
    const uint64_t rowElems = static_cast<uint64_t>(td_->numHeads) * td_->dimV;
    uint32_t t0, t1;
    while (dead.Next(t0, t1)) {
      StoreZeros(outGm_[t0 * rowElems], zeros, chunk_, (t1 - t0) * rowElems);
    }
  }

  __aicore__ inline void ProcessItem(const WorkItem& it) {
    const uint32_t s = it.span.s, i0 = it.blk * HSTU_BLOCK;
    const uint32_t m = (it.span.le - i0) < HSTU_BLOCK ? (it.span.le - i0) : HSTU_BLOCK;
    const uint32_t kv = i0 + m;
    const uint32_t hqk = td_->numHeads * td_->dimQK, hv = td_->numHeads * td_->dimV;

    // 1. S = Q_blk . K^T  (rows of one head are hqk apart in [T, H, dqk])
    mmNT.SetOrgShape(m, kv, hqk, hqk, td_->kvPad);
    mmNT.SetTensorA(qGm_[static_cast<uint64_t>(s + i0) * hqk + it.head * td_->dimQK]);
    mmNT.SetTensorB(kGm_[static_cast<uint64_t>(s) * hqk + it.head * td_->dimQK], true);
    mmNT.SetSingleShape(m, kv, td_->dimQK);
    mmNT.IterateAll(sWs_);

    // 2. P = SiLU(S + bias) / N, row by row, causal
    LocalTensor<T> zeros = zeroBuf_.Get<T>();
    for (uint32_t r = 0; r < m; ++r) {
      const uint32_t i = i0 + r, cnt = i + 1;
      // the query time: t_{i+1}, at the row's last position its request time (the target's time)
      const int64_t tq = (i + 1 < it.span.le) ? tsGm_.GetValue(s + i + 1) : reqGm_.GetValue(it.row);
      for (uint32_t c0 = 0; c0 < cnt; c0 += chunk_) {
        const uint32_t len = (cnt - c0) < chunk_ ? (cnt - c0) : chunk_;
        CopyIn(r * td_->kvPad + c0, td_->maxLen - 1 - i + c0, c0, len);
        Compute(TimeHi(tq), TimeLo(tq), len);
        CopyOut(r * td_->kvPad + c0, len);
      }
      if (cnt < kv) StoreZeros(pWs_[r * td_->kvPad + cnt], zeros, chunk_, kv - cnt);
    }
    PipeBarrier<PIPE_ALL>();  // P is in GM before the Cube reads it

    // 3. out_blk = P . V
    mmNN.SetOrgShape(m, hv, td_->kvPad, kv, hv);
    mmNN.SetTensorA(pWs_);
    mmNN.SetTensorB(vGm_[static_cast<uint64_t>(s) * hv + it.head * td_->dimV]);
    mmNN.SetSingleShape(m, td_->dimV, kv);
    mmNN.IterateAll(outGm_[static_cast<uint64_t>(s + i0) * hv + it.head * td_->dimV]);
  }

  __aicore__ inline void CopyIn(uint64_t sOff, uint64_t posOff, uint32_t keyOff, uint32_t len) {
    LocalTensor<float> sl = inS_.AllocTensor<float>();
    LocalTensor<float> pl = inPos_.AllocTensor<float>();
    LoadF32(sl, sWs_[sOff], len);
    LoadF32(pl, wPosGm_[posOff], len);
    inS_.EnQue(sl);
    inPos_.EnQue(pl);
    if (td_->numBuckets > 0) {
      LocalTensor<int32_t> tl = inTime_.AllocTensor<int32_t>();
      DataCopyExtParams p{1, len * 4, 0, 0, 0};
      DataCopyPadExtParams<int32_t> pad{false, 0, 0, 0};
      DataCopyPad(tl, timeWs_[keyOff], p, pad);                        // hi(t_j)
      DataCopyPad(tl[chunk_], timeWs_[td_->kvPad + keyOff], p, pad);  // lo(t_j)
      inTime_.EnQue(tl);
    }
  }

  __aicore__ inline void Compute(int32_t tqHi, int32_t tqLo, uint32_t len) {
    const uint32_t n = Align64(len);
    LocalTensor<float> sl = inS_.DeQue<float>();
    LocalTensor<float> pl = inPos_.DeQue<float>();
    LocalTensor<float> bucketF = bucketBuf_.Get<float>();
    Add(sl, sl, pl, n);
    if (td_->numBuckets > 0) {
      LocalTensor<int32_t> tl = inTime_.DeQue<int32_t>();
      LocalTensor<int32_t> hi = tl;
      LocalTensor<int32_t> lo = tl[chunk_];
      AddTimeBias(sl, bucketF, hi, lo, tqHi, tqLo, len, td_->numBuckets, w_);
      inTime_.FreeTensor(tl);
    } else {
      Adds(sl, sl, wts0_, n);
    }
    LocalTensor<float> out = outP_.AllocTensor<float>();
    if constexpr (HstuSame<T, float>::value) {
      Silu(out, sl, w_.f1, n);
      Muls(out, out, td_->invN, n);
    } else {
      Silu(w_.f2, sl, w_.f1, n);
      Muls(w_.f2, w_.f2, td_->invN, n);
      LocalTensor<T> outT = out.template ReinterpretCast<T>();
      Cast(outT, w_.f2, RoundMode::CAST_RINT, n);
    }
    outP_.EnQue(out);
    inS_.FreeTensor(sl);
    inPos_.FreeTensor(pl);
  }

  __aicore__ inline void CopyOut(uint64_t pOff, uint32_t len) {
    LocalTensor<float> out = outP_.DeQue<float>();
    LocalTensor<T> outT = out.template ReinterpretCast<T>();
    DataCopyExtParams p{1, static_cast<uint32_t>(len * sizeof(T)), 0, 0, 0};
    DataCopyPad(pWs_[pOff], outT, p);
    outP_.FreeTensor(out);
  }

  const HstuAttnTilingData* td_;
  TPipe* pipe_;
  uint32_t me_, chunk_;
  float wts0_;
  WorkPlan plan_;
  BiasScratch w_;
  GlobalTensor<T> qGm_, kGm_, vGm_, outGm_, pWs_;
  GlobalTensor<int64_t> tsGm_, reqGm_;
  GlobalTensor<float> wPosGm_, wTsGm_, sWs_;
  GlobalTensor<int32_t> timeWs_;
  TQue<QuePosition::VECIN, 2> inS_, inPos_, inTime_;
  TQue<QuePosition::VECOUT, 2> outP_;
  TBuf<QuePosition::VECCALC> scratch_, bucketBuf_, maskBuf_, boundsBuf_, wtsBuf_, zeroBuf_, splitBuf_;
};

extern "C" __global__ __aicore__ void hstu_jagged_attention(GM_ADDR q, GM_ADDR k, GM_ADDR v, GM_ADDR offsets,
                                                            GM_ADDR timestamps, GM_ADDR request_times,
                                                            GM_ADDR w_pos, GM_ADDR w_ts,
                                                            GM_ADDR out, GM_ADDR workspace, GM_ADDR tiling) {
  KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_MIX_AIC_1_2);
  GET_TILING_DATA(td, tiling);
  GM_ADDR user = GetUserWorkspace(workspace);
  if (user == nullptr) return;
  TPipe pipe;
  HstuFwdKernel<DTYPE_Q> op;
  // MIX mode: on the Cube core this registers the Matmul objects and serves the vector cores'
  // requests; the vector cores run Init/Process and drive the matmuls (Matmul API client side).
  REGIST_MATMUL_OBJ(&pipe, GetSysWorkSpacePtr(), op.mmNT, &td.mmNT, op.mmNN, &td.mmNN);
  op.Init(q, k, v, offsets, timestamps, request_times, w_pos, w_ts, out, user, &td, &pipe);
  op.Process();
}
