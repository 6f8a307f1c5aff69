/*
 * Device-side pieces shared by the HSTU attention kernels (forward and backward):
 *   WorkPlan   - the work split over (row, head, [kind,] block) computed from `offsets` on the device;
 *                mirrored in Python by tests/ascend_plan.py (keep the two in step);
 *   DeadTokens - the tokens whose outputs / gradients are zero (cut rows, unused tail);
 *   TimeSplit  - a row's timestamps split into 24-bit halves (int32) so the vector unit forms
 *                float32(|tq - tk|) exactly (one rounding) for |dt| < 2^47;
 *   RowBias    - w_pos + w_ts[bucket] for one query (or key) against a chunk of partners, with the
 *                bucket estimated by Ln and corrected to the exact float32 formula by thresholds.
 */
#ifndef MINDGR_HSTU_COMMON_H
#define MINDGR_HSTU_COMMON_H

#include "kernel_operator.h"
#include "lib/matmul_intf.h"

using namespace AscendC;

constexpr uint32_t HSTU_BLOCK = 64;                       // = plan.BLOCK = hstu::BLOCK (host)
constexpr uint64_t HSTU_ITEM_OVERHEAD = HSTU_BLOCK * HSTU_BLOCK;
constexpr int32_t HSTU_MAX_BUCKET = 146;
constexpr uint32_t HSTU_NUM_BOUNDS = 148;
constexpr uint32_t HSTU_BOUNDS_PAD = 152;                 // 148 rounded up to 8 floats
constexpr uint32_t KIND_FWD = 0, KIND_DQ = 1, KIND_DKV = 2;

template <typename A, typename B> struct HstuSame { static constexpr bool value = false; };
template <typename A> struct HstuSame<A, A> { static constexpr bool value = true; };

__aicore__ inline uint32_t CeilDiv(uint32_t a, uint32_t b) { return (a + b - 1) / b; }
__aicore__ inline uint32_t Align8(uint32_t a) { return (a + 7) / 8 * 8; }
__aicore__ inline uint32_t Align64(uint32_t a) { return (a + 63) / 64 * 64; }

struct RowSpan {
  uint32_t s;
  uint32_t e;
  uint32_t le;  // min(e - s, N): tokens that take part
};

struct WorkItem {
  uint32_t row;
  uint32_t head;
  uint32_t kind;
  uint32_t blk;
  RowSpan span;
};

// ------------------------------------------------------------------------------------------------
// The plan: every worker scans the rows with the same integer arithmetic and keeps its items.
class WorkPlan {
 public:
  __aicore__ inline void Init(GM_ADDR offsets, uint32_t numRows, uint32_t numTokens, uint32_t maxLen,
                              uint32_t numHeads, uint32_t workers, uint32_t me, bool backward) {
    off_.SetGlobalBuffer((__gm__ int32_t*)offsets, numRows + 1);
    rows_ = numRows;
    tokens_ = numTokens;
    n_ = maxLen;
    heads_ = numHeads;
    workers_ = workers;
    me_ = me;
    kinds_ = backward ? 2 : 1;
    total_ = 0;
    for (uint32_t b = 0; b < rows_; ++b) total_ += RowCost(Span(b));
    row_ = 0;
    head_ = 0;
    kindIdx_ = 0;
    blk_ = 0;
    start_ = 0;
    rowStart_ = 0;
    rowEnd_ = 0;
    cur_ = RowSpan{0, 0, 0};
    rowReady_ = false;
  }

  __aicore__ inline RowSpan Span(uint32_t b) const {
    RowSpan sp{0, 0, 0};
    if (b >= rows_) return sp;
    int32_t a = off_.GetValue(b);
    int32_t c = off_.GetValue(b + 1);
    uint32_t s = a < 0 ? 0 : (static_cast<uint32_t>(a) > tokens_ ? tokens_ : static_cast<uint32_t>(a));
    uint32_t e = c < static_cast<int32_t>(s) ? s : (static_cast<uint32_t>(c) > tokens_ ? tokens_ : static_cast<uint32_t>(c));
    sp.s = s;
    sp.e = e;
    sp.le = (e - s) < n_ ? (e - s) : n_;
    return sp;
  }

  __aicore__ inline uint64_t ItemCost(uint32_t kind, uint32_t le, uint32_t blk) const {
    uint32_t i0 = blk * HSTU_BLOCK;
    uint32_t rows = (le - i0) < HSTU_BLOCK ? (le - i0) : HSTU_BLOCK;
    uint32_t partners = (kind == KIND_DKV) ? (le - i0) : (i0 + rows);
    return static_cast<uint64_t>(rows) * partners + HSTU_ITEM_OVERHEAD;
  }

  __aicore__ inline uint64_t RowCost(const RowSpan& sp) const {
    uint64_t c = 0;
    uint32_t nb = CeilDiv(sp.le, HSTU_BLOCK);
    for (uint32_t k = 0; k < kinds_; ++k) {
      for (uint32_t blk = 0; blk < nb; ++blk) c += ItemCost(Kind(k), sp.le, blk);
    }
    return c * heads_;
  }

  __aicore__ inline uint32_t Kind(uint32_t k) const { return kinds_ == 1 ? KIND_FWD : (k == 0 ? KIND_DQ : KIND_DKV); }

  __aicore__ inline uint32_t Owner(uint64_t start, uint64_t cost) const {
    if (total_ == 0) return 0;
    uint64_t w = ((2 * start + cost) * workers_) / (2 * total_);
    return w >= workers_ ? workers_ - 1 : static_cast<uint32_t>(w);
  }

  // Next item of this worker in plan order; false when there is none left.
  __aicore__ inline bool Next(WorkItem& it) {
    while (row_ < rows_) {
      if (!rowReady_) {
        cur_ = Span(row_);
        uint64_t rc = RowCost(cur_);
        // Owners are non-decreasing in plan order: skip rows entirely before / stop after our share.
        if (rc == 0 || Owner(rowStart_ + rc - 1, 1) < me_) {
          rowStart_ += rc;
          ++row_;
          continue;
        }
        if (Owner(rowStart_, 1) > me_) return false;
        rowReady_ = true;
        head_ = 0;
        kindIdx_ = 0;
        blk_ = 0;
        start_ = rowStart_;
        rowEnd_ = rowStart_ + rc;
      }
      uint32_t nb = CeilDiv(cur_.le, HSTU_BLOCK);
      while (head_ < heads_) {
        while (kindIdx_ < kinds_) {
          while (blk_ < nb) {
            uint32_t kind = Kind(kindIdx_);
            uint64_t c = ItemCost(kind, cur_.le, blk_);
            uint32_t owner = Owner(start_, c);
            start_ += c;
            uint32_t blk = blk_++;
            if (owner == me_) {
              it.row = row_;
              it.head = head_;
              it.kind = kind;
              it.blk = blk;
              it.span = cur_;
              return true;
            }
            if (owner > me_) return false;
          }
          blk_ = 0;
          ++kindIdx_;
        }
        kindIdx_ = 0;
        ++head_;
      }
      rowReady_ = false;
      rowStart_ = rowEnd_;
      ++row_;
    }
    return false;
  }

  __aicore__ inline uint32_t Rows() const { return rows_; }

 private:
  GlobalTensor<int32_t> off_;
  uint32_t rows_, tokens_, n_, heads_, workers_, me_, kinds_;
  uint64_t total_;
  uint32_t row_, head_, kindIdx_, blk_;
  uint64_t start_, rowStart_, rowEnd_;
  RowSpan cur_;
  bool rowReady_;
};

// ------------------------------------------------------------------------------------------------
// Dead tokens (cut parts of rows longer than N, then the tail past the last row), split into
// `workers` contiguous shares of the list; Next() yields runs [t0, t1) of consecutive tokens.
class DeadTokens {
 public:
  __aicore__ inline void Init(const WorkPlan& plan, uint32_t numTokens, uint32_t workers, uint32_t me) {
    plan_ = &plan;
    tokens_ = numTokens;
    uint64_t total = 0;
    uint32_t last = 0;
    for (uint32_t b = 0; b < plan.Rows(); ++b) {
      RowSpan sp = plan.Span(b);
      total += sp.e - sp.s - sp.le;
      last = sp.e;
    }
    total += tokens_ - last;
    lo_ = total * me / workers;
    hi_ = total * (me + 1) / workers;
    b_ = 0;
    seen_ = 0;
    tailDone_ = false;
    last_ = last;
  }

  __aicore__ inline bool Next(uint32_t& t0, uint32_t& t1) {
    while (seen_ < hi_) {
      uint32_t a, c;
      if (b_ < plan_->Rows()) {
        RowSpan sp = plan_->Span(b_++);
        a = sp.s + sp.le;
        c = sp.e;
      } else if (!tailDone_) {
        tailDone_ = true;
        a = last_;
        c = tokens_;
      } else {
        return false;
      }
      uint64_t runLo = seen_, runHi = seen_ + (c - a);
      seen_ = runHi;
      uint64_t x = runLo > lo_ ? runLo : lo_;
      uint64_t y = runHi < hi_ ? runHi : hi_;
      if (x < y) {
        t0 = a + static_cast<uint32_t>(x - runLo);
        t1 = a + static_cast<uint32_t>(y - runLo);
        return true;
      }
    }
    return false;
  }

 private:
  const WorkPlan* plan_;
  uint32_t tokens_, b_, last_;
  uint64_t lo_, hi_, seen_;
  bool tailDone_;
};

// ------------------------------------------------------------------------------------------------
// Timestamps of one row split into 24-bit halves, cached in the worker's GM workspace:
//   [0, kvPad)       hi(t_j)     [kvPad, 2 kvPad)     lo(t_j)
//   [2 kvPad, ...)   hi(tq_j)    [3 kvPad, 4 kvPad)   lo(tq_j)    with tq_j = t_{j+1} if j+1 < Le, else the
//   row's request time `lastTq` (request_times[row]: the published convention's time of the target)
// Built by the scalar unit in UB (chunks of `chunk`) and copied out by MTE3.
__aicore__ inline int32_t TimeHi(int64_t t) { return static_cast<int32_t>(t >> 24); }
__aicore__ inline int32_t TimeLo(int64_t t) { return static_cast<int32_t>(t & 0xFFFFFF); }

__aicore__ inline void SplitRowTimes(const GlobalTensor<int64_t>& ts, const RowSpan& sp, int64_t lastTq,
                                     GlobalTensor<int32_t>& cache, uint32_t kvPad, LocalTensor<int32_t>& buf,
                                     uint32_t chunk) {
  // buf holds 4 * chunk int32
  for (uint32_t c0 = 0; c0 < sp.le; c0 += chunk) {
    uint32_t len = (sp.le - c0) < chunk ? (sp.le - c0) : chunk;
    for (uint32_t x = 0; x < len; ++x) {
      uint32_t j = c0 + x;
      int64_t t = ts.GetValue(sp.s + j);
      int64_t tq = (j + 1 < sp.le) ? ts.GetValue(sp.s + j + 1) : lastTq;
      buf.SetValue(x, TimeHi(t));
      buf.SetValue(chunk + x, TimeLo(t));
      buf.SetValue(2 * chunk + x, TimeHi(tq));
      buf.SetValue(3 * chunk + x, TimeLo(tq));
    }
    event_t sToMte3 = static_cast<event_t>(GetTPipePtr()->FetchEventID(HardEvent::S_MTE3));
    SetFlag<HardEvent::S_MTE3>(sToMte3);
    WaitFlag<HardEvent::S_MTE3>(sToMte3);
    DataCopyExtParams p{1, len * 4, 0, 0, 0};
    for (uint32_t part = 0; part < 4; ++part) {
      DataCopyPad(cache[part * kvPad + c0], buf[part * chunk], p);
    }
    event_t mte3ToS = static_cast<event_t>(GetTPipePtr()->FetchEventID(HardEvent::MTE3_S));
    SetFlag<HardEvent::MTE3_S>(mte3ToS);
    WaitFlag<HardEvent::MTE3_S>(mte3ToS);
  }
  // later DataCopyPad reads of the cache (MTE2) must see these writes
  event_t mte3ToMte2 = static_cast<event_t>(GetTPipePtr()->FetchEventID(HardEvent::MTE3_MTE2));
  SetFlag<HardEvent::MTE3_MTE2>(mte3ToMte2);
  WaitFlag<HardEvent::MTE3_MTE2>(mte3ToMte2);
}

// ------------------------------------------------------------------------------------------------
// Bias of a chunk of pairs: s[x] += w_pos-part (already loaded into `pos`) + w_ts[bucket(x)].
// gapHi/gapLo hold hi/lo of the partner times, (tHi, tLo) the fixed time of the pair's other end;
// the sign of the gap does not matter (|.|). On exit `bucketF` holds each pair's bucket as float.
// `len` elements are valid; vector ops run on lenPad = Align64(len) (padding lanes hold values that
// are never stored and never index outside the tables: indices are clamped before every Gather).
struct BiasScratch {
  LocalTensor<float> g;        // gap, then ln
  LocalTensor<float> f1;       // scratch
  LocalTensor<float> f2;       // scratch
  LocalTensor<int32_t> i1;     // integer scratch / gather offsets
  LocalTensor<uint8_t> mask;   // compare result bits
  LocalTensor<float> bounds;   // HSTU_BOUNDS_PAD thresholds
  LocalTensor<float> wts;      // w_ts table (first min(nb, 146) + 1 entries)
};

__aicore__ inline void AddTimeBias(LocalTensor<float>& s, LocalTensor<float>& bucketF, LocalTensor<int32_t>& gapHi,
                                   LocalTensor<int32_t>& gapLo, int32_t tHi, int32_t tLo, uint32_t len,
                                   uint32_t numBuckets, BiasScratch& w) {
  const uint32_t n = Align64(len);
  LocalTensor<uint32_t> offs = w.i1.ReinterpretCast<uint32_t>();
  // float32(|dt|) with one rounding: hi part exact (|dh| < 2^23), lo part exact, one Add
  Adds(gapHi, gapHi, -tHi, n);
  Adds(gapLo, gapLo, -tLo, n);
  Cast(w.f1, gapHi, RoundMode::CAST_NONE, n);
  Muls(w.f1, w.f1, 16777216.0f, n);
  Cast(w.f2, gapLo, RoundMode::CAST_NONE, n);
  Add(w.g, w.f1, w.f2, n);
  Abs(w.g, w.g, n);
  Maxs(w.g, w.g, 1.0f, n);
  // estimate: floor(ln(g) / 0.301), clamped to [0, MAX_BUCKET]
  Ln(w.f1, w.g, n);
  Muls(w.f1, w.f1, 1.0f / 0.301f, n);
  Cast(w.i1, w.f1, RoundMode::CAST_FLOOR, n);
  Maxs(w.i1, w.i1, 0, n);
  Mins(w.i1, w.i1, HSTU_MAX_BUCKET, n);
  Cast(bucketF, w.i1, RoundMode::CAST_NONE, n);
  // exact correction: b = est - (g < bound[est]) + (g >= bound[est + 1])
  Muls(w.i1, w.i1, 4, n);
  Gather(w.f1, w.bounds, offs, 0u, len);
  Adds(w.i1, w.i1, 4, n);
  Gather(w.f2, w.bounds, offs, 0u, len);
  Compare(w.mask, w.g, w.f1, CMPMODE::LT, n);
  Adds(w.f1, bucketF, -1.0f, n);
  Select(w.f1, w.mask, w.f1, bucketF, SELMODE::VSEL_TENSOR_TENSOR_MODE, len);
  Compare(w.mask, w.g, w.f2, CMPMODE::GE, n);
  Adds(w.f2, bucketF, 1.0f, n);
  Select(bucketF, w.mask, w.f2, w.f1, SELMODE::VSEL_TENSOR_TENSOR_MODE, len);
  Maxs(bucketF, bucketF, 0.0f, n);
  Mins(bucketF, bucketF, static_cast<float>(numBuckets < HSTU_MAX_BUCKET ? numBuckets : HSTU_MAX_BUCKET), n);
  // s += w_ts[b]
  Cast(w.i1, bucketF, RoundMode::CAST_RINT, n);
  Muls(w.i1, w.i1, 4, n);
  Gather(w.f1, w.wts, offs, 0u, len);
  Add(s, s, w.f1, n);
}

// SiLU(x) = x / (1 + exp(-x)) into dst; `tmp` scratch.
__aicore__ inline void Silu(LocalTensor<float>& dst, LocalTensor<float>& x, LocalTensor<float>& tmp, uint32_t n) {
  Muls(tmp, x, -1.0f, n);
  Exp(tmp, tmp, n);
  Adds(tmp, tmp, 1.0f, n);
  Div(dst, x, tmp, n);
}

// Copy `len` floats UB -> GM, converting to T when T is not float (stage: scratch of T).
template <typename T>
__aicore__ inline void StoreAs(GlobalTensor<T> dst, LocalTensor<float>& src, LocalTensor<T>& stage, uint32_t len) {
  DataCopyExtParams p{1, static_cast<uint32_t>(len * sizeof(T)), 0, 0, 0};
  if constexpr (HstuSame<T, float>::value) {
    DataCopyPad(dst, src, p);
  } else {
    Cast(stage, src, RoundMode::CAST_RINT, Align64(len));
    event_t vToMte3 = static_cast<event_t>(GetTPipePtr()->FetchEventID(HardEvent::V_MTE3));
    SetFlag<HardEvent::V_MTE3>(vToMte3);
    WaitFlag<HardEvent::V_MTE3>(vToMte3);
    DataCopyPad(dst, stage, p);
  }
}

__aicore__ inline void LoadF32(LocalTensor<float>& dst, GlobalTensor<float> src, uint32_t len) {
  DataCopyExtParams p{1, static_cast<uint32_t>(len * sizeof(float)), 0, 0, 0};
  DataCopyPadExtParams<float> pad{false, 0, 0, 0.0f};
  DataCopyPad(dst, src, p, pad);
}

// Write `len` zeros of T to GM from a zeroed UB buffer of at least `zeroLen` elements.
template <typename T>
__aicore__ inline void StoreZeros(GlobalTensor<T> dst, LocalTensor<T>& zeros, uint32_t zeroLen, uint64_t len) {
  for (uint64_t x = 0; x < len; x += zeroLen) {
    uint32_t n = static_cast<uint32_t>((len - x) < zeroLen ? (len - x) : zeroLen);
    DataCopyExtParams p{1, static_cast<uint32_t>(n * sizeof(T)), 0, 0, 0};
    DataCopyPad(dst[x], zeros, p);
  }
}

// Scalar read of a UB value written by the vector unit.
__aicore__ inline void WaitVectorForScalar() {
  event_t vToS = static_cast<event_t>(GetTPipePtr()->FetchEventID(HardEvent::V_S));
  SetFlag<HardEvent::V_S>(vToS);
  WaitFlag<HardEvent::V_S>(vToS);
}

__aicore__ inline void WaitLoadsForVector() {
  event_t m2ToV = static_cast<event_t>(GetTPipePtr()->FetchEventID(HardEvent::MTE2_V));
  SetFlag<HardEvent::MTE2_V>(m2ToV);
  WaitFlag<HardEvent::MTE2_V>(m2ToV);
}

__aicore__ inline void WaitVectorForStores() {
  event_t vToM3 = static_cast<event_t>(GetTPipePtr()->FetchEventID(HardEvent::V_MTE3));
  SetFlag<HardEvent::V_MTE3>(vToM3);
  WaitFlag<HardEvent::V_MTE3>(vToM3);
}

__aicore__ inline void WaitStoresForVector() {
  event_t m3ToV = static_cast<event_t>(GetTPipePtr()->FetchEventID(HardEvent::MTE3_V));
  SetFlag<HardEvent::MTE3_V>(m3ToV);
  WaitFlag<HardEvent::MTE3_V>(m3ToV);
}

#endif  // MINDGR_HSTU_COMMON_H
