// Where the decode kernel's CTAs put their warps: for a grid of N persistent CTAs per SM of 256
// threads (the kernels' shape), each warp records its SM, its warp slot (%warpid; a warp's
// scheduler is its slot mod 4) and its CTA. The summary says, per rule that picks the producer
// warp of each CTA (0: warp 0, as the kernels do; 1 and 2: two rotations tried in the lab), how
// many SMs end up with their CTAs' producers on distinct schedulers.
//   nvcc -arch=sm_90a -o /tmp/probe_warp_slots scripts/probe_warp_slots.cu && /tmp/probe_warp_slots 3
#include <cstdio>
#include <cstdlib>
#include <map>
#include <set>
#include <vector>

__global__ void record(int* out, long long spin_ns) {
  extern __shared__ int smem[];
  unsigned slot, sm, nsm;
  asm volatile("mov.u32 %0, %%warpid;" : "=r"(slot));
  asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
  asm volatile("mov.u32 %0, %%nsmid;" : "=r"(nsm));
  if (threadIdx.x % 32 == 0) {
    int* r = out + (blockIdx.x * 8 + threadIdx.x / 32) * 4;
    r[0] = blockIdx.x, r[1] = sm, r[2] = slot, r[3] = nsm;
  }
  smem[threadIdx.x] = slot;
  long long t0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  for (long long t = t0; t - t0 < spin_ns;) asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));  // all CTAs resident at once
}

int main(int argc, char** argv) {
  const int per_sm = argc > 1 ? atoi(argv[1]) : 3;
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  const int smem = (228 * 1024) / per_sm - 1024 - 256;  // like the kernels: per_sm CTAs fit, not one more
  cudaFuncSetAttribute(record, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  const int grid = per_sm * sms;
  int* d;
  cudaMalloc(&d, grid * 8 * 4 * sizeof(int));
  record<<<grid, 256, smem>>>(d, 200000);
  if (cudaDeviceSynchronize() != cudaSuccess) { printf("launch failed: %s\n", cudaGetErrorString(cudaGetLastError())); return 1; }
  std::vector<int> h(grid * 8 * 4);
  cudaMemcpy(h.data(), d, h.size() * sizeof(int), cudaMemcpyDeviceToHost);
  std::map<int, std::vector<int>> ctas_of_sm;  // sm -> blocks
  std::vector<int> base(grid);
  int nsm = 0, contiguous = 0, aligned = 0;
  for (int b = 0; b < grid; ++b) {
    const int* w0 = &h[(b * 8) * 4];
    base[b] = w0[2], nsm = w0[3];
    ctas_of_sm[w0[1]].push_back(b);
    bool c = true;
    for (int w = 1; w < 8; ++w) c = c && h[(b * 8 + w) * 4 + 2] == w0[2] + w;
    contiguous += c;
    aligned += w0[2] % 8 == 0;
  }
  printf("per_sm %d, SMs %d (nsmid %d), CTAs %d: warps of a CTA in consecutive slots %d, first slot a multiple of 8 %d\n",
         per_sm, sms, nsm, grid, contiguous, aligned);
  // rule 0: warp 0; rule 1: slot-based ((slot/8 - slot) mod 4); rule 2: (blockIdx / nsmid) mod 4
  for (int rule = 0; rule < 3; ++rule) {
    int distinct = 0;
    for (auto& [sm, blocks] : ctas_of_sm) {
      std::set<int> scheds;
      for (int b : blocks) {
        const int s = base[b];
        const int pw = rule == 0 ? 0 : rule == 1 ? (((s >> 3) - s) & 3) : ((b / nsm) & 3);
        scheds.insert(h[(b * 8 + pw) * 4 + 2] % 4);  // the slot warp pw recorded
      }
      distinct += (int)scheds.size() == (int)blocks.size();
    }
    printf("rule %d: SMs whose CTAs' producers sit on distinct schedulers: %d of %zu\n", rule, distinct, ctas_of_sm.size());
  }
  int shown = 0;
  for (auto& [sm, blocks] : ctas_of_sm) {
    if (shown++ >= 4) break;
    printf("SM %d:", sm);
    for (int b : blocks) {
      printf(" block %d (slots", b);
      for (int w = 0; w < 8; ++w) printf(" %d", h[(b * 8 + w) * 4 + 2]);
      printf(")");
    }
    printf("\n");
  }
  return 0;
}
