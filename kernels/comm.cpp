// kernels/comm.cpp — the in-process CPU communicator (see comm.hpp).
#include "kernels/comm.hpp"

#include <barrier>
#include <cstring>
#include <stdexcept>

namespace specactor::kernels {

namespace {

struct Shared {
  explicit Shared(int n) : size(n), sync(n), slots(static_cast<std::size_t>(n)) {}
  int size;
  std::barrier<> sync;
  std::vector<void*> slots;  // each rank's buffer for the collective in progress
};

class CpuCommunicator final : public Communicator {
 public:
  CpuCommunicator(std::shared_ptr<Shared> s, int rank) : s_(std::move(s)), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return s_->size; }

  void all_reduce_sum(float* data, std::size_t n) override {
    if (s_->size == 1) return;
    s_->slots[static_cast<std::size_t>(rank_)] = data;
    s_->sync.arrive_and_wait();  // every buffer is posted
    sum_.assign(n, 0.0f);
    for (int r = 0; r < s_->size; ++r) {
      const auto* src = static_cast<const float*>(s_->slots[static_cast<std::size_t>(r)]);
      for (std::size_t i = 0; i < n; ++i) sum_[i] += src[i];
    }
    s_->sync.arrive_and_wait();  // every rank has read every buffer
    std::memcpy(data, sum_.data(), n * sizeof(float));
  }

  void broadcast(std::int32_t* data, std::size_t n, int root) override {
    if (s_->size == 1) return;
    if (rank_ == root) s_->slots[static_cast<std::size_t>(root)] = data;
    s_->sync.arrive_and_wait();
    if (rank_ != root) std::memcpy(data, s_->slots[static_cast<std::size_t>(root)], n * sizeof(std::int32_t));
    s_->sync.arrive_and_wait();
  }

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
