// Hopper (sm_90a) primitives of the FOSCAR kernels: warpgroup MMA (wgmma) with the A operand
// in registers and B in shared memory, its shared-memory matrix descriptor, and the
// warpgroup fences. GPU only; foscar_emu.h gives the same functions to a host compiler.
//
// Operand layouts (PTX ISA, "asynchronous warpgroup level matrix" section):
//  - A (64 x 16, registers): warp w of the warpgroup holds rows 16w .. 16w + 15 in exactly
//    the fragment layout of mma.sync.m16n8k16's A: a0 = (row g, cols 2t, 2t+1),
//    a1 = (row g+8, same cols), a2 = (row g, cols 2t+8, 2t+9), a3 = (row g+8, cols 2t+8, +9),
//    with g = lane / 4 and t = lane % 4.
//  - D (64 x 8, registers): warp w holds rows 16w + g (d0, d1: cols 2t, 2t+1) and 16w + g + 8
//    (d2, d3): mma.sync's C layout, per warp.
//  - B (16 x 8, shared memory, K-major, no swizzle): two 8 x 8 "core matrices" side by side
//    along K, each 128 contiguous bytes holding row n (the N index) as 8 consecutive K values
//    (16 bytes). Element (k, n) of one B tile sits at byte (k / 8) * 128 + n * 16 + (k % 8) * 2.
//    The descriptor's leading-dimension offset (LBO) is the distance between the two core
//    matrices along K (128 bytes); the stride offset (SBO), the distance to the next 8 rows of
//    N, is unused at N = 8 and set to 256.
#pragma once

#include <stdint.h>

namespace foscar {

// Byte offset of element (k, n) inside one 16 x 8 B tile (see above).
__host__ __device__ constexpr int b_tile_offset(int k, int n) { return (k / 8) * 128 + n * 16 + (k % 8) * 2; }
constexpr int kBTileBytes = 256;

#ifndef FOSCAR_HOST_EMU
// The 64-bit shared-memory matrix descriptor of a B tile starting at `smem_addr` (a shared
// address, 16-byte aligned): start, LBO and SBO in 16-byte units, swizzle mode 0.
__device__ __forceinline__ uint64_t b_tile_desc(uint32_t smem_addr) {
  return static_cast<uint64_t>((smem_addr & 0x3FFFF) >> 4) | (static_cast<uint64_t>(128 >> 4) << 16) |
         (static_cast<uint64_t>(256 >> 4) << 32);
}

// Orders this thread's earlier register writes (A operands, accumulators) before the next
// wgmma of the warpgroup reads them.
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
// Waits until at most N committed groups of this warpgroup are still in flight.
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

// D (+)= A B for one m64n8k16 step; accumulate = false computes D = A B (the accumulator's
// old value is ignored, no zeroing needed). The "+f" constraints keep D's registers live
// and unmodified while the operation is in flight.
template <bool F16>
__device__ __forceinline__ void wgmma_m64n8k16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                               uint64_t b_desc, bool accumulate) {
  if constexpr (F16) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %9, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n8k16.f32.f16.f16 {%0,%1,%2,%3}, {%4,%5,%6,%7}, %8, p, 1, 1, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(b_desc), "r"(static_cast<int>(accumulate)));
  } else {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %9, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {%0,%1,%2,%3}, {%4,%5,%6,%7}, %8, p, 1, 1, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(b_desc), "r"(static_cast<int>(accumulate)));
  }
}
#endif

}  // namespace foscar
