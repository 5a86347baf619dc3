// kernels/cpu/pool.hpp — the one pool of compute threads every CPU kernel runs on.
//
// The engine's forward passes (target, tensor-parallel ranks, STANDALONE and head drafters) all
// submit their parallel loops here, so a drafter uses every core instead of one, and no second
// thread team competes with the first. Calls are serialized: the speculative loop is sequential
// (the drafter and the target never compute at the same time), and tensor-parallel ranks take turns
// per kernel (never while waiting on their communicator). The submitting thread works as thread 0.
#pragma once

#include <functional>

namespace specactor::kernels {

class ComputePool {
 public:
  // The process-wide pool (threads start on first use).
  static ComputePool& instance();

  // Threads used by run(), the caller included; 0 = every core. Takes effect at the next run().
  void set_threads(int n);
  int threads() const;
  // Starts the threads threads() asks for now (else they start at the first run()); throws
  // std::runtime_error naming the count when the system refuses one (its thread or memory limits).
  void start_threads();

  // fn(tid, nth) on nth threads; returns when every call has returned. An exception thrown by any
  // call is rethrown here (the first one).
  void run(const std::function<void(int tid, int nth)>& fn);

  ComputePool(const ComputePool&) = delete;
  ComputePool& operator=(const ComputePool&) = delete;
  ~ComputePool();

 private:
  ComputePool();
  struct Impl;
  Impl* impl_;
};

// ComputePool::instance().run(fn).
inline void parallel_run(const std::function<void(int tid, int nth)>& fn) { ComputePool::instance().run(fn); }

}  // namespace specactor::kernels
