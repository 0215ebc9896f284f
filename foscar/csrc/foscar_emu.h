// A host emulation of the CUDA and Hopper features the FOSCAR kernels use, so that the kernels'
// own source runs on a CPU (foscar/emu.py, tests/foscar/test_kernels_emu.py): every thread of a
// CTA is a fiber, and the fibers of a launch take turns on the one host thread that called it.
// A fiber runs until it must wait (a barrier, an mbarrier phase), then hands the host thread to
// the next; so the kernels' barriers cost a user-space switch (about ten nanoseconds on x86-64)
// instead of a futex between hundreds of host threads, and a launch runs the same way every time.
// Warp collectives (shuffles, __syncwarp) and warpgroup MMAs are exchanges through per-warp /
// per-warpgroup slots between two barriers; mbarriers, named barriers and the bulk copy engine
// keep their real semantics (phases, arrival counts, transaction bytes), so the producer /
// consumer handshakes run as on the GPU; a bulk copy lands at once. A launch whose every fiber
// waits with nothing left to change it is a deadlock: the emulation says so and aborts.
// Numerics: fp16 / bf16 wgmma and mma.sync products and accumulation follow the H200's Tensor
// Cores bit for bit (foscar/tcmodel.py: every addend cut towards zero at 2^(e_max - 25), e_max
// the largest of the operands' exponent sums and the accumulator's, the sum cut towards zero to
// fp32); the u8 x s8 wgmma sums exactly in int32, as the hardware does; exp2f and division are
// the host's, not the GPU's approximations.
//
// Included by foscar_hopper.cuh when FOSCAR_HOST_EMU is defined; compiled by a host C++20
// compiler with the CUDA headers on the include path (for the bf16 and fp16 types).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <vector>

#ifndef __launch_bounds__
#define __launch_bounds__(...)
#endif
#ifndef __grid_constant__
#define __grid_constant__
#endif
#ifndef __noinline__
#define __noinline__
#endif

namespace foscar_emu {

// ---- fibers (foscar_emu.cpp has the context switch and the stacks)
struct Cta;
struct Warp;
struct Warpgroup;

struct ThreadCtx {
  uint3 thread_idx, block_idx;
  dim3 block_dim, grid_dim;
  Cta* cta;
  int lane() const { return static_cast<int>(thread_idx.x % 32); }
  Warp& warp() const;
  Warpgroup& warpgroup() const;
};

// One emulated CUDA thread: its stack, its saved context while another runs, its body.
struct Fiber {
  ThreadCtx ctx;
  std::function<void()> body;
  void* stack = nullptr;
  size_t stack_bytes = 0;
  void* saved = nullptr;  // the context to resume it from (a stack pointer, or a ucontext_t)
  bool started = false, done = false;
};

// The fibers of one launch, run in turns on the calling host thread: each runs until it waits or
// ends. `progress` counts every change a waiting fiber could be waiting for (a fiber's start or
// end, an arrival at any barrier, an mbarrier's arrivals and bytes, a wait satisfied): a whole
// round of turns without one leaves every fiber waiting on what nothing can change, a deadlock.
struct Scheduler {
  std::vector<std::unique_ptr<Fiber>> fibers;
  Fiber* current = nullptr;
  void* home = nullptr;  // the scheduler's own saved context
  unsigned long long progress = 0;
  void run();   // until every fiber has ended (foscar_emu.cpp)
  void yield();  // the current fiber back to the scheduler, to be resumed on its next turn
};
inline Scheduler& scheduler() {  // this host thread's
  static thread_local Scheduler s;
  return s;
}

inline ThreadCtx& tls() { return scheduler().current->ctx; }

// Waits, fiber by fiber, until cond() holds.
template <class F>
inline void wait_until(F&& cond) {
  if (cond()) return;
  Scheduler& s = scheduler();
  do s.yield();
  while (!cond());
  ++s.progress;
}

// A barrier of `count` fibers (std::barrier's arrive_and_wait).
struct Barrier {
  explicit Barrier(int n) : count(n) {}
  int count, arrived = 0;
  long generation = 0;
  void arrive_and_wait() {
    ++scheduler().progress;
    const long gen = generation;
    if (++arrived == count) {
      arrived = 0;
      ++generation;
      return;
    }
    wait_until([&] { return generation != gen; });
  }
};

struct Warp {
  Warp() : bar(32) {}
  Barrier bar;
  uint32_t slot[32][8];
};

struct Warpgroup {
  Warpgroup() : bar(128) {}
  Barrier bar;
  uint32_t a[128][4];
};

// A named barrier (bar.sync id, count).
struct NamedBarrier {
  int arrived = 0;
  long generation = 0;
};

struct Mbarrier {
  int expected = 0, pending = 0;
  long long tx = 0;
  long long phase = 0;  // phases completed; the one in progress has parity phase & 1
};

struct Cta {
  Cta(int threads, size_t smem_bytes)
      : bar(threads), smem(smem_bytes + 128), warps((threads + 31) / 32), warpgroups((threads + 127) / 128) {}
  Barrier bar;
  std::vector<uint8_t> smem;
  std::vector<Warp> warps;
  std::vector<Warpgroup> warpgroups;
  NamedBarrier named[16];
  std::map<uint32_t, Mbarrier> mbars;
  uint8_t* smem_base() { return smem.data() + (128 - reinterpret_cast<uintptr_t>(smem.data()) % 128) % 128; }
};

inline Warp& ThreadCtx::warp() const { return cta->warps[thread_idx.x / 32]; }
inline Warpgroup& ThreadCtx::warpgroup() const { return cta->warpgroups[thread_idx.x / 128]; }

// One exchange: every lane publishes up to 8 words, then reads any lane's.
template <int N>
inline void publish(const uint32_t (&w)[N]) {
  Warp& wp = tls().warp();
  std::memcpy(wp.slot[tls().lane()], w, sizeof(w));
  wp.bar.arrive_and_wait();
}
inline void done_reading() { tls().warp().bar.arrive_and_wait(); }

template <class T>
inline uint32_t bits_of(T v) {
  static_assert(sizeof(T) == 4, "32-bit values only");
  uint32_t u;
  std::memcpy(&u, &v, 4);
  return u;
}
template <class T>
inline T from_bits(uint32_t u) {
  T v;
  std::memcpy(&v, &u, 4);
  return v;
}

inline double bf16_at(uint32_t word, int half) {
  __nv_bfloat16_raw r;
  r.x = static_cast<uint16_t>(word >> (16 * half));
  return __bfloat162float(__nv_bfloat16(r));
}
inline double f16_at(uint32_t word, int half) {
  __half_raw r;
  r.x = static_cast<uint16_t>(word >> (16 * half));
  return __half2float(__half(r));
}

// The H200's MMA accumulation of one output (foscar/tcmodel.py, h200(dtype)): fp16 operands
// below 2^-14 (subnormals) count as 2^-14 where the products are aligned.
inline float tc_dot(float c, const double (&a)[16], const double (&b)[16], bool f16) {
  const int floor_exp = f16 ? -14 : INT_MIN / 4;
  int e_max = INT_MIN;
  if (c != 0.f) e_max = std::ilogb(static_cast<double>(c));
  for (int k = 0; k < 16; ++k)
    if (a[k] != 0.0 && b[k] != 0.0)
      e_max = std::max(e_max, std::max(std::ilogb(a[k]), floor_exp) + std::max(std::ilogb(b[k]), floor_exp));
  if (e_max == INT_MIN) return c;
  const double quantum = std::ldexp(1.0, e_max - 25);
  double sum = std::trunc(static_cast<double>(c) / quantum);
  for (int k = 0; k < 16; ++k) sum += std::trunc(a[k] * b[k] / quantum);
  const double exact = sum * quantum;
  float f = static_cast<float>(exact);
  if (std::fabs(static_cast<double>(f)) > std::fabs(exact)) f = std::nextafter(f, 0.0f);
  return f;
}

inline uint32_t smem_offset(const void* p) {
  return static_cast<uint32_t>(static_cast<const uint8_t*>(p) - tls().cta->smem_base());
}

inline void named_arrive(int id, int count) {
  NamedBarrier& nb = tls().cta->named[id];
  ++scheduler().progress;
  const long gen = nb.generation;
  if (++nb.arrived == count) {
    nb.arrived = 0;
    ++nb.generation;
  } else {
    wait_until([&] { return nb.generation != gen; });
  }
}

inline void mbar_complete_if_done(Mbarrier& m) {
  if (m.pending == 0 && m.tx == 0) {
    ++m.phase;
    m.pending = m.expected;
    ++scheduler().progress;
  }
}

}  // namespace foscar_emu

#define threadIdx (::foscar_emu::tls().thread_idx)
#define blockIdx (::foscar_emu::tls().block_idx)
#define blockDim (::foscar_emu::tls().block_dim)
#define gridDim (::foscar_emu::tls().grid_dim)

inline int min(int a, int b) { return std::min(a, b); }
inline int max(int a, int b) { return std::max(a, b); }

inline void __syncthreads() { ::foscar_emu::tls().cta->bar.arrive_and_wait(); }
// CTAs run one after another here, a few at once, or all of a cooperative launch at once
// (foscar_emu.cpp): the split counter's atomic and the sense word are real, with the ordering
// they have on the GPU (foscar_hopper.cuh).
namespace foscar {
inline int atomic_add_acq_rel_gpu(int* counter, int v) { return __atomic_fetch_add(counter, v, __ATOMIC_ACQ_REL); }
inline int ld_relaxed_gpu(const int* flag) { return __atomic_load_n(flag, __ATOMIC_RELAXED); }
inline void st_release_gpu(int* flag, int v) {
  __atomic_store_n(flag, v, __ATOMIC_RELEASE);
  ++::foscar_emu::scheduler().progress;
}
// The other CTAs run as fibers of this host thread (a cooperative launch runs them all at once):
// the wait yields to them until the flag changes.
inline void wait_until_changed_gpu(const int* flag, int old) {
  ::foscar_emu::wait_until([&] { return __atomic_load_n(flag, __ATOMIC_ACQUIRE) != old; });
}
}  // namespace foscar
template <class T>
inline T __ldcg(const T* address) {
  return *address;
}
inline void __syncwarp(unsigned = 0xffffffffu) { ::foscar_emu::tls().warp().bar.arrive_and_wait(); }

template <class T>
inline T __shfl_sync(unsigned, T v, int src) {
  const uint32_t w[1] = {::foscar_emu::bits_of(v)};
  ::foscar_emu::publish(w);
  const T r = ::foscar_emu::from_bits<T>(::foscar_emu::tls().warp().slot[src & 31][0]);
  ::foscar_emu::done_reading();
  return r;
}
template <class T>
inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask) {
  return __shfl_sync(mask, v, ::foscar_emu::tls().lane() ^ lane_mask);
}
inline bool __any_sync(unsigned, bool pred) {
  const uint32_t w[1] = {pred ? 1u : 0u};
  ::foscar_emu::publish(w);
  bool any = false;
  for (int l = 0; l < 32; ++l) any = any || ::foscar_emu::tls().warp().slot[l][0] != 0;
  ::foscar_emu::done_reading();
  return any;
}

namespace foscar {

inline uint8_t* dynamic_smem() { return ::foscar_emu::tls().cta->smem_base(); }
// Shared "addresses" are offsets from the CTA's shared memory (what a descriptor encodes).
inline uint32_t smem_u32(const void* p) { return ::foscar_emu::smem_offset(p); }
inline uint4 lds128(const void* p) {
  uint4 v;
  std::memcpy(&v, p, 16);
  return v;
}

// ---- warpgroup MMA: executed when issued, so the waits and fences have nothing to do. (The
// hardware reads A asynchronously: a kernel must not change A registers before the wait; the
// emulation cannot see such a bug.)
inline void wgmma_fence() {}
template <class R>
inline void pin_operands(R&) {}
template <class R>
inline void pin_accumulators(R&) {}
inline void wgmma_commit() {}
template <int N>
inline void wgmma_wait() {}

// A warpgroup MMA's start: this thread's A registers published to the warpgroup, and the B
// tile its descriptor points at (the one layout every tile has).
inline const uint8_t* wgmma_operands(uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b_desc_lo) {
  const uint64_t b_desc = b_desc_lo | (static_cast<uint64_t>(kBTileDescHi) << 32);
  using namespace ::foscar_emu;
  Warpgroup& wg = tls().warpgroup();
  const int me = static_cast<int>(tls().thread_idx.x % 128);
  wg.a[me][0] = a0, wg.a[me][1] = a1, wg.a[me][2] = a2, wg.a[me][3] = a3;
  wg.bar.arrive_and_wait();
  if (((b_desc >> 16) & 0x3FFF) != (kBTileLbo >> 4) || ((b_desc >> 32) & 0x3FFF) != (kBTileSbo >> 4) ||
      ((b_desc >> 62) & 3) != 0)
    std::abort();
  return tls().cta->smem_base() + ((b_desc & 0x3FFF) << 4);
}

template <bool F16>
inline void wgmma_m64n8k16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b_desc_lo) {
  using namespace ::foscar_emu;
  const uint8_t* B = wgmma_operands(a0, a1, a2, a3, b_desc_lo);
  Warpgroup& wg = tls().warpgroup();
  const int me = static_cast<int>(tls().thread_idx.x % 128);
  auto elem = [](uint32_t word, int half) { return F16 ? f16_at(word, half) : bf16_at(word, half); };
  auto A = [&](int row, int k) {  // the mma A fragment layout, per warp of 16 rows
    const int owner = (row / 16) * 32 + (row % 8) * 4 + (k % 8) / 2;
    return elem(wg.a[owner][(row % 16) / 8 + 2 * (k / 8)], k % 2);
  };
  auto Bv = [&](int k, int n) {
    uint16_t u;
    std::memcpy(&u, B + b_tile_offset(k, n), 2);
    return elem(u, 0);
  };
  const int warp = me / 32, lane = me % 32, g = lane / 4, t = lane % 4;
  float out[4];
  for (int e = 0; e < 4; ++e) {
    const int row = 16 * warp + g + 8 * (e / 2), col = 2 * t + (e % 2);
    double a[16], b[16];
    for (int k = 0; k < 16; ++k) a[k] = A(row, k), b[k] = Bv(k, col);
    out[e] = tc_dot(d[e], a, b, F16);
  }
  wg.bar.arrive_and_wait();
  for (int e = 0; e < 4; ++e) d[e] = out[e];
}

// m64n16k32 u8 x s8 into int32: exact (wraps as the hardware's int32 would, never reached).
inline void wgmma_m64n16k32_u8s8(int (&d)[8], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b_desc_lo) {
  using namespace ::foscar_emu;
  const uint8_t* B = wgmma_operands(a0, a1, a2, a3, b_desc_lo);
  Warpgroup& wg = tls().warpgroup();
  const int me = static_cast<int>(tls().thread_idx.x % 128);
  auto A = [&](int row, int k) -> int64_t {  // the 8-bit A fragment, per warp of 16 rows
    const int owner = (row / 16) * 32 + (row % 8) * 4 + (k % 16) / 4;
    return (wg.a[owner][(row % 16) / 8 + 2 * (k / 16)] >> (8 * (k % 4))) & 0xFFu;
  };
  const int warp = me / 32, lane = me % 32, g = lane / 4, t = lane % 4;
  int out[8];
  for (int e = 0; e < 8; ++e) {
    const int row = 16 * warp + g + 8 * ((e % 4) / 2), col = 8 * (e / 4) + 2 * t + (e % 2);
    int64_t sum = d[e];
    for (int k = 0; k < 32; ++k) sum += A(row, k) * static_cast<int8_t>(B[b8_tile_offset(k, col)]);
    out[e] = static_cast<int>(static_cast<uint32_t>(sum));
  }
  wg.bar.arrive_and_wait();
  for (int e = 0; e < 8; ++e) d[e] = out[e];
}

// One warp's m16n8k16 MMA (bf16 or fp16), the same numerics as wgmma (scripts/probe_tc.py).
template <bool F16>
inline void mma_16816(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1) {
  using namespace ::foscar_emu;
  const uint32_t mine[6] = {a0, a1, a2, a3, b0, b1};
  publish(mine);
  const Warp& wp = tls().warp();
  auto elem = [](uint32_t word, int half) { return F16 ? f16_at(word, half) : bf16_at(word, half); };
  auto A = [&](int row, int k) { return elem(wp.slot[(row % 8) * 4 + (k % 8) / 2][row / 8 + 2 * (k / 8)], k % 2); };
  auto B = [&](int k, int n) { return elem(wp.slot[n * 4 + (k % 8) / 2][4 + k / 8], k % 2); };
  const int lane = tls().lane(), g = lane / 4, t = lane % 4;
  float d[4];
  for (int e = 0; e < 4; ++e) {
    const int row = g + 8 * (e / 2), col = 2 * t + (e % 2);
    double a[16], b[16];
    for (int k = 0; k < 16; ++k) a[k] = A(row, k), b[k] = B(k, col);
    d[e] = tc_dot(c[e], a, b, F16);
  }
  done_reading();
  for (int e = 0; e < 4; ++e) c[e] = d[e];
}
inline void mma_bf16_16816(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                           uint32_t b1) {
  mma_16816<false>(c, a0, a1, a2, a3, b0, b1);
}
inline void mma_f16_16816(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                          uint32_t b1) {
  mma_16816<true>(c, a0, a1, a2, a3, b0, b1);
}

// movmatrix.m8n8.trans.b16: lane (g, t) gets elements (2t, g) and (2t + 1, g) of the matrix
// whose row r, columns 2c, 2c + 1 lane (r, c) held.
inline uint32_t movmatrix_trans(uint32_t x) {
  using namespace ::foscar_emu;
  const uint32_t mine[1] = {x};
  publish(mine);
  const Warp& wp = tls().warp();
  const int lane = tls().lane(), g = lane / 4, t = lane % 4;
  auto elem = [&](int row, int col) { return (wp.slot[row * 4 + col / 2][0] >> (16 * (col % 2))) & 0xFFFFu; };
  const uint32_t y = elem(2 * t, g) | (elem(2 * t + 1, g) << 16);
  done_reading();
  return y;
}

// ---- mbarriers and the bulk copy engine
inline void mbar_init(uint64_t* bar, uint32_t arrivals) {
  using namespace ::foscar_emu;
  Mbarrier& m = tls().cta->mbars[smem_offset(bar)];
  m = Mbarrier{};
  m.expected = m.pending = static_cast<int>(arrivals);
}
inline void mbar_init_fence() {}
inline void fence_acq_rel_cta() { std::atomic_thread_fence(std::memory_order_acq_rel); }
inline void mbar_arrive(uint64_t* bar) {
  using namespace ::foscar_emu;
  Mbarrier& m = tls().cta->mbars.at(smem_offset(bar));
  ++scheduler().progress;
  --m.pending;
  mbar_complete_if_done(m);
}
inline void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  using namespace ::foscar_emu;
  Mbarrier& m = tls().cta->mbars.at(smem_offset(bar));
  ++scheduler().progress;
  m.tx += bytes;
  --m.pending;
  mbar_complete_if_done(m);
}
inline bool mbar_try_wait(uint64_t* bar, uint32_t parity) {
  using namespace ::foscar_emu;
  return (tls().cta->mbars.at(smem_offset(bar)).phase & 1) != parity;
}
inline void mbar_wait(uint64_t* bar, uint32_t parity) {
  using namespace ::foscar_emu;
  const Mbarrier& m = tls().cta->mbars.at(smem_offset(bar));
  wait_until([&] { return (m.phase & 1) != parity; });
}
inline void bulk_copy_g2s(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  using namespace ::foscar_emu;
  if (bytes % 16 || reinterpret_cast<uintptr_t>(src) % 16 || smem_offset(dst) % 16) std::abort();
  std::memcpy(dst, src, bytes);
  Mbarrier& m = tls().cta->mbars.at(smem_offset(bar));
  ++scheduler().progress;
  m.tx -= bytes;
  mbar_complete_if_done(m);
}
inline void fence_proxy_async_smem() {}

// ---- named barriers and register reallocation
inline void named_barrier(int id, int threads) { ::foscar_emu::named_arrive(id, threads); }
template <int N>
inline void setmaxnreg_dec() {}
template <int N>
inline void setmaxnreg_inc() {}

// %globaltimer: the host's monotonic clock in nanoseconds.
inline uint64_t globaltimer_ns() {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count());
}

}  // namespace foscar
