// Host-side check of the kernels' own injection code (foscar_common.cuh): for random words,
// every position k of both halves of a K word must read as exactly fp16 1024 + f_k * code and
// of a V word as bf16 128 + f_k * code (inject_v) or fp16 1024 + f_k * code (inject_v16, the
// per-warp consumer's), where the code sits at bit 16 * half + bits * k (docs/FORMAT.md). It also prints each position's (shift, mask, factor), which
// tests/foscar/test_injection.py compares with foscar/packing.py's schedules.
#include <cstdio>
#include <cstdlib>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <utility>

#include "foscar_common.cuh"

using namespace foscar;

float bf16_value(uint16_t bits) {
  __nv_bfloat16_raw r;
  r.x = bits;
  return __bfloat162float(__nv_bfloat16(r));
}

template <int BITS, int K, bool V>
int check(uint32_t w) {
  const uint32_t x = V ? inject_v<BITS, K>(w) : inject_k<BITS, K>(w);
  const float f = V ? v_radix<BITS>(K) : k_radix<BITS>(K);
  const float bias = V ? kVBias : kKBias;
  int bad = 0;
  for (int h = 0; h < 2; ++h) {
    const uint32_t code = (w >> (16 * h + BITS * K)) & ((1u << BITS) - 1u);
    const uint16_t half = static_cast<uint16_t>(x >> (16 * h));
    const float got = V ? bf16_value(half) : f16_value(half);
    if (got != bias + f * code) {
      if (bad++ < 3)
        std::printf("bits=%d k=%d v=%d half=%d word=%08x: got %g, want %g\n", BITS, K, V, h, w, got, bias + f * code);
    }
  }
  return bad;
}

template <int BITS, int K>
int check16(uint32_t w) {
  const uint32_t x = inject_v16<BITS, K>(w);
  const float f = static_cast<float>(1 << v16_lsb<BITS>(K));
  int bad = 0;
  for (int h = 0; h < 2; ++h) {
    const uint32_t code = (w >> (16 * h + BITS * K)) & ((1u << BITS) - 1u);
    const float got = f16_value(static_cast<uint16_t>(x >> (16 * h)));
    if (got != kKBias + f * code) {
      if (bad++ < 3) std::printf("v16 bits=%d k=%d half=%d word=%08x: got %g, want %g\n", BITS, K, h, w, got, kKBias + f * code);
    }
  }
  return bad;
}

template <int BITS, int... Ks>
int check16_all(uint32_t w, std::integer_sequence<int, Ks...>) {
  return (check16<BITS, Ks>(w) + ...);
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

int main() {
  std::srand(12345);
  int bad = 0;
  for (int i = 0; i < 20000; ++i) {
    const uint32_t w = (static_cast<uint32_t>(std::rand()) << 16) ^ static_cast<uint32_t>(std::rand());
    bad += check_all<4, false>(w, std::make_integer_sequence<int, 4>{});
    bad += check_all<2, false>(w, std::make_integer_sequence<int, 8>{});
    bad += check_all<4, true>(w, std::make_integer_sequence<int, 4>{});
    bad += check_all<2, true>(w, std::make_integer_sequence<int, 8>{});
    bad += check16_all<4>(w, std::make_integer_sequence<int, 4>{});
    bad += check16_all<2>(w, std::make_integer_sequence<int, 8>{});
  }
  // The two token offsets of an INT2 channel block must share a factor (one output row).
  for (int b = 0; b < 4; ++b)
    if (v16_lsb<2>(v2_position(b, 0)) != v16_lsb<2>(v2_position(b, 1))) {
      std::printf("v16 INT2 block %d: positions %d and %d differ in factor\n", b, v2_position(b, 0), v2_position(b, 1));
      ++bad;
    }
  print_schedule<4, false>();
  print_schedule<2, false>();
  print_schedule<4, true>();
  print_schedule<2, true>();
  std::printf("%d mismatches\n", bad);
  return bad ? 1 : 0;
}
