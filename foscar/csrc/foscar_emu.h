// A host emulation of the few CUDA features the FOSCAR kernels use, so that the kernels'
// own source runs on a CPU (foscar/emu.py, tests/foscar/test_kernels_emu.py): every lane of a
// CTA is a host thread, and each warp-collective operation (shuffle, vote, mma.sync,
// movmatrix, __syncwarp) is an exchange through the warp's slots between two barriers.
// Copies into shared memory (cp.async, the bulk copy engine) complete at once, so their
// waits are no-ops. Numerics: mma.sync multiplies bf16 or fp16 exactly and accumulates in double,
// rounding to fp32 once per instruction; exp2f and division are the host's, not the GPU's
// approximations. It checks indexing, folding and control flow, not speed.
//
// Included by foscar_common.cuh when FOSCAR_HOST_EMU is defined; compiled by a host C++20
// compiler with the CUDA headers on the include path (for the bf16 and fp16 types).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#ifndef __launch_bounds__
#define __launch_bounds__(...)
#endif
#ifndef __grid_constant__
#define __grid_constant__
#endif

namespace foscar_emu {

struct Warp {
  explicit Warp() : bar(32) {}
  std::barrier<> bar;
  uint32_t slot[32][8];
};

struct Cta {
  Cta(int threads, size_t smem_bytes) : bar(threads), smem(smem_bytes + 16), warps((threads + 31) / 32) {}
  std::barrier<> bar;
  std::vector<uint8_t> smem;
  std::vector<Warp> warps;
  uint8_t* smem_base() { return smem.data() + (16 - reinterpret_cast<uintptr_t>(smem.data()) % 16) % 16; }
};

struct ThreadCtx {
  uint3 thread_idx, block_idx;
  dim3 block_dim;
  Cta* cta;
  int lane() const { return static_cast<int>(thread_idx.x % 32); }
  Warp& warp() const { return cta->warps[thread_idx.x / 32]; }
};

inline ThreadCtx& tls() {
  static thread_local ThreadCtx ctx;
  return ctx;
}

// One exchange: every lane publishes up to 8 words, then reads any lane's.
template <int N>
inline void publish(const uint32_t (&w)[N]) {
  Warp& wp = tls().warp();
  std::memcpy(wp.slot[tls().lane()], w, sizeof(w));
  wp.bar.arrive_and_wait();
}
inline void done_reading() { tls().warp().bar.arrive_and_wait(); }

template <class T>
inline uint32_t bits_of(T v) {
  static_assert(sizeof(T) == 4, "32-bit values only");
  uint32_t u;
  std::memcpy(&u, &v, 4);
  return u;
}
template <class T>
inline T from_bits(uint32_t u) {
  T v;
  std::memcpy(&v, &u, 4);
  return v;
}

inline float bf16_at(uint32_t word, int half) {
  __nv_bfloat16_raw r;
  r.x = static_cast<uint16_t>(word >> (16 * half));
  return __bfloat162float(__nv_bfloat16(r));
}
inline float f16_at(uint32_t word, int half) {
  __half_raw r;
  r.x = static_cast<uint16_t>(word >> (16 * half));
  return __half2float(__half(r));
}
inline uint16_t b16_at(uint32_t word, int half) { return static_cast<uint16_t>(word >> (16 * half)); }

}  // namespace foscar_emu

#define threadIdx (::foscar_emu::tls().thread_idx)
#define blockIdx (::foscar_emu::tls().block_idx)
#define blockDim (::foscar_emu::tls().block_dim)

inline float __fdividef(float a, float b) { return a / b; }
inline int min(int a, int b) { return std::min(a, b); }
inline int max(int a, int b) { return std::max(a, b); }

inline void __syncthreads() { ::foscar_emu::tls().cta->bar.arrive_and_wait(); }
// CTAs run one after another here, so global memory needs no fences; the atomics are real.
inline void __threadfence() {}
inline int atomicAdd(int* address, int value) { return __atomic_fetch_add(address, value, __ATOMIC_SEQ_CST); }
template <class T>
inline T __ldcg(const T* address) {
  return *address;
}
inline void __syncwarp(unsigned = 0xffffffffu) { ::foscar_emu::tls().warp().bar.arrive_and_wait(); }

template <class T>
inline T __shfl_sync(unsigned, T v, int src) {
  const uint32_t w[1] = {::foscar_emu::bits_of(v)};
  ::foscar_emu::publish(w);
  const T r = ::foscar_emu::from_bits<T>(::foscar_emu::tls().warp().slot[src & 31][0]);
  ::foscar_emu::done_reading();
  return r;
}
template <class T>
inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask) {
  return __shfl_sync(mask, v, ::foscar_emu::tls().lane() ^ lane_mask);
}
inline int __any_sync(unsigned, int pred) {
  const uint32_t w[1] = {pred ? 1u : 0u};
  ::foscar_emu::publish(w);
  int any = 0;
  for (int l = 0; l < 32; ++l) any |= ::foscar_emu::tls().warp().slot[l][0];
  ::foscar_emu::done_reading();
  return any;
}

namespace foscar {

inline uint8_t* dynamic_smem() { return ::foscar_emu::tls().cta->smem_base(); }

// D = A B + C for one m16n8k16 tile, the lanes holding the fragments of PTX's mma.sync
// layout: A row r = lane / 4 (+8), columns 2 (lane % 4) (+1, +8); B column lane / 4,
// rows 2 (lane % 4) (+1, +8); C and D like A's first two registers, per 8-column block.
template <float (*elem)(uint32_t, int)>
inline void mma_16816(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1) {
  using namespace ::foscar_emu;
  const uint32_t mine[6] = {a0, a1, a2, a3, b0, b1};
  publish(mine);
  const Warp& wp = tls().warp();
  auto A = [&](int row, int k) { return elem(wp.slot[(row % 8) * 4 + (k % 8) / 2][row / 8 + 2 * (k / 8)], k % 2); };
  auto B = [&](int k, int n) { return elem(wp.slot[n * 4 + (k % 8) / 2][4 + k / 8], k % 2); };
  const int lane = tls().lane(), r = lane / 4, t4 = lane % 4;
  float d[4];
  for (int e = 0; e < 4; ++e) {
    const int row = r + 8 * (e / 2), col = 2 * t4 + (e % 2);
    double acc = c[e];
    for (int k = 0; k < 16; ++k) acc += static_cast<double>(A(row, k)) * static_cast<double>(B(k, col));
    d[e] = static_cast<float>(acc);
  }
  done_reading();
  for (int e = 0; e < 4; ++e) c[e] = d[e];
}
inline void mma_bf16_16816(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                           uint32_t b1) {
  mma_16816<::foscar_emu::bf16_at>(c, a0, a1, a2, a3, b0, b1);
}
inline void mma_f16_16816(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                          uint32_t b1) {
  mma_16816<::foscar_emu::f16_at>(c, a0, a1, a2, a3, b0, b1);
}

// movmatrix.m8n8.trans.b16: lane l holds row l / 4, columns 2 (l % 4) and +1 of an 8x8 matrix.
inline uint32_t movmatrix_trans(uint32_t x) {
  using namespace ::foscar_emu;
  const uint32_t mine[1] = {x};
  publish(mine);
  const Warp& wp = tls().warp();
  const int lane = tls().lane(), i = lane / 4, j0 = 2 * (lane % 4);
  auto at = [&](int row, int col) { return b16_at(wp.slot[row * 4 + col / 2][0], col % 2); };
  const uint32_t y = static_cast<uint32_t>(at(j0, i)) | (static_cast<uint32_t>(at(j0 + 1, i)) << 16);
  done_reading();
  return y;
}

// Copies into shared memory complete at once; their barriers and fences have nothing to do.
inline void cp_async_16(void* smem, const void* gmem) { std::memcpy(smem, gmem, 16); }
inline void cp_async_commit() {}
template <int N>
inline void cp_async_wait() {}
inline void mbar_init(uint64_t*, uint32_t) {}
inline void mbar_init_fence() {}
inline void mbar_arrive_expect_tx(uint64_t*, uint32_t) {}
inline void mbar_wait(uint64_t*, uint32_t) {}
inline void bulk_copy_g2s(void* dst, const void* src, uint32_t bytes, uint64_t*) { std::memcpy(dst, src, bytes); }
inline void fence_proxy_async_smem() {}

}  // namespace foscar
