// Probe of the Tensor Cores' arithmetic, for foscar/tcmodel.py (the CPU model of it) and for
// the wgmma operand layouts the kernels rely on (foscar/csrc/foscar_hopper.cuh).
//
// Each entry point runs one MMA instruction per instance on operands given bit for bit by the
// host, and writes the fp32 results; scripts/probe_tc.py makes the operands (seeded), runs
// this library on the GPU, and fits the model to what comes back:
//   probe_mma_sync: mma.sync.m16n8k16 (one warp per instance), D = A B + C;
//   probe_wgmma:    wgmma.m64n8k16 with A in registers and B in shared memory (one warpgroup
//                   per chain), D = A_{c-1} B_{c-1} + ... + A_0 B_0 + C over `chain`
//                   instructions issued back to back into one accumulator, one commit group.
// Operands: A [instances][M][16] and B [instances][16][8] as raw bf16/fp16 bits (row-major,
// B indexed (k, n)); C and D [chains][M][8] fp32.
//
// Build (the driver does it): nvcc -gencode=arch=compute_90a,code=sm_90a -O2 -std=c++17
//   -shared -Xcompiler -fPIC -I foscar/csrc scripts/probe_tc.cu -o probe_tc.so
#include <cuda_runtime.h>
#include <stdint.h>

#include "foscar_hopper.cuh"

namespace {

template <bool F16>
__device__ __forceinline__ void mma_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (F16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

__device__ __forceinline__ uint32_t pair(const uint16_t* p, int lo, int hi) {
  return static_cast<uint32_t>(p[lo]) | (static_cast<uint32_t>(p[hi]) << 16);
}

// The A fragment of rows row0 .. row0 + 15 of a row-major [rows][16] matrix (mma.sync layout).
__device__ __forceinline__ void load_a(const uint16_t* a, int row0, uint32_t (&f)[4]) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const uint16_t* r0 = a + (row0 + g) * 16;
  const uint16_t* r1 = a + (row0 + g + 8) * 16;
  f[0] = pair(r0, 2 * t, 2 * t + 1);
  f[1] = pair(r1, 2 * t, 2 * t + 1);
  f[2] = pair(r0, 2 * t + 8, 2 * t + 9);
  f[3] = pair(r1, 2 * t + 8, 2 * t + 9);
}

template <bool F16>
__global__ void mma_sync_kernel(const uint16_t* A, const uint16_t* B, const float* C, float* D, int n) {
  const int inst = blockIdx.x * 4 + (threadIdx.x >> 5);
  if (inst >= n) return;
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  uint32_t a[4];
  load_a(A + (size_t)inst * 256, 0, a);
  const uint16_t* b = B + (size_t)inst * 128;  // (k, n) at k * 8 + n
  const uint32_t b0 = pair(b, (2 * t) * 8 + g, (2 * t + 1) * 8 + g);
  const uint32_t b1 = pair(b, (2 * t + 8) * 8 + g, (2 * t + 9) * 8 + g);
  const float* c = C + (size_t)inst * 128;
  float d[4] = {c[g * 8 + 2 * t], c[g * 8 + 2 * t + 1], c[(g + 8) * 8 + 2 * t], c[(g + 8) * 8 + 2 * t + 1]};
  mma_16816<F16>(d, a, b0, b1);
  float* o = D + (size_t)inst * 128;
  o[g * 8 + 2 * t] = d[0];
  o[g * 8 + 2 * t + 1] = d[1];
  o[(g + 8) * 8 + 2 * t] = d[2];
  o[(g + 8) * 8 + 2 * t + 1] = d[3];
}

// The chain length is a template parameter: a run-time count would make ptxas insert a
// warpgroup arrive between the instructions (it cannot prove the registers unchanged).
template <bool F16, int CHAIN>
__global__ void __launch_bounds__(128) wgmma_kernel(const uint16_t* A, const uint16_t* B, const float* C, float* D) {
  constexpr int chain = CHAIN;
  __shared__ __align__(128) uint8_t b_smem[CHAIN * foscar::kBTileBytes];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const size_t first = (size_t)blockIdx.x * chain;
  // Every B tile of the chain into shared memory in the K-major core-matrix layout.
  for (int i = threadIdx.x; i < chain * 128; i += 128) {
    const int step = i / 128, k = (i % 128) / 8, n = i % 8;
    *reinterpret_cast<uint16_t*>(b_smem + step * foscar::kBTileBytes + foscar::b_tile_offset(k, n)) =
        B[(first + step) * 128 + k * 8 + n];
  }
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // generic writes -> wgmma reads
  __syncthreads();
  const float* c = C + (size_t)blockIdx.x * 512;
  const int row0 = 16 * warp + g;
  float d[4] = {c[row0 * 8 + 2 * t], c[row0 * 8 + 2 * t + 1], c[(row0 + 8) * 8 + 2 * t], c[(row0 + 8) * 8 + 2 * t + 1]};
  uint32_t a[CHAIN][4];
#pragma unroll
  for (int s = 0; s < CHAIN; ++s) load_a(A + (first + s) * 1024, 16 * warp, a[s]);
  const uint32_t base = static_cast<uint32_t>(__cvta_generic_to_shared(b_smem));
  foscar::wgmma_fence();
#pragma unroll
  for (int s = 0; s < CHAIN; ++s)
    foscar::wgmma_m64n8k16<F16>(d, a[s][0], a[s][1], a[s][2], a[s][3], foscar::b_tile_desc(base + s * foscar::kBTileBytes));
  foscar::wgmma_commit();
  foscar::wgmma_wait<0>();
  float* o = D + (size_t)blockIdx.x * 512;
  o[row0 * 8 + 2 * t] = d[0];
  o[row0 * 8 + 2 * t + 1] = d[1];
  o[(row0 + 8) * 8 + 2 * t] = d[2];
  o[(row0 + 8) * 8 + 2 * t + 1] = d[3];
}

int finish() {
  if (cudaGetLastError() != cudaSuccess) return 1;
  return cudaDeviceSynchronize() == cudaSuccess ? 0 : 1;
}

}  // namespace

extern "C" int probe_mma_sync(const uint16_t* A, const uint16_t* B, const float* C, float* D, int n, int f16) {
  const int blocks = (n + 3) / 4;
  if (f16)
    mma_sync_kernel<true><<<blocks, 128>>>(A, B, C, D, n);
  else
    mma_sync_kernel<false><<<blocks, 128>>>(A, B, C, D, n);
  return finish();
}

// n instances form n / chain chains (chain 1 or 8); C and D hold one 64 x 8 block per chain.
extern "C" int probe_wgmma(const uint16_t* A, const uint16_t* B, const float* C, float* D, int n, int f16,
                           int chain) {
  if ((chain != 1 && chain != 8) || n % chain) return 2;
  const int blocks = n / chain;
  if (chain == 1) {
    if (f16) wgmma_kernel<true, 1><<<blocks, 128>>>(A, B, C, D);
    else wgmma_kernel<false, 1><<<blocks, 128>>>(A, B, C, D);
  } else {
    if (f16) wgmma_kernel<true, 8><<<blocks, 128>>>(A, B, C, D);
    else wgmma_kernel<false, 8><<<blocks, 128>>>(A, B, C, D);
  }
  return finish();
}

extern "C" const char* probe_last_error() { return cudaGetErrorString(cudaGetLastError()); }
