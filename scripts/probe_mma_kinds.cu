// Which 8-bit mma.sync shapes the H200 runs natively: compiled for sm_90a, not run. The SASS
// answers (docs/PERFORMANCE.md, eleventh session): u8 x u8 -> s32 at m16n8k16 and m16n8k32 is
// one IMMA each; e4m3 x e4m3 -> f32 at m16n8k32 becomes four F2FP.F16.E4M3.UNPACK_B and two
// HMMA.16816 (fp8 through mma.sync is fp16 work on Hopper; only wgmma has native fp8).
//   nvcc -arch=sm_90a -cubin -o /tmp/probe_mma_kinds.cubin scripts/probe_mma_kinds.cu
//   cuobjdump -sass /tmp/probe_mma_kinds.cubin | grep -E 'Function|MMA|F2FP'
#include <cstdint>

// One kernel, both kinds: the SASS of each asm statement lies between the loads and the stores.
__global__ void products(const uint32_t* a, int* ci, float* cf) {
  const uint32_t x = a[threadIdx.x], y = a[threadIdx.x + 32];
  int d[4] = {0, 0, 0, 0};
  float f[4] = {0.f, 0.f, 0.f, 0.f};
  asm volatile(  // u8 x u8 -> s32, k = 32 then k = 16
      "mma.sync.aligned.m16n8k32.row.col.s32.u8.u8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n\t"
      "mma.sync.aligned.m16n8k16.row.col.s32.u8.u8.s32 {%0,%1,%2,%3}, {%4,%5}, {%8}, {%0,%1,%2,%3};"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "r"(x), "r"(y), "r"(x), "r"(y), "r"(x), "r"(y));
  asm volatile(  // e4m3 x e4m3 -> f32, k = 32
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(f[0]), "+f"(f[1]), "+f"(f[2]), "+f"(f[3])
      : "r"(x), "r"(y), "r"(x), "r"(y), "r"(x), "r"(y));
  ci[threadIdx.x] = d[0] + d[1] + d[2] + d[3];
  cf[threadIdx.x] = f[0] + f[1] + f[2] + f[3];
}
