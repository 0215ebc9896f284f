// The CUDA launcher of the decode kernels (foscar_dispatch.h picks the instance).
#pragma once

#include <cuda_runtime.h>

#include <atomic>

#include "foscar_decode.cuh"
#include "foscar_dispatch.h"

namespace foscar {

struct CudaLaunch {
  template <int BITS, int G, bool KCH, bool VCH, bool DEQ, int HP>
  static int run(const FoscarDecodeArgs& a, void* stream_ptr) {
    auto kernel = foscar_decode_kernel<BITS, G, KCH, VCH, DEQ, HP>;
    constexpr int smem = decode_smem_bytes<BITS, G, KCH, VCH, DEQ, HP>();
    // The CTAs per SM the kernel is made for must fit an SM's 228 KB of shared memory (1 KB of
    // each CTA's is the system's), or occupancy drops without a word (docs/PERFORMANCE.md).
    static_assert(DecodeTraits<BITS, G, KCH, VCH, DEQ, HP>::kCtasPerSm * (smem + 1024) <= 228 * 1024,
                  "this build's ring does not let kCtasPerSm CTAs share an SM: fewer stages");
    const cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
    // This library links its own CUDA runtime, whose current device is not the caller's:
    // set it from the tensors' device, and raise the shared-memory limit once per device.
    constexpr int kMaxDevices = 64;
    static std::atomic<bool> attr_set[kMaxDevices];
    if (a.device < 0 || a.device >= kMaxDevices) {
      last_error() = "device index " + std::to_string(a.device) + " is out of range 0.." +
                     std::to_string(kMaxDevices - 1);
      return 2;
    }
    cudaError_t e = cudaSetDevice(a.device);
    if (e != cudaSuccess) {
      last_error() = std::string("cudaSetDevice: ") + cudaGetErrorString(e);
      return 1;
    }
    if (!attr_set[a.device].load()) {
      int limit = 0;
      cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, a.device);
      if (smem > limit) {
        last_error() = "this build's kernel needs " + std::to_string(smem) + " bytes of shared memory per block, " +
                       "the GPU gives " + std::to_string(limit) + "; build with fewer stages";
        return 2;
      }
      e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
      // All of the unified L1 as shared memory, so that kCtasPerSm CTAs fit where their rings do.
      if (e == cudaSuccess)
        e = cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared);
      if (e != cudaSuccess) {
        last_error() = std::string("cudaFuncSetAttribute: ") + cudaGetErrorString(e);
        return 1;
      }
      attr_set[a.device].store(true);
    }
    (void)cudaGetLastError();  // report only what this launch causes
    const DecodeParams p = make_params(a);
    using T = DecodeTraits<BITS, G, KCH, VCH, DEQ, HP>;
    kernel<<<a.num_ctas, T::kThreads, smem, stream>>>(p);
    e = cudaGetLastError();
    if (e != cudaSuccess) {
      last_error() = std::string("kernel launch: ") + cudaGetErrorString(e);
      return 1;
    }
    return 0;
  }
};

}  // namespace foscar
