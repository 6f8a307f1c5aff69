/*
 * HstuJaggedAttentionGrad kernel (AscendC, Atlas A2 / ascend910b, Cube + Vector MIX 1:2).
 *
 * Items (device-side WorkPlan, backward layout): per (row, head) the dq items then the dkv items.
 *   dq item  (query block [i0, i0+m)):
 *     Cube   S = Q_blk K^T, G = dO_blk V^T                      (keys 0 .. i0+m-1, -> GM ws, fp32)
 *     Vector s = S + bias, ds = G * SiLU'(s) / N (causal)       (-> GM ws, dtype of q)
 *            dw_pos partial += ds (atomic DataCopyPad into this worker's own GM slice, serialized)
 *            dw_ts  partial += per-bucket sums of ds (this worker's UB accumulator)
 *     Cube   dq_blk = dS K
 *   dkv item (key block [j0, j0+n)):
 *     Cube   S^T = K_blk Q^T, G^T = V_blk dO^T                   (queries j0 .. Le-1)
 *     Vector per key j: P^T = SiLU(s)/N and dS^T for queries i >= j (bias reversed by Gather)
 *     Cube   dk_blk = dS^T Q, dv_blk = P^T dO
 * Then every worker stores its dw_ts partial, all vector cores meet at SyncAll, and the partials
 * are summed in worker order 0..P-1 (deterministic: no float atomics across cores).
 */
#include "hstu_common.h"

using namespace matmul;

template <typename T>
class HstuBwdKernel {
 public:
  using AType = MatmulType<TPosition::GM, CubeFormat::ND, T>;
  using BTransType = MatmulType<TPosition::GM, CubeFormat::ND, T, true>;
  using BType = MatmulType<TPosition::GM, CubeFormat::ND, T>;
  using ScoreType = MatmulType<TPosition::GM, CubeFormat::ND, float>;
  using OutType = MatmulType<TPosition::GM, CubeFormat::ND, T>;
  Matmul<AType, BTransType, ScoreType> mmNT;
  Matmul<AType, BType, OutType> mmNN;

  __aicore__ inline HstuBwdKernel() {}

  __aicore__ inline void Init(GM_ADDR dout, GM_ADDR q, GM_ADDR k, GM_ADDR v, GM_ADDR offsets, GM_ADDR timestamps,
                              GM_ADDR requestTimes, GM_ADDR wPos, GM_ADDR wTs, GM_ADDR dq, GM_ADDR dk, GM_ADDR dv, GM_ADDR dwPos,
                              GM_ADDR dwTs, GM_ADDR user, const HstuAttnTilingData* td, TPipe* pipe) {
    td_ = td;
    me_ = GetBlockIdx();
    const uint64_t t = td->numTokens, h = td->numHeads;
    doGm_.SetGlobalBuffer((__gm__ T*)dout, t * h * td->dimV);
    qGm_.SetGlobalBuffer((__gm__ T*)q, t * h * td->dimQK);
    kGm_.SetGlobalBuffer((__gm__ T*)k, t * h * td->dimQK);
    vGm_.SetGlobalBuffer((__gm__ T*)v, t * h * td->dimV);
    dqGm_.SetGlobalBuffer((__gm__ T*)dq, t * h * td->dimQK);
    dkGm_.SetGlobalBuffer((__gm__ T*)dk, t * h * td->dimQK);
    dvGm_.SetGlobalBuffer((__gm__ T*)dv, t * h * td->dimV);
    tsGm_.SetGlobalBuffer((__gm__ int64_t*)timestamps, t);
    reqGm_.SetGlobalBuffer((__gm__ int64_t*)requestTimes, td->numRows);
    wPosGm_.SetGlobalBuffer((__gm__ float*)wPos, td->wPosLen);
    wTsGm_.SetGlobalBuffer((__gm__ float*)wTs, td->numBuckets + 1);
    dwPosGm_.SetGlobalBuffer((__gm__ float*)dwPos, td->wPosLen);
    dwTsGm_.SetGlobalBuffer((__gm__ float*)dwTs, td->numBuckets + 1);

    const uint64_t kv = td->kvPad, blk = HSTU_BLOCK * kv;
    __gm__ uint8_t* base = (__gm__ uint8_t*)user + td->wsPerWorker * me_;
    sWs_.SetGlobalBuffer((__gm__ float*)base, blk);
    gWs_.SetGlobalBuffer((__gm__ float*)(base + blk * 4), blk);
    aWs_.SetGlobalBuffer((__gm__ T*)(base + blk * 8), blk);
    bWs_.SetGlobalBuffer((__gm__ T*)(base + blk * (8 + sizeof(T))), blk);
    timeWs_.SetGlobalBuffer((__gm__ int32_t*)(base + blk * (8 + 2 * sizeof(T))), 4 * kv);
    __gm__ uint8_t* shared = (__gm__ uint8_t*)user + td->wsSharedOffset;
    const uint64_t workers = td->numWorkers;
    syncGm_.SetGlobalBuffer((__gm__ int32_t*)shared, workers * 8);
    posPart_.SetGlobalBuffer((__gm__ float*)(shared + workers * 32), workers * td->wPosPad);
    tsPart_.SetGlobalBuffer((__gm__ float*)(shared + workers * 32 + workers * td->wPosPad * 4),
                            workers * td->wTsPad);

    chunk_ = td->colChunk;
    const uint32_t fb = chunk_ * sizeof(float);
    pipe->InitBuffer(inS_, 2, fb);
    pipe->InitBuffer(inG_, 2, fb);
    pipe->InitBuffer(inPos_, 2, fb);
    pipe->InitBuffer(inTime_, 2, 2 * fb);
    pipe->InitBuffer(outA_, 2, fb);
    pipe->InitBuffer(outB_, 2, fb);
    pipe->InitBuffer(outDs_, 2, fb);
    pipe->InitBuffer(scratch_, 4 * fb);
    pipe->InitBuffer(sigBuf_, fb);
    pipe->InitBuffer(bucketBuf_, fb);
    pipe->InitBuffer(revBuf_, fb);
    pipe->InitBuffer(workBuf_, fb);
    pipe->InitBuffer(maskBuf_, chunk_ / 8);
    pipe->InitBuffer(boundsBuf_, HSTU_BOUNDS_PAD * 4);
    pipe->InitBuffer(wtsBuf_, HSTU_BOUNDS_PAD * 4);
    pipe->InitBuffer(accBuf_, HSTU_BOUNDS_PAD * 4);
    pipe->InitBuffer(zeroBuf_, fb);
    pipe->InitBuffer(splitBuf_, 4 * fb);
    pipe->InitBuffer(syncBuf_, workers * 32);

    LocalTensor<float> sc = scratch_.Get<float>();
    w_.g = sc;
    w_.f1 = sc[chunk_];
    w_.f2 = sc[2 * chunk_];
    w_.i1 = sc[3 * chunk_].template ReinterpretCast<int32_t>();
    w_.mask = maskBuf_.Get<uint8_t>();
    w_.bounds = boundsBuf_.Get<float>();
    w_.wts = wtsBuf_.Get<float>();
    acc_ = accBuf_.Get<float>();
    const uint32_t bmax = td->numBuckets < static_cast<uint32_t>(HSTU_MAX_BUCKET) ? td->numBuckets : HSTU_MAX_BUCKET;
    for (uint32_t x = 0; x < HSTU_BOUNDS_PAD; ++x) {
      w_.bounds.SetValue(x, x < HSTU_NUM_BOUNDS ? td->bucketBound[x] : td->bucketBound[HSTU_NUM_BOUNDS - 1]);
      w_.wts.SetValue(x, x <= bmax ? wTsGm_.GetValue(x) : 0.0f);
      acc_.SetValue(x, 0.0f);
    }
    wts0_ = wTsGm_.GetValue(0);
    LocalTensor<int32_t> rev = revBuf_.Get<int32_t>();
    for (uint32_t x = 0; x < chunk_; ++x) rev.SetValue(x, static_cast<int32_t>((chunk_ - 1 - x) * 4));
    LocalTensor<int32_t> zeroBits = zeroBuf_.Get<int32_t>();
    Duplicate(zeroBits, 0, chunk_);
    plan_.Init(offsets, td->numRows, td->numTokens, td->maxLen, td->numHeads, td->numWorkers, me_, true);
  }

  __aicore__ inline void Process() {
    if (me_ >= td_->numWorkers) return;
    WaitVectorForStores();
    LocalTensor<float> zf = zeroBuf_.Get<float>();
    // barrier flags (every core clears all of them, as SyncAll's soft mode requires) and own partial
    LocalTensor<int32_t> zi = zeroBuf_.Get<int32_t>();
    StoreZeros(syncGm_, zi, chunk_, td_->numWorkers * 8);
    StoreZeros(posPart_[me_ * td_->wPosPad], zf, chunk_, td_->wPosPad);
    ZeroDeadTokens();
    PipeBarrier<PIPE_ALL>();

    WorkItem it;
    uint32_t cachedRow = 0xFFFFFFFFu;
    while (plan_.Next(it)) {
      if (it.row != cachedRow && td_->numBuckets > 0) {
        LocalTensor<int32_t> sb = splitBuf_.Get<int32_t>();
        SplitRowTimes(tsGm_, it.span, reqGm_.GetValue(it.row), timeWs_, td_->kvPad, sb, chunk_);
        cachedRow = it.row;
      }
      if (it.kind == KIND_DQ) ProcessDq(it); else ProcessDkv(it);
    }
    mmNT.End();
    mmNN.End();

    // this worker's dw_ts partial, then the deterministic cross-core sums
    DataCopyExtParams p{1, td_->wTsPad * 4, 0, 0, 0};
    DataCopyPad(tsPart_[me_ * td_->wTsPad], acc_, p);
    PipeBarrier<PIPE_ALL>();
    LocalTensor<int32_t> syncUb = syncBuf_.Get<int32_t>();
    SyncAll(syncGm_, syncUb);
    ReduceWeightGrads();
  }

 private:
  __aicore__ inline void ZeroDeadTokens() {
    DeadTokens dead;
    dead.Init(plan_, td_->numTokens, td_->numWorkers, me_);
    LocalTensor<T> zeros = zeroBuf_.Get<T>();
    const uint64_t rqk = static_cast<uint64_t>(td_->numHeads) * td_->dimQK;
    const uint64_t rv = static_cast<uint64_t>(td_->numHeads) * td_->dimV;
    uint32_t t0, t1;
    while (dead.Next(t0, t1)) {
      StoreZeros(dqGm_[t0 * rqk], zeros, chunk_, (t1 - t0) * rqk);
      StoreZeros(dkGm_[t0 * rqk], zeros, chunk_, (t1 - t0) * rqk);
      StoreZeros(dvGm_[t0 * rv], zeros, chunk_, (t1 - t0) * rv);
    }
  }

  // ---- loads of one chunk: S, G rows of the workspaces, a w_pos window, partner times ----------
  __aicore__ inline void CopyIn(uint64_t wsOff, uint64_t posOff, uint64_t timeOff, uint32_t len) {
    LocalTensor<float> sl = inS_.AllocTensor<float>();
    LocalTensor<float> gl = inG_.AllocTensor<float>();
    LocalTensor<float> pl = inPos_.AllocTensor<float>();
    LoadF32(sl, sWs_[wsOff], len);
    LoadF32(gl, gWs_[wsOff], len);
    LoadF32(pl, wPosGm_[posOff], len);
    inS_.EnQue(sl);
    inG_.EnQue(gl);
    inPos_.EnQue(pl);
    if (td_->numBuckets > 0) {
      LocalTensor<int32_t> tl = inTime_.AllocTensor<int32_t>();
      DataCopyExtParams p{1, len * 4, 0, 0, 0};
      DataCopyPadExtParams<int32_t> pad{false, 0, 0, 0};
      DataCopyPad(tl, timeWs_[timeOff], p, pad);
      DataCopyPad(tl[chunk_], timeWs_[td_->kvPad + timeOff], p, pad);
      inTime_.EnQue(tl);
    }
  }

  // s = S + pos (+ time bias); sig = sigmoid(s); writes P (optional) and dS; returns dS in `ds` (fp32).
  __aicore__ inline void Compute(int32_t tHi, int32_t tLo, uint32_t len, bool reversePos, bool wantP,
                                 LocalTensor<float>& ds) {
    const uint32_t n = Align64(len);
    LocalTensor<float> sl = inS_.DeQue<float>();
    LocalTensor<float> gl = inG_.DeQue<float>();
    LocalTensor<float> pl = inPos_.DeQue<float>();
    LocalTensor<float> bucketF = bucketBuf_.Get<float>();
    LocalTensor<float> sig = sigBuf_.Get<float>();
    if (reversePos) {  // the dkv direction walks w_pos backwards: reverse the window by Gather
      LocalTensor<int32_t> rev = revBuf_.Get<int32_t>();
      Adds(w_.i1, rev, -static_cast<int32_t>((chunk_ - len) * 4), n);
      Gather(w_.f1, pl, w_.i1.template ReinterpretCast<uint32_t>(), 0u, len);
      Add(sl, sl, w_.f1, n);
    } else {
      Add(sl, sl, pl, n);
    }
    inPos_.FreeTensor(pl);
    if (td_->numBuckets > 0) {
      LocalTensor<int32_t> tl = inTime_.DeQue<int32_t>();
      LocalTensor<int32_t> hi = tl;
      LocalTensor<int32_t> lo = tl[chunk_];
      AddTimeBias(sl, bucketF, hi, lo, tHi, tLo, len, td_->numBuckets, w_);
      inTime_.FreeTensor(tl);
    } else {
      Adds(sl, sl, wts0_, n);
    }
    // sig = 1 / (1 + exp(-s))
    Muls(w_.f1, sl, -1.0f, n);
    Exp(w_.f1, w_.f1, n);
    Adds(w_.f1, w_.f1, 1.0f, n);
    Reciprocal(sig, w_.f1, n);
    if (wantP) {  // P = s * sig / N
      LocalTensor<float> pb = outB_.AllocTensor<float>();
      Mul(w_.f2, sl, sig, n);
      Muls(w_.f2, w_.f2, td_->invN, n);
      ToStoreType(pb, w_.f2, n);
      outB_.EnQue(pb);
    }
    // dS = G * sig * (1 + s * (1 - sig)) / N
    Muls(w_.f1, sig, -1.0f, n);
    Adds(w_.f1, w_.f1, 1.0f, n);
    Mul(w_.f1, w_.f1, sl, n);
    Adds(w_.f1, w_.f1, 1.0f, n);
    Mul(w_.f1, w_.f1, sig, n);
    Mul(ds, w_.f1, gl, n);
    Muls(ds, ds, td_->invN, n);
    LocalTensor<float> pa = outA_.AllocTensor<float>();
    ToStoreType(pa, ds, n);
    outA_.EnQue(pa);
    inS_.FreeTensor(sl);
    inG_.FreeTensor(gl);
  }

  __aicore__ inline void ToStoreType(LocalTensor<float>& dst, LocalTensor<float>& src, uint32_t n) {
    if constexpr (HstuSame<T, float>::value) {
      Adds(dst, src, 0.0f, n);
    } else {
      LocalTensor<T> d = dst.template ReinterpretCast<T>();
      Cast(d, src, RoundMode::CAST_RINT, n);
    }
  }

  __aicore__ inline void StoreQueued(TQue<QuePosition::VECOUT, 2>& que, GlobalTensor<T> dst, uint32_t len) {
    LocalTensor<float> x = que.DeQue<float>();
    DataCopyExtParams p{1, static_cast<uint32_t>(len * sizeof(T)), 0, 0, 0};
    DataCopyPad(dst, x.template ReinterpretCast<T>(), p);
    que.FreeTensor(x);
  }

  // dw_ts partial: per bucket present in this chunk, acc[k] += sum(ds where bucket == k)
  __aicore__ inline void AccumulateTimeGrad(LocalTensor<float>& ds, uint32_t len) {
    LocalTensor<float> work = workBuf_.Get<float>();
    LocalTensor<float> red = w_.f2;
    const uint32_t n = Align64(len);
    if (td_->numBuckets == 0) {
      ReduceSum(red, ds, work, len);
      WaitVectorForScalar();
      acc_.SetValue(0, acc_.GetValue(0) + red.GetValue(0));
      return;
    }
    LocalTensor<float> bucketF = bucketBuf_.Get<float>();
    ReduceMin(red, bucketF, work, len, false);
    ReduceMax(red[8], bucketF, work, len, false);
    WaitVectorForScalar();
    const int32_t lo = static_cast<int32_t>(red.GetValue(0));
    const int32_t hi = static_cast<int32_t>(red.GetValue(8));
    for (int32_t b = lo; b <= hi; ++b) {
      CompareScalar(w_.mask, bucketF, static_cast<float>(b), CMPMODE::EQ, n);
      Select(w_.f1, w_.mask, ds, 0.0f, SELMODE::VSEL_TENSOR_SCALAR_MODE, len);
      ReduceSum(red[16], w_.f1, work, len);
      WaitVectorForScalar();
      acc_.SetValue(b, acc_.GetValue(b) + red.GetValue(16));
    }
  }

  __aicore__ inline void ProcessDq(const WorkItem& it) {
    const uint32_t s = it.span.s, i0 = it.blk * HSTU_BLOCK;
    const uint32_t m = (it.span.le - i0) < HSTU_BLOCK ? (it.span.le - i0) : HSTU_BLOCK;
    const uint32_t kv = i0 + m, kvPad = td_->kvPad, nMax = td_->maxLen;
    const uint32_t hqk = td_->numHeads * td_->dimQK, hv = td_->numHeads * td_->dimV;
    const uint64_t qkOff = static_cast<uint64_t>(it.head) * td_->dimQK, vOff = static_cast<uint64_t>(it.head) * td_->dimV;

    mmNT.SetOrgShape(m, kv, hqk, hqk, kvPad);
    mmNT.SetTensorA(qGm_[static_cast<uint64_t>(s + i0) * hqk + qkOff]);
    mmNT.SetTensorB(kGm_[static_cast<uint64_t>(s) * hqk + qkOff], true);
    mmNT.SetSingleShape(m, kv, td_->dimQK);
    mmNT.IterateAll(sWs_);
    mmNT.SetOrgShape(m, kv, hv, hv, kvPad);
    mmNT.SetTensorA(doGm_[static_cast<uint64_t>(s + i0) * hv + vOff]);
    mmNT.SetTensorB(vGm_[static_cast<uint64_t>(s) * hv + vOff], true);
    mmNT.SetSingleShape(m, kv, td_->dimV);
    mmNT.IterateAll(gWs_);

    LocalTensor<T> zeros = zeroBuf_.Get<T>();
    for (uint32_t r = 0; r < m; ++r) {
      const uint32_t i = i0 + r, cnt = i + 1;
      // the query time: t_{i+1}, at the row's last position its request time (the target's time)
      const int64_t tq = (i + 1 < it.span.le) ? tsGm_.GetValue(s + i + 1) : reqGm_.GetValue(it.row);
      for (uint32_t c0 = 0; c0 < cnt; c0 += chunk_) {
        const uint32_t len = (cnt - c0) < chunk_ ? (cnt - c0) : chunk_;
        CopyIn(static_cast<uint64_t>(r) * kvPad + c0, nMax - 1 - i + c0, c0, len);
        LocalTensor<float> ds = outDs_.AllocTensor<float>();
        Compute(TimeHi(tq), TimeLo(tq), len, false, false, ds);
        AccumulateTimeGrad(ds, len);
        outDs_.EnQue(ds);
        StoreQueued(outA_, aWs_[static_cast<uint64_t>(r) * kvPad + c0], len);
        // dw_pos[N-1+j-i] for j = c0.. is an ascending run: one serialized atomic add per chunk
        LocalTensor<float> dsq = outDs_.DeQue<float>();
        DataCopyExtParams p{1, len * 4, 0, 0, 0};
        SetAtomicAdd<float>();
        DataCopyPad(posPart_[static_cast<uint64_t>(me_) * td_->wPosPad + (nMax - 1 - i + c0)], dsq, p);
        SetAtomicNone();
        PipeBarrier<PIPE_MTE3>();
        outDs_.FreeTensor(dsq);
      }
      if (cnt < kv) StoreZeros(aWs_[static_cast<uint64_t>(r) * kvPad + cnt], zeros, chunk_, kv - cnt);
    }
    PipeBarrier<PIPE_ALL>();

    mmNN.SetOrgShape(m, hqk, kvPad, kv, hqk);
    mmNN.SetTensorA(aWs_);
    mmNN.SetTensorB(kGm_[static_cast<uint64_t>(s) * hqk + qkOff]);
    mmNN.SetSingleShape(m, td_->dimQK, kv);
    mmNN.IterateAll(dqGm_[static_cast<uint64_t>(s + i0) * hqk + qkOff]);
  }

  __aicore__ inline void ProcessDkv(const WorkItem& it) {
    const uint32_t s = it.span.s, j0 = it.blk * HSTU_BLOCK;
    const uint32_t n = (it.span.le - j0) < HSTU_BLOCK ? (it.span.le - j0) : HSTU_BLOCK;
    const uint32_t qLen = it.span.le - j0, kvPad = td_->kvPad, nMax = td_->maxLen;
    const uint32_t hqk = td_->numHeads * td_->dimQK, hv = td_->numHeads * td_->dimV;
    const uint64_t qkOff = static_cast<uint64_t>(it.head) * td_->dimQK, vOff = static_cast<uint64_t>(it.head) * td_->dimV;

    mmNT.SetOrgShape(n, qLen, hqk, hqk, kvPad);  // S^T = K_blk Q^T
    mmNT.SetTensorA(kGm_[static_cast<uint64_t>(s + j0) * hqk + qkOff]);
    mmNT.SetTensorB(qGm_[static_cast<uint64_t>(s + j0) * hqk + qkOff], true);
    mmNT.SetSingleShape(n, qLen, td_->dimQK);
    mmNT.IterateAll(sWs_);
    mmNT.SetOrgShape(n, qLen, hv, hv, kvPad);    // G^T = V_blk dO^T
    mmNT.SetTensorA(vGm_[static_cast<uint64_t>(s + j0) * hv + vOff]);
    mmNT.SetTensorB(doGm_[static_cast<uint64_t>(s + j0) * hv + vOff], true);
    mmNT.SetSingleShape(n, qLen, td_->dimV);
    mmNT.IterateAll(gWs_);

    LocalTensor<T> zeros = zeroBuf_.Get<T>();
    for (uint32_t c = 0; c < n; ++c) {
      const uint32_t j = j0 + c, cnt = qLen - c;  // queries i = j .. Le-1 (columns c .. qLen-1)
      const int64_t tk = tsGm_.GetValue(s + j);
      for (uint32_t a = 0; a < cnt; a += chunk_) {
        const uint32_t len = (cnt - a) < chunk_ ? (cnt - a) : chunk_;
        // w_pos[N-1+j-i] for i = j+a .. j+a+len-1 is the window [N-a-len, N-a) read backwards
        CopyIn(static_cast<uint64_t>(c) * kvPad + c + a, nMax - a - len, j + a + 2 * kvPad, len);
        LocalTensor<float> ds = outDs_.AllocTensor<float>();
        Compute(TimeHi(tk), TimeLo(tk), len, true, true, ds);
        outDs_.FreeTensor(ds);
        StoreQueued(outA_, aWs_[static_cast<uint64_t>(c) * kvPad + c + a], len);
        StoreQueued(outB_, bWs_[static_cast<uint64_t>(c) * kvPad + c + a], len);
      }
      if (c > 0) {  // queries before the key: zero
        StoreZeros(aWs_[static_cast<uint64_t>(c) * kvPad], zeros, chunk_, c);
        StoreZeros(bWs_[static_cast<uint64_t>(c) * kvPad], zeros, chunk_, c);
      }
    }
    PipeBarrier<PIPE_ALL>();

    mmNN.SetOrgShape(n, hqk, kvPad, qLen, hqk);   // dk_blk = dS^T Q
    mmNN.SetTensorA(aWs_);
    mmNN.SetTensorB(qGm_[static_cast<uint64_t>(s + j0) * hqk + qkOff]);
    mmNN.SetSingleShape(n, td_->dimQK, qLen);
    mmNN.IterateAll(dkGm_[static_cast<uint64_t>(s + j0) * hqk + qkOff]);
    mmNN.SetOrgShape(n, hv, kvPad, qLen, hv);     // dv_blk = P^T dO
    mmNN.SetTensorA(bWs_);
    mmNN.SetTensorB(doGm_[static_cast<uint64_t>(s + j0) * hv + vOff]);
    mmNN.SetSingleShape(n, td_->dimV, qLen);
    mmNN.IterateAll(dvGm_[static_cast<uint64_t>(s + j0) * hv + vOff]);
  }

  // dw_pos[x] = sum_{c=0..P-1} part_c[x] (x < 2N-1; zero beyond), dw_ts likewise; each worker
  // owns a contiguous share of x, and the sum runs over c in order.
  __aicore__ inline void ReduceWeightGrads() {
    const uint32_t workers = td_->numWorkers;
    const uint32_t live = 2 * td_->maxLen - 1;
    const uint32_t total = td_->wPosLen;
    const uint32_t lo = static_cast<uint32_t>(static_cast<uint64_t>(total) * me_ / workers);
    const uint32_t hi = static_cast<uint32_t>(static_cast<uint64_t>(total) * (me_ + 1) / workers);
    LocalTensor<float> accum = w_.f1;
    LocalTensor<float> part = w_.f2;
    LocalTensor<float> zf = zeroBuf_.Get<float>();
    for (uint32_t x0 = lo; x0 < hi; x0 += chunk_) {
      const uint32_t len = (hi - x0) < chunk_ ? (hi - x0) : chunk_;
      const uint32_t liveLen = x0 >= live ? 0 : ((live - x0) < len ? (live - x0) : len);
      DataCopyExtParams out{1, len * 4, 0, 0, 0};
      if (liveLen == 0) {
        DataCopyPad(dwPosGm_[x0], zf, out);
        continue;
      }
      Duplicate(accum, 0.0f, chunk_);
      for (uint32_t c = 0; c < workers; ++c) {
        WaitVectorForStores();
        LoadF32(part, posPart_[static_cast<uint64_t>(c) * td_->wPosPad + x0], liveLen);
        WaitLoadsForVector();
        Add(accum, accum, part, Align64(liveLen));
        event_t vToM2 = static_cast<event_t>(GetTPipePtr()->FetchEventID(HardEvent::V_MTE2));
        SetFlag<HardEvent::V_MTE2>(vToM2);
        WaitFlag<HardEvent::V_MTE2>(vToM2);
      }
      if (liveLen < len) Duplicate(accum[Align64(liveLen)], 0.0f, chunk_ - Align64(liveLen));
      WaitVectorForStores();
      DataCopyPad(dwPosGm_[x0], accum, out);
      WaitStoresForVector();
    }
    if (me_ == workers - 1) {  // dw_ts: small, one worker
      const uint32_t nts = td_->numBuckets + 1;
      for (uint32_t x0 = 0; x0 < nts; x0 += chunk_) {
        const uint32_t len = (nts - x0) < chunk_ ? (nts - x0) : chunk_;
        const uint32_t liveLen = x0 >= td_->wTsPad ? 0 : ((td_->wTsPad - x0) < len ? (td_->wTsPad - x0) : len);
        Duplicate(accum, 0.0f, chunk_);
        for (uint32_t c = 0; c < workers && liveLen > 0; ++c) {
          WaitVectorForStores();
          LoadF32(part, tsPart_[static_cast<uint64_t>(c) * td_->wTsPad + x0], liveLen);
          WaitLoadsForVector();
          Add(accum, accum, part, Align64(liveLen));
          event_t vToM2 = static_cast<event_t>(GetTPipePtr()->FetchEventID(HardEvent::V_MTE2));
          SetFlag<HardEvent::V_MTE2>(vToM2);
          WaitFlag<HardEvent::V_MTE2>(vToM2);
        }
        WaitVectorForStores();
        DataCopyExtParams out{1, len * 4, 0, 0, 0};
        DataCopyPad(dwTsGm_[x0], accum, out);
        WaitStoresForVector();
      }
    }
  }

  const HstuAttnTilingData* td_;
  uint32_t me_, chunk_;
  float wts0_;
  WorkPlan plan_;
  BiasScratch w_;
  LocalTensor<float> acc_;
  GlobalTensor<T> doGm_, qGm_, kGm_, vGm_, dqGm_, dkGm_, dvGm_, aWs_, bWs_;
  GlobalTensor<int64_t> tsGm_, reqGm_;
  GlobalTensor<float> wPosGm_, wTsGm_, dwPosGm_, dwTsGm_, sWs_, gWs_, posPart_, tsPart_;
  GlobalTensor<int32_t> timeWs_, syncGm_;
  TQue<QuePosition::VECIN, 2> inS_, inG_, inPos_, inTime_;
  TQue<QuePosition::VECOUT, 2> outA_, outB_, outDs_;
  TBuf<QuePosition::VECCALC> scratch_, sigBuf_, bucketBuf_, revBuf_, workBuf_, maskBuf_, boundsBuf_, wtsBuf_,
      accBuf_, zeroBuf_, splitBuf_, syncBuf_;
};

extern "C" __global__ __aicore__ void hstu_jagged_attention_grad(GM_ADDR dout, GM_ADDR q, GM_ADDR k, GM_ADDR v,
                                                                 GM_ADDR offsets, GM_ADDR timestamps,
                                                                 GM_ADDR request_times, GM_ADDR w_pos,
                                                                 GM_ADDR w_ts, GM_ADDR dq, GM_ADDR dk, GM_ADDR dv,
                                                                 GM_ADDR dw_pos, GM_ADDR dw_ts, GM_ADDR workspace,
                                                                 GM_ADDR tiling) {
  KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_MIX_AIC_1_2);
  GET_TILING_DATA(td, tiling);
  GM_ADDR user = GetUserWorkspace(workspace);
  if (user == nullptr) return;
  TPipe pipe;
  HstuBwdKernel<DTYPE_Q> op;
  REGIST_MATMUL_OBJ(&pipe, GetSysWorkSpacePtr(), op.mmNT, &td.mmNT, op.mmNN, &td.mmNN);
  op.Init(dout, q, k, v, offsets, timestamps, request_times, w_pos, w_ts, dq, dk, dv, dw_pos, dw_ts, user, &td, &pipe);
  op.Process();
}
