// Small device helpers shared by the FOSCAR kernels: mantissa injection of packed codes into
// Tensor Core operands (the schedules of docs/FORMAT.md, the same as foscar/packing.py), bf16 /
// fp16 packing, and warp reductions. Framework-free: CUDA headers only; every function here
// also compiles for the host (tests/foscar/test_injection.py, the host emulation).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>
#include <string.h>

namespace foscar {

// ---------------------------------------------------------------------------------------
// Mantissa injection. (w & mask) | bias as ONE three-input LOP3: written in C, nvcc splits it
// into two LOP3s (a LOP3 takes one immediate), which doubles the cost; with the bias in a
// register the single LOP3 is what ptxas emits.
template <uint32_t MASK>
__host__ __device__ __forceinline__ uint32_t and_or(uint32_t w, uint32_t bias) {
#ifdef __CUDA_ARCH__
  uint32_t d;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;\n" : "=r"(d) : "r"(w), "n"(MASK), "r"(bias));
  return d;
#else
  return (w & MASK) | bias;
#endif
}

constexpr uint32_t kPair = 0x00010001u;           // a 16-bit pattern in both halves
constexpr uint32_t kF16Bias2 = 0x64006400u;       // fp16 1024.0 twice: 0x6400 | c = 1024 + c, c < 1024
constexpr float kKBias = 1024.0f;                 // K operands are fp16 1024 + f c

// K, fp16 (10 mantissa bits), one shift per word serves every position:
//   INT4: positions 0, 1 in place (bits 0-3, 4-7: f = 1, 16); 2, 3 from w >> 8 (f = 1, 16).
//   INT2: positions 0-4 in place (f = 1, 4, 16, 64, 256); 5-7 from w >> 10 (f = 1, 4, 16).
template <int BITS>
__host__ __device__ constexpr int k_shift(int k) {
  return BITS == 4 ? (k < 2 ? 0 : 8) : (k < 5 ? 0 : 10);
}
template <int BITS>
__host__ __device__ constexpr int k_lsb(int k) {  // bit of the code's LSB after the shift
  return BITS == 4 ? 4 * (k % 2) : 2 * (k < 5 ? k : k - 5);
}
template <int BITS>
__host__ __device__ constexpr float k_radix(int k) {
  return static_cast<float>(1 << k_lsb<BITS>(k));
}
// w >> K for the operand extraction: an SHF on the ALU pipe. FOSCAR_SHIFT_FMA=1 (lab; v29) puts it
// on the FMA pipe instead, as the high word of w 2^(32 - K) (IMAD.HI.U32; the multiplier passes an
// empty asm, so that the compiler does not turn the product back into a shift, and ptxas still
// takes it as an immediate): ALU per KV element 0.750 -> 0.625 (INT4) and 0.699 -> 0.637 (INT2),
// but 1-2 % slower at batch 128 and up to 3 % at batch 1 (docs/PERFORMANCE.md, eleventh session).
#ifndef FOSCAR_SHIFT_FMA
#define FOSCAR_SHIFT_FMA 0
#endif
template <int K>
__host__ __device__ __forceinline__ uint32_t shift_right(uint32_t w) {
  static_assert(K > 0 && K < 32, "a right shift by 1 to 31");
#if defined(__CUDA_ARCH__) && FOSCAR_SHIFT_FMA
  uint32_t m = 1u << (32 - K);
  asm("" : "+r"(m));
  return __umulhi(w, m);
#else
  return w >> K;
#endif
}
template <int BITS, int K>
__host__ __device__ __forceinline__ uint32_t inject_k(uint32_t w) {
  constexpr uint32_t mask = (((1u << BITS) - 1u) << k_lsb<BITS>(K)) * kPair;
  constexpr int sh = k_shift<BITS>(K);
  if constexpr (sh > 0) w = shift_right<sh>(w);
  return and_or<mask>(w, kF16Bias2);
}

// V, fp16 subnormals f c 2^-24 (the bits (w >> shift) & mask alone, no bias; the B operand P~
// or P is fp16 too): an fp16 whose exponent field is 0 or 1 is worth its bit pattern times
// 2^-24, so any code whose bits lie in 0-10 is read exactly, and the product's sum holds the
// signal only. With no bias there is nothing for the Tensor Cores' cut toward zero to take
// from one side (docs/PERFORMANCE.md, v4 and v23).
// The unit 2^-24 rides in the fold with the factor (kVUnit v_radix).
//   INT4: positions 0, 1 in place (bits 0-3, 4-7: f = 1, 16); 2, 3 from w >> 8 (f = 1, 16), as
//   K (1 shift and 4 LOP3 per 8 codes).
//   INT2: positions 1-4 in place (bits 2-9), 5, 6, 7 and 0 from the word with the two bytes of
//   each half swapped (one PRMT), where they sit at bits 2-9 too (f = 256, 4, 16, 64, 256, 4, 16,
//   64 for positions 0-7), so that the two positions of each channel block share a factor: blocks
//   0-3 (positions (3, 7), (1, 5), (4, 0), (2, 6)) at f = 64, 4, 256, 16 (1 PRMT and 8 LOP3 per
//   16 codes; v41, in place of v23's w << 2 and w >> 6). Read at f = 1 instead, INT2's error grew
//   with the context on the H200 (1.67e-3 at 4K to 1.83e-3 at 256K), where at f >= 4 it holds
//   (PERFORMANCE.md, v23).
constexpr float kVUnit = 0x1p-24f;  // an fp16 pattern's worth below 2^-13 (exponent field 0 or 1)
constexpr int kSwapHalves = 16;  // v_shift's mark for "the two bytes of each half swapped"
template <int BITS>
__host__ __device__ constexpr int v_shift(int k) {  // > 0: right shift, < 0: left shift, or kSwapHalves
  return BITS == 4 ? (k < 2 ? 0 : 8) : (1 <= k && k <= 4 ? 0 : kSwapHalves);
}
template <int BITS>
__host__ __device__ constexpr int v_lsb(int k) {
  return BITS == 4 ? 4 * (k % 2) : (1 <= k && k <= 4 ? 2 * k : k == 0 ? 8 : 2 * k - 8);
}
// Each 16-bit half's two bytes swapped: one PRMT on the device.
__host__ __device__ __forceinline__ uint32_t swap_half_bytes(uint32_t w) {
#ifdef __CUDA_ARCH__
  return __byte_perm(w, 0u, 0x2301);
#else
  return ((w >> 8) & 0x00FF00FFu) | ((w << 8) & 0xFF00FF00u);
#endif
}
template <int BITS>
__host__ __device__ constexpr float v_radix(int k) {  // the operand holds kVUnit v_radix c
  return static_cast<float>(1 << v_lsb<BITS>(k));
}
template <int BITS, int K>
__host__ __device__ __forceinline__ uint32_t inject_v(uint32_t w) {
  constexpr int sh = v_shift<BITS>(K);
  constexpr uint32_t mask = (((1u << BITS) - 1u) << v_lsb<BITS>(K)) * kPair;
  if constexpr (sh == kSwapHalves) w = swap_half_bytes(w);
  else if constexpr (sh < 0) w <<= -sh;
  else if constexpr (sh > 0) w = shift_right<sh>(w);
  return w & mask;
}
// K as int8 operands (KFoldChannel, KFoldToken8): the codes masked in place,
// one per byte, four to a register, read by wgmma's u8 x s8 products into int32 (exact). Byte b
// of a masked word holds the code of half b >> 1 at position k = 2 (b & 1) + i (INT4) or
// 4 (b & 1) + i (INT2), register i of the word, at factor f = k8_radix(i):
//   INT4: i = 0 from w & 0x0F0F0F0F, i = 1 from (w >> 4) & 0x0F0F0F0F, f = 1 (1 shift, 2 LOP3
//   per 8 codes);
//   INT2: i = 0, 1 from w & 0x03030303, w & 0x0C0C0C0C, i = 2, 3 the same from w >> 4, f = 1, 4,
//   1, 4 (1 shift, 4 LOP3 per 16 codes).
template <int BITS>
__host__ __device__ constexpr int k8_regs_per_word() {
  return BITS == 4 ? 2 : 4;
}
template <int BITS>
__host__ __device__ __forceinline__ uint32_t extract_k8(uint32_t w, int i) {
  if (BITS == 4) return (i == 0 ? w : shift_right<4>(w)) & 0x0F0F0F0Fu;
  return (i < 2 ? w : shift_right<4>(w)) & (0x03030303u << (2 * (i & 1)));
}
template <int BITS>
__host__ __device__ constexpr int k8_radix(int i) {
  return BITS == 2 && (i & 1) ? 4 : 1;
}
// The 8-channel block (docs/FORMAT.md: channel = 2 t4 + h + 8 block) whose codes byte run r
// (the bytes b with b & 1 = r) of register i of a lane's word j holds.
template <int BITS>
__host__ __device__ constexpr int k8_block(int j, int i, int r) {
  return BITS == 4 ? 4 * j + 2 * r + i : 8 * j + 4 * r + i;
}
// The factor at which channel block blk is read (its register i: blk % 4 for INT2).
template <int BITS>
__host__ __device__ constexpr int k8_block_radix(int blk) {
  return BITS == 2 && (blk & 1) ? 4 : 1;
}
// A wgmma k-step ks (32 channels) takes, for each of its two 16-column halves hf, register
// q = 2 ks + hf of the lane's row-g words (a0, a2) and of its row-(g + 8) words (a1, a3):
// word q / R, register q % R, R = k8_regs_per_word.
template <int BITS>
__host__ __device__ constexpr int k8_word(int ks, int hf) {
  return (2 * ks + hf) / k8_regs_per_word<BITS>();
}
template <int BITS>
__host__ __device__ constexpr int k8_reg(int ks, int hf) {
  return (2 * ks + hf) % k8_regs_per_word<BITS>();
}
// Byte B of each of four words, gathered into one (x0's in byte 0): three PRMT.
template <int B>
__host__ __device__ __forceinline__ uint32_t gather_bytes(uint32_t x0, uint32_t x1, uint32_t x2, uint32_t x3) {
#ifdef __CUDA_ARCH__
  const uint32_t lo = __byte_perm(x0, x1, B | ((4 + B) << 4)), hi = __byte_perm(x2, x3, B | ((4 + B) << 4));
  return __byte_perm(lo, hi, 0x5410);
#else
  auto byte = [](uint32_t x) { return (x >> (8 * B)) & 0xFFu; };
  return byte(x0) | (byte(x1) << 8) | (byte(x2) << 16) | (byte(x3) << 24);
#endif
}

// INT2 V: the position holding channel block b (0..3) at token offset o (0: tokens 2t, 2t+1;
// 1: tokens 2t+8, 2t+9) of a k-step's word.
__host__ __device__ constexpr int v2_position(int b, int o) {
  return b == 0 ? (o ? 7 : 3) : b == 1 ? (o ? 5 : 1) : b == 2 ? (o ? 0 : 4) : (o ? 6 : 2);
}

// ---------------------------------------------------------------------------------------
// Conversions and packing. A float's bits and back (memcpy: no aliasing trouble).
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
__host__ __device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  uint32_t u;
  memcpy(&u, &v, 4);
  return u;
}
__host__ __device__ __forceinline__ float2 unpack_bf16x2(uint32_t x) {
  __nv_bfloat162 v;
  memcpy(&v, &x, 4);
  return __bfloat1622float2(v);
}
// Two floats as fp16x2, round to nearest, subnormal results kept: on the device cuda_fp16's
// inline `cvt.rn.f16x2.f32`, which --use_fast_math does not turn into its .ftz form (P~ = p s is
// often below fp16's smallest normal, 6.1e-5; tests/foscar/test_injection.py checks the PTX).
__host__ __device__ __forceinline__ uint32_t pack_f16x2(float lo, float hi) {
  __half2 v = __floats2half2_rn(lo, hi);
  uint32_t u;
  memcpy(&u, &v, 4);
  return u;
}
__host__ __device__ __forceinline__ float2 unpack_f16x2(uint32_t x) {
  __half2 v;
  memcpy(&v, &x, 4);
  return __half22float2(v);
}
__host__ __device__ __forceinline__ float f16_value(uint16_t u) {
  __half v;
  memcpy(&v, &u, 2);
  return __half2float(v);
}
__host__ __device__ __forceinline__ float bf16_round(float x) { return __bfloat162float(__float2bfloat16(x)); }

// Eight integers Q = round(x 2^e), |Q| <= 2^14, as the two s8 parts of the int8 B tiles (Q = 256
// hi + lo, lo the low byte sign-extended), four bytes a word in Q8Slice's order (byte 2c + r of
// a part is value 4r + c), and their sum. One FFMA each: y = x 2^e + 1.5 2^23 + 128 rounds to
// nearest even as x 2^e alone would (the added constant is an even integer) and holds Q + 128
// in its low bits above 0x4B400000, whose two low bytes are 0: byte 1 of y's bits is hi = (Q +
// 128) >> 8, and byte 0 is lo + 128, so lo is byte 0 with its top bit flipped (one LOP3 a word).
struct Q15Parts {
  uint2 lo, hi;  // the words of part 0 (rows n) and part 1 (rows n + 8)
  int sum;       // sum of the eight Q, exact
};
__host__ __device__ __forceinline__ Q15Parts q15_parts(const float (&x)[8], float up) {
  constexpr float kRound = 12583040.f;     // 1.5 2^23 + 128
  constexpr uint32_t kBits = 0x4B400080u;  // its bits
  uint32_t y[8], bits = 0u;  // the sum of the bits kBits + Q, modulo 2^32
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    y[j] = static_cast<uint32_t>(float_bits(fmaf(x[j], up, kRound)));
    bits += y[j];
  }
  Q15Parts r;
  r.hi = make_uint2(gather_bytes<1>(y[0], y[4], y[1], y[5]), gather_bytes<1>(y[2], y[6], y[3], y[7]));
  r.lo = make_uint2(gather_bytes<0>(y[0], y[4], y[1], y[5]) ^ 0x80808080u,
                    gather_bytes<0>(y[2], y[6], y[3], y[7]) ^ 0x80808080u);
  r.sum = static_cast<int>(bits - 8u * kBits);
  return r;
}

// Power-of-two scale factors built from exponent bits (exact): 2^e for -126 <= e <= 127.
__host__ __device__ __forceinline__ float exp2_int(int e) { return bits_float((e + 127) << 23); }
// floor(log2(x)) of a positive normal float.
__host__ __device__ __forceinline__ int ilog2f(float x) { return ((float_bits(x) >> 23) & 0xff) - 127; }

}  // namespace foscar
