// kernels/comm.cpp — the in-process CPU communicator (see comm.hpp).
#include "kernels/comm.hpp"

#include <condition_variable>
#include <cstring>
#include <mutex>
#include <stdexcept>

namespace specactor::kernels {

namespace {

// A reusable barrier that a rank can abort: waiters then throw CommAborted instead of hanging.
struct Shared {
  explicit Shared(int n) : size(n), slots(static_cast<std::size_t>(n)) {}
  int size;
  std::vector<void*> slots;  // each rank's buffer for the collective in progress
  std::mutex m;
  std::condition_variable cv;
  std::uint64_t generation = 0;
  int arrived = 0;
  bool aborted = false;
  std::string reason;

  void arrive_and_wait() {
    std::unique_lock<std::mutex> lk(m);
    if (aborted) throw CommAborted(reason);
    const std::uint64_t gen = generation;
    if (++arrived == size) {
      arrived = 0;
      ++generation;
      cv.notify_all();
      return;
    }
    cv.wait(lk, [&] { return generation != gen || aborted; });
    if (generation == gen) throw CommAborted(reason);
  }

  void abort(const std::string& why) {
    {
      std::lock_guard<std::mutex> lk(m);
      if (aborted) return;
      aborted = true;
      reason = "tensor-parallel group aborted: " + why;
    }
    cv.notify_all();
  }
};

class CpuCommunicator final : public Communicator {
 public:
  CpuCommunicator(std::shared_ptr<Shared> s, int rank) : s_(std::move(s)), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return s_->size; }

  void all_reduce_sum(float* data, std::size_t n) override {
    if (s_->size == 1) return;
    s_->slots[static_cast<std::size_t>(rank_)] = data;
    s_->arrive_and_wait();  // every buffer is posted
    sum_.assign(n, 0.0f);
    for (int r = 0; r < s_->size; ++r) {
      const auto* src = static_cast<const float*>(s_->slots[static_cast<std::size_t>(r)]);
      for (std::size_t i = 0; i < n; ++i) sum_[i] += src[i];
    }
    s_->arrive_and_wait();  // every rank has read every buffer
    std::memcpy(data, sum_.data(), n * sizeof(float));
  }

  void broadcast(std::int32_t* data, std::size_t n, int root) override {
    if (s_->size == 1) return;
    if (rank_ == root) s_->slots[static_cast<std::size_t>(root)] = data;
    s_->arrive_and_wait();
    if (rank_ != root) std::memcpy(data, s_->slots[static_cast<std::size_t>(root)], n * sizeof(std::int32_t));
    s_->arrive_and_wait();
  }

  void abort(const std::string& reason) override { s_->abort(reason); }

 private:
  std::shared_ptr<Shared> s_;
  int rank_;
  std::vector<float> sum_;
};

}  // namespace

std::vector<std::unique_ptr<Communicator>> make_cpu_group(int size) {
  if (size < 1) throw std::invalid_argument("make_cpu_group: size must be >= 1");
  auto shared = std::make_shared<Shared>(size);
  std::vector<std::unique_ptr<Communicator>> out;
  for (int r = 0; r < size; ++r) out.push_back(std::make_unique<CpuCommunicator>(shared, r));
  return out;
}

}  // namespace specactor::kernels
