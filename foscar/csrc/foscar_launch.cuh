// The CUDA launcher of the decode kernels (foscar_dispatch.h picks the instance).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <climits>

#include "foscar_decode.cuh"
#include "foscar_dispatch.h"

namespace foscar {

struct CudaLaunch {
  template <int BITS, int G, bool KCH, bool VCH, bool DEQ, int HP, int CTAS>
  static int run(const FoscarDecodeArgs& a, void* stream_ptr) {
    const auto kernel = foscar_decode_kernel<BITS, G, KCH, VCH, DEQ, HP, CTAS>;
    constexpr int smem = decode_smem_bytes<BITS, G, KCH, VCH, DEQ, HP, CTAS>();
    using Tr = DecodeTraits<BITS, G, KCH, VCH, DEQ, HP, CTAS>;  // its CTAs per SM fit its shared memory
    const cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
    // This library links its own CUDA runtime, whose current device is not the caller's:
    // set it from the tensors' device, and raise the shared-memory limit once per device.
    constexpr int kMaxDevices = 64;
    // This kernel's CTAs that the device holds at once; 0 until the device is set up.
    static std::atomic<int> resident[kMaxDevices];
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
    if (resident[a.device].load() == 0) {
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
      int sms = 0;
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, a.device);
      resident[a.device].store(sms > 0 ? sms * Tr::kCtasPerSm : INT_MAX);  // unknown: no trim
    }
    (void)cudaGetLastError();  // report only what this launch causes
    const DecodeParams p = make_params(a);
    // A persistent grid no larger than what the device holds at once: the planner sizes it by
    // foscar_ctas_per_sm(), and a lab build's kernel that holds fewer CTAs than the knob asks
    // (DecodeTraits) would otherwise run its last CTAs in a second wave.
    const int ctas = std::min(a.num_ctas, resident[a.device].load());
    if (merge_together_launch(p, ctas)) {
      // The CTAs wait for each other in the split merge: a cooperative launch, which the driver
      // runs only with every CTA resident at once (or refuses).
      cudaLaunchConfig_t config = {};
      cudaLaunchAttribute attr[1];
      attr[0].id = cudaLaunchAttributeCooperative;
      attr[0].val.cooperative = 1;
      config.gridDim = dim3(ctas), config.blockDim = dim3(Tr::kThreads);
      config.dynamicSmemBytes = smem, config.stream = stream;
      config.attrs = attr, config.numAttrs = 1;
      e = cudaLaunchKernelEx(&config, kernel, p);
      if (e != cudaSuccess) {
        last_error() = std::string("cooperative kernel launch: ") + cudaGetErrorString(e);
        return 1;
      }
      return 0;
    }
    kernel<<<ctas, Tr::kThreads, smem, stream>>>(p);
    e = cudaGetLastError();
    if (e != cudaSuccess) {
      last_error() = std::string("kernel launch: ") + cudaGetErrorString(e);
      return 1;
    }
    return 0;
  }
};

}  // namespace foscar
