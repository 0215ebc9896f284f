// Hopper (sm_90a) primitives of the FOSCAR kernels: warpgroup MMA (wgmma) with the A operand
// in registers and B in shared memory and its matrix descriptor, the bulk copy engine (TMA)
// completing on mbarriers, named barriers, and register reallocation. On a host compiler
// (FOSCAR_HOST_EMU) foscar_emu.h gives the same functions over fibers on a host thread.
//
// Operand layouts (PTX ISA, "asynchronous warpgroup level matrix" section; scripts/probe_tc.py
// checked them on the H200):
//  - A (64 x 16, registers): warp w of the warpgroup holds rows 16w .. 16w + 15 in exactly
//    the fragment layout of mma.sync.m16n8k16's A: a0 = (row g, cols 2t, 2t+1),
//    a1 = (row g+8, same cols), a2 = (row g, cols 2t+8, 2t+9), a3 = (row g+8, cols 2t+8, +9),
//    with g = lane / 4 and t = lane % 4.
//  - D (64 x 8, registers): warp w holds rows 16w + g (d0, d1: cols 2t, 2t+1) and 16w + g + 8
//    (d2, d3).
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
constexpr uint32_t kBTileLbo = 128, kBTileSbo = 256;

// A B tile's descriptor is two 32-bit words. The low word holds the start address (bits 0-13,
// in 16-byte units) and the LBO (bits 16-29). The high word holds the SBO (bits 32-45) and no
// swizzle, the same for every tile, so the wgmma wrapper takes only the low word. The next
// k-step's tile is then one 32-bit add (+16 per 256 bytes: shared addresses stay below 2^18, so
// the address field never carries). With a 64-bit descriptor ptxas spent four uniform
// instructions per wgmma on the add and its carry.
__host__ __device__ __forceinline__ uint32_t b_tile_desc(uint32_t smem_addr) {
  return ((smem_addr & 0x3FFFF) >> 4) | ((kBTileLbo >> 4) << 16);
}
constexpr uint32_t kBTileDescHi = kBTileSbo >> 4;
constexpr uint32_t kBTileDescStep = kBTileBytes >> 4;  // the next k-step's tile

// The int8 B tile of wgmma.m64n16k32 (KFoldChannel, KFoldToken8): K-major, no swizzle, core matrices of
// 8 rows x 16 bytes; the two 16-byte halves along K 128 bytes apart (LBO), the two 8-row groups
// of N 256 bytes apart (SBO): the same descriptor constants as the fp16 tile, 512 bytes a k-step.
__host__ __device__ constexpr int b8_tile_offset(int k, int n) { return (n / 8) * 256 + (k / 16) * 128 + (n % 8) * 16 + k % 16; }
constexpr int kB8TileBytes = 512;
constexpr uint32_t kB8TileDescStep = kB8TileBytes >> 4;

}  // namespace foscar

#ifdef FOSCAR_HOST_EMU
#include "foscar_emu.h"
#else
namespace foscar {

// The CTA's dynamic shared memory.
__device__ __forceinline__ uint8_t* dynamic_smem() {
  extern __shared__ __align__(128) uint8_t smem_dynamic[];
  return smem_dynamic;
}
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// ---- warpgroup MMA
// Orders this thread's earlier register writes (A operands, accumulators) before the next
// wgmma of the warpgroup reads them.
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
// Waits until at most N committed groups of this warpgroup are still in flight.
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// D += A B for one m64n8k16 step. It always accumulates: a chain starts from an accumulator
// zeroed before the wgmma fence. (A chain whose wgmmas start several accumulators with the
// scale-d predicate false is serialized by ptxas, one wait per instruction, as is any read of
// an accumulator after a partial wgmma_wait<N > 0>: the kernels wait for all.)
// The "+f" constraints keep D's registers live and untouched while the operation is in flight.
// b_desc: the B tile descriptor's low word (b_tile_desc); the high word is kBTileDescHi.
template <bool F16>
__device__ __forceinline__ void wgmma_m64n8k16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                               uint32_t b_desc) {
  if constexpr (F16) {
    asm volatile(
        "{\n.reg .pred p;\n.reg .b64 desc;\nsetp.ne.b32 p, 1, 0;\nmov.b64 desc, {%8, %9};\n"
        "wgmma.mma_async.sync.aligned.m64n8k16.f32.f16.f16 {%0,%1,%2,%3}, {%4,%5,%6,%7}, desc, p, 1, 1, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b_desc), "r"(kBTileDescHi));
  } else {
    asm volatile(
        "{\n.reg .pred p;\n.reg .b64 desc;\nsetp.ne.b32 p, 1, 0;\nmov.b64 desc, {%8, %9};\n"
        "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {%0,%1,%2,%3}, {%4,%5,%6,%7}, desc, p, 1, 1, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b_desc), "r"(kBTileDescHi));
  }
}

// D += A B for one m64n16k32 step, A u8 (registers: a0 = row g, k-columns 4t .. 4t + 3, a1 row
// g + 8, a2 / a3 the same at columns 16 + 4t ..), B s8 (the int8 B tile), D int32: exact.
// Accumulator element e: rows g (e % 4 < 2) / g + 8, column 8 (e / 4) + 2t + (e % 2).
__device__ __forceinline__ void wgmma_m64n16k32_u8s8(int (&d)[8], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                                     uint32_t b_desc) {
  asm volatile(
      "{\n.reg .pred p;\n.reg .b64 desc;\nsetp.ne.b32 p, 1, 0;\nmov.b64 desc, {%12, %13};\n"
      "wgmma.mma_async.sync.aligned.m64n16k32.s32.u8.s8 {%0,%1,%2,%3,%4,%5,%6,%7}, {%8,%9,%10,%11}, desc, p;\n}\n"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]), "+r"(d[7])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b_desc), "r"(kBTileDescHi));
}

// Pins operand registers at this point of the program: the compiler must have computed them
// here and may not sink their computation past it (between two wgmmas of a chain it would
// have to wait for the first before overwriting its registers, serializing the chain).
__device__ __forceinline__ void pin_operands(uint32_t& r) { asm volatile("" : "+r"(r)::"memory"); }
template <class R, int N>
__device__ __forceinline__ void pin_operands(R (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) pin_operands(r[i]);
}
// The same for accumulators (fp32 or int32 registers).
__device__ __forceinline__ void pin_accumulators(float& r) { asm volatile("" : "+f"(r)::"memory"); }
__device__ __forceinline__ void pin_accumulators(int& r) { asm volatile("" : "+r"(r)::"memory"); }
template <class R, int N>
__device__ __forceinline__ void pin_accumulators(R (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) pin_accumulators(r[i]);
}

// One warp's synchronous m16n8k16 MMA (bf16 or fp16 operands, fp32 accumulate): A rows g / g+8
// and columns 2t.. as in wgmma's A fragment, B b0 = (rows 2t, 2t+1; column g), b1 = (rows 2t+8,
// 2t+9; column g), C / D as wgmma's D per warp. bf16: the cold paths outside the wgmma pipeline
// (the BF16 tail); fp16: the per-warp consumer's PV (V injected as fp16 1024 + f c).
template <bool F16>
__device__ __forceinline__ void mma_16816(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                          uint32_t b0, uint32_t b1) {
  if constexpr (F16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
}
__device__ __forceinline__ void mma_bf16_16816(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                               uint32_t b0, uint32_t b1) {
  mma_16816<false>(c, a0, a1, a2, a3, b0, b1);
}
__device__ __forceinline__ void mma_f16_16816(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                              uint32_t b0, uint32_t b1) {
  mma_16816<true>(c, a0, a1, a2, a3, b0, b1);
}

// Transposes an 8 x 8 matrix of 16-bit elements spread over a warp as an MMA fragment: lane
// (g, t) holds row g, columns 2t and 2t + 1 before, and row g of the transpose after.
__device__ __forceinline__ uint32_t movmatrix_trans(uint32_t x) {
  uint32_t y;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
  return y;
}

// ---- mbarriers and the bulk copy engine
__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(arrivals) : "memory");
}
// Makes initialised barriers visible to the async proxy (the copy engine).
__device__ __forceinline__ void mbar_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }
// Orders this thread's earlier memory accesses, loads whose results are still in flight included,
// before its later ones (MEMBAR.ALL.CTA).
__device__ __forceinline__ void fence_acq_rel_cta() { asm volatile("fence.acq_rel.cta;\n" ::: "memory"); }
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_u32(bar)) : "memory");
}
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
}
// Whether the barrier's phase of this parity has completed (a bounded wait in hardware).
__device__ __forceinline__ bool mbar_try_wait(uint64_t* bar, uint32_t parity) {
  uint32_t done;
  asm volatile(
      "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.b32 %0, 1, 0, p;\n}\n"
      : "=r"(done)
      : "r"(smem_u32(bar)), "r"(parity)
      : "memory");
  return done != 0;
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  while (!mbar_try_wait(bar, parity)) {
  }
}
// Global -> shared bulk copy completing on `bar`; `bytes` and both addresses multiples of 16.
__device__ __forceinline__ void bulk_copy_g2s(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(smem_u32(dst)),
      "l"(src), "r"(bytes), "r"(smem_u32(bar))
      : "memory");
}
// Orders this thread's generic-proxy shared-memory writes before later async-proxy accesses
// (a wgmma reading a B tile that threads just stored).
__device__ __forceinline__ void fence_proxy_async_smem() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// ---- named barriers among a subset of the CTA's warps
__device__ __forceinline__ void named_barrier(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// ---- a counter that publishes the CTA's global writes to whoever counts last
// Adds `v` to `*counter` at GPU scope with release and acquire semantics and returns the old value.
// Called by one thread after a barrier of the threads whose writes it publishes: the barrier orders
// their writes before this release (cumulativity), and a barrier after it orders this acquire before
// their later reads. One fence-like operation in one thread, where __threadfence() in every thread
// before and after a relaxed atomicAdd was MEMBAR.SC.GPU and an L1 invalidation each, twice.
__device__ __forceinline__ int atomic_add_acq_rel_gpu(int* counter, int v) {
  int old;
  asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], %2;\n" : "=r"(old) : "l"(counter), "r"(v) : "memory");
  return old;
}

// A flag at GPU scope (lab knob FOSCAR_COOP_MERGE's sense word): read with no ordering (before the
// counter's release, which orders it), published with release, awaited with relaxed polls 100 ns
// apart and one acquire fence once it changed (an acquiring load per poll, back to back, slowed
// the other CTAs' counts and trips on an H100: docs/PERFORMANCE.md, thirty-seventh session).
__device__ __forceinline__ int ld_relaxed_gpu(const int* flag) {
  int v;
  asm volatile("ld.relaxed.gpu.global.s32 %0, [%1];\n" : "=r"(v) : "l"(flag) : "memory");
  return v;
}
__device__ __forceinline__ void st_release_gpu(int* flag, int v) {
  asm volatile("st.release.gpu.global.s32 [%0], %1;\n" ::"l"(flag), "r"(v) : "memory");
}
__device__ __forceinline__ void wait_until_changed_gpu(const int* flag, int old) {
  while (ld_relaxed_gpu(flag) == old) __nanosleep(100);
  asm volatile("fence.acq_rel.gpu;\n" ::: "memory");
}

// ---- register reallocation between warpgroups (the kernel has a register cap at entry)
template <int N>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}

__device__ __forceinline__ uint4 lds128(const void* p) { return *reinterpret_cast<const uint4*>(p); }

// The GPU's global nanosecond clock (one clock for every SM, unlike clock64): lab knob
// FOSCAR_TIMELINE's stamps.
__device__ __forceinline__ uint64_t globaltimer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(t));
  return t;
}

}  // namespace foscar
#endif
