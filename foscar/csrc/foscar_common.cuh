// Small device helpers shared by the FOSCAR kernels: bf16 mantissa injection, mma.sync,
// movmatrix, cp.async, and warp reductions. Framework-free: CUDA headers only.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

namespace foscar {

// bf16 128.0 in both halves: OR-ing a code c < 128 into the mantissa gives exactly 128 + c.
constexpr uint32_t kBf16Bias2 = 0x43004300u;
// fp16 1024.0 in both halves: 0x6400 | c is exactly 1024 + c for c < 1024.
constexpr uint32_t kF16Bias2 = 0x64006400u;

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

// bf16 operands (7 mantissa bits, 128.0 = 0x4300) take an INT4 code only at bits 0-3, so
// every INT4 position needs a shift. fp16 operands (10 mantissa bits, 1024.0 = 0x6400) take
// codes anywhere in bits 0-9, worth f * c (FOSCAR.md section 4, "mixed-radix injection").
// The fp16 schedule reads every code at bit 4 or higher (f >= 16): the injection bias is
// then at most 1024 / 16 = 64 times a code's unit, where positions read at bit 0 made it
// 1024 times, and v2's measurements (docs/PERFORMANCE.md) point at the MMA accumulation
// losing precision to that bias. A left shift is an IMAD (FMA pipe), nearly free beside LOP3.
//   fp16 INT4: position 0 from w << 4, 1 in place (bits 4-7), 2 from w >> 4 (all f = 16),
//              3 from w >> 6 at bits 6-9 (f = 64).
//   fp16 INT2: positions 0, 1 from w << 4 (f = 16, 64), 2-4 in place (16, 64, 256),
//              5-7 from w >> 6 (16, 64, 256).
template <int BITS>
__host__ __device__ constexpr int f16_shift(int k) {  // > 0: right shift, < 0: left shift
  if (BITS == 4) return k == 0 ? -4 : (k == 1 ? 0 : (k == 2 ? 4 : 6));
  return k < 2 ? -4 : (k < 5 ? 0 : 6);
}
template <int BITS>
__host__ __device__ constexpr int f16_offset(int k) {  // bit of the code's LSB after the shift
  if (BITS == 4) return k == 3 ? 6 : 4;
  return 4 + 2 * ((k < 2 ? k : (k < 5 ? k - 2 : k - 5)));
}

template <int BITS, int K, bool F16>
__host__ __device__ __forceinline__ uint32_t inject(uint32_t w) {
  if constexpr (!F16) {
    if constexpr (BITS == 4) {
      return and_or_bias<0x000F000Fu, kBf16Bias2>(w >> (4 * K));  // factor 1
    } else {
      // INT2: positions 0-2 in place (factors 1, 4, 16), 3-5 from w >> 6, 6-7 from w >> 12.
      return and_or_bias<(0x00030003u << (2 * (K % 3))), kBf16Bias2>(w >> ((K / 3) * 6));
    }
  } else {
    constexpr int kShift = f16_shift<BITS>(K);
    constexpr uint32_t kMask = (((1u << BITS) - 1u) << f16_offset<BITS>(K)) * 0x00010001u;
    const uint32_t x = kShift < 0 ? w * (1u << (kShift < 0 ? -kShift : 0)) : w >> (kShift > 0 ? kShift : 0);
    return and_or_bias<kMask, kF16Bias2>(x);
  }
}

// The value a position is worth relative to its code (see inject above).
template <int BITS, bool F16>
__host__ __device__ constexpr float radix_factor(int k) {
  if (!F16) return BITS == 4 ? 1.0f : (k % 3 == 0 ? 1.0f : (k % 3 == 1 ? 4.0f : 16.0f));
  return static_cast<float>(1 << f16_offset<BITS>(k));
}

// Positions that share a radix factor form a class (the ablation keeps one scale per class).
template <int BITS, bool F16>
__host__ __device__ constexpr int radix_classes() {
  return F16 ? (BITS == 4 ? 2 : 3) : (BITS == 4 ? 1 : 3);
}
template <int BITS, bool F16>
__host__ __device__ constexpr int radix_class(int k) {
  if (!F16) return BITS == 4 ? 0 : k % 3;
  return (f16_offset<BITS>(k) - 4) / 2;
}
template <int BITS, bool F16>
__host__ __device__ constexpr float class_factor(int c) {
  return F16 ? static_cast<float>(16 << (2 * c)) : radix_factor<BITS, false>(c);
}

// ---------------------------------------------------------------------------------------
// Tensor Core and data-movement primitives.
__device__ __forceinline__ void mma_bf16_16816(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                               uint32_t a3, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
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

__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

__device__ __forceinline__ float2 unpack_bf16x2(uint32_t x) {
  __nv_bfloat162 v = *reinterpret_cast<__nv_bfloat162*>(&x);
  return __bfloat1622float2(v);
}

__device__ __forceinline__ void mma_f16_16816(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                              uint32_t a3, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack_f16x2(float lo, float hi) {
  __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

__device__ __forceinline__ float2 unpack_f16x2(uint32_t x) {
  return __half22float2(*reinterpret_cast<__half2*>(&x));
}

// The 16-bit type the Tensor Cores read: bf16 (v1) or fp16 (v2), with its injection bias.
template <bool F16>
struct Operand {
  static constexpr float kBias = F16 ? 1024.0f : 128.0f;
  __device__ static __forceinline__ uint32_t pack(float lo, float hi) {
    return F16 ? pack_f16x2(lo, hi) : pack_bf16x2(lo, hi);
  }
  __device__ static __forceinline__ float2 unpack(uint32_t x) {
    return F16 ? unpack_f16x2(x) : unpack_bf16x2(x);
  }
  __device__ static __forceinline__ void mma(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                             uint32_t b0, uint32_t b1) {
    if constexpr (F16) mma_f16_16816(c, a0, a1, a2, a3, b0, b1);
    else mma_bf16_16816(c, a0, a1, a2, a3, b0, b1);
  }
  // BF16 data from memory (queries, the tail) in this operand type.
  __device__ static __forceinline__ uint32_t from_bf16(uint32_t x) {
    if constexpr (F16) {
      const float2 v = unpack_bf16x2(x);
      return pack_f16x2(v.x, v.y);
    } else {
      return x;
    }
  }
  // Dequantize-first ablation: an injected register (bias + f c, two elements) becomes
  // round(c * s + z), computed in fp32 as x * (s / f) + (z - bias * s / f), the way a kernel
  // that dequantizes every element before the Tensor Cores computes it.
  __device__ static __forceinline__ uint32_t dequant(uint32_t x, const float (&scale)[2], const float (&offset)[2]) {
    const float2 v = unpack(x);
    return pack(fmaf(v.x, scale[0], offset[0]), fmaf(v.y, scale[1], offset[1]));
  }
};

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
