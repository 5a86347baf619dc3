// kernels/cpu/pool.cpp — see pool.hpp. Workers spin briefly on a generation counter after each job
// (a forward pass submits ~150 jobs back to back, microseconds apart), then sleep on a condition
// variable, so an idle engine costs no CPU.
#include "kernels/cpu/pool.hpp"

#include <immintrin.h>

#include <atomic>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

namespace specactor::kernels {

namespace {
// One step of a spin wait: a pause, and after the first ~6 µs also a yield, so that a waiting thread
// gives its core to a runnable one — the thread it waits for, when the machine has more busy threads
// than cores (two engines, or tests running side by side): spinning alone then held the cores for
// whole time slices, and forwards took ten times longer. Without other runnable threads the yield
// returns at once.
inline void backoff(int spin) {
  _mm_pause();
  if (spin >= 256) std::this_thread::yield();
}
}  // namespace

struct ComputePool::Impl {
  std::mutex submit;  // one job at a time
  std::mutex mu;
  std::condition_variable wake;
  std::vector<std::thread> workers;
  // The job's number and its thread count in one word ((count << 16) | nth): a worker decides from
  // the generation it saw whether it takes part. With the count alone a worker that had just seen a
  // job it sat out (tid >= its nth) could read the next job's larger nth, run that job's share, then
  // see the new generation and run it again: two decrements of `pending`, and the submitter went on
  // while another share was still running (outputs left unwritten, at 3 threads on 2 cores).
  std::atomic<std::uint64_t> generation{0};
  std::uint64_t count = 0;  // the submitter's, under `submit`
  std::atomic<int> pending{0};
  std::atomic<bool> stop{false};
  std::atomic<int> want{0};
  std::atomic<int> sleepers{0};  // workers blocked on `wake` (the submitter notifies only then)
  const int n_cores = cores();
  const std::function<void(int, int)>* job = nullptr;
  std::exception_ptr error;
  std::mutex error_mu;

  static int cores() {  // asked once: glibc reads /sys on every call
    const unsigned n = std::thread::hardware_concurrency();
    return n == 0 ? 1 : static_cast<int>(n);
  }

  static int nth_of(std::uint64_t g) { return static_cast<int>(g & 0xFFFF); }

  void run_share(int tid, int nth) {
    try {
      (*job)(tid, nth);
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mu);
      if (!error) error = std::current_exception();
    }
  }

  void worker(int tid) {
    std::uint64_t seen = 0;
    for (;;) {
      // Spin a while for the next job, then sleep.
      std::uint64_t g = generation.load(std::memory_order_acquire);
      for (int spin = 0; g == seen && spin < 200000 && !stop.load(std::memory_order_relaxed); ++spin) {
        backoff(spin);
        g = generation.load(std::memory_order_acquire);
      }
      if (g == seen) {
        std::unique_lock<std::mutex> lock(mu);
        sleepers.fetch_add(1);
        wake.wait(lock, [&] { return stop.load() || generation.load() != seen; });
        sleepers.fetch_sub(1);
        g = generation.load();
      }
      if (stop.load()) return;
      seen = g;
      if (tid < nth_of(g)) {
        run_share(tid, nth_of(g));
        pending.fetch_sub(1, std::memory_order_acq_rel);
      }
    }
  }

  void ensure_workers(int n) {  // worker threads 1..n-1 exist
    for (int tid = static_cast<int>(workers.size()) + 1; tid < n; ++tid) {
      try {
        workers.emplace_back([this, tid] { worker(tid); });
      } catch (const std::system_error& e) {  // the system's thread or memory limits
        throw std::runtime_error("the system refused to start compute thread " + std::to_string(tid + 1) + " of " +
                                 std::to_string(n) + " (" + e.code().message() + ")");
      }
    }
  }
};

ComputePool::ComputePool() : impl_(new Impl) {}

ComputePool::~ComputePool() {
  impl_->stop.store(true);
  { std::lock_guard<std::mutex> lock(impl_->mu); }
  impl_->wake.notify_all();
  for (auto& t : impl_->workers) t.join();
  delete impl_;
}

ComputePool& ComputePool::instance() {
  static ComputePool pool;
  return pool;
}

void ComputePool::set_threads(int n) { impl_->want.store(n < 0 ? 0 : n); }

int ComputePool::threads() const {
  const int w = impl_->want.load();
  return w > 0 ? w : impl_->n_cores;
}

void ComputePool::start_threads() {
  Impl& p = *impl_;
  std::lock_guard<std::mutex> one(p.submit);
  p.ensure_workers(threads());
}

void ComputePool::run(const std::function<void(int tid, int nth)>& fn) {
  Impl& p = *impl_;
  std::lock_guard<std::mutex> one(p.submit);
  const int nth = threads();
  if (nth == 1) {
    fn(0, 1);
    return;
  }
  if (nth > 0xFFFF) throw std::invalid_argument("compute pool: more than 65535 threads");
  p.ensure_workers(nth);
  p.job = &fn;
  p.error = nullptr;
  p.pending.store(nth - 1, std::memory_order_release);
  // seq_cst, as the sleepers count: a worker either sees it or is woken
  p.generation.store((++p.count << 16) | static_cast<std::uint64_t>(nth));
  if (p.sleepers.load() > 0) {
    { std::lock_guard<std::mutex> lock(p.mu); }
    p.wake.notify_all();
  }
  p.run_share(0, nth);
  for (int spin = 0; p.pending.load(std::memory_order_acquire) > 0; ++spin) backoff(spin);
  p.job = nullptr;
  if (p.error) std::rethrow_exception(p.error);
}

}  // namespace specactor::kernels
