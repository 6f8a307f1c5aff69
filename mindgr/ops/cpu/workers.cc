// Persistent worker threads behind common.h's parallel_run: fn(tid) for tid in [1, n) on pooled
// threads, tid 0 on the caller, return when all are done (the same split as fresh threads, so the
// kernels' results are unchanged bit for bit).
//
// A caller takes a pool of its own from a free list (a new one if none is free), so two MindSpore
// threads calling kernels at once, or a kernel calling parallel_run inside fn, never share workers.
// A pool grows to the largest n it has been asked for; each worker has its own ticket, bumped only
// for the workers a job uses, so idle workers of a wider pool stay asleep.
// Waiting, on both sides: a bounded spin (kSpinNs: the next job or the last worker usually comes
// within microseconds inside a kernel) then a sleep on a condition variable, never an endless spin
// (the host's cores are shared with MindSpore's own threads).
// Exceptions: the first one thrown by any fn(tid) is rethrown on the caller after every worker has
// finished (a worker that could not start is a std::system_error from the caller, as before).
// Process exit stops and joins the workers; a forked child drops its parent's pools (their threads
// do not exist there) and starts new ones. Workers are named "mindgr-worker" (profiles tell them
// from the MindSpore thread that called the kernel).
#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

#include "common.h"

namespace mindgr {
namespace {

constexpr int64_t kSpinNs = 30000;  // 30 us

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

inline int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Spins until done() or kSpinNs passed; true if done().
template <class Pred>
bool spin_until(Pred&& done) {
  if (done()) return true;
  const int64_t t0 = now_ns();
  for (;;) {
    for (int i = 0; i < 32; ++i) {
      cpu_relax();
      if (done()) return true;
    }
    if (now_ns() - t0 > kSpinNs) return done();
  }
}

class Pool {
 public:
  ~Pool() { stop(); }

  void run(int n, RunFn call, void* ctx) {
    grow(n - 1);  // may throw (a thread that cannot start): nothing is running yet
    call_ = call;
    ctx_ = ctx;
    err_ = nullptr;
    pending_.store(n - 1, std::memory_order_relaxed);
    for (int w = 0; w < n - 1; ++w) {
      Worker& k = *workers_[size_t(w)];
      k.ticket.fetch_add(1, std::memory_order_release);
      std::lock_guard<std::mutex> lock(k.mu);  // pairs with the worker's check under k.mu: no lost wake-up
      k.cv.notify_one();
    }
    std::exception_ptr mine;
    try {
      call(ctx, 0);
    } catch (...) {
      mine = std::current_exception();
    }
    if (!spin_until([&] { return pending_.load(std::memory_order_acquire) == 0; })) {
      std::unique_lock<std::mutex> lock(done_mu_);
      done_cv_.wait(lock, [&] { return pending_.load(std::memory_order_acquire) == 0; });
    }
    if (mine) std::rethrow_exception(mine);
    if (err_) std::rethrow_exception(err_);
  }

  // Stops and joins the workers (they are idle: run() has returned).
  void stop() {
    for (auto& k : workers_) {
      {
        std::lock_guard<std::mutex> lock(k->mu);
        k->quit = true;
      }
      k->cv.notify_one();
    }
    for (auto& k : workers_)
      if (k->th.joinable()) k->th.join();
    workers_.clear();
  }

  // A forked child: the threads are not there; forget them without touching their state.
  void abandon() {
    for (auto& k : workers_) (void)k.release();  // its mutex may be held by a parent's thread: never touched
    workers_.clear();
  }

 private:
  struct Worker {
    std::atomic<uint64_t> ticket{0};
    std::mutex mu;
    std::condition_variable cv;
    bool quit = false;
    std::thread th;
  };

  void grow(int want) {
    while (int(workers_.size()) < want) {
      std::unique_ptr<Worker> k(new Worker());
      Worker* kp = k.get();
      const int tid = int(workers_.size()) + 1;
      k->th = std::thread([this, kp, tid] { loop(kp, tid); });
      workers_.push_back(std::move(k));
    }
  }

  void loop(Worker* k, int tid) {
    pthread_setname_np(pthread_self(), "mindgr-worker");  // (15 characters at most) for profiles
    uint64_t seen = 0;
    for (;;) {
      if (!spin_until([&] { return k->ticket.load(std::memory_order_acquire) != seen; })) {
        std::unique_lock<std::mutex> lock(k->mu);
        k->cv.wait(lock, [&] { return k->quit || k->ticket.load(std::memory_order_acquire) != seen; });
        if (k->quit) return;
      }
      seen = k->ticket.load(std::memory_order_acquire);
      try {
        call_(ctx_, tid);
      } catch (...) {
        std::lock_guard<std::mutex> lock(err_mu_);
        if (!err_) err_ = std::current_exception();
      }
      if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
        std::lock_guard<std::mutex> lock(done_mu_);
        done_cv_.notify_one();
      }
    }
  }

  std::vector<std::unique_ptr<Worker>> workers_;
  RunFn call_ = nullptr;
  void* ctx_ = nullptr;
  std::atomic<int> pending_{0};
  std::mutex err_mu_, done_mu_;
  std::condition_variable done_cv_;
  std::exception_ptr err_;
};

// The pools of this process. Never destroyed (callers may come from any thread until exit); at exit
// close() joins the idle pools' workers and later callers get fresh threads.
class Registry {
 public:
  static Registry& instance() {
    static Registry* reg = new Registry();
    static struct Closer {
      ~Closer() { reg->close(); }
    } closer;
    return *reg;
  }
  Pool* acquire() {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return nullptr;
    if (free_.empty()) {
      all_.emplace_back(new Pool());
      return all_.back().get();
    }
    Pool* p = free_.back();
    free_.pop_back();
    return p;
  }
  void release(Pool* p) {
    std::lock_guard<std::mutex> lock(mu_);
    free_.push_back(p);
  }
  void close() {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
    for (Pool* p : free_) p->stop();  // a pool still in use (a thread racing exit) is left alone
    free_.clear();
    for (auto& p : all_) (void)p.release();
    all_.clear();
  }
  // In a forked child (one thread, the fork's caller): drop every pool of the parent.
  void after_fork_child() {
    new (&mu_) std::mutex();  // the parent's lock state is meaningless here
    for (auto& p : all_) {
      p->abandon();
      (void)p.release();
    }
    all_.clear();
    free_.clear();
  }

 private:
  Registry() { pthread_atfork(nullptr, nullptr, [] { Registry::instance().after_fork_child(); }); }
  std::mutex mu_;
  bool closed_ = false;
  std::vector<Pool*> free_;
  std::vector<std::unique_ptr<Pool>> all_;
};

}  // namespace

void parallel_run_impl(int n, RunFn call, void* ctx) {
  Registry& reg = Registry::instance();
  Pool* pool = reg.acquire();
  if (pool == nullptr) {  // the process is exiting: fresh threads, as parallel_run did before pools
    std::vector<std::thread> th;
    th.reserve(size_t(n - 1));
    for (int t = 1; t < n; ++t) th.emplace_back([call, ctx, t] { call(ctx, t); });
    call(ctx, 0);
    for (auto& x : th) x.join();
    return;
  }
  struct Back {
    Registry& reg;
    Pool* pool;
    ~Back() { reg.release(pool); }
  } back{reg, pool};
  pool->run(n, call, ctx);
}

}  // namespace mindgr

// For tests (tests/unit/ops/test_ops_cpu_workers.py): `rounds` parallel_runs of n tids, each adding 1 to
// counts[tid] (counts: n ints); with throw_tid in [0, n) that tid throws in every round. Returns 0,
// or 1 if a round's exception did not reach the caller (or one came where none was thrown).
extern "C" int mindgr_parallel_probe(int n, int rounds, int throw_tid, int* counts) {
  int bad = 0;
  for (int r = 0; r < rounds; ++r) {
    bool caught = false;
    try {
      mindgr::parallel_run(n, [&](int tid) {
        __atomic_fetch_add(&counts[tid], 1, __ATOMIC_RELAXED);
        if (tid == throw_tid) throw std::runtime_error("probe");
      });
    } catch (const std::runtime_error&) {
      caught = true;
    }
    bad |= caught != (throw_tid >= 0 && throw_tid < n);
  }
  return bad;
}
