// Host-side check of the kernels' own injection code (foscar_common.cuh): for random words,
// every position k of both halves must come out as exactly bias + f_k * code (bf16: 128, fp16:
// 1024, in the build's fp16 schedule), where the code
// sits at bit 16 * half + bits * k (docs/FORMAT.md). Built by tests/foscar/test_injection.py.
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

float f16_value(uint16_t bits) {
  __half_raw r;
  r.x = bits;
  return __half2float(__half(r));
}

template <int BITS, int K, bool F16>
int check(uint32_t w) {
  const uint32_t x = F16 ? inject_f16<BITS, K>(w) : inject<BITS, K>(w);
  const float f = F16 ? radix_factor_f16<BITS>(K) : radix_factor<BITS>(K);
  const float bias = F16 ? kBiasF16 : kBias;
  int bad = 0;
  for (int h = 0; h < 2; ++h) {
    const uint32_t code = (w >> (16 * h + BITS * K)) & ((1u << BITS) - 1u);
    const uint16_t half = static_cast<uint16_t>(x >> (16 * h));
    const float got = F16 ? f16_value(half) : bf16_value(half);
    if (got != bias + f * code) {
      if (bad++ < 3)
        std::printf("bits=%d k=%d f16=%d half=%d word=%08x: got %g, want %g\n", BITS, K, F16, h, w, got, bias + f * code);
    }
    // The ablation's class table must give the same factor as the position.
    if (!F16 && class_factor<BITS>(radix_class<BITS>(K)) != f) bad++;
  }
  return bad;
}

template <int BITS, bool F16, int... Ks>
int check_all(uint32_t w, std::integer_sequence<int, Ks...>) {
  return (check<BITS, Ks, F16>(w) + ...);
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
  std::printf("%d mismatches\n", bad);
  return bad ? 1 : 0;
}
