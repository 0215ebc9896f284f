// Which 8-bit mma.sync shapes the H200 runs natively: compiled for sm_90a, not run. The SASS
// answers (docs/PERFORMANCE.md, eleventh session): u8 x u8 -> s32 at m16n8k16 and m16n8k32 is
// one IMMA each; e4m3 x e4m3 -> f32 at m16n8k32 becomes four F2FP.F16.E4M3.UNPACK_B and two
// HMMA.16816 (fp8 through mma.sync is fp16 work on Hopper; only wgmma has native fp8).
//   nvcc -arch=sm_90a -cubin -o /tmp/probe_mma_kinds.cubin scripts/probe_mma_kinds.cu
//   cuobjdump -sass /tmp/probe_mma_kinds.cubin | grep -E 'Function|MMA|F2FP'
#include <cstdint>

__global__ void u8_products(const uint32_t* a, int* c) {
  int d0 = 0, d1 = 0, d2 = 0, d3 = 0;
  const uint32_t x = a[threadIdx.x], y = a[threadIdx.x + 32];
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.u8.u8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+r"(d0), "+r"(d1), "+r"(d2), "+r"(d3)
      : "r"(x), "r"(y), "r"(x), "r"(y), "r"(x), "r"(y));
  asm volatile("mma.sync.aligned.m16n8k16.row.col.s32.u8.u8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};"
               : "+r"(d0), "+r"(d1), "+r"(d2), "+r"(d3)
               : "r"(x), "r"(y), "r"(x));
  c[threadIdx.x] = d0 + d1 + d2 + d3;
}

__global__ void e4m3_products(const uint32_t* a, float* c) {
  float d0 = 0.f, d1 = 0.f, d2 = 0.f, d3 = 0.f;
  const uint32_t x = a[threadIdx.x], y = a[threadIdx.x + 32];
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d0), "+f"(d1), "+f"(d2), "+f"(d3)
      : "r"(x), "r"(y), "r"(x), "r"(y), "r"(x), "r"(y));
  c[threadIdx.x] = d0 + d1 + d2 + d3;
}
