// Host-side dispatch from runtime configuration to kernel template instances.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstdio>
#include <string>

#include "foscar_api.h"
#include "foscar_decode.cuh"

namespace foscar {

std::string& last_error();

template <int BITS, int D, int G, bool KCH, bool VCH, bool DEQ, bool F16>
int launch_instance(const FoscarDecodeArgs& a, cudaStream_t stream) {
  auto kernel = foscar_decode_kernel<BITS, D, G, KCH, VCH, DEQ, F16>;
  constexpr int smem = decode_smem_bytes<BITS, D, G, KCH, VCH, DEQ, F16>();
  // This library links its own CUDA runtime, whose current device is not the caller's:
  // set it from the tensors' device, and raise the shared-memory limit once per device.
  constexpr int kMaxDevices = 64;
  static std::atomic<bool> attr_set[kMaxDevices];
  if (a.device < 0 || a.device >= kMaxDevices) {
    last_error() = "device index " + std::to_string(a.device) + " is out of range 0.." + std::to_string(kMaxDevices - 1);
    return 2;
  }
  cudaError_t e = cudaSetDevice(a.device);
  if (e != cudaSuccess) {
    last_error() = std::string("cudaSetDevice: ") + cudaGetErrorString(e);
    return 1;
  }
  if (!attr_set[a.device].load()) {
    e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (e != cudaSuccess) {
      last_error() = std::string("cudaFuncSetAttribute: ") + cudaGetErrorString(e);
      return 1;
    }
    attr_set[a.device].store(true);
  }
  (void)cudaGetLastError();  // report only what this launch causes
  DecodeParams p;
  p.q = static_cast<const __nv_bfloat16*>(a.q);
  p.o = static_cast<__nv_bfloat16*>(a.o);
  p.k_codes = static_cast<const uint32_t*>(a.k_codes);
  p.v_codes = static_cast<const uint32_t*>(a.v_codes);
  p.k_params = static_cast<const __half2*>(a.k_params);
  p.v_params = static_cast<const __half2*>(a.v_params);
  p.page_table = a.page_table;
  p.seq_lens = a.seq_lens;
  p.k_tail = static_cast<const __nv_bfloat16*>(a.k_tail);
  p.v_tail = static_cast<const __nv_bfloat16*>(a.v_tail);
  p.ws_o = a.ws_o;
  p.ws_ml = a.ws_ml;
  p.batch = a.batch;
  p.num_q_heads = a.num_q_heads;
  p.num_kv_heads = a.num_kv_heads;
  p.page_size = a.page_size;
  p.max_pages = a.max_pages;
  p.num_splits = a.num_splits;
  p.units_per_split = a.units_per_split;
  p.sm_scale_log2 = a.sm_scale * 1.4426950408889634f;
  using T = DecodeTraits<BITS, D, G, KCH, VCH, DEQ, F16>;
  dim3 grid(a.num_splits, a.num_kv_heads, a.batch);
  kernel<<<grid, T::kWarps * 32, smem, stream>>>(p);
  if (a.num_splits > 1) {
    foscar_combine_kernel<D><<<a.batch * a.num_q_heads, D, 0, stream>>>(a.ws_o, a.ws_ml, p.o, a.num_splits);
  }
  e = cudaGetLastError();
  if (e != cudaSuccess) {
    last_error() = std::string("kernel launch: ") + cudaGetErrorString(e);
    return 1;
  }
  return 0;
}

template <int BITS, int G, bool KCH, bool VCH, bool F16>
int launch_variant(const FoscarDecodeArgs& a, cudaStream_t s) {
  if (a.dequant) {
    if constexpr (KCH && !VCH) return launch_instance<BITS, 128, G, KCH, VCH, true, F16>(a, s);
    last_error() = "the dequantize-first ablation is built for K channel-wise, V token-wise only";
    return 2;
  }
  return launch_instance<BITS, 128, G, KCH, VCH, false, F16>(a, s);
}

template <int BITS, int G, bool KCH, bool VCH>
int launch_modes(const FoscarDecodeArgs& a, cudaStream_t s) {
  return a.operand_f16 ? launch_variant<BITS, G, KCH, VCH, true>(a, s) : launch_variant<BITS, G, KCH, VCH, false>(a, s);
}

template <int BITS, int G>
int launch_group(const FoscarDecodeArgs& a, cudaStream_t s) {
  if (a.k_channel) {
    return a.v_channel ? launch_modes<BITS, G, true, true>(a, s) : launch_modes<BITS, G, true, false>(a, s);
  }
  return a.v_channel ? launch_modes<BITS, G, false, true>(a, s) : launch_modes<BITS, G, false, false>(a, s);
}

template <int BITS>
int launch_bits(const FoscarDecodeArgs& a, cudaStream_t s) {
  switch (a.group_size) {
    case 32: return launch_group<BITS, 32>(a, s);
    case 64: return launch_group<BITS, 64>(a, s);
    case 128: return launch_group<BITS, 128>(a, s);
    default:
      last_error() = "group_size " + std::to_string(a.group_size) + " is not built; expected 32, 64 or 128";
      return 2;
  }
}

}  // namespace foscar
