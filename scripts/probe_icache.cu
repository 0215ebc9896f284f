// What a cold instruction cache costs a CTA: straight-line code of 4 to 96 KB (FMAs of 16 bytes,
// eight independent chains, so that a hot pass issues about one instruction a cycle), run twice
// in one launch by one or four warps on each SM; %globaltimer around each pass. The first pass
// fetches the code (from L2, or from DRAM after other data evicted it), the second runs it from
// the SM's instruction caches, so (first - second) / KB is the fetch cost per KB of code run once.
// A kernel that runs most of its code once per CTA (a decode at batch 1: the start, one or two
// trips, the finish and the split merge) pays it on its critical path.
//   nvcc -arch=sm_90a -O3 -o /tmp/probe_icache scripts/probe_icache.cu && /tmp/probe_icache
//   /tmp/probe_icache capacity    (8-44 KB launched again: where the hot cache ends)
// "branchy" rows run the same KB as blocks of 512 bytes, each ending in a taken branch over an
// unexecuted twin (the item's finish has 24 branches in 7.5 KB).
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
#include <string>
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

// Blocks LO .. HI - 1 of 32 FMAs (512 bytes), each behind a branch on the uniform `taken` (1 at
// run time): the block runs, then jumps over its twin (another 512 bytes, never run), so the
// code is laid out as the item's finish is, runs of straight code between taken branches, with
// unexecuted code beside them in the fetched lines.
template <int LO, int HI, int SALT>
struct Branchy {
  static __device__ __forceinline__ void run(float (&a)[8], int taken) {
    if constexpr (HI - LO == 1) {
      if (taken) {
        Fmas<32 * LO, 32 * LO + 32, SALT>::run(a);
      } else {
        Fmas<32 * LO, 32 * LO + 32, SALT + 50>::run(a);
      }
    } else {
      Branchy<LO, (LO + HI) / 2, SALT>::run(a, taken);
      Branchy<(LO + HI) / 2, HI, SALT>::run(a, taken);
    }
  }
};

// KB kilobytes of code run per pass: straight (BRANCHY false) or as Branchy's blocks (twice the
// code in the binary, KB of it run).
template <int KB, int SALT, bool BRANCHY>
__device__ __forceinline__ void code(float (&a)[8], int taken) {
  if constexpr (BRANCHY)
    Branchy<0, KB * 1024 / 512, SALT>::run(a, taken);
  else
    Fmas<0, KB * 1024 / 16, SALT>::run(a);
}

// Two passes over KB kilobytes of code; stamps[cta][warp][3].
template <int KB, int SALT, bool BRANCHY = false>
__global__ void __launch_bounds__(128) probe(uint64_t* stamps, float* sink, float seed, int taken) {
  float a[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) a[i] = seed + i + threadIdx.x;
  uint64_t t[3];
  t[0] = gtime();
#pragma unroll 1
  for (int pass = 0; pass < 2; ++pass) {
    code<KB, SALT, BRANCHY>(a, taken);
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

template <int KB, int SALT, bool BRANCHY = false>
Result launch(int ctas, int warps, uint64_t* d_stamps, float* sink) {
  probe<KB, SALT, BRANCHY><<<ctas, 32 * warps>>>(d_stamps, sink, 0.5f, 1);
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
void emit(int kb, bool branchy, int ctas, int warps, const char* order, int rep, Result r) {
  static int rows = 0;
  printf("%s\n  {\"kb\": %d, \"form\": \"%s\", \"ctas\": %d, \"warps\": %d, \"order\": \"%s\", \"rep\": %d, \"first_us\": %.3f, \"second_us\": %.3f}",
         rows++ ? "," : "", kb, branchy ? "branchy" : "straight", ctas, warps, order, rep, r.first_us, r.second_us);
}

// again_only: the first launch and the repeats alone (`capacity`: where the hot cache ends, the
// first pass of a repeat launch as fast as the second where the code stayed in the SM).
template <int KB, bool BRANCHY = false>
void run_size(int ctas, int warps, uint64_t* st, float* sink, float* big, size_t big_n, bool again_only = false) {
  auto one = [&] { return launch<KB, 0, BRANCHY>(ctas, warps, st, sink); };
  emit(KB, BRANCHY, ctas, warps, "first_launch", 0, one());
  for (int rep = 0; rep < 3; ++rep) emit(KB, BRANCHY, ctas, warps, "again", rep, one());
  if (again_only) return;
  for (int rep = 0; rep < 3; ++rep) {
    launch<96, 7>(ctas, warps, st, sink);
    emit(KB, BRANCHY, ctas, warps, "after_other", rep, one());
  }
  for (int rep = 0; rep < 3; ++rep) {
    scribble<<<1024, 256>>>(big, big_n);
    cudaDeviceSynchronize();
    emit(KB, BRANCHY, ctas, warps, "after_flush", rep, one());
  }
}

// run_size's first launch and repeats alone, for each size in KB.
template <int... KB>
void run_sizes_again(int ctas, int warps, uint64_t* st, float* sink, float* big, size_t big_n) {
  (run_size<KB>(ctas, warps, st, sink, big, big_n, true), ...);
}

int main(int argc, char** argv) {
  // `capacity`: 8 KB, then 16-44 KB in 4 KB steps, launched again (where between 16 and 48 KB the hot cache ends)
  const bool capacity = argc > 1 && std::string(argv[1]) == "capacity";
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
    if (capacity) {
      run_sizes_again<8, 16, 20, 24, 28, 32, 36, 40, 44>(sms, warps, st, sink, big, big_n);
      continue;
    }
    run_size<4>(sms, warps, st, sink, big, big_n);
    run_size<16>(sms, warps, st, sink, big, big_n);
    run_size<48>(sms, warps, st, sink, big, big_n);
    run_size<96>(sms, warps, st, sink, big, big_n);
    run_size<4, true>(sms, warps, st, sink, big, big_n);
    run_size<8, true>(sms, warps, st, sink, big, big_n);
    run_size<16, true>(sms, warps, st, sink, big, big_n);
  }
  printf("\n]}\n");
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) {
    fprintf(stderr, "CUDA error: %s\n", cudaGetErrorString(e));
    return 1;
  }
  return 0;
}
