// kernels/cuda/nccl.cu — the NCCL communicator: one rank per device of this process, behind
// kernels::Communicator (all-reduce on device memory; broadcast of small host arrays staged through
// the device).
#include <cuda_runtime.h>
#include <nccl.h>

#include <mutex>
#include <string>
#include <vector>

#include "kernels/cuda/device_model.hpp"
#include "kernels/cuda/ops.cuh"

namespace specactor::kernels::cuda {
namespace {

void check_nccl(ncclResult_t r, const char* what) {
  if (r != ncclSuccess) throw std::runtime_error(std::string("NCCL ") + what + ": " + ncclGetErrorString(r));
}

// The group's abort flag, shared by its ranks.
struct AbortFlag {
  std::mutex m;
  std::string reason;
};

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(ncclComm_t comm, int rank, int size, std::shared_ptr<AbortFlag> flag)
      : flag_(std::move(flag)), comm_(comm), rank_(rank), size_(size) {
    detail::check(cudaSetDevice(rank_), "set device");
    detail::check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "create stream");
  }
  ~NcclCommunicator() override {
    cudaSetDevice(rank_);
    if (stage_) cudaFree(stage_);
    if (stream_) cudaStreamDestroy(stream_);
    ncclCommDestroy(comm_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  bool device_memory() const override { return true; }

  // Later collectives of every rank throw. A rank already waiting inside an NCCL collective is not
  // woken (that needs ncclCommAbort from a watchdog on every rank, which is not built yet).
  void abort(const std::string& reason) override {
    std::lock_guard<std::mutex> lk(flag_->m);
    if (flag_->reason.empty()) flag_->reason = "tensor-parallel group aborted: " + reason;
  }

  void all_reduce_sum(float* data, std::size_t n) override {
    throw_if_aborted();
    detail::check(cudaSetDevice(rank_), "set device");
    check_nccl(ncclAllReduce(data, data, n, ncclFloat, ncclSum, comm_, stream_), "all-reduce");
    detail::check(cudaStreamSynchronize(stream_), "all-reduce");
  }

  void broadcast(std::int32_t* data, std::size_t n, int root) override {
    throw_if_aborted();
    detail::check(cudaSetDevice(rank_), "set device");
    if (n > stage_n_) {
      if (stage_) cudaFree(stage_);
      detail::check(cudaMalloc(&stage_, sizeof(std::int32_t) * n), "malloc");
      stage_n_ = n;
    }
    if (rank_ == root)
      detail::check(cudaMemcpy(stage_, data, sizeof(std::int32_t) * n, cudaMemcpyHostToDevice), "memcpy");
    check_nccl(ncclBroadcast(stage_, stage_, n, ncclInt32, root, comm_, stream_), "broadcast");
    detail::check(cudaStreamSynchronize(stream_), "broadcast");
    detail::check(cudaMemcpy(data, stage_, sizeof(std::int32_t) * n, cudaMemcpyDeviceToHost), "memcpy");
  }

 private:
  void throw_if_aborted() {
    std::lock_guard<std::mutex> lk(flag_->m);
    if (!flag_->reason.empty()) throw CommAborted(flag_->reason);
  }

  std::shared_ptr<AbortFlag> flag_;
  ncclComm_t comm_;
  int rank_, size_;
  cudaStream_t stream_ = nullptr;
  std::int32_t* stage_ = nullptr;
  std::size_t stage_n_ = 0;
};

}  // namespace

std::vector<std::unique_ptr<Communicator>> make_nccl_group(int size) {
  int devices = 0;
  detail::check(cudaGetDeviceCount(&devices), "device count");
  if (size < 1 || size > devices)
    throw std::runtime_error("NCCL group of " + std::to_string(size) + " ranks needs as many devices; " +
                             std::to_string(devices) + " answered");
  std::vector<ncclComm_t> comms(static_cast<std::size_t>(size));
  std::vector<int> devs(static_cast<std::size_t>(size));
  for (int i = 0; i < size; ++i) devs[static_cast<std::size_t>(i)] = i;
  check_nccl(ncclCommInitAll(comms.data(), size, devs.data()), "init");
  std::vector<std::unique_ptr<Communicator>> out;
  auto flag = std::make_shared<AbortFlag>();
  for (int i = 0; i < size; ++i)
    out.push_back(std::make_unique<NcclCommunicator>(comms[static_cast<std::size_t>(i)], i, size, flag));
  return out;
}

std::vector<float> test_all_reduce(Communicator& comm, std::size_t n, int rank) {
  detail::check(cudaSetDevice(rank), "set device");
  std::vector<float> h(n);
  for (std::size_t i = 0; i < n; ++i) h[i] = static_cast<float>(rank + 1) * static_cast<float>(i);
  float* d = nullptr;
  detail::check(cudaMalloc(&d, sizeof(float) * n), "malloc");
  detail::check(cudaMemcpy(d, h.data(), sizeof(float) * n, cudaMemcpyHostToDevice), "memcpy");
  comm.all_reduce_sum(d, n);
  detail::check(cudaMemcpy(h.data(), d, sizeof(float) * n, cudaMemcpyDeviceToHost), "memcpy");
  cudaFree(d);
  return h;
}

}  // namespace specactor::kernels::cuda
