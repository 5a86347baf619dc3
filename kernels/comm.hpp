// kernels/comm.hpp — collective communication for tensor parallelism, behind one interface: the
// in-process CPU group (threads of one process) here, NCCL (one GPU per rank) in kernels/cuda/.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace specactor::kernels {

// A collective could not complete because a rank gave up (abort); every later collective of the
// group throws it too. The message names the rank's reason.
class CommAborted : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Whether all_reduce_sum takes device pointers (NCCL) rather than host memory (the CPU group).
  virtual bool device_memory() const { return false; }
  // Every rank calls it with n floats; afterwards every rank holds the element-wise sum. The sum
  // runs in rank order on every rank, so all ranks hold bit-identical results.
  virtual void all_reduce_sum(float* data, std::size_t n) = 0;
  // Every rank calls it with host memory; afterwards every rank holds root's n values.
  virtual void broadcast(std::int32_t* data, std::size_t n, int root) = 0;
  // Called by a rank that cannot go on (its forward failed, its actor is exiting): the ranks waiting
  // in a collective, and every later collective, throw CommAborted with `reason` instead of waiting
  // forever for it. Safe from any thread, idempotent (the first reason stays).
  virtual void abort(const std::string& reason) = 0;
};

// A group of `size` communicators for `size` threads of this process (rank i = element i). Each
// must be used by one thread; collectives block until every rank has arrived.
std::vector<std::unique_ptr<Communicator>> make_cpu_group(int size);

}  // namespace specactor::kernels
