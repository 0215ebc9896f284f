// Host-side check of the kernels' own injection code (foscar_common.cuh): for random words,
// every position k of both halves of a K word must read as exactly fp16 1024 + f_k * code
// (inject_k), and of a V word as the fp16 subnormal f_k * code * 2^-24 (inject_v), where the
// code sits at bit 16 * half + bits * k (docs/FORMAT.md). It
// also prints each position's (shift, mask, factor), which tests/foscar/test_injection.py
// compares with foscar/packing.py's schedules, and checks q15_parts, the split of Q~ and Q' into
// the two s8 parts of the int8 B tiles.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cuda_fp16.h>
#include <utility>

#include "foscar_common.cuh"

using namespace foscar;

template <int BITS, int KK, bool V>
int check(uint32_t w) {
  const uint32_t x = V ? inject_v<BITS, KK>(w) : inject_k<BITS, KK>(w);
  const float f = V ? v_radix<BITS>(KK) : k_radix<BITS>(KK);
  const float bias = V ? 0.f : kKBias;
  const float unit = V ? kVUnit : 1.f;
  int bad = 0;
  for (int h = 0; h < 2; ++h) {
    const uint32_t code = (w >> (16 * h + BITS * KK)) & ((1u << BITS) - 1u);
    const float got = f16_value(static_cast<uint16_t>(x >> (16 * h)));
    if (got != bias + unit * f * code) {
      if (bad++ < 3)
        std::printf("bits=%d k=%d %c half=%d word=%08x: got %g, want %g\n", BITS, KK, V ? 'v' : 'k', h, w, got,
                    bias + unit * f * code);
    }
  }
  return bad;
}

template <int BITS, bool V, int... Ks>
int check_all(uint32_t w, std::integer_sequence<int, Ks...>) {
  return (check<BITS, Ks, V>(w) + ...);
}

template <int BITS, bool V>
void print_schedule() {
  for (int k = 0; k < 16 / BITS; ++k) {
    const int shift = V ? v_shift<BITS>(k) : k_shift<BITS>(k);
    const int lsb = V ? v_lsb<BITS>(k) : k_lsb<BITS>(k);
    const unsigned mask = (((1u << BITS) - 1u) << lsb) * kPair;
    std::printf("schedule %c %d %d %d %u %g\n", V ? 'v' : 'k', BITS, k, shift, mask, V ? v_radix<BITS>(k) : k_radix<BITS>(k));
  }
}

// The int8 K read (v24): for each k-step and k-column, the channel the kernels' Q~ rebuild puts
// there (Q8Slice's k8_block / k8_word / k8_reg) and the shift and mask extract_k8 applies to the
// word of that column's register, as "k8 bits ks col channel shift mask".
template <int BITS>
void print_int8_k() {
  for (int ks = 0; ks < 4; ++ks)
    for (int col = 0; col < 32; ++col) {
      const int hf = col / 16, m = (col % 16) / 8, p = col % 8, c = p >> 1, r = p & 1;
      const int i = k8_reg<BITS>(ks, hf);
      const int channel = 8 * k8_block<BITS>(k8_word<BITS>(ks, hf), i, r) + 4 * m + c;
      // The mask: what a word of ones keeps; the shift: 4 where the mask's bits 4 higher come back.
      const uint32_t mask = extract_k8<BITS>(0xFFFFFFFFu, i);
      const int shift = extract_k8<BITS>(mask << 4, i) == mask ? 4 : 0;
      std::printf("k8 %d %d %d %d %d %u\n", BITS, ks, col, channel, shift, mask);
    }
}

// q15_parts on eight values x (with up = 2^e): each part's byte 2c + r is value 4r + c, and 256
// hi + lo (both read as s8) must be round-to-nearest-even of x up, the sum their sum.
int check_q15(const float (&x)[8], float up) {
  const Q15Parts r = q15_parts(x, up);
  const uint32_t lo_w[2] = {r.lo.x, r.lo.y}, hi_w[2] = {r.hi.x, r.hi.y};
  int bad = 0, sum = 0;
  for (int j = 0; j < 8; ++j) {
    const int q = static_cast<int>(std::nearbyint(static_cast<double>(x[j]) * up));
    const int rr = j / 4, c = j % 4, byte = 2 * c + rr;
    const int lo = static_cast<int8_t>((lo_w[byte / 4] >> (8 * (byte % 4))) & 0xFFu);
    const int hi = static_cast<int8_t>((hi_w[byte / 4] >> (8 * (byte % 4))) & 0xFFu);
    sum += q;
    if (256 * hi + lo != q && bad++ < 3) std::printf("q15 x=%.9g up=%g: hi %d lo %d, want %d\n", x[j], up, hi, lo, q);
  }
  if (r.sum != sum && bad++ < 3) std::printf("q15 sum %d, want %d\n", r.sum, sum);
  return bad;
}

int main() {
  std::srand(12345);
  int bad = 0;
  for (int i = 0; i < 20000; ++i) {
    const uint32_t w = (static_cast<uint32_t>(std::rand()) << 16) ^ static_cast<uint32_t>(std::rand());
    bad += check_all<4, false>(w, std::make_integer_sequence<int, 4>{});
    bad += check_all<2, false>(w, std::make_integer_sequence<int, 8>{});
    bad += check_all<4, true>(w, std::make_integer_sequence<int, 4>{});
    bad += check_all<2, true>(w, std::make_integer_sequence<int, 8>{});
  }
  // The two token offsets of an INT2 V channel block must share a factor (one output row), and
  // every V operand must be an fp16 worth its bit pattern times 2^-24 (exponent field 0 or 1:
  // the code's highest bit at most bit 10).
  for (int b = 0; b < 4; ++b)
    if (v_lsb<2>(v2_position(b, 0)) != v_lsb<2>(v2_position(b, 1))) {
      std::printf("V INT2 block %d: positions %d and %d differ in factor\n", b, v2_position(b, 0), v2_position(b, 1));
      ++bad;
    }
  for (int k = 0; k < 8; ++k)
    if ((k < 4 && v_lsb<4>(k) + 4 > 11) || v_lsb<2>(k) + 2 > 11) {
      std::printf("V position %d is read above bit 10\n", k);
      ++bad;
    }
  // Q~ and Q' span [-2^14, 2^14]: random values at random exponents, the ends, and halves (ties).
  for (int i = 0; i < 20000; ++i) {
    const float up = std::ldexp(1.f, std::rand() % 40 - 20);
    float x[8];
    for (int j = 0; j < 8; ++j) {
      const float u = 2.f * static_cast<float>(std::rand()) / static_cast<float>(RAND_MAX) - 1.f;
      x[j] = (i % 3 == 0 ? std::nearbyint(u * 32767.f) * 0.5f : u * 16384.f) / up;
    }
    bad += check_q15(x, up);
  }
  const float ends[8] = {16384.f, -16384.f, 16383.5f, -16383.5f, 0.5f, -0.5f, 127.5f, -128.5f};
  bad += check_q15(ends, 1.f);
  print_int8_k<4>();
  print_int8_k<2>();
  print_schedule<4, false>();
  print_schedule<2, false>();
  print_schedule<4, true>();
  print_schedule<2, true>();
  std::printf("%d mismatches\n", bad);
  return bad ? 1 : 0;
}
