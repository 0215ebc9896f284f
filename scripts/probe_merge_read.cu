// How fast one CTA reads the split partials that other SMs have just written (the split merge's
// last phase, docs/PERFORMANCE.md "v21"): S writer CTAs each store COLS rows of 128 floats, fence
// and count; the last to count reads all S x COLS rows with 128 threads, UNROLL splits of loads in
// flight, and stamps %globaltimer around the reads. The same read of rows that a previous launch
// wrote (L2-resident, written long before), and after 4x L2 of other writes (cold), for comparison;
// with 4-byte loads (as the kernel), float4 loads, and the bulk copy engine into shared memory.
//   nvcc -arch=sm_90a -O3 -o /tmp/probe_merge_read scripts/probe_merge_read.cu && /tmp/probe_merge_read
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdint.h>
#include <algorithm>
#include <vector>

__device__ __forceinline__ uint64_t gtime() {
  uint64_t t;
  asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
  return t;
}

// Every CTA stores its COLS rows (when `write`), fences and counts; true in the last to count.
template <int COLS>
__device__ bool write_and_count(float* ws, int* count, int S, int write) {
  const int c = threadIdx.x;
  __shared__ int last;
  if (write) {
#pragma unroll
    for (int hd = 0; hd < COLS; ++hd) ws[((size_t)hd * S + blockIdx.x) * 128 + c] = float(blockIdx.x + hd + c);
  }
  __threadfence();
  __syncthreads();
  if (c == 0) {
    last = atomicAdd(count, 1) == S - 1;
    if (last) *count = 0;
  }
  __syncthreads();
  if (last) __threadfence();
  return last;
}

template <int COLS, int UNROLL>
__global__ void merge_probe(float* ws, int* count, float* out, uint64_t* stamps, int S, int write) {
  const int c = threadIdx.x;
  if (!write_and_count<COLS>(ws, count, S, write)) return;
  const uint64_t t0 = gtime();
  float acc[COLS] = {};
#pragma unroll UNROLL
  for (int sp = 0; sp < S; ++sp)
#pragma unroll
    for (int hd = 0; hd < COLS; ++hd) acc[hd] += __ldcg(ws + ((size_t)hd * S + sp) * 128 + c);
  float sum = 0.f;
#pragma unroll
  for (int hd = 0; hd < COLS; ++hd) sum += acc[hd];
  out[c] = sum;  // the loads must complete before the stamp: the store depends on them
  __syncthreads();
  if (c == 0) stamps[0] = t0, stamps[1] = gtime();
}

// The same reads as float4: thread t holds channels 4 (t % 32) .. + 3 of column t / 32 (COLS = 4).
template <int UNROLL>
__global__ void merge_probe_v4(float* ws, int* count, float* out, uint64_t* stamps, int S, int write) {
  constexpr int COLS = 4;
  const int c = threadIdx.x;
  if (!write_and_count<COLS>(ws, count, S, write)) return;
  const uint64_t t0 = gtime();
  const int hd = c / 32, ch = 4 * (c % 32);
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll UNROLL
  for (int sp = 0; sp < S; ++sp) {
    const float4 v = __ldcg(reinterpret_cast<const float4*>(ws + ((size_t)hd * S + sp) * 128 + ch));
    acc.x += v.x, acc.y += v.y, acc.z += v.z, acc.w += v.w;
  }
  out[c] = acc.x + acc.y + acc.z + acc.w;
  __syncthreads();
  if (c == 0) stamps[0] = t0, stamps[1] = gtime();
}

// The same rows by the bulk copy engine into shared memory (one copy per column), then summed.
__global__ void merge_probe_bulk(float* ws, int* count, float* out, uint64_t* stamps, int S, int write) {
  constexpr int COLS = 4;
  extern __shared__ __align__(128) float buf[];
  __shared__ __align__(8) uint64_t bar;
  const int c = threadIdx.x;
  const unsigned bar_s = static_cast<unsigned>(__cvta_generic_to_shared(&bar));
  if (c == 0) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(bar_s));
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  if (!write_and_count<COLS>(ws, count, S, write)) return;  // its barriers publish the init
  const uint64_t t0 = gtime();
  if (c == 0) {
    asm volatile("fence.proxy.async;" ::: "memory");
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar_s), "r"(COLS * S * 512) : "memory");
    for (int hd = 0; hd < COLS; ++hd)
      asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::
                       "r"(static_cast<unsigned>(__cvta_generic_to_shared(buf + hd * S * 128))),
                   "l"(ws + (size_t)hd * S * 128), "r"(S * 512), "r"(bar_s) : "memory");
  }
  unsigned done = 0;
  while (!done)
    asm volatile("{.reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], 0; selp.b32 %0, 1, 0, p;}"
                 : "=r"(done) : "r"(bar_s) : "memory");
  float acc = 0.f;
  for (int i = 0; i < COLS * S; ++i) acc += buf[i * 128 + c];
  out[c] = acc;
  __syncthreads();
  if (c == 0) stamps[0] = t0, stamps[1] = gtime();
}

template <int COLS, int UNROLL, int KIND = 0>
void run(const char* name, int S, float* ws, int* count, float* out, uint64_t* d_st, char* scrub, size_t scrub_bytes) {
  const char* modes[3] = {"fresh (just written by other SMs)", "resident (written by an earlier launch)", "cold (4x L2 written since)"};
  for (int mode = 0; mode < 3; ++mode) {
    std::vector<double> us;
    for (int it = 0; it < 21; ++it) {
      auto launch = [&](int write) {
        if (KIND == 0) merge_probe<COLS, UNROLL><<<S, 128>>>(ws, count, out, d_st, S, write);
        if (KIND == 1) merge_probe_v4<UNROLL><<<S, 128>>>(ws, count, out, d_st, S, write);
        if (KIND == 2) merge_probe_bulk<<<S, 128, S * 4 * 512>>>(ws, count, out, d_st, S, write);
      };
      if (mode >= 1) launch(1);  // write them now
      if (mode == 2) cudaMemset(scrub, it, scrub_bytes);
      cudaDeviceSynchronize();
      launch(mode == 0);
      uint64_t st[2];
      cudaMemcpy(st, d_st, sizeof st, cudaMemcpyDeviceToHost);
      if (it > 0) us.push_back((st[1] - st[0]) / 1000.0);
    }
    std::sort(us.begin(), us.end());
    printf("%-10s S=%3d cols=%d unroll=%2d %6.1f KB  %-42s median %6.2f us  p10 %6.2f  p90 %6.2f\n", name, S, COLS, UNROLL,
           S * COLS * 512 / 1024.0, modes[mode], us[us.size() / 2], us[us.size() / 10], us[us.size() * 9 / 10]);
  }
}

int main() {
  const int maxS = 128;
  float *ws, *out;
  int* count;
  uint64_t* st;
  char* scrub;
  int l2 = 0;
  cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, 0);
  const size_t scrub_bytes = 4ull * l2;
  cudaMalloc(&ws, (size_t)maxS * 8 * 128 * sizeof(float));
  cudaMalloc(&out, 128 * sizeof(float));
  cudaMalloc(&count, sizeof(int));
  cudaMalloc(&st, 2 * sizeof(uint64_t));
  cudaMalloc(&scrub, scrub_bytes);
  cudaMemset(count, 0, sizeof(int));
  cudaFuncSetAttribute(merge_probe_bulk, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024);
  for (int S : {8, 32, 49, 96}) {
    run<4, 8>("v21", S, ws, count, out, st, scrub, scrub_bytes);
    run<4, 32>("wide", S, ws, count, out, st, scrub, scrub_bytes);
    run<4, 8, 1>("float4", S, ws, count, out, st, scrub, scrub_bytes);
    run<4, 16, 1>("float4x16", S, ws, count, out, st, scrub, scrub_bytes);
    run<4, 1, 2>("bulk", S, ws, count, out, st, scrub, scrub_bytes);
  }
  run<8, 4>("v21", 11, ws, count, out, st, scrub, scrub_bytes);
  cudaError_t e = cudaGetLastError();
  printf("%s\n", e == cudaSuccess ? "ok" : cudaGetErrorString(e));
  return 0;
}
