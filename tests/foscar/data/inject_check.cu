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

// The three readings: K (fp16 1024 + f c), V (bf16 128 + f c), V16 (fp16 1024 + f c).
enum Kind { K, V, V16 };

template <int BITS, int KK, Kind KIND>
int check(uint32_t w) {
  const uint32_t x = KIND == K ? inject_k<BITS, KK>(w) : KIND == V ? inject_v<BITS, KK>(w) : inject_v16<BITS, KK>(w);
  const float f = KIND == K ? k_radix<BITS>(KK) : KIND == V ? v_radix<BITS>(KK) : float(1 << v16_lsb<BITS>(KK));
  const float bias = KIND == V ? kVBias : kKBias;
  int bad = 0;
  for (int h = 0; h < 2; ++h) {
    const uint32_t code = (w >> (16 * h + BITS * KK)) & ((1u << BITS) - 1u);
    const uint16_t half = static_cast<uint16_t>(x >> (16 * h));
    const float got = KIND == V ? bf16_value(half) : f16_value(half);
    if (got != bias + f * code) {
      if (bad++ < 3)
        std::printf("bits=%d k=%d kind=%d half=%d word=%08x: got %g, want %g\n", BITS, KK, int(KIND), h, w, got,
                    bias + f * code);
    }
  }
  return bad;
}

template <int BITS, Kind KIND, int... Ks>
int check_all(uint32_t w, std::integer_sequence<int, Ks...>) {
  return (check<BITS, Ks, KIND>(w) + ...);
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
    bad += check_all<4, K>(w, std::make_integer_sequence<int, 4>{});
    bad += check_all<2, K>(w, std::make_integer_sequence<int, 8>{});
    bad += check_all<4, V>(w, std::make_integer_sequence<int, 4>{});
    bad += check_all<2, V>(w, std::make_integer_sequence<int, 8>{});
    bad += check_all<4, V16>(w, std::make_integer_sequence<int, 4>{});
    bad += check_all<2, V16>(w, std::make_integer_sequence<int, 8>{});
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
