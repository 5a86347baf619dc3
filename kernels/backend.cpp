// kernels/backend.cpp — device probe and the CPU/CUDA backend tables.
#include "kernels/backend.hpp"

#include "kernels/cpu/rmsnorm.hpp"
#ifdef SPECACTOR_HAVE_CUDA
#include "kernels/cuda/cuda_api.hpp"
#endif

namespace specactor::kernels {

const DeviceProbe& probe_devices() {
  static const DeviceProbe probe = [] {
    DeviceProbe p;
#ifdef SPECACTOR_HAVE_CUDA
    p.cuda_compiled = true;
    const cuda::ProbeResult r = cuda::probe();
    p.device_count = r.device_count;
    p.device_name = r.device_name;
    p.cuda_runtime_version = r.runtime_version;
    p.nccl_version = r.nccl_version;
    p.cuda_usable = r.error.empty() && r.device_count > 0;
    if (!r.error.empty()) p.reason = r.error;
    else if (r.device_count == 0) p.reason = "the CUDA runtime reports no devices";
#else
    p.reason = "built without CUDA (no nvcc at configure time, or -DSPECACTOR_CUDA=OFF)";
#endif
    return p;
  }();
  return probe;
}

const Backend& cpu_backend() {
  static const Backend b{BackendKind::Cpu, "cpu", &rmsnorm_cpu};
  return b;
}

const Backend* cuda_backend() {
#ifdef SPECACTOR_HAVE_CUDA
  static const Backend b{BackendKind::Cuda, "cuda", &cuda::rmsnorm_cuda};
  return probe_devices().cuda_usable ? &b : nullptr;
#else
  return nullptr;
#endif
}

}  // namespace specactor::kernels
