// model/runner.hpp — picks the forward runner for a snapshot's device: the CPU LlamaRunner, or (when
// built with CUDA) a runner whose weights and KV pool live on one GPU (kernels/cuda/device_model.hpp).
#pragma once

#include <memory>

#include "config/snapshot.hpp"
#include "model/llama.hpp"

namespace specactor::model {

// The runner for `snap.device` (cpu or cuda; auto must have been resolved), for tensor-parallel
// rank `rank` (CUDA: device `rank`). CPU threads: `threads` (the compute pool's size, 0 = every core). The KV pool's
// device copy is sized like `kv`. Throws std::runtime_error with the reason when CUDA cannot run it
// (not compiled, out of device memory — kernels::cuda::DeviceOutOfMemory's message —, a weight type
// the CUDA kernels do not compute).
std::unique_ptr<ForwardRunner> make_runner(std::shared_ptr<const LlamaWeights> weights, const config::ServerArgs& snap,
                                           int rank, int threads, const KvCache& kv);

// The communicators of a tensor-parallel group of snap.tp_size ranks: NCCL over devices 0..T-1 for
// --device cuda, else the in-process CPU group.
std::vector<std::unique_ptr<kernels::Communicator>> make_tp_group(const config::ServerArgs& snap);

// The snapshot's --cpu-precision as the kernels' enum.
kernels::Precision cpu_precision(const config::ServerArgs& snap);
// The snapshot's KV cache element type (kv_cache_dtype, resolved: float32, float16 or bfloat16).
kernels::KvType kv_type(const config::ServerArgs& snap);

// Whether this build has the CUDA forward pass.
bool cuda_forward_compiled();

}  // namespace specactor::model
