// What a cold instruction cache costs a CTA: straight-line code of 4 to 96 KB (FMAs of 16 bytes,
// eight independent chains, so that a hot pass issues about one instruction a cycle), run twice
// in one launch by one or four warps on each SM; %globaltimer around each pass. The first pass
// fetches the code (from L2, or from DRAM after other data evicted it), the second runs it from
// the SM's instruction caches, so (first - second) / KB is the fetch cost per KB of code run once.
// A kernel that runs most of its code once per CTA (a decode at batch 1: the start, one or two
// trips, the finish and the split merge) pays it on its critical path.
//   nvcc -arch=sm_90a -O3 -o /tmp/probe_icache scripts/probe_icache.cu && /tmp/probe_icache
// Launch orders: "again" repeats the same kernel (its code in L2, maybe still in the SM's
// caches); "after_other" runs a different 96 KB kernel between; "after_flush" writes 4x L2 of
// data between (the code, if evicted from L2, then comes from DRAM).
// On an H100 (thirty-fifth session, docs/data/icache_probe_h100.json, docs/PERFORMANCE.md): the
// code stays in the SM's cache from launch to launch; the cache holds between 16 and 48 KB; code
// from L2 costs about 45 ns a KB more than hot code.
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <algorithm>
#include <vector>

__device__ __forceinline__ uint64_t gtime() {
  uint64_t t;
  asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
  return t;
}

// FMAs LO .. HI - 1, each with its own constants (so none folds), expanded by halves.
template <int LO, int HI, int SALT>
struct Fmas {
  static __device__ __forceinline__ void run(float (&a)[8]) {
    if constexpr (HI - LO == 1) {
      constexpr float mul = 1.0f + float(LO % 97 + 1 + SALT) * 1e-6f;
      constexpr float add = float((LO * 37) % 1013 + 1) * 1e-3f;
      a[LO % 8] = fmaf(a[LO % 8], mul, add);
    } else {
      Fmas<LO, (LO + HI) / 2, SALT>::run(a);
      Fmas<(LO + HI) / 2, HI, SALT>::run(a);
    }
  }
};

// Two passes over KB kilobytes of code; stamps[cta][warp][3].
template <int KB, int SALT>
__global__ void __launch_bounds__(128) probe(uint64_t* stamps, float* sink, float seed) {
  float a[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) a[i] = seed + i + threadIdx.x;
  uint64_t t[3];
  t[0] = gtime();
#pragma unroll 1
  for (int pass = 0; pass < 2; ++pass) {
    Fmas<0, KB * 1024 / 16, SALT>::run(a);
    __syncwarp();
    t[pass + 1] = gtime();
    if (a[0] == 12345.f) seed += 1.f;  // keeps the pass's results live without a store per pass
  }
  if (threadIdx.x % 32 == 0) {
    uint64_t* s = stamps + ((size_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32) * 3;
    for (int i = 0; i < 3; ++i) s[i] = t[i];
  }
  float r = 0.f;
#pragma unroll
  for (int i = 0; i < 8; ++i) r += a[i];
  if (r == seed) sink[threadIdx.x] = r;  // never true in practice; keeps the chains live
}

__global__ void scribble(float* buf, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) buf[i] = 1.f;
}

struct Result {
  double first_us, second_us;
};

template <int KB, int SALT>
Result launch(int ctas, int warps, uint64_t* d_stamps, float* sink) {
  probe<KB, SALT><<<ctas, 32 * warps>>>(d_stamps, sink, 0.5f);
  cudaDeviceSynchronize();
  std::vector<uint64_t> h((size_t)ctas * warps * 3);
  cudaMemcpy(h.data(), d_stamps, h.size() * 8, cudaMemcpyDeviceToHost);
  std::vector<double> f, s;
  for (size_t i = 0; i < h.size(); i += 3) f.push_back((h[i + 1] - h[i]) * 1e-3), s.push_back((h[i + 2] - h[i + 1]) * 1e-3);
  std::sort(f.begin(), f.end());
  std::sort(s.begin(), s.end());
  return {f[f.size() / 2], s[s.size() / 2]};
}

// One JSON row of the "runs" array (the first without a leading comma).
void emit(int kb, int ctas, int warps, const char* order, int rep, Result r) {
  static int rows = 0;
  printf("%s\n  {\"kb\": %d, \"ctas\": %d, \"warps\": %d, \"order\": \"%s\", \"rep\": %d, \"first_us\": %.3f, \"second_us\": %.3f}",
         rows++ ? "," : "", kb, ctas, warps, order, rep, r.first_us, r.second_us);
}

template <int KB>
void run_size(int ctas, int warps, uint64_t* st, float* sink, float* big, size_t big_n) {
  emit(KB, ctas, warps, "first_launch", 0, launch<KB, 0>(ctas, warps, st, sink));
  for (int rep = 0; rep < 3; ++rep) emit(KB, ctas, warps, "again", rep, launch<KB, 0>(ctas, warps, st, sink));
  for (int rep = 0; rep < 3; ++rep) {
    launch<96, 7>(ctas, warps, st, sink);
    emit(KB, ctas, warps, "after_other", rep, launch<KB, 0>(ctas, warps, st, sink));
  }
  for (int rep = 0; rep < 3; ++rep) {
    scribble<<<1024, 256>>>(big, big_n);
    cudaDeviceSynchronize();
    emit(KB, ctas, warps, "after_flush", rep, launch<KB, 0>(ctas, warps, st, sink));
  }
}

int main() {
  int sms = 0, l2 = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, 0);
  uint64_t* st;
  float *sink, *big;
  const size_t big_n = (size_t)l2 * 4 / sizeof(float);
  cudaMalloc(&st, (size_t)sms * 4 * 3 * 8);
  cudaMalloc(&sink, 1024 * sizeof(float));
  cudaMalloc(&big, big_n * sizeof(float));
  printf("{\"sms\": %d, \"l2_bytes\": %d, \"runs\": [", sms, l2);
  for (int warps : {1, 4}) {
    run_size<4>(sms, warps, st, sink, big, big_n);
    run_size<16>(sms, warps, st, sink, big, big_n);
    run_size<48>(sms, warps, st, sink, big, big_n);
    run_size<96>(sms, warps, st, sink, big, big_n);
  }
  printf("\n]}\n");
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) {
    fprintf(stderr, "CUDA error: %s\n", cudaGetErrorString(e));
    return 1;
  }
  return 0;
}
