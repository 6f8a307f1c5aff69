// Shared helpers for MindGR's CPU kernels: threads, float vectors of the build's ISA, a
// vectorisable exp, a fast reciprocal, and reading MindSpore custom-op (AOT) arguments.
//
// The ISA is chosen by build.py on the user's machine and passed as one MINDGR_ISA_* macro:
//   AVX512  16 lanes (zmm), 32 vector registers      AVX2     8 lanes (ymm, with FMA), 16 registers
//   NEON     4 lanes (q),   32 vector registers      GENERIC  4 lanes, portable vector extensions
// Kernels size their register tiles from VL and kVecRegs so that the accumulators fit.
#pragma once

#include <sched.h>
#if defined(MINDGR_ISA_AVX512)
#if !defined(__AVX512F__)
#error "MINDGR_ISA_AVX512 needs AVX-512F code generation"
#endif
#include <immintrin.h>
#elif defined(MINDGR_ISA_AVX2)
#if !defined(__AVX2__) || !defined(__FMA__)
#error "MINDGR_ISA_AVX2 needs AVX2 and FMA code generation"
#endif
#include <immintrin.h>
#elif defined(MINDGR_ISA_NEON)
#if !defined(__ARM_NEON)
#error "MINDGR_ISA_NEON needs NEON code generation"
#endif
#include <arm_neon.h>
#elif !defined(MINDGR_ISA_GENERIC)
#define MINDGR_ISA_GENERIC 1
#endif

// A custom-op (AOT) entry point with MindSpore's CPU signature, forwarding the tensors to FN and any
// further arguments, e.g. MINDGR_AOT_OP(MindgrHstuFwd, mindgr::run_forward, true).
#define MINDGR_AOT_OP(NAME, FN, ...)                                                                  \
  extern "C" int NAME(int nparam, void** params, int* ndims, int64_t** shapes, const char** dtypes, \
                      void* /*stream*/, void* /*extra*/) {                                         \
    return FN(nparam, params, ndims, shapes, dtypes, ##__VA_ARGS__);                               \
  }

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

namespace mindgr {

// ---------------------------------------------------------------------------------------------
// Threads. MINDGR_CPU_THREADS (>= 1) wins; otherwise the number of cores this process may use.
inline int num_threads() {
  const char* env = std::getenv("MINDGR_CPU_THREADS");
  if (env != nullptr && *env != '\0') {
    int n = std::atoi(env);
    if (n >= 1) return std::min(n, 256);
  }
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    int n = CPU_COUNT(&set);
    if (n >= 1) return std::min(n, 256);
  }
  unsigned n = std::thread::hardware_concurrency();
  return n >= 1 ? static_cast<int>(std::min(n, 256u)) : 1;
}

// Runs fn(tid) for tid in [0, n): tid 0 on the calling thread, the others on persistent worker
// threads (workers.cc), and returns when all have finished. The first exception thrown by any
// fn(tid) is rethrown here after all have finished; so is a std::system_error when a worker thread
// cannot start. Safe to call from several threads at once and from inside fn.
typedef void (*RunFn)(void* ctx, int tid);
void parallel_run_impl(int n, RunFn call, void* ctx);

// fn(tid) through one out-of-line copy, whatever the thread count: an inlined fn(0) on the one-thread path
// was compiled apart from the workers' copy, and under -ffp-contract=fast the two copies may contract
// a * b + c differently (seen on AVX2: LayerNorm's rows differed by an ulp between 1 and 2 threads).
template <class F>
__attribute__((noinline)) void run_tid(void* ctx, int tid) {
  (*static_cast<F*>(ctx))(tid);
}

template <class Fn>
void parallel_run(int n, Fn&& fn) {
  using F = typename std::remove_reference<Fn>::type;
  void* ctx = const_cast<void*>(static_cast<const void*>(&fn));
  if (n <= 1) {
    run_tid<F>(ctx, 0);
    return;
  }
  parallel_run_impl(n, &run_tid<F>, ctx);
}

// fn(tid, i0, i1) over [0, n) in blocks of `block` items taken from a shared counter by n_threads threads:
// a thread that another process (or the input thread) preempts takes fewer blocks instead of holding up
// the call. For work whose items are independent (the result cannot depend on the split).
template <class Fn>
void parallel_blocks(int n_threads, int64_t n, int64_t block, Fn&& fn) {
  std::atomic<int64_t> next(0);
  block = std::max<int64_t>(block, 1);
  parallel_run(n_threads, [&](int tid) {
    for (;;) {
      const int64_t i0 = next.fetch_add(block, std::memory_order_relaxed);
      if (i0 >= n) break;
      fn(tid, i0, std::min(n, i0 + block));
    }
  });
}

// ---------------------------------------------------------------------------------------------
// Scratch memory reused across calls: large fresh allocations cost page faults on every call.
// Contents are NOT cleared between uses.  Buffers up to kKeepBytes are kept for the process.
class ScratchPool {
 public:
  static ScratchPool& instance() {
    static ScratchPool* pool = new ScratchPool();  // never destroyed: used until exit
    return *pool;
  }
  std::vector<float>* acquire(size_t n) {
    std::vector<float>* v = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu_);
      // the smallest free buffer that is large enough, else the largest one (grown below)
      size_t best = free_.size();
      for (size_t i = 0; i < free_.size(); ++i) {
        if (best == free_.size()) {
          best = i;
          continue;
        }
        const size_t si = free_[i]->size(), sb = free_[best]->size();
        const bool fi = si >= n, fb = sb >= n;
        if ((fi && !fb) || (fi && fb && si < sb) || (!fi && !fb && si > sb)) best = i;
      }
      if (best < free_.size()) {
        v = free_[best];
        free_.erase(free_.begin() + best);
      }
    }
    if (v == nullptr) v = new std::vector<float>();
    if (v->size() < n) v->resize(n);
    return v;
  }
  void release(std::vector<float>* v) {
    if (v->size() * sizeof(float) > kKeepBytes) {
      delete v;
      return;
    }
    std::lock_guard<std::mutex> lock(mu_);
    free_.push_back(v);
  }

 private:
  static constexpr size_t kKeepBytes = size_t(512) << 20;
  std::mutex mu_;
  std::vector<std::vector<float>*> free_;
};

// A scratch buffer of at least n floats for the lifetime of this object (contents undefined).
class Scratch {
 public:
  explicit Scratch(size_t n) : v_(ScratchPool::instance().acquire(n)) {}
  ~Scratch() { ScratchPool::instance().release(v_); }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  float* data() { return v_->data(); }
  const float* data() const { return v_->data(); }

 private:
  std::vector<float>* v_;
};

// ---------------------------------------------------------------------------------------------
// Vectors of VL floats (GCC/Clang vector extensions: one register of the build's ISA).
#if defined(MINDGR_ISA_AVX512)
constexpr int VL = 16;
constexpr int kVecRegs = 32;
constexpr const char* kIsaName = "avx512";
#elif defined(MINDGR_ISA_AVX2)
constexpr int VL = 8;
constexpr int kVecRegs = 16;
constexpr const char* kIsaName = "avx2";
#elif defined(MINDGR_ISA_NEON)
constexpr int VL = 4;
constexpr int kVecRegs = 32;
constexpr const char* kIsaName = "neon";
#else
constexpr int VL = 4;
constexpr int kVecRegs = 16;
constexpr const char* kIsaName = "generic";
#endif
typedef float vf __attribute__((vector_size(VL * sizeof(float))));
typedef int32_t vi __attribute__((vector_size(VL * sizeof(int32_t))));

inline vf vload(const float* p) {
  vf r;
  std::memcpy(&r, p, sizeof(r));
  return r;
}
inline void vstore(float* p, vf v) { std::memcpy(p, &v, sizeof(v)); }
// (not vf{} + a: 0 + a is not an identity for a = -0, so the compiler keeps an add per broadcast)
inline vf vbcast(float a) {
#if defined(MINDGR_ISA_AVX512)
  return (vf)_mm512_set1_ps(a);
#elif defined(MINDGR_ISA_AVX2)
  return (vf)_mm256_set1_ps(a);
#else
  return a - vf{};
#endif
}
inline vf vzero() { return vf{}; }
// 0, 1, ..., VL-1
inline vi iota() {
  vi r{};
  for (int i = 0; i < VL; ++i) r[i] = i;
  return r;
}
// mask ? a : 0 for an integer mask of -1/0 lanes.
inline vf vselect(vi mask, vf a) {
  vi bits;
  std::memcpy(&bits, &a, sizeof(bits));
  bits &= mask;
  vf r;
  std::memcpy(&r, &bits, sizeof(r));
  return r;
}

inline vi vload_i(const int32_t* p) {
  vi r;
  std::memcpy(&r, p, sizeof(r));
  return r;
}
inline void vstore_i(int32_t* p, vi v) { std::memcpy(p, &v, sizeof(v)); }
inline vi vbcast_i(int32_t a) { return a - vi{}; }
inline vi vbits(vf a) {
  vi r;
  std::memcpy(&r, &a, sizeof(r));
  return r;
}

// base[idx[lane]] for every lane (idx in range: the caller's guarantee).
inline vi vgather_i(const int32_t* base, vi idx) {
#if defined(MINDGR_ISA_AVX512)
  return (vi)_mm512_i32gather_epi32((__m512i)idx, base, 4);
#elif defined(MINDGR_ISA_AVX2)
  return (vi)_mm256_i32gather_epi32(base, (__m256i)idx, 4);
#else
  vi r;
  for (int i = 0; i < VL; ++i) r[i] = base[idx[i]];
  return r;
#endif
}
inline vf vgather_f(const float* base, vi idx) {
#if defined(MINDGR_ISA_AVX512)
  return (vf)_mm512_i32gather_ps((__m512i)idx, base, 4);
#elif defined(MINDGR_ISA_AVX2)
  return (vf)_mm256_i32gather_ps(base, (__m256i)idx, 4);
#else
  vf r;
  for (int i = 0; i < VL; ++i) r[i] = base[idx[i]];
  return r;
#endif
}

// base[idx[lane]] for a table of n entries (idx < n) padded with zeros to a multiple of 32 entries.
// AVX-512 with n <= 256: in-register permutes (vpermi2d over pairs of 16-entry registers, one blend
// per further pair), much cheaper than a 16-lane gather; otherwise gathers.
inline vi vtable_i(const int32_t* base, int n, vi idx) {
#if defined(MINDGR_ISA_AVX512)
  if (n <= 256) {
    const __m512i ix = (__m512i)idx;
    const __m512i hi = _mm512_srli_epi32(ix, 5);
    __m512i r = _mm512_permutex2var_epi32(_mm512_loadu_si512(base), ix, _mm512_loadu_si512(base + 16));
    for (int p = 1; p * 32 < n; ++p) {
      const __m512i v = _mm512_permutex2var_epi32(_mm512_loadu_si512(base + 32 * p), ix,
                                                  _mm512_loadu_si512(base + 32 * p + 16));
      r = _mm512_mask_mov_epi32(r, _mm512_cmpeq_epi32_mask(hi, _mm512_set1_epi32(p)), v);
    }
    return (vi)r;
  }
#endif
  (void)n;
  return vgather_i(base, idx);
}
inline vf vtable_f(const float* base, int n, vi idx) {
  vi r = vtable_i(reinterpret_cast<const int32_t*>(base), n, idx);
  vf f;
  std::memcpy(&f, &r, sizeof(f));
  return f;
}

// n (0 <= n < VL) leading floats of p, the other lanes zero; never reads past p + n.
inline vf vload_tail(const float* p, int n) {
#if defined(MINDGR_ISA_AVX512)
  return (vf)_mm512_maskz_loadu_ps((__mmask16)((1u << n) - 1u), p);
#elif defined(MINDGR_ISA_AVX2)
  const __m256i m = _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  return (vf)_mm256_maskload_ps(p, m);
#else
  vf r = vzero();
  std::memcpy(&r, p, sizeof(float) * size_t(n));
  return r;
#endif
}

#if defined(MINDGR_ISA_AVX2)
// The n (0 <= n <= VL) leading lanes of v to p as at most three plain stores of 4, 2 and 1 lanes:
// vmaskmovps to memory costs about 20 cycles on Zen 3 (measured: 8 ns against 1 ns for a plain store).
inline void store_lanes_avx2(float* p, vf v, int n) {
  if (n == VL) {
    _mm256_storeu_ps(p, (__m256)v);
    return;
  }
  __m128 q = _mm256_castps256_ps128((__m256)v);
  if (n & 4) {
    _mm_storeu_ps(p, q);
    p += 4;
    q = _mm256_extractf128_ps((__m256)v, 1);
  }
  if (n & 2) {
    _mm_storel_pi(reinterpret_cast<__m64*>(p), q);
    p += 2;
    q = _mm_movehl_ps(q, q);
  }
  if (n & 1) _mm_store_ss(p, q);
}
#endif

// Stores the n (0 <= n < VL) leading lanes of v; never writes past p + n.
inline void vstore_tail(float* p, vf v, int n) {
#if defined(MINDGR_ISA_AVX512)
  _mm512_mask_storeu_ps(p, (__mmask16)((1u << n) - 1u), (__m512)v);
#elif defined(MINDGR_ISA_AVX2)
  store_lanes_avx2(p, v, n);
#else
  std::memcpy(p, &v, sizeof(float) * size_t(n));
#endif
}

// Keeps v in a register from here on (an empty asm that "changes" it): on AVX2 GCC otherwise folds a
// vector reused by several FMAs into each FMA as a memory operand, reloading it once per use, and the
// micro-kernels become load-bound (Zen 3: two 256-bit loads a cycle against two FMAs). Same arithmetic.
// Other ISAs: nothing (AVX-512's 32 registers are not restricted to the 16 that "x" names).
inline void pin_reg(vf& v) {
#if defined(MINDGR_ISA_AVX2)
  asm("" : "+x"(v));
#else
  (void)v;
#endif
}

// Sum of the VL lanes in a fixed pairwise order (a[i] + a[i + VL/2], halving).
inline float vsum(vf v) {
  float a[VL];
  std::memcpy(a, &v, sizeof(a));
  for (int w = VL / 2; w >= 1; w /= 2)
    for (int i = 0; i < w; ++i) a[i] += a[i + w];
  return a[0];
}

// exp(x) for every lane, about 1 ulp on [-87, 88] (inputs are clamped to that range): 2^n * p(r)
// with n = round(x / ln 2), r = x - n ln 2 split in two parts, p a degree-7 minimax polynomial.
inline vf vexp(vf x) {
  const vf hi = vbcast(88.0f), lo = vbcast(-87.0f);
  x = x < hi ? x : hi;
  x = x > lo ? x : lo;
  vf t = x * 1.44269504088896341f + 0.5f;
  vi ti = __builtin_convertvector(t, vi);  // truncates toward zero
  vf tf = __builtin_convertvector(ti, vf);
  vi above = tf > t;                        // -1 where truncation rounded up (negative t)
  tf += __builtin_convertvector(above, vf); // floor(t)
  ti = __builtin_convertvector(tf, vi);
  vf r = x - tf * 0.693359375f;
  r = r - tf * -2.12194440e-4f;
  vf p = vbcast(1.9875691500e-4f);
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  vi bits = (ti + 127) << 23;
  vf scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return p * scale;
}

// 1 / x without a division: the ISA's reciprocal estimate refined by Newton steps
// r' = r (2 - x r), which square the relative error e: AVX-512 rcp14 (|e| < 2^-14, one step),
// AVX2 rcpps (|e| < 1.5 * 2^-12, one step), NEON vrecpe (|e| < 2^-8, two steps); the refined
// error is below 2^-22 plus the steps' own rounding (test_ops_cpu_isa.py checks |e| <= 4e-7 on
// [1, 1e30], the range SiLU uses: 1 + exp(-x) >= 1).  GENERIC divides.
inline vf vrecip(vf x) {
#if defined(MINDGR_ISA_AVX512)
  vf r = (vf)_mm512_rcp14_ps((__m512)x);
  return r * (2.0f - x * r);
#elif defined(MINDGR_ISA_AVX2)
  vf r = (vf)_mm256_rcp_ps((__m256)x);
  return r * (2.0f - x * r);
#elif defined(MINDGR_ISA_NEON)
  float32x4_t xv = (float32x4_t)x;
  float32x4_t r = vrecpeq_f32(xv);
  r = vmulq_f32(r, vrecpsq_f32(xv, r));
  r = vmulq_f32(r, vrecpsq_f32(xv, r));
  return (vf)r;
#else
  return 1.0f / x;
#endif
}

// 1 / (1 + exp(-x))
inline vf vsigmoid(vf x) { return vrecip(1.0f + vexp(-x)); }

// ---------------------------------------------------------------------------------------------
// AOT arguments. An entry point returns 0 or one named ArgError code (arg_errors.def, which Python
// reads too): MindSpore reports a nonzero return as "Return value from CPU AOT kernel ... is N" and
// mindgr/ops/cpu/errors.py turns that into "<op>: <text> (code N)".
enum class ArgError : int {
#define MINDGR_ARG_ERROR(NAME, CODE, TEXT) NAME = CODE,
#include "arg_errors.def"
#undef MINDGR_ARG_ERROR
};

inline int arg_error(ArgError e) { return static_cast<int>(e); }

// MINDGR_REJECT_IF(bad, kName): return ArgError::kName from the entry point when `bad` holds.
#define MINDGR_REJECT_IF(BAD, NAME)                                       \
  do {                                                                    \
    if (BAD) return ::mindgr::arg_error(::mindgr::ArgError::NAME);        \
  } while (0)
// MINDGR_FAIL(kName): return ArgError::kName (e.g. from a catch block).
#define MINDGR_FAIL(NAME) return ::mindgr::arg_error(::mindgr::ArgError::NAME)

inline int64_t numel(int ndim, const int64_t* shape) {
  int64_t n = 1;
  for (int i = 0; i < ndim; ++i) n *= shape[i];
  return n;
}

inline bool is_dtype(const char* got, const char* want) { return got != nullptr && std::strcmp(got, want) == 0; }

inline bool is_f32(const char* dt) { return is_dtype(dt, "float32") || is_dtype(dt, "float"); }

// Size in bytes of one element, 0 if the dtype is unknown.
inline int dtype_size(const char* dt) {
  if (dt == nullptr) return 0;
  static const struct { const char* name; int size; } table[] = {
      {"float32", 4}, {"float", 4}, {"float16", 2}, {"bfloat16", 2}, {"float64", 8}, {"double", 8},
      {"int8", 1}, {"int16", 2}, {"int32", 4}, {"int", 4}, {"int64", 8}, {"uint8", 1},
      {"uint16", 2}, {"uint32", 4}, {"uint", 4}, {"uint64", 8}, {"bool", 1}, {"complex64", 8},
      {"complex128", 16}};
  for (const auto& e : table)
    if (std::strcmp(dt, e.name) == 0) return e.size;
  return 0;
}

// Integer tensor (int32 or int64) as int64 values; false for other dtypes.
inline bool read_ints(const void* p, const char* dt, int64_t n, std::vector<int64_t>* out) {
  out->resize(static_cast<size_t>(n));
  if (is_dtype(dt, "int32") || is_dtype(dt, "int")) {
    const int32_t* s = static_cast<const int32_t*>(p);
    for (int64_t i = 0; i < n; ++i) (*out)[i] = s[i];
    return true;
  }
  if (is_dtype(dt, "int64")) {
    const int64_t* s = static_cast<const int64_t*>(p);
    for (int64_t i = 0; i < n; ++i) (*out)[i] = s[i];
    return true;
  }
  return false;
}

// Offsets must start >= 0, never decrease and end <= num_tokens.
inline bool offsets_ok(const std::vector<int64_t>& off, int64_t num_tokens) {
  if (off.empty()) return false;
  if (off[0] < 0) return false;
  for (size_t b = 1; b < off.size(); ++b)
    if (off[b] < off[b - 1]) return false;
  return off.back() <= num_tokens;
}

}  // namespace mindgr
