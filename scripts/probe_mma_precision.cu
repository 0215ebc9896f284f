// Probes two facts about mma.sync.m16n8k16 (f32 accumulate) that decide whether the FOSCAR
// fold can carry a large injection bias (docs/PERFORMANCE.md, v2 and v3):
//  1. accumulation precision: A = bias + f * c (exact in the operand type), B = p in (0, 1);
//     chain n MMAs into one accumulator, subtract bias * sum(B) in fp32 as the kernel does,
//     and compare the signal f * sum(c * p) with the exact value computed in double;
//  2. subnormal operands: is an fp16 B below 6.1e-5 multiplied, or flushed to zero?
// Build and run on the GPU box (no torch needed):
//   nvcc -gencode=arch=compute_90a,code=sm_90a -std=c++17 -O2 scripts/probe_mma_precision.cu -o /tmp/probe && /tmp/probe
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

// The probe's own operand helpers: the kernels use bf16 alone since v4 (docs/PERFORMANCE.md),
// and this probe is what settled that fp16 with a bias read at bit 0 loses precision.
template <bool F16>
struct Operand {
  __device__ static uint32_t pack(float lo, float hi) {
    if constexpr (F16) {
      __half2 v = __floats2half2_rn(lo, hi);
      return *reinterpret_cast<uint32_t*>(&v);
    } else {
      __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
      return *reinterpret_cast<uint32_t*>(&v);
    }
  }
  __device__ static void mma(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                             uint32_t b1) {
    if constexpr (F16) {
      asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                   : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                   : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    } else {
      asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                   : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                   : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    }
  }
};

#define CHECK(x)                                                                  \
  do {                                                                            \
    cudaError_t e_ = (x);                                                         \
    if (e_ != cudaSuccess) {                                                      \
      std::printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_));      \
      return 1;                                                                   \
    }                                                                             \
  } while (0)

// One warp: acc[16x8] = sum over n k-steps of A_i (16x16) B_i (16x8). Operands arrive as
// float and are packed to the operand type here, so the host knows their exact values.
template <bool F16>
__global__ void chain(const float* a, const float* b, int n, float* out) {
  using Op = Operand<F16>;
  const int lane = threadIdx.x, r = lane >> 2, t4 = lane & 3;
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  for (int i = 0; i < n; ++i) {
    const float* A = a + i * 256;  // row-major 16 x 16
    const float* B = b + i * 128;  // row-major 16 x 8 (k x n)
    auto ra = [&](int row, int col) { return Op::pack(A[row * 16 + col], A[row * 16 + col + 1]); };
    auto rb = [&](int k) { return Op::pack(B[k * 8 + r], B[(k + 1) * 8 + r]); };
    Op::mma(acc, ra(r, 2 * t4), ra(r + 8, 2 * t4), ra(r, 2 * t4 + 8), ra(r + 8, 2 * t4 + 8), rb(2 * t4),
            rb(2 * t4 + 8));
  }
  out[r * 8 + 2 * t4] = acc[0];
  out[r * 8 + 2 * t4 + 1] = acc[1];
  out[(r + 8) * 8 + 2 * t4] = acc[2];
  out[(r + 8) * 8 + 2 * t4 + 1] = acc[3];
}

template <bool F16>
float round_to_operand(float x) {
  // Host rounding to bf16 / fp16 (round to nearest even), through the CUDA host helpers.
  if constexpr (F16) return __half2float(__float2half_rn(x));
  return __bfloat162float(__float2bfloat16_rn(x));
}

template <bool F16>
int run(float bias, float f, int bits, int n, std::mt19937& rng) {
  std::uniform_int_distribution<int> code(0, (1 << bits) - 1);
  std::uniform_real_distribution<float> prob(0.02f, 1.0f);
  std::vector<float> a(n * 256), b(n * 128), out(128);
  std::vector<int> c(n * 256);
  for (int i = 0; i < n * 256; ++i) c[i] = code(rng), a[i] = bias + f * c[i];
  for (auto& x : b) x = round_to_operand<F16>(prob(rng));
  float *da, *db, *dout;
  CHECK(cudaMalloc(&da, a.size() * 4));
  CHECK(cudaMalloc(&db, b.size() * 4));
  CHECK(cudaMalloc(&dout, 128 * 4));
  CHECK(cudaMemcpy(da, a.data(), a.size() * 4, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(db, b.data(), b.size() * 4, cudaMemcpyHostToDevice));
  chain<F16><<<1, 32>>>(da, db, n, dout);
  CHECK(cudaGetLastError());
  CHECK(cudaMemcpy(out.data(), dout, 128 * 4, cudaMemcpyDeviceToHost));
  double err2 = 0, ref2 = 0;
  for (int m = 0; m < 16; ++m)
    for (int col = 0; col < 8; ++col) {
      double signal = 0, bsum = 0;
      for (int i = 0; i < n; ++i)
        for (int k = 0; k < 16; ++k) {
          const double p = b[i * 128 + k * 8 + col];
          signal += f * c[i * 256 + m * 16 + k] * p;
          bsum += p;
        }
      float bsum32 = 0;  // the kernel sums the rounded B values in fp32
      for (int i = 0; i < n; ++i)
        for (int k = 0; k < 16; ++k) bsum32 += b[i * 128 + k * 8 + col];
      const double got = out[m * 8 + col] - bias * bsum32;
      err2 += (got - signal) * (got - signal);
      ref2 += signal * signal;
    }
  std::printf("%s bias %6.0f  f %5.0f  INT%d  chain %3d: relative error of the signal %.2e\n",
              F16 ? "fp16" : "bf16", bias, f, bits, n, std::sqrt(err2 / ref2));
  cudaFree(da), cudaFree(db), cudaFree(dout);
  return 0;
}

__global__ void subnormal_probe(float* out) {
  using Op = Operand<true>;
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  const uint32_t a = Op::pack(1024.f, 1024.f), b = Op::pack(3.0e-6f, 3.0e-6f);  // b is subnormal
  Op::mma(acc, a, a, a, a, b, b);
  if (threadIdx.x == 0) out[0] = acc[0];
}

int main() {
  std::mt19937 rng(7);
  int rc = 0;
  for (int n : {1, 4, 8, 64}) {
    rc |= run<false>(128.f, 1.f, 4, n, rng);
    rc |= run<false>(128.f, 1.f, 2, n, rng);
    rc |= run<true>(1024.f, 1.f, 4, n, rng);
    rc |= run<true>(1024.f, 1.f, 2, n, rng);
    rc |= run<true>(1024.f, 16.f, 4, n, rng);
    rc |= run<true>(1024.f, 16.f, 2, n, rng);
  }
  float* d;
  CHECK(cudaMalloc(&d, 4));
  subnormal_probe<<<1, 32>>>(d);
  CHECK(cudaGetLastError());
  float h = 0;
  CHECK(cudaMemcpy(&h, d, 4, cudaMemcpyDeviceToHost));
  const float b = __half2float(__float2half_rn(3.0e-6f));
  std::printf("fp16 subnormal B: mma gave %.6e, exact %.6e (%s)\n", h, 16 * 1024.0 * b,
              h == 0.f ? "flushed to zero" : "kept");
  return rc;
}
