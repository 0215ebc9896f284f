// Small device helpers shared by the FOSCAR kernels: bf16 mantissa injection, mma.sync,
// movmatrix, cp.async and the bulk copy engine, and warp reductions. Framework-free: CUDA
// headers only.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>
#include <string.h>

namespace foscar {

// bf16 128.0 in both halves: OR-ing a code c < 128 into the mantissa gives exactly 128 + c.
constexpr uint32_t kBf16Bias2 = 0x43004300u;

// ---------------------------------------------------------------------------------------
// Mantissa injection. Each returns the bf16x2 register holding position k of both halves
// of a packed word (docs/FORMAT.md). The right shifts are shared by the callers: the
// compiler keeps `w >> 6` and `w >> 12` live once per word.
// (w & mask) | 0x43004300 as ONE LOP3: written in C, nvcc splits it into two LOP3s (a LOP3
// takes one immediate), which doubles the cost of injection; with the bias in a register
// the single three-input LOP3 is what ptxas emits.
template <uint32_t MASK, uint32_t BIAS>
__host__ __device__ __forceinline__ uint32_t and_or_bias(uint32_t w) {
#ifdef __CUDA_ARCH__
  uint32_t d;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;\n" : "=r"(d) : "r"(w), "n"(MASK), "r"(BIAS));
  return d;
#else
  return (w & MASK) | BIAS;  // the host build, for tests/foscar/test_injection.py
#endif
}

// bf16 operands have 7 mantissa bits (128.0 = 0x4300), so an INT4 code is read at bits 0-3 of
// its half (factor 1) and INT2 codes at bits 0-1, 2-3 or 4-5 (factors 1, 4, 16: FOSCAR.md
// section 4, "mixed-radix injection"); the radix factor is folded into Q (K side) or into the
// output channel (V side).
template <int BITS, int K>
__host__ __device__ __forceinline__ uint32_t inject(uint32_t w) {
  if constexpr (BITS == 4) {
    return and_or_bias<0x000F000Fu, kBf16Bias2>(w >> (4 * K));  // factor 1
  } else {
    // INT2: positions 0-2 in place (factors 1, 4, 16), 3-5 from w >> 6, 6-7 from w >> 12.
    return and_or_bias<(0x00030003u << (2 * (K % 3))), kBf16Bias2>(w >> ((K / 3) * 6));
  }
}

// The value a position is worth relative to its code (see inject above).
template <int BITS>
__host__ __device__ constexpr float radix_factor(int k) {
  return BITS == 4 ? 1.0f : (k % 3 == 0 ? 1.0f : (k % 3 == 1 ? 4.0f : 16.0f));
}

// fp16 1024.0 in both halves: 0x6400 | c is exactly 1024 + c for c < 1024.
constexpr uint32_t kF16Bias2 = 0x64006400u;

// fp16 operands (10 mantissa bits) take codes anywhere in bits 0-9 of a half (the channel-
// wise-K product uses them, docs/FORMAT.md). Two schedules, chosen at build time:
//  - compact (default): one shift per word serves every position.
//      INT4: positions 0, 1 in place (factors 1, 16); 2, 3 from w >> 8 (1, 16).
//      INT2: positions 0-4 in place (1, 4, 16, 64, 256); 5-7 from w >> 10 (1, 4, 16).
//  - high (FOSCAR_KF16_HIGH=1): every code at bit 4 or above (factor >= 16), so the 1024 bias
//    is at most 64 times a code's unit and the MMA's fp32 accumulation loses less of the
//    signal (scripts/probe_mma_precision.cu: 2.5e-4 -> 6.6e-6 of it over 8 INT2 steps), for
//    one more shift and a left shift (an IMAD, FMA pipe) per word.
//      INT4: 0 from w << 4, 1 in place, 2 from w >> 4 (all 16); 3 from w >> 6 (64).
//      INT2: 0, 1 from w << 4 (16, 64); 2-4 in place (16, 64, 256); 5-7 from w >> 6 (16, 64, 256).
#ifndef FOSCAR_KF16_HIGH
#define FOSCAR_KF16_HIGH 0
#endif
template <int BITS>
__host__ __device__ constexpr int f16_shift(int k) {  // > 0: right shift, < 0: left shift
  if (FOSCAR_KF16_HIGH) {
    if (BITS == 4) return k == 0 ? -4 : (k == 1 ? 0 : (k == 2 ? 4 : 6));
    return k < 2 ? -4 : (k < 5 ? 0 : 6);
  }
  if (BITS == 4) return k < 2 ? 0 : 8;
  return k < 5 ? 0 : 10;
}
template <int BITS>
__host__ __device__ constexpr int f16_offset(int k) {  // bit of the code's LSB after the shift
  if (FOSCAR_KF16_HIGH) {
    if (BITS == 4) return k == 3 ? 6 : 4;
    return 4 + 2 * (k < 2 ? k : (k < 5 ? k - 2 : k - 5));
  }
  if (BITS == 4) return 4 * (k % 2);
  return 2 * (k < 5 ? k : k - 5);
}
template <int BITS, int K>
__host__ __device__ __forceinline__ uint32_t inject_f16(uint32_t w) {
  constexpr int kShift = f16_shift<BITS>(K);
  constexpr uint32_t kMask = (((1u << BITS) - 1u) << f16_offset<BITS>(K)) * 0x00010001u;
  const uint32_t x = kShift < 0 ? w * (1u << (kShift < 0 ? -kShift : 0)) : w >> (kShift > 0 ? kShift : 0);
  return and_or_bias<kMask, kF16Bias2>(x);
}
template <int BITS>
__host__ __device__ constexpr float radix_factor_f16(int k) {
  return static_cast<float>(1 << f16_offset<BITS>(k));
}

// Position K of a word as a bf16 or an fp16 operand.
template <int BITS, bool F16, int K>
__host__ __device__ __forceinline__ uint32_t inject_as(uint32_t w) {
  if constexpr (F16) {
    return inject_f16<BITS, K>(w);
  } else {
    return inject<BITS, K>(w);
  }
}

// A float's bits and back (memcpy: no aliasing trouble, a register move in SASS).
__host__ __device__ __forceinline__ int float_bits(float x) {
  int u;
  memcpy(&u, &x, 4);
  return u;
}
__host__ __device__ __forceinline__ float bits_float(int u) {
  float x;
  memcpy(&x, &u, 4);
  return x;
}

// Positions that share a radix factor form a class (the ablation keeps one scale per class).
template <int BITS>
__host__ __device__ constexpr int radix_classes() {
  return BITS == 4 ? 1 : 3;
}
template <int BITS>
__host__ __device__ constexpr int radix_class(int k) {
  return BITS == 4 ? 0 : k % 3;
}
template <int BITS>
__host__ __device__ constexpr float class_factor(int c) {
  return radix_factor<BITS>(c);
}

// ---------------------------------------------------------------------------------------
// Tensor Core and data-movement primitives: inline PTX on the GPU; on the host, when
// FOSCAR_HOST_EMU is defined, foscar_emu.h gives the same functions over host threads.
}  // namespace foscar
#ifdef FOSCAR_HOST_EMU
#include "foscar_emu.h"
#else
namespace foscar {
// The CTA's dynamic shared memory.
__device__ __forceinline__ uint8_t* dynamic_smem() {
  extern __shared__ __align__(16) uint8_t smem_dynamic[];
  return smem_dynamic;
}

__device__ __forceinline__ void mma_bf16_16816(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                               uint32_t a3, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void mma_f16_16816(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                              uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Transposes an 8x8 b16 matrix held in mma fragment order across the warp.
__device__ __forceinline__ uint32_t movmatrix_trans(uint32_t x) {
  uint32_t y;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
  return y;
}

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_u32(smem)), "l"(gmem));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// mbarrier and the bulk copy engine (cp.async.bulk, sm_90): one lane moves a whole chunk
// with four instructions, where per-lane cp.async needs 16 to 24 plus their address
// arithmetic on every lane.
__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(arrivals) : "memory");
}
// Makes the initialised barriers visible to the async proxy (the copy engine).
__device__ __forceinline__ void mbar_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(bytes)
               : "memory");
}
// Spins until the barrier's phase with this parity has completed.
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n"
      "  .reg .pred done;\n"
      "FOSCAR_MBAR_SPIN:\n"
      "  mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "  @!done bra FOSCAR_MBAR_SPIN;\n"
      "}\n" ::"r"(smem_u32(bar)),
      "r"(parity)
      : "memory");
}
// Global -> shared bulk copy; `bytes` and both addresses are multiples of 16.
__device__ __forceinline__ void bulk_copy_g2s(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(smem_u32(dst)),
      "l"(src), "r"(bytes), "r"(smem_u32(bar))
      : "memory");
}
// Orders this thread's earlier generic-proxy shared-memory accesses before later async-proxy
// ones (a bulk copy refilling a buffer that was just read).
__device__ __forceinline__ void fence_proxy_async_smem() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

}  // namespace foscar
#endif
namespace foscar {

__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

__device__ __forceinline__ float2 unpack_bf16x2(uint32_t x) {
  __nv_bfloat162 v = *reinterpret_cast<__nv_bfloat162*>(&x);
  return __bfloat1622float2(v);
}

// The injection bias of every A operand: 128 + f * c (bf16), 1024 + f * c (fp16).
constexpr float kBias = 128.0f;
constexpr float kBiasF16 = 1024.0f;

__host__ __device__ __forceinline__ uint32_t pack_f16x2(float lo, float hi) {
  __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}
__host__ __device__ __forceinline__ float2 unpack_f16x2(uint32_t x) {
  return __half22float2(*reinterpret_cast<__half2*>(&x));
}
// The same for fp16 operands (1024 + f c), as the channel-wise-K product reads them.
__device__ __forceinline__ uint32_t dequant_f16x2(uint32_t x, const float (&scale)[2], const float (&offset)[2]) {
  const float2 v = unpack_f16x2(x);
  return pack_f16x2(fmaf(v.x, scale[0], offset[0]), fmaf(v.y, scale[1], offset[1]));
}

// Dequantize-first ablation: an injected register (128 + f c, two elements) becomes
// round(c * s + z), computed in fp32 as x * (s / f) + (z - 128 s / f), the way a kernel that
// dequantizes every element before the Tensor Cores computes it.
__device__ __forceinline__ uint32_t dequant_bf16x2(uint32_t x, const float (&scale)[2], const float (&offset)[2]) {
  const float2 v = unpack_bf16x2(x);
  return pack_bf16x2(fmaf(v.x, scale[0], offset[0]), fmaf(v.y, scale[1], offset[1]));
}

__device__ __forceinline__ uint4 lds128(const void* p) {
  return *reinterpret_cast<const uint4*>(p);
}

// Reductions across the 8 lanes that share lane % 4 (the token rows of an mma fragment).
__device__ __forceinline__ float warp_max_rows(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 4));
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 8));
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 16));
  return x;
}
__device__ __forceinline__ float warp_sum_rows(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 4);
  x += __shfl_xor_sync(0xffffffffu, x, 8);
  x += __shfl_xor_sync(0xffffffffu, x, 16);
  return x;
}
// Sum across the 4 lanes that share lane / 4 (the channel columns of a B fragment).
__device__ __forceinline__ float warp_sum_quad(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  x += __shfl_xor_sync(0xffffffffu, x, 2);
  return x;
}

}  // namespace foscar
