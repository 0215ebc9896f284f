// FOSCAR decode attention over a 2- or 4-bit paged KV cache (docs/FORMAT.md), for Hopper.
//
// A persistent CTA of two warpgroups loops over work items (sequence, KV head, split):
//   - the producer (warp 0) streams each item's 64-token chunks into a shared-memory ring with
//     the bulk copy engine: K codes, V codes and their (scale, offset) runs, completing on the
//     stage's "full" mbarrier;
//   - the consumer warpgroup turns the packed codes into Tensor Core A operands in registers
//     (mantissa injection) and runs both products on wgmma with KV on M and the query heads on
//     N = 8:  S^T = K Q^T (tokens x heads) and O^T = V^T P^T (channels x heads); Q (or Q~) and
//     P wait in shared memory as the B operands. Warp w of the warpgroup holds tokens
//     16w .. 16w+15 of a chunk in S and channels 32w .. 32w+31 in O.
// Scales and offsets are folded, never applied per element (FOSCAR.md section 3); each (K mode,
// V mode) is a pair of policy types below:
//   KFoldToken   : accumulator fold per channel group,  score = s (acc - 1024 q'/f) + z sum q
//   KFoldChannel : operand fold, Q~ = q s / f rebuilt in shared memory once per token group
//   VFoldToken   : operand fold, P~ = p s; offsets and the bias summed apart per (group, head)
//   VFoldChannel : accumulator fold, each chunk's accumulator folded with s / f, z at the group's end
// and the dequantize-first ablation is KDequant / VDequant: the same data path, with every
// element turned into s c + z before the MMA.
//
// Precision (docs/PERFORMANCE.md, "v5"): the Tensor Cores cut every addend towards zero at the
// alignment of the largest (foscar/tcmodel.py), so an accumulator fed with biased operands
// (128 + f c, positive probabilities) loses a part of the signal of one sign, in proportion to
// how many MMAs it chains. v4 chained 32 and failed past 32K tokens; here every chunk's PV chain
// (4 k-steps) starts from zero and is folded into the fp32 output when it completes, which keeps
// that loss far below rounding at every context length (foscar/precision.py models it), and the
// bias 128 leaves through one p-sum per (group, head) instead of one HSUB2 per register.
#pragma once

#include <math.h>

#include <type_traits>

#include "foscar_api.h"
#include "foscar_common.cuh"
#include "foscar_hopper.cuh"

namespace foscar {

struct DecodeParams {
  const __nv_bfloat16* q;       // [batch, num_q_heads, D]
  __nv_bfloat16* o;             // [batch, num_q_heads, D]
  const uint8_t* k_codes;       // [pages, num_kv_heads, page_size / 16, words_per_tile] (int32 words)
  const uint8_t* v_codes;
  const uint8_t* k_params;      // [pages, num_kv_heads, page_size * D / G] of fp16 (scale, offset)
  const uint8_t* v_params;
  const int32_t* page_table;    // [batch, max_pages]
  const int32_t* seq_lens;      // [batch], tail included
  const __nv_bfloat16* k_tail;  // [batch, num_kv_heads, G, D]
  const __nv_bfloat16* v_tail;
  float* ws_o;                  // [batch, num_q_heads, num_splits, D] (num_splits > 1 only)
  float* ws_ml;                 // [batch, num_q_heads, num_splits, 2]
  int* ws_count;                // [batch, num_kv_heads] splits done; 0 between launches
  int batch, num_q_heads, num_kv_heads, ratio;
  int page_size, max_pages, page_shift;  // page_shift = log2(page_size) for powers of two, else -1
  // Byte strides of the staged runs: one head's codes / parameters inside a page, one page.
  int code_head_bytes, param_head_bytes;
  long long code_page_bytes, param_page_bytes;
  int num_splits, chunks_per_split, num_items;
  float sm_scale_log2;          // softmax scale times log2(e)
};

inline DecodeParams make_params(const FoscarDecodeArgs& a) {
  DecodeParams p;
  p.q = static_cast<const __nv_bfloat16*>(a.q);
  p.o = static_cast<__nv_bfloat16*>(a.o);
  p.k_codes = static_cast<const uint8_t*>(a.k_codes);
  p.v_codes = static_cast<const uint8_t*>(a.v_codes);
  p.k_params = static_cast<const uint8_t*>(a.k_params);
  p.v_params = static_cast<const uint8_t*>(a.v_params);
  p.page_table = a.page_table;
  p.seq_lens = a.seq_lens;
  p.k_tail = static_cast<const __nv_bfloat16*>(a.k_tail);
  p.v_tail = static_cast<const __nv_bfloat16*>(a.v_tail);
  p.ws_o = a.ws_o;
  p.ws_ml = a.ws_ml;
  p.ws_count = a.ws_count;
  p.batch = a.batch;
  p.num_q_heads = a.num_q_heads;
  p.num_kv_heads = a.num_kv_heads;
  p.ratio = a.num_q_heads / a.num_kv_heads;
  p.page_size = a.page_size;
  p.max_pages = a.max_pages;
  p.page_shift = (a.page_size & (a.page_size - 1)) == 0 ? __builtin_ctz(static_cast<unsigned>(a.page_size)) : -1;
  p.code_head_bytes = a.page_size * a.head_dim * a.bits / 8;
  p.param_head_bytes = a.page_size * (a.head_dim / a.group_size) * 4;
  p.code_page_bytes = static_cast<long long>(p.code_head_bytes) * a.num_kv_heads;
  p.param_page_bytes = static_cast<long long>(p.param_head_bytes) * a.num_kv_heads;
  p.num_splits = a.num_splits;
  p.chunks_per_split = a.units_per_split;
  p.num_items = a.batch * a.num_kv_heads * a.num_splits;
  p.sm_scale_log2 = a.sm_scale * 1.4426950408889634f;
  return p;
}

constexpr int kD = 128;           // head dim (the one instantiated)
constexpr int kChunk = 64;        // tokens per ring stage and per S = K Q^T wgmma (M = 64)
constexpr int kN = 8;             // query heads on N
constexpr int kConsumerThreads = 128;
constexpr int kConsumerBarrier = 1;  // named barrier of the consumer warpgroup (0 is __syncthreads)
constexpr float kNegInf = -INFINITY;
// A score may exceed the running maximum by this much (log2 units, p <= 2^8) before the state is
// rescaled: after the first chunks a rescale is rare, and the common chunk needs no exchange.
constexpr float kLazyMax = 8.0f;
// Stands in for a zero scale (a constant group, codes all 0: docs/FORMAT.md) where a fold divides.
constexpr float kZeroScaleStandIn = 1.0f;

// Build knobs (foscar.build passes -D flags; scripts/kernel_lab.py compares them).
// The lab's v6 candidate: per-warp softmax and PV on mma.sync (foscar_consume_warp.cuh).
#ifndef FOSCAR_WARP_PV
#define FOSCAR_WARP_PV 0
#endif
// The lab's self-fed ring (per-warp consumer only): no producer warpgroup; lane 0 of consumer
// warp 0 refills the ring itself, so a CTA is one warpgroup of 128 registers a thread and four
// CTAs share an SM (four consumer warps per scheduler instead of three).
#ifndef FOSCAR_SELF_FEED
#define FOSCAR_SELF_FEED 0
#endif
#ifndef FOSCAR_CTAS_INT4
#define FOSCAR_CTAS_INT4 (FOSCAR_SELF_FEED ? 4 : 3)
#endif
#ifndef FOSCAR_CTAS_INT2
#define FOSCAR_CTAS_INT2 (FOSCAR_SELF_FEED ? 4 : 3)
#endif
#ifndef FOSCAR_STAGES_INT4
#define FOSCAR_STAGES_INT4 4
#endif
#ifndef FOSCAR_STAGES_INT2
#define FOSCAR_STAGES_INT2 6
#endif
static_assert(!FOSCAR_SELF_FEED || FOSCAR_WARP_PV, "the self-fed ring is built for the per-warp consumer (FOSCAR_WARP_PV=1)");

template <int BITS_, int G_, bool KCH_, bool VCH_, bool DEQ_>
struct DecodeTraits {
  static constexpr int BITS = BITS_, G = G_;
  static constexpr bool KCH = KCH_, VCH = VCH_, DEQ = DEQ_;
  static constexpr int kCodeBytes = kChunk * kD * BITS / 8;     // one tensor's codes of one chunk
  static constexpr int kGroupsD = kD / G;                        // channel groups (token-wise modes)
  static constexpr int kGroupsT = G >= kChunk ? 1 : kChunk / G;  // token groups in a chunk (channel-wise)
  static constexpr int kKParamBytes = (KCH ? kGroupsT * kD : kChunk * kGroupsD) * 4;
  static constexpr int kVParamBytes = (VCH ? kGroupsT * kD : kChunk * kGroupsD) * 4;
  static constexpr int kStageBytes = 2 * kCodeBytes + kKParamBytes + kVParamBytes;
  static constexpr int kStages = BITS == 4 ? FOSCAR_STAGES_INT4 : FOSCAR_STAGES_INT2;
  static constexpr int kCtasPerSm = BITS == 4 ? FOSCAR_CTAS_INT4 : FOSCAR_CTAS_INT2;
  static constexpr bool kSelfFed = FOSCAR_SELF_FEED;
  static constexpr int kThreads = kSelfFed ? 128 : 256;  // (producer warpgroup +) consumer warpgroup
  static constexpr int kConsumerBase = kThreads - 128;   // the consumer warpgroup's first thread
  // Registers: the cap at entry, then the producer gives its share to the consumers.
  static constexpr int kEntryRegs = (65536 / (kThreads * kCtasPerSm)) / 8 * 8;
  static constexpr int kProducerRegs = 24;
  static constexpr int kConsumerRegs = (2 * kEntryRegs - kProducerRegs) / 8 * 8;
  static constexpr int kWordsK = kD * BITS / 64;  // K words per lane of one 16-token tile
  static constexpr int kWordsV = 2 * BITS;        // V words per lane of one 64-token block
  static constexpr bool kHasTail = KCH || VCH;
  static_assert(kStageBytes % 16 == 0 && kCodeBytes % 16 == 0, "bulk copies move multiples of 16 bytes");
  // The feeder refills chunk c - 1's stage at the end of chunk c, after the wait for chunk c + 1.
  static_assert(!kSelfFed || kStages >= 3, "the self-fed ring needs at least 3 stages");
};

// ---------------------------------------------------------------------------------------
// The self-fed ring's cursor (Feeder below).
struct FeedCursor {
  int item, c, end, h, filled;  // the next chunk to copy (its item, index, item's end, KV head); copies issued
  const int32_t* row;           // its sequence's page table row
};

// Shared memory, one typed struct: the ring, the B operands, the query, exchange slots.
template <class T>
struct SharedStorage {
  static constexpr int kQTiles = T::KCH && !T::DEQ ? T::kGroupsT : 1;   // S's B per token group
  static constexpr int kPTiles = !T::VCH && !T::DEQ ? T::kGroupsD : 1;  // PV's B per channel group
  alignas(128) uint8_t ring[T::kStages][T::kStageBytes];
  alignas(128) uint8_t q_tile[kQTiles][8][kBTileBytes];  // fp16 q'/f, or Q~, per k-step of S
  alignas(128) uint8_t qt_tile[8][kBTileBytes];          // bf16 q for the BF16 tail
  alignas(128) uint8_t p_tile[kPTiles][4][kBTileBytes];  // bf16 P (or P~) per k-step of O
  float q32[kN][kD];                                      // the query heads; zero rows past ratio
  float kconst[T::KCH ? T::kGroupsT : T::kGroupsD][kN][4];  // per (group, head) constants of the K fold
  float red[4][kN][12];  // [warp][head][slot]: 0 max, 1 group p-sum, 2 denominator, 3.. offsets, 7.. p~ sums
  // Per-warp consumer: each warp's output at the item's end, 4 heads a pass; the split merge's
  // weights (8 heads x 128 splits) in either consumer.
  float merge[FOSCAR_WARP_PV ? 4 : 2][kN / 2][kD];
  FeedCursor feed;  // the self-fed ring's cursor
  uint64_t full[T::kStages], empty[T::kStages];
  int last_split;
};

template <int BITS, int G, bool KCH, bool VCH, bool DEQ>
constexpr int decode_smem_bytes() {
  return static_cast<int>(sizeof(SharedStorage<DecodeTraits<BITS, G, KCH, VCH, DEQ>>));
}

// ---------------------------------------------------------------------------------------
// Work items: (sequence, KV head, split), the split a run of 64-token chunks; the last split
// takes whatever remains, so a plan made before the cache grew stays correct.
struct WorkItem {
  int b, h, split;
  int chunk_begin, chunk_end;  // packed chunks of this split
  int packed_len, tail_len;
};

template <class T>
__device__ __forceinline__ WorkItem work_item(const DecodeParams& p, int item) {
  WorkItem w;
  w.split = item % p.num_splits;
  const int rest = item / p.num_splits;
  w.h = rest % p.num_kv_heads;
  w.b = rest / p.num_kv_heads;
  const int len = p.seq_lens[w.b];
  w.tail_len = T::kHasTail ? len % T::G : 0;
  w.packed_len = len - w.tail_len;
  const int chunks = (w.packed_len + kChunk - 1) / kChunk;
  w.chunk_begin = min(w.split * p.chunks_per_split, chunks);
  w.chunk_end = w.split == p.num_splits - 1 ? chunks : min(w.chunk_begin + p.chunks_per_split, chunks);
  return w;
}

// ---------------------------------------------------------------------------------------
// Chunk c (its first token's page given) of KV head h into a stage of the ring: four bulk copies
// completing on the stage's "full" mbarrier.
template <class T>
__device__ __forceinline__ void copy_chunk(const DecodeParams& p, SharedStorage<T>& s, int h, unsigned page, int c,
                                           int stage) {
  const int tok = c * kChunk;
  const int lpage = p.page_shift >= 0 ? tok >> p.page_shift : tok / p.page_size;
  const int tip = tok - lpage * p.page_size;
  // Pages hold every head: the page, this head's slice, the chunk's first 16-token row.
  const unsigned long long codes = (unsigned long long)page * p.code_page_bytes + (unsigned)(h * p.code_head_bytes) +
                                   (unsigned)(tip / 16 * (16 * kD * T::BITS / 8));
  const unsigned long long params = (unsigned long long)page * p.param_page_bytes + (unsigned)(h * p.param_head_bytes);
  const unsigned k_par = T::KCH ? (tip / T::G) * kD * 4 : tip * T::kGroupsD * 4;
  const unsigned v_par = T::VCH ? (tip / T::G) * kD * 4 : tip * T::kGroupsD * 4;
  uint8_t* st = s.ring[stage];
  mbar_arrive_expect_tx(&s.full[stage], T::kStageBytes);
  bulk_copy_g2s(st, p.k_codes + codes, T::kCodeBytes, &s.full[stage]);
  bulk_copy_g2s(st + T::kCodeBytes, p.v_codes + codes, T::kCodeBytes, &s.full[stage]);
  bulk_copy_g2s(st + 2 * T::kCodeBytes, p.k_params + params + k_par, T::kKParamBytes, &s.full[stage]);
  bulk_copy_g2s(st + 2 * T::kCodeBytes + T::kKParamBytes, p.v_params + params + v_par, T::kVParamBytes,
                &s.full[stage]);
}

__device__ __forceinline__ unsigned chunk_page(const DecodeParams& p, const int32_t* row, int c) {
  const int tok = c * kChunk;
  return static_cast<unsigned>(row[p.page_shift >= 0 ? tok >> p.page_shift : tok / p.page_size]);
}

// The producer: one lane streams every chunk of the CTA's items into the ring.
template <class T>
__device__ void produce(const DecodeParams& p, SharedStorage<T>& s) {
  int it = 0;
  for (int item = blockIdx.x; item < p.num_items; item += gridDim.x) {
    const WorkItem w = work_item<T>(p, item);
    const int32_t* row = p.page_table + (size_t)w.b * p.max_pages;
    for (int c = w.chunk_begin; c < w.chunk_end; ++c, ++it) {
      const int stage = it % T::kStages;
      mbar_wait(&s.empty[stage], ((it / T::kStages) & 1) ^ 1);  // the consumers freed it
      copy_chunk<T>(p, s, w.h, chunk_page(p, row, c), c, stage);
    }
  }
}

// The self-fed ring's feeder (FOSCAR_SELF_FEED): lane 0 of consumer warp 0 walks the CTA's chunks
// in the consumers' order, ahead of them. Its cursor (FeedCursor) lives in shared memory, except
// the next chunk's page, loaded one refill ahead so that the page table's latency is off the
// warp's path.
template <class T>
struct Feeder {
  const DecodeParams& p;
  SharedStorage<T>& s;
  unsigned page;  // of the next chunk (lane 0 only)

  // The first item at or after `item` that has chunks; its first page.
  __device__ __forceinline__ void seek(int item) {
    FeedCursor& f = s.feed;
    for (; item < p.num_items; item += gridDim.x) {
      const WorkItem w = work_item<T>(p, item);
      if (w.chunk_begin < w.chunk_end) {
        f.c = w.chunk_begin, f.end = w.chunk_end, f.h = w.h;
        f.row = p.page_table + (size_t)w.b * p.max_pages;
        page = chunk_page(p, f.row, f.c);
        break;
      }
    }
    f.item = item;
  }
  // Copy the next chunk once every warp has read the stage it goes to (its last chunk).
  __device__ __forceinline__ void refill() {
    FeedCursor& f = s.feed;
    if (f.item >= p.num_items) return;
    const int stage = f.filled % T::kStages;
    mbar_wait(&s.empty[stage], ((f.filled / T::kStages) & 1) ^ 1);
    copy_chunk<T>(p, s, f.h, page, f.c, stage);
    ++f.filled;
    if (++f.c < f.end) {
      page = chunk_page(p, f.row, f.c);
    } else {
      seek(f.item + gridDim.x);
    }
  }
  // The ring's first kStages - 1 chunks; then one refill per chunk consumed keeps one stage
  // for the chunk being read and the rest in flight.
  __device__ __forceinline__ void start() {
    s.feed.filled = 0;
    seek(blockIdx.x);
    for (int i = 0; i < T::kStages - 1; ++i) refill();
  }
};

// ---------------------------------------------------------------------------------------
// The consumer's view of itself: warp w (0..3) of the warpgroup, lane (g, t).
struct Lane {
  int tid, warp, lane, g, t;
  __device__ __forceinline__ explicit Lane(int consumer_tid)
      : tid(consumer_tid), warp(consumer_tid >> 5), lane(consumer_tid & 31), g((consumer_tid & 31) >> 2),
        t(consumer_tid & 3) {}
  // Token (within a chunk) of S accumulator element e: rows g and g + 8 of warp w's 16.
  __device__ __forceinline__ int token(int e) const { return 16 * warp + g + 8 * (e >> 1); }
  // Channel of O accumulator element e of m64 tile i: warp w owns channels 32w .. 32w + 31.
  __device__ __forceinline__ int channel(int i, int e) const { return 32 * warp + 16 * i + 8 * (e >> 1) + g; }
};

template <int N>
__device__ __forceinline__ void zero_accumulators(float (&acc)[N][4]) {
#pragma unroll
  for (int i = 0; i < N; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[i][e] = 0.f;
}

// Sums / maxima over the 8 lanes that share t (the rows g of an accumulator fragment).
__device__ __forceinline__ float sum_rows(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 4);
  x += __shfl_xor_sync(0xffffffffu, x, 8);
  x += __shfl_xor_sync(0xffffffffu, x, 16);
  return x;
}
__device__ __forceinline__ float max_rows(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 4));
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 8));
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 16));
  return x;
}
// Reduction over aligned groups of N lanes (xor within the group).
template <int N, bool MAX>
__device__ __forceinline__ float reduce_lanes(float x) {
#pragma unroll
  for (int m = 1; m < N; m *= 2) {
    const float y = __shfl_xor_sync(0xffffffffu, x, m);
    x = MAX ? fmaxf(x, y) : x + y;
  }
  return x;
}

// Per-thread query staging: thread tid owns head n = tid / 16, channels 8 (tid % 16) .. + 7.
struct QSlice {
  int n, d0;
  __device__ __forceinline__ explicit QSlice(int tid) : n(tid >> 4), d0(8 * (tid & 15)) {}
  // Byte offset of this slice in a B tile stack (8 k-steps): 8 consecutive K values of row n.
  __device__ __forceinline__ int tile_offset() const { return (d0 / 16) * kBTileBytes + b_tile_offset(d0 % 16, n); }
};

// ---------------------------------------------------------------------------------------
// K side. Each policy builds the A operands of S = K Q^T from a staged 16-token tile, issues the
// chunk's wgmmas, and turns the accumulators into log2-domain scores.
template <class T>
struct KFoldToken {
  // Token-wise K, accumulator fold. B = q' / f (fp16, q' = q 2^-e, e keeping |q'| < 2^14); per
  // channel group gk an accumulator acc_gk = sum_d q'_d / f_d (1024 + f_d c) and
  //   score log2 = 2^e lambda s_{t,gk} (acc - 1024 sum q'/f) + lambda z_{t,gk} sum q.
  static constexpr int kAcc = T::kGroupsD;
  float acc[kAcc][4];
  float kscale[2];       // 2^e lambda of heads 2t, 2t+1
  float c1[kAcc][2], c2[kAcc][2];  // 1024 sum q'/f and lambda sum q per channel group, heads 2t, 2t+1

  __device__ __forceinline__ void setup(const DecodeParams& p, SharedStorage<T>& s, const Lane& L) {
    const QSlice qs(L.tid);
    float x[8], amax = 0.f;
#pragma unroll
    for (int j = 0; j < 8; ++j) amax = fmaxf(amax, fabsf(x[j] = s.q32[qs.n][qs.d0 + j]));
    amax = reduce_lanes<16, true>(amax);
    const int e = amax >= 16384.f ? ilog2f(amax) - 13 : 0;  // keep q' in fp16's range
    const float down = exp2_int(-e);
    uint32_t h[4];
    float qf = 0.f, qsum = 0.f;
#pragma unroll
    for (int j = 0; j < 8; j += 2) {
      const float f0 = k_radix<T::BITS>(((qs.d0 + j) / 8) % (16 / T::BITS));
      h[j / 2] = pack_f16x2(x[j] * down / f0, x[j + 1] * down / f0);  // a pair shares its block's factor
      const float2 r = unpack_f16x2(h[j / 2]);
      qf += r.x + r.y;
      qsum += x[j] + x[j + 1];
    }
    *reinterpret_cast<uint4*>(s.q_tile[0][0] + qs.tile_offset()) = make_uint4(h[0], h[1], h[2], h[3]);
    // Sums over each channel group: G / 8 lanes of 8 channels each.
    qf = reduce_lanes<T::G / 8, false>(qf);
    qsum = reduce_lanes<T::G / 8, false>(qsum);
    if ((L.tid & (T::G / 8 - 1)) == 0) {
      const int gk = qs.d0 / T::G;
      s.kconst[gk][qs.n][0] = kKBias * qf;
      s.kconst[gk][qs.n][1] = p.sm_scale_log2 * qsum;
      s.kconst[gk][qs.n][2] = p.sm_scale_log2 * exp2_int(e);
    }
  }
  __device__ __forceinline__ void load_constants(SharedStorage<T>& s, const Lane& L) {
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      kscale[hh] = s.kconst[0][2 * L.t + hh][2];
#pragma unroll
      for (int gk = 0; gk < kAcc; ++gk) c1[gk][hh] = s.kconst[gk][2 * L.t + hh][0], c2[gk][hh] = s.kconst[gk][2 * L.t + hh][1];
    }
  }
  __device__ __forceinline__ void begin_chunk(const DecodeParams&, SharedStorage<T>&, const Lane&, const uint8_t*, bool) {}

  __device__ __forceinline__ void issue(SharedStorage<T>& s, const Lane&, const uint32_t (&a)[8][4]) {
    const uint64_t base = b_tile_desc(smem_u32(s.q_tile[0][0]));
#pragma unroll
    for (int kt = 0; kt < 8; ++kt) {
      const int gk = kt * 16 / T::G;
      wgmma_m64n8k16<true>(acc[gk], a[kt][0], a[kt][1], a[kt][2], a[kt][3], base + kt * (kBTileBytes >> 4));
    }
  }
  // log2-domain scores of this thread's (token, head) pairs; `par` = the chunk's K params.
  __device__ __forceinline__ void scores(SharedStorage<T>&, const Lane& L, const uint8_t* par, float (&x)[4]) const {
#pragma unroll
    for (int e = 0; e < 4; ++e) x[e] = 0.f;
#pragma unroll
    for (int gk = 0; gk < kAcc; ++gk)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float2 sz = __half22float2(reinterpret_cast<const __half2*>(par)[L.token(e) * T::kGroupsD + gk]);
        x[e] = fmaf(kscale[e & 1] * sz.x, acc[gk][e] - c1[gk][e & 1], fmaf(sz.y, c2[gk][e & 1], x[e]));
      }
  }
};

template <class T>
struct KFoldChannel {
  // Channel-wise K, operand fold. Once per token group the warpgroup builds
  // Q~ = q s lambda 2^e / f (fp16, 2^e per head keeping max |Q~| in [2^13, 2^14)) and
  // bias = sum_d Q~_d (f z / s - 1024), so that  score log2 = 2^-e (acc + bias): the offset rides
  // on the same rounded Q~ as the codes, so each channel carries one centred rounding.
  // A chunk holding two token groups (G = 32) runs one wgmma chain per group, each warp giving
  // zero operands to the group it does not hold.
  static constexpr int kGroups = T::kGroupsT;
  float acc[1][4];
  float bias[2], inv[2];  // of this thread's group, heads 2t, 2t+1

  // Warps whose two heads (16 threads each) are both padding (ratio <= 2 w) skip the rebuild:
  // their rows of Q~ and their constants are zeroed once per item here.
  __device__ __forceinline__ static bool padding_warp(const DecodeParams& p, const Lane& L) {
    return 2 * L.warp >= p.ratio;
  }
  __device__ __forceinline__ void setup(const DecodeParams& p, SharedStorage<T>& s, const Lane& L) {
    if (!padding_warp(p, L)) return;
    const QSlice qs(L.tid);
#pragma unroll
    for (int gq = 0; gq < kGroups; ++gq) {
      *reinterpret_cast<uint4*>(s.q_tile[gq][0] + qs.tile_offset()) = make_uint4(0u, 0u, 0u, 0u);
      if ((L.tid & 15) == 0) s.kconst[gq][qs.n][0] = 0.f, s.kconst[gq][qs.n][1] = 1.f;
    }
  }
  __device__ __forceinline__ void load_constants(SharedStorage<T>&, const Lane&) {}
  __device__ __forceinline__ int my_group(const Lane& L) const { return kGroups == 1 ? 0 : (16 * L.warp) / T::G; }

  // Rebuild Q~ for the chunk's token groups when one starts (every chunk when G < 64).
  __device__ __forceinline__ void begin_chunk(const DecodeParams& p, SharedStorage<T>& s, const Lane& L,
                                              const uint8_t* par, bool group_starts) {
    if (!group_starts) return;
    const QSlice qs(L.tid);
#pragma unroll
    for (int gq = 0; gq < kGroups && !padding_warp(p, L); ++gq) {
      const __half2* row = reinterpret_cast<const __half2*>(par) + gq * kD;
      float qt[8], sc[8], amax = 0.f;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const float2 sz = __half22float2(row[qs.d0 + j]);
        sc[j] = sz.x != 0.f ? sz.x : kZeroScaleStandIn;
        const float f = k_radix<T::BITS>(((qs.d0 + j) / 8) % (16 / T::BITS));
        qt[j] = s.q32[qs.n][qs.d0 + j] * sc[j] * (p.sm_scale_log2 / f);
        amax = fmaxf(amax, fabsf(qt[j]));
      }
      amax = reduce_lanes<16, true>(amax);
      const int e = amax > 0.f ? 13 - ilog2f(amax) : 0;
      const float up = exp2_int(max(min(e, 126), -126));
      uint32_t h[4];
      float part = 0.f;
#pragma unroll
      for (int j = 0; j < 8; j += 2) {
        h[j / 2] = pack_f16x2(qt[j] * up, qt[j + 1] * up);
        const float2 r = unpack_f16x2(h[j / 2]);
        const float f = k_radix<T::BITS>(((qs.d0 + j) / 8) % (16 / T::BITS));
        const float2 z01 = make_float2(__half22float2(row[qs.d0 + j]).y, __half22float2(row[qs.d0 + j + 1]).y);
        part = fmaf(r.x, f * z01.x / sc[j] - kKBias, fmaf(r.y, f * z01.y / sc[j + 1] - kKBias, part));
      }
      *reinterpret_cast<uint4*>(s.q_tile[gq][0] + qs.tile_offset()) = make_uint4(h[0], h[1], h[2], h[3]);
      part = reduce_lanes<16, false>(part);
      if ((L.tid & 15) == 0) {
        s.kconst[gq][qs.n][0] = part;
        s.kconst[gq][qs.n][1] = exp2_int(-max(min(e, 126), -126));
      }
    }
    fence_proxy_async_smem();
    named_barrier(kConsumerBarrier, kConsumerThreads);
    const int gq = my_group(L);
    bias[0] = s.kconst[gq][2 * L.t][0], bias[1] = s.kconst[gq][2 * L.t + 1][0];
    inv[0] = s.kconst[gq][2 * L.t][1], inv[1] = s.kconst[gq][2 * L.t + 1][1];
  }

  __device__ __forceinline__ void issue(SharedStorage<T>& s, const Lane& L, const uint32_t (&a)[8][4]) {
#pragma unroll
    for (int gq = 0; gq < kGroups; ++gq) {
      const uint64_t base = b_tile_desc(smem_u32(s.q_tile[gq][0]));
      const bool mine = my_group(L) == gq;
#pragma unroll
      for (int kt = 0; kt < 8; ++kt)
        wgmma_m64n8k16<true>(acc[0], mine ? a[kt][0] : 0u, mine ? a[kt][1] : 0u, mine ? a[kt][2] : 0u,
                             mine ? a[kt][3] : 0u, base + kt * (kBTileBytes >> 4));
    }
  }
  __device__ __forceinline__ void scores(SharedStorage<T>&, const Lane&, const uint8_t*, float (&x)[4]) const {
#pragma unroll
    for (int e = 0; e < 4; ++e) x[e] = (acc[0][e] + bias[e & 1]) * inv[e & 1];
  }
};

template <class T>
struct KDequant {
  // The ablation, channel-wise K: every element becomes s c + z (fp32, rounded once to fp16)
  // before the MMA; B = q' = q 2^-e (fp16).  score log2 = 2^e lambda acc.
  float acc[1][4];
  float kscale[2];
  __device__ __forceinline__ void setup(const DecodeParams& p, SharedStorage<T>& s, const Lane& L) {
    const QSlice qs(L.tid);
    float x[8], amax = 0.f;
#pragma unroll
    for (int j = 0; j < 8; ++j) amax = fmaxf(amax, fabsf(x[j] = s.q32[qs.n][qs.d0 + j]));
    amax = reduce_lanes<16, true>(amax);
    const int e = amax >= 16384.f ? ilog2f(amax) - 13 : 0;
    const float down = exp2_int(-e);
    uint32_t h[4];
#pragma unroll
    for (int j = 0; j < 8; j += 2) h[j / 2] = pack_f16x2(x[j] * down, x[j + 1] * down);
    *reinterpret_cast<uint4*>(s.q_tile[0][0] + qs.tile_offset()) = make_uint4(h[0], h[1], h[2], h[3]);
    if ((L.tid & 15) == 0) s.kconst[0][qs.n][2] = p.sm_scale_log2 * exp2_int(e);
  }
  __device__ __forceinline__ void load_constants(SharedStorage<T>& s, const Lane& L) {
    kscale[0] = s.kconst[0][2 * L.t][2];
    kscale[1] = s.kconst[0][2 * L.t + 1][2];
  }
  // The K operands are dequantized in place: (x - 1024) / f s + z per element.
  __device__ __forceinline__ void begin_chunk(const DecodeParams&, SharedStorage<T>&, const Lane&, const uint8_t*, bool) {}
  __device__ __forceinline__ void dequantize(const Lane& L, const uint8_t* par, uint32_t (&a)[8][4]) const {
    const __half2* row = reinterpret_cast<const __half2*>(par) + ((16 * L.warp) / T::G) * kD;
#pragma unroll
    for (int kt = 0; kt < 8; ++kt)
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int c = 16 * kt + 2 * L.t + 8 * (r >> 1);
        const float f = k_radix<T::BITS>((c / 8) % (16 / T::BITS));
        const float2 s0 = __half22float2(row[c]), s1 = __half22float2(row[c + 1]);
        const float2 v = unpack_f16x2(a[kt][r]);
        a[kt][r] = pack_f16x2(fmaf(v.x, s0.x / f, s0.y - kKBias * s0.x / f), fmaf(v.y, s1.x / f, s1.y - kKBias * s1.x / f));
      }
  }
  __device__ __forceinline__ void issue(SharedStorage<T>& s, const Lane&, const uint32_t (&a)[8][4]) {
    const uint64_t base = b_tile_desc(smem_u32(s.q_tile[0][0]));
#pragma unroll
    for (int kt = 0; kt < 8; ++kt)
      wgmma_m64n8k16<true>(acc[0], a[kt][0], a[kt][1], a[kt][2], a[kt][3], base + kt * (kBTileBytes >> 4));
  }
  __device__ __forceinline__ void scores(SharedStorage<T>&, const Lane&, const uint8_t*, float (&x)[4]) const {
#pragma unroll
    for (int e = 0; e < 4; ++e) x[e] = acc[0][e] * kscale[e & 1];
  }
};

// A lane's W words of a block in fragment order, stored [W / 4][32 lanes][4]: one 16-byte load
// per 4 words, coalesced across the warp (docs/FORMAT.md).
template <int W>
__device__ __forceinline__ void lane_words(const uint8_t* block, int lane, uint32_t (&w)[W]) {
#pragma unroll
  for (int v = 0; v < W / 4; ++v) {
    const uint4 x = lds128(block + (v * 128 + lane * 4) * 4);
    w[4 * v] = x.x, w[4 * v + 1] = x.y, w[4 * v + 2] = x.z, w[4 * v + 3] = x.w;
  }
}

// The A operands of S for warp w's 16-token tile of a chunk (fp16 injection, docs/FORMAT.md).
template <int BITS>
__device__ __forceinline__ void k_operands(const uint8_t* tile, int lane, uint32_t (&a)[8][4]) {
  constexpr int W = kD * BITS / 64, HALF = W / 2, P = 16 / BITS;
  uint32_t w[W];
  lane_words(tile, lane, w);
#pragma unroll
  for (int kt = 0; kt < 8; ++kt) {
    const int j = (2 * kt) / P;
    switch ((2 * kt) % P) {
#define FOSCAR_K_CASE(K0)                                                                   \
  case K0:                                                                                  \
    a[kt][0] = inject_k<BITS, K0>(w[j]), a[kt][1] = inject_k<BITS, K0>(w[HALF + j]);        \
    a[kt][2] = inject_k<BITS, K0 + 1>(w[j]), a[kt][3] = inject_k<BITS, K0 + 1>(w[HALF + j]); \
    break;
      FOSCAR_K_CASE(0)
      FOSCAR_K_CASE(2)
      FOSCAR_K_CASE(4)
      FOSCAR_K_CASE(6)
#undef FOSCAR_K_CASE
    }
  }
}

// ---------------------------------------------------------------------------------------
// V side. Each policy builds the A operands of O^T = V^T P^T from the warp's slice of a staged
// 64-token block, publishes the B operand (P or P~) and folds the accumulators into the output.
//
// The A operands of warp w for k-step kt and m64 tile i: rows g / g+8 are the channels of blocks
// 2i / 2i+1 (32w + 16i + g, + 8), columns the tokens 16kt + 2t (+1) and + 8.
// The A operands of k-step kt for m64 tiles i = 0, 1 of one 32-channel slice, from that k-step's
// words of a lane: INT4 words 2kt + o (o = token offset), position = block (2i + row half), all at
// f = 2; INT2 word kt, block b at token offset o at v2_position(b, o), blocks 0-3 at f 2, 8, 8, 32.
template <int BITS>
__device__ __forceinline__ void v_inject_kstep(const uint32_t* words, uint32_t (&a)[2][4]) {
  if constexpr (BITS == 4) {
    const uint32_t w0 = words[0], w1 = words[1];
    a[0][0] = inject_v<4, 0>(w0), a[0][1] = inject_v<4, 1>(w0);
    a[0][2] = inject_v<4, 0>(w1), a[0][3] = inject_v<4, 1>(w1);
    a[1][0] = inject_v<4, 2>(w0), a[1][1] = inject_v<4, 3>(w0);
    a[1][2] = inject_v<4, 2>(w1), a[1][3] = inject_v<4, 3>(w1);
  } else {
    const uint32_t x = words[0];
    a[0][0] = inject_v<2, v2_position(0, 0)>(x), a[0][1] = inject_v<2, v2_position(1, 0)>(x);
    a[0][2] = inject_v<2, v2_position(0, 1)>(x), a[0][3] = inject_v<2, v2_position(1, 1)>(x);
    a[1][0] = inject_v<2, v2_position(2, 0)>(x), a[1][1] = inject_v<2, v2_position(3, 0)>(x);
    a[1][2] = inject_v<2, v2_position(2, 1)>(x), a[1][3] = inject_v<2, v2_position(3, 1)>(x);
  }
}

// The A operands of warp w's 32-channel slice for all four k-steps of a staged V block.
template <int BITS>
__device__ __forceinline__ void v_operands(const uint8_t* block, int warp, int lane, uint32_t (&a)[4][2][4]) {
  constexpr int W = 2 * BITS;
  const uint8_t* mine = block + warp * 32 * W * 4;
  uint32_t w[W];
  lane_words(mine, lane, w);
#pragma unroll
  for (int kt = 0; kt < 4; ++kt) v_inject_kstep<BITS>(w + (BITS == 4 ? 2 * kt : kt), a[kt]);
}
// Radix factor of the channel block (tile i, row half hf) of a V operand.
template <int BITS>
__device__ __forceinline__ constexpr float v_block_radix(int i, int hf) {
  return BITS == 4 ? 2.f : (i == 0 ? (hf == 0 ? 2.f : 8.f) : (hf == 0 ? 8.f : 32.f));
}

// The ablation's V element pair: an injected register (bf16 128 + f c, two tokens) turned into
// s c + z with each token's (s, z).
__device__ __forceinline__ uint32_t dequant_v_pair(uint32_t x, float f, float2 sz0, float2 sz1) {
  const float2 v = unpack_bf16x2(x);
  const float s0 = sz0.x / f, s1 = sz1.x / f;
  return pack_bf16x2(fmaf(v.x, s0, sz0.y - kVBias * s0), fmaf(v.y, s1, sz1.y - kVBias * s1));
}

template <class T>
struct VFoldToken {
  // Token-wise V, operand fold: P~ = p s_{t,gv} per channel group, A = 128 + f c; each chunk's
  // accumulator (sum p~ (128 + f c)) is folded into the fp32 output as raw / f. The offsets
  // sum p~ z / s and the bias sum p~ are summed apart per (group, head); at the end every channel
  // of the group gets  off - 128 / f * pbar.
  static constexpr int kGroups = T::kGroupsD;  // B tiles per k-step
  float raw[2][4];                  // the chunk's accumulators (two m64 tiles)
  float out[2][4];                  // folded output
  float off[kGroups][2];            // this thread's partial offsets per (group, head)
  float pbar[kGroups][2];           // this thread's partial sums of p~ per (group, head)

  __device__ __forceinline__ void reset() {
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) out[i][e] = 0.f, raw[i][e] = 0.f;
#pragma unroll
    for (int gv = 0; gv < kGroups; ++gv) off[gv][0] = off[gv][1] = pbar[gv][0] = pbar[gv][1] = 0.f;
  }
  __device__ __forceinline__ int my_group(const Lane& L) const { return (32 * L.warp) / T::G; }
  __device__ __forceinline__ void operands(const uint8_t* block, const Lane& L, uint32_t (&a)[4][2][4]) const {
    v_operands<T::BITS>(block, L.warp, L.lane, a);
  }
  // P~ for this thread's (token, head) probabilities; `par` = the chunk's V params. The thread's
  // four elements are two tokens (rows g, g + 8) of two heads: one (s, z) and one division each.
  __device__ __forceinline__ void publish(SharedStorage<T>& s, const Lane& L, const uint8_t* par, bool, const float (&pr)[4]) {
#pragma unroll
    for (int gv = 0; gv < kGroups; ++gv) {
      float sc[2], zs[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const float2 sz = __half22float2(reinterpret_cast<const __half2*>(par)[L.token(2 * r) * T::kGroupsD + gv]);
        sc[r] = sz.x != 0.f ? sz.x : kZeroScaleStandIn;  // codes of a constant group are 0
        zs[r] = sz.y / sc[r];
      }
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const uint16_t pb = bf16_bits(pr[e] * sc[e >> 1]);
        *reinterpret_cast<uint16_t*>(s.p_tile[gv][L.warp] + b_tile_offset(L.g + 8 * (e >> 1), 2 * L.t + (e & 1))) = pb;
        const float pt = unpack_bf16x2(pb).x;
        off[gv][e & 1] = fmaf(pt, zs[e >> 1], off[gv][e & 1]);
        pbar[gv][e & 1] += pt;
      }
    }
  }
  // Before the wgmma fence: each chunk's accumulators start from zero.
  __device__ __forceinline__ void begin_pv() { zero_accumulators(raw); }
  __device__ __forceinline__ void issue(SharedStorage<T>& s, const Lane& L, const uint32_t (&a)[4][2][4]) {
#pragma unroll
    for (int gv = 0; gv < kGroups; ++gv) {
      const bool mine = kGroups == 1 || my_group(L) == gv;
      const uint64_t base = b_tile_desc(smem_u32(s.p_tile[gv][0]));
#pragma unroll
      for (int kt = 0; kt < 4; ++kt)
#pragma unroll
        for (int i = 0; i < 2; ++i)
          wgmma_m64n8k16<false>(raw[i], mine ? a[kt][i][0] : 0u, mine ? a[kt][i][1] : 0u, mine ? a[kt][i][2] : 0u,
                                mine ? a[kt][i][3] : 0u, base + kt * (kBTileBytes >> 4));
    }
  }
  // After the chunk's PV has completed: fold it (raw / f per channel block).
  __device__ __forceinline__ void after_pv() {
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) out[i][e] = fmaf(raw[i][e], 1.f / v_block_radix<T::BITS>(i, e >> 1), out[i][e]);
  }
  __device__ __forceinline__ void rescale(const float (&alpha)[2]) {
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) out[i][e] *= alpha[e & 1];
#pragma unroll
    for (int gv = 0; gv < kGroups; ++gv)
      off[gv][0] *= alpha[0], off[gv][1] *= alpha[1], pbar[gv][0] *= alpha[0], pbar[gv][1] *= alpha[1];
  }
  // The offsets and the bias, summed over the warpgroup, added to every channel of their group
  // (item end): out += off - 128 / f * pbar.
  __device__ __forceinline__ void finish(SharedStorage<T>& s, const Lane& L) {
#pragma unroll
    for (int gv = 0; gv < kGroups; ++gv)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const float v = sum_rows(off[gv][hh]), b = sum_rows(pbar[gv][hh]);
        if (L.g == 0) s.red[L.warp][2 * L.t + hh][3 + gv] = v, s.red[L.warp][2 * L.t + hh][7 + gv] = b;
      }
    named_barrier(kConsumerBarrier, kConsumerThreads);
    const int gv = kGroups == 1 ? 0 : my_group(L);
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      float total = 0.f, bias = 0.f;
#pragma unroll
      for (int w = 0; w < 4; ++w) total += s.red[w][2 * L.t + hh][3 + gv], bias += s.red[w][2 * L.t + hh][7 + gv];
#pragma unroll
      for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int hf = 0; hf < 2; ++hf)
          out[i][hh + 2 * hf] += fmaf(-kVBias / v_block_radix<T::BITS>(i, hf), bias, total);
    }
  }
};

template <class T>
struct VFoldChannel {
  // Channel-wise V, accumulator fold: A = 128 + f c, B = p (bf16). Each chunk's accumulator
  // is folded with its group's s / f per channel (out += s / f * acc); at a group's end the
  // offsets and the bias follow, (z - 128 s / f) * sum_T p with the p-sum over the whole
  // warpgroup. A chunk holding two groups (G = 32) accumulates its two halves apart.
  static constexpr int kHalves = T::kGroupsT;  // token groups per chunk (2 when G = 32)
  float raw[kHalves][2][4];
  float out[2][4];
  float psum[2];               // this thread's partial p-sum of the open group
  float gsum[kHalves][2];      // the warpgroup's p-sums of the groups closed in this chunk
  float sz[kHalves][2][2][2];  // [group][tile][row half] (s, z) of this thread's channels
  bool closes = false;

  __device__ __forceinline__ void reset() {
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) out[i][e] = 0.f;
#pragma unroll
    for (int h = 0; h < kHalves; ++h) zero_accumulators(raw[h]);
    psum[0] = psum[1] = 0.f;
    closes = false;
  }
  __device__ __forceinline__ void operands(const uint8_t* block, const Lane& L, uint32_t (&a)[4][2][4]) const {
    v_operands<T::BITS>(block, L.warp, L.lane, a);
  }
  // bf16 p as the B operand; the chunk's group rows (s, z) of this thread's four channels are
  // kept for the folds; at a group's end the p-sums are exchanged through s.red.
  __device__ __forceinline__ void publish(SharedStorage<T>& s, const Lane& L, const uint8_t* par, bool group_ends,
                                          const float (&pr)[4]) {
#pragma unroll
    for (int gq = 0; gq < kHalves; ++gq)
#pragma unroll
      for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
          const float2 v = __half22float2(reinterpret_cast<const __half2*>(par)[gq * kD + L.channel(i, 2 * hf)]);
          sz[gq][i][hf][0] = v.x, sz[gq][i][hf][1] = v.y;
        }
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const uint16_t pb = bf16_bits(pr[e]);
      *reinterpret_cast<uint16_t*>(s.p_tile[0][L.warp] + b_tile_offset(L.g + 8 * (e >> 1), 2 * L.t + (e & 1))) = pb;
      psum[e & 1] += unpack_bf16x2(pb).x;
    }
    closes = group_ends;
    if (group_ends) {
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const float v = sum_rows(psum[hh]);
        if (L.g == 0) s.red[L.warp][2 * L.t + hh][1] = v;
        psum[hh] = 0.f;
      }
    }
  }
  // After the publishing barrier: the closed groups' p-sums (warps 0-3, or 0-1 and 2-3 at G = 32).
  __device__ __forceinline__ void collect(SharedStorage<T>& s, const Lane& L) {
    if (!closes) return;
#pragma unroll
    for (int gq = 0; gq < kHalves; ++gq)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        float total = 0.f;
#pragma unroll
        for (int w = gq * 4 / kHalves; w < (gq + 1) * 4 / kHalves; ++w) total += s.red[w][2 * L.t + hh][1];
        gsum[gq][hh] = total;
      }
  }
  __device__ __forceinline__ void begin_pv() {
#pragma unroll
    for (int h = 0; h < kHalves; ++h) zero_accumulators(raw[h]);
  }
  __device__ __forceinline__ void issue(SharedStorage<T>& s, const Lane&, const uint32_t (&a)[4][2][4]) {
    const uint64_t base = b_tile_desc(smem_u32(s.p_tile[0][0]));
#pragma unroll
    for (int kt = 0; kt < 4; ++kt)
#pragma unroll
      for (int i = 0; i < 2; ++i)
        wgmma_m64n8k16<false>(raw[kt * kHalves / 4][i], a[kt][i][0], a[kt][i][1], a[kt][i][2], a[kt][i][3],
                              base + kt * (kBTileBytes >> 4));
  }
  // After the chunk's PV has completed: fold each half with its group's scales, and the offsets
  // of the groups that closed.
  __device__ __forceinline__ void after_pv() {
#pragma unroll
    for (int gq = 0; gq < kHalves; ++gq)
#pragma unroll
      for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float s_c = sz[gq][i][e >> 1][0], z_c = sz[gq][i][e >> 1][1];
          const float inv_f = 1.f / v_block_radix<T::BITS>(i, e >> 1);
          out[i][e] = fmaf(s_c * inv_f, raw[gq][i][e], out[i][e]);
          if (closes) out[i][e] = fmaf(fmaf(-kVBias * inv_f, s_c, z_c), gsum[gq][e & 1], out[i][e]);
        }
    closes = false;
  }
  __device__ __forceinline__ void rescale(const float (&alpha)[2]) {
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) out[i][e] *= alpha[e & 1];
    psum[0] *= alpha[0], psum[1] *= alpha[1];
  }
  __device__ __forceinline__ void finish(SharedStorage<T>&, const Lane&) {}
};

template <class T>
struct VDequant {
  // The ablation, token-wise V: every element becomes s_t c + z_t (fp32, rounded once to bf16)
  // before the MMA; B = p (bf16).
  float raw[2][4];
  float out[2][4];
  float2 tsz[4][2][2];  // [k-step][token offset][pair element] (s, z) of this thread's A columns
  __device__ __forceinline__ void reset() {
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) out[i][e] = 0.f, raw[i][e] = 0.f;
  }
  __device__ __forceinline__ void operands(const uint8_t* block, const Lane& L, uint32_t (&a)[4][2][4]) const {
    v_operands<T::BITS>(block, L.warp, L.lane, a);
#pragma unroll
    for (int kt = 0; kt < 4; ++kt)
#pragma unroll
      for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const int o = r >> 1;
          a[kt][i][r] = dequant_v_pair(a[kt][i][r], v_block_radix<T::BITS>(i, r & 1), tsz[kt][o][0], tsz[kt][o][1]);
        }
  }
  // The (s, z) of the tokens this thread's A columns hold (before operands()).
  __device__ __forceinline__ void load_params(const Lane& L, const uint8_t* par) {
    const int gv = (32 * L.warp) / T::G;
#pragma unroll
    for (int kt = 0; kt < 4; ++kt)
#pragma unroll
      for (int o = 0; o < 2; ++o)
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const int tok = 16 * kt + 2 * L.t + 8 * o + j;
          tsz[kt][o][j] = __half22float2(reinterpret_cast<const __half2*>(par)[tok * T::kGroupsD + gv]);
        }
  }
  __device__ __forceinline__ void publish(SharedStorage<T>& s, const Lane& L, const uint8_t*, bool, const float (&pr)[4]) {
#pragma unroll
    for (int e = 0; e < 4; ++e)
      *reinterpret_cast<uint16_t*>(s.p_tile[0][L.warp] + b_tile_offset(L.g + 8 * (e >> 1), 2 * L.t + (e & 1))) =
          bf16_bits(pr[e]);
  }
  __device__ __forceinline__ void begin_pv() { zero_accumulators(raw); }
  __device__ __forceinline__ void issue(SharedStorage<T>& s, const Lane&, const uint32_t (&a)[4][2][4]) {
    const uint64_t base = b_tile_desc(smem_u32(s.p_tile[0][0]));
#pragma unroll
    for (int kt = 0; kt < 4; ++kt)
#pragma unroll
      for (int i = 0; i < 2; ++i)
        wgmma_m64n8k16<false>(raw[i], a[kt][i][0], a[kt][i][1], a[kt][i][2], a[kt][i][3],
                              base + kt * (kBTileBytes >> 4));
  }
  __device__ __forceinline__ void after_pv() {
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) out[i][e] += raw[i][e];
  }
  __device__ __forceinline__ void rescale(const float (&alpha)[2]) {
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) out[i][e] *= alpha[e & 1];
  }
  __device__ __forceinline__ void finish(SharedStorage<T>&, const Lane&) {}
};

// ---------------------------------------------------------------------------------------
// The online softmax of one warpgroup: a running reference maximum per head, shared by the
// warpgroup, which a chunk's scores may exceed by kLazyMax before the state is rescaled.
struct OnlineSoftmax {
  float m[2] = {kNegInf, kNegInf};  // heads 2t, 2t+1, log2 domain
  float l[2] = {0.f, 0.f};          // this thread's partial denominators

  // Phase A: does any score of the warpgroup exceed the reference by more than kLazyMax? If so,
  // exchange the chunk's maxima and return the rescale factors (else alpha = 1).
  template <class T>
  __device__ __forceinline__ bool update(SharedStorage<T>& s, const Lane& L, const float (&x)[4], float (&alpha)[2]) {
    const bool over = x[0] > m[0] + kLazyMax || x[2] > m[0] + kLazyMax || x[1] > m[1] + kLazyMax ||
                      x[3] > m[1] + kLazyMax;
    alpha[0] = alpha[1] = 1.f;
    if (!named_barrier_any(kConsumerBarrier, kConsumerThreads, over)) return false;
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const float v = max_rows(fmaxf(x[hh], x[hh + 2]));
      if (L.g == 0) s.red[L.warp][2 * L.t + hh][0] = v;
    }
    named_barrier(kConsumerBarrier, kConsumerThreads);
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      float mx = m[hh];
#pragma unroll
      for (int w = 0; w < 4; ++w) mx = fmaxf(mx, s.red[w][2 * L.t + hh][0]);
      alpha[hh] = mx == kNegInf ? 1.f : exp2f(m[hh] - mx);  // 0 on the first chunk
      m[hh] = mx;
      l[hh] *= alpha[hh];
    }
    return true;
  }
  // Phase B: probabilities against the reference; the denominator takes the unrounded p.
  __device__ __forceinline__ void probabilities(const float (&x)[4], float (&pr)[4]) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      pr[e] = exp2f(x[e] - m[e & 1]);
      l[e & 1] += pr[e];
    }
  }
};

template <class T, class VSide>
__device__ __forceinline__ void consume_tail(const DecodeParams& p, SharedStorage<T>& s, const Lane& L, const WorkItem& w,
                                          OnlineSoftmax& sm, VSide& vs);
template <class T, class VSide>
__device__ void finish_item(const DecodeParams& p, SharedStorage<T>& s, const Lane& L, const WorkItem& w,
                            const OnlineSoftmax& sm, VSide& vs);

// The query heads of an item's KV head: fp32 in shared memory (zero rows past the ratio), bf16
// B tiles for the BF16 tail, then the K side's setup and constants.
template <class T, class KSide>
__device__ __forceinline__ void load_query(const DecodeParams& p, SharedStorage<T>& s, const Lane& L, const WorkItem& w,
                                           KSide& ks) {
  const QSlice qs(L.tid);
  float x[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  if (qs.n < p.ratio) {
    const uint4 raw = *reinterpret_cast<const uint4*>(p.q + ((size_t)w.b * p.num_q_heads + w.h * p.ratio + qs.n) * kD + qs.d0);
    const uint32_t u[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float2 f = unpack_bf16x2(u[j]);
      x[2 * j] = f.x, x[2 * j + 1] = f.y;
    }
    if constexpr (T::kHasTail) {  // bf16 q for the tail's products (exact: q is bf16)
      *reinterpret_cast<uint4*>(s.qt_tile[0] + qs.tile_offset()) = raw;
    }
  } else if constexpr (T::kHasTail) {
    *reinterpret_cast<uint4*>(s.qt_tile[0] + qs.tile_offset()) = make_uint4(0u, 0u, 0u, 0u);
  }
#pragma unroll
  for (int j = 0; j < 8; ++j) s.q32[qs.n][qs.d0 + j] = x[j];
  __syncwarp();
  ks.setup(p, s, L);
  fence_proxy_async_smem();
  named_barrier(kConsumerBarrier, kConsumerThreads);
  ks.load_constants(s, L);
}

// The S side of an item's chunk loop, shared by both consumers: the ring's stages counted from
// the current chunk, chunk c's S operands (the B tile when a token group starts, the A operands
// of warp w's 16-token tile), the first chunk's S, and a chunk's masked scores.
template <class T, class KSide>
struct SStream {
  const DecodeParams& p;
  SharedStorage<T>& s;
  const Lane& L;
  const WorkItem& w;
  KSide& ks;
  const int& it;       // chunks consumed by this CTA before the current one
  uint32_t a[8][4];    // the S operands prepared last

  __device__ __forceinline__ const uint8_t* stage(int k) const { return s.ring[(it + k) % T::kStages]; }
  __device__ __forceinline__ void wait(int k) const {
    mbar_wait(&s.full[(it + k) % T::kStages], ((it + k) / T::kStages) & 1);
  }
  // Before the wgmma fence.
  __device__ __forceinline__ void prepare(int k, int c) {
    const uint8_t* st = stage(k);
    const uint8_t* k_par = st + 2 * T::kCodeBytes;
    ks.begin_chunk(p, s, L, k_par, c == w.chunk_begin || (c * kChunk) % T::G == 0);
    k_operands<T::BITS>(st + L.warp * (T::kCodeBytes / 4), L.lane, a);
    if constexpr (T::DEQ) ks.dequantize(L, k_par, a);
  }
  // S of the item's first chunk, completed.
  __device__ __forceinline__ void first() {
    if (w.chunk_end == w.chunk_begin) return;
    wait(0);
    prepare(0, w.chunk_begin);
    pin_operands(a);
    zero_accumulators(ks.acc);
    pin_accumulators(ks.acc);
    wgmma_fence();
    ks.issue(s, L, a);
    wgmma_commit();
    wgmma_wait<0>();
    pin_accumulators(ks.acc);
  }
  // Log2-domain scores of chunk c (its S completed), -inf past the packed length.
  __device__ __forceinline__ void scores(int c, float (&x)[4]) const {
    ks.scores(s, L, stage(0) + 2 * T::kCodeBytes, x);
    const int tok0 = c * kChunk;
    if (tok0 + kChunk > w.packed_len) {
#pragma unroll
      for (int e = 0; e < 4; ++e)
        if (tok0 + L.token(e) >= w.packed_len) x[e] = kNegInf;
    }
  }
};

// ---------------------------------------------------------------------------------------
// The consumer warpgroup: the items of this CTA, chunk by chunk.
template <class T, class KSide, class VSide>
__device__ void consume(const DecodeParams& p, SharedStorage<T>& s) {
  const Lane L(threadIdx.x - T::kConsumerBase);
  int it = 0;
  for (int item = blockIdx.x; item < p.num_items; item += gridDim.x) {
    const WorkItem w = work_item<T>(p, item);
    KSide ks;
    VSide vs;
    OnlineSoftmax sm;
    vs.reset();
    load_query<T>(p, s, L, w, ks);

    // The chunks, software-pipelined by one: iteration c attends chunk c (its S is done) and
    // issues chunk c's PV together with chunk c + 1's S, so the two chains overlap on the Tensor
    // Cores and one wait per chunk covers both. No wgmma is in flight across the back edge
    // (ptxas would serialize every wgmma, and it does not keep an in-flight wgmma's registers).
    SStream<T, KSide> ss{p, s, L, w, ks, it, {}};
    ss.first();
    for (int c = w.chunk_begin; c < w.chunk_end; ++c, ++it) {
      const uint8_t* st = ss.stage(0);
      const uint8_t* v_par = st + 2 * T::kCodeBytes + T::kKParamBytes;
      const int tok0 = c * kChunk;
      const bool last = c == w.chunk_end - 1;

      // Scores of chunk c (its K params), the online softmax, P (its V params).
      float x[4];
      ss.scores(c, x);
      float alpha[2];
      if (sm.update(s, L, x, alpha)) vs.rescale(alpha);
      float pr[4];
      sm.probabilities(x, pr);
      // O^T = V^T P^T operands of chunk c.
      uint32_t av[4][2][4];
      if constexpr (T::DEQ) vs.load_params(L, v_par);
      vs.operands(st + T::kCodeBytes, L, av);
      const bool group_ends = last || (tok0 + kChunk) % T::G == 0;
      vs.publish(s, L, v_par, group_ends, pr);

      // Chunk c's stage is read out: the producer may refill it.
      __syncwarp();
      if (L.lane == 0) mbar_arrive(&s.empty[it % T::kStages]);
      fence_proxy_async_smem();
      named_barrier(kConsumerBarrier, kConsumerThreads);
      if constexpr (T::VCH && !T::DEQ) vs.collect(s, L);
      if (!last) {
        ss.wait(1);
        ss.prepare(1, c + 1);
      }

      // Chunk c + 1's S and chunk c's PV, one commit, one wait (each chain starts from a zeroed
      // accumulator). The last chunk's S chain runs too, on stale operands, and is discarded: a
      // conditional wgmma would make ptxas serialize them all.
      pin_operands(ss.a);
      pin_operands(av);
      zero_accumulators(ks.acc);
      vs.begin_pv();
      pin_accumulators(ks.acc);
      pin_accumulators(vs.raw);
      wgmma_fence();
      ks.issue(s, L, ss.a);
      vs.issue(s, L, av);
      wgmma_commit();
      wgmma_wait<0>();
      pin_accumulators(vs.raw);
      pin_accumulators(ks.acc);
      vs.after_pv();
    }

    if constexpr (T::kHasTail) {
      if (w.split == 0 && w.tail_len > 0) consume_tail<T>(p, s, L, w, sm, vs);
    }
    finish_item<T>(p, s, L, w, sm, vs);
  }
}

// ---------------------------------------------------------------------------------------
// The BF16 tail of channel-wise caches (< G newest tokens), attended by split 0 in up to two
// 64-token pieces: bf16 operands loaded straight from global memory, the same softmax. It runs
// on each warp's synchronous mma.sync, outside the wgmma pipeline: a wgmma on this rare,
// data-dependent path would make ptxas serialize every wgmma of the kernel.
template <class T, class VSide>
__device__ __forceinline__ void consume_tail(const DecodeParams& p, SharedStorage<T>& s, const Lane& L, const WorkItem& w,
                                          OnlineSoftmax& sm, VSide& vs) {
  const size_t base = ((size_t)w.b * p.num_kv_heads + w.h) * T::G * kD;
  const __nv_bfloat16* kt_rows = p.k_tail + base;
  const __nv_bfloat16* vt_rows = p.v_tail + base;
  auto k_pair = [&](int tok, int c) -> uint32_t {
    return tok < w.tail_len ? *reinterpret_cast<const uint32_t*>(kt_rows + (size_t)tok * kD + c) : 0u;
  };
  auto v_pair = [&](int tok, int c) -> uint32_t {  // channel c of tokens tok, tok + 1
    const uint32_t lo = tok < w.tail_len ? *reinterpret_cast<const uint16_t*>(vt_rows + (size_t)tok * kD + c) : 0u;
    const uint32_t hi = tok + 1 < w.tail_len ? *reinterpret_cast<const uint16_t*>(vt_rows + (size_t)(tok + 1) * kD + c) : 0u;
    return lo | (hi << 16);
  };
  // A B fragment of a K-major B tile stack (8 x 16 per tile): rows 2t, 2t+1 (+8) of column g.
  auto b_frag = [&](const uint8_t* tiles, int kt, int hi) -> uint32_t {
    return *reinterpret_cast<const uint32_t*>(tiles + kt * kBTileBytes + b_tile_offset(2 * L.t + 8 * hi, L.g));
  };
  for (int t0 = 0; t0 < w.tail_len; t0 += kChunk) {
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    const int r0 = t0 + 16 * L.warp + L.g;
#pragma unroll
    for (int kt = 0; kt < 8; ++kt) {
      const int c = 16 * kt + 2 * L.t;
      mma_bf16_16816(acc, k_pair(r0, c), k_pair(r0 + 8, c), k_pair(r0, c + 8), k_pair(r0 + 8, c + 8),
                     b_frag(s.qt_tile[0], kt, 0), b_frag(s.qt_tile[0], kt, 1));
    }
    float x[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) x[e] = t0 + L.token(e) < w.tail_len ? acc[e] * p.sm_scale_log2 : kNegInf;
    float alpha[2];
    if (sm.update(s, L, x, alpha)) vs.rescale(alpha);
    float pr[4];
    sm.probabilities(x, pr);
#pragma unroll
    for (int e = 0; e < 4; ++e)
      *reinterpret_cast<uint16_t*>(s.p_tile[0][L.warp] + b_tile_offset(L.g + 8 * (e >> 1), 2 * L.t + (e & 1))) =
          bf16_bits(pr[e]);
    named_barrier(kConsumerBarrier, kConsumerThreads);
    float raw[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
#pragma unroll
    for (int kt = 0; kt < 4; ++kt)
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int tk = t0 + 16 * kt + 2 * L.t, ch = L.channel(i, 0);
        mma_bf16_16816(raw[i], v_pair(tk, ch), v_pair(tk, ch + 8), v_pair(tk + 8, ch), v_pair(tk + 8, ch + 8),
                       b_frag(s.p_tile[0][0], kt, 0), b_frag(s.p_tile[0][0], kt, 1));
      }
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) vs.out[i][e] += raw[i][e];
    named_barrier(kConsumerBarrier, kConsumerThreads);  // P is read out before the next piece
  }
}

// After every split of an item wrote its partials (o against its own maximum m, and l): the
// last split of a (sequence, KV head) to arrive merges them all into the output and resets the
// counter for the next launch.
template <class T>
__device__ void merge_splits(const DecodeParams& p, SharedStorage<T>& s, const Lane& L, const WorkItem& w) {
  const int hq0 = w.h * p.ratio;
  __threadfence();
  named_barrier(kConsumerBarrier, kConsumerThreads);
  if (L.tid == 0) {
    int* count = p.ws_count + (size_t)w.b * p.num_kv_heads + w.h;
    const int done = atomicAdd(count, 1);
    s.last_split = done == p.num_splits - 1;
    if (s.last_split) *count = 0;  // every split has counted: ready for the next launch
  }
  named_barrier(kConsumerBarrier, kConsumerThreads);
  if (!s.last_split) return;
  __threadfence();
  // Every split's m and l of a head are read once: the m into shared memory (s.merge, free by
  // now), then one warp per head turns them into weights exp2(m - max) / denominator as it reads
  // the l; then thread tid sums channel tid of every head over the splits with independent loads. (Each thread
  // reading every (m, l) itself, with the loads in a chain, cost ~35 us at batch 1 and 128K,
  // where the last CTA of a KV head merges 49 splits while the rest of the GPU waits.)
  const int S = p.num_splits, n = p.ratio * S;  // at most 8 x 128 (foscar_dispatch.h)
  float* wgt = &s.merge[0][0][0];  // [head][split]
  static_assert(sizeof(s.merge) >= kN * kD * sizeof(float), "the merge buffer holds 8 heads x 128 splits");
  const size_t row0 = ((size_t)w.b * p.num_q_heads + hq0) * S;  // head hd, split sp: row0 + hd S + sp
  for (int i = L.tid; i < n; i += kConsumerThreads) wgt[i] = __ldcg(p.ws_ml + (row0 + i) * 2);
  named_barrier(kConsumerBarrier, kConsumerThreads);
  for (int hd = L.warp; hd < p.ratio; hd += 4) {
    float mx = kNegInf;
    for (int sp = L.lane; sp < S; sp += 32) mx = fmaxf(mx, wgt[hd * S + sp]);
    mx = reduce_lanes<32, true>(mx);
    float den = 0.f;
    for (int sp = L.lane; sp < S; sp += 32) {
      const float m = wgt[hd * S + sp];  // a split with no tokens of this sequence weighs 0
      const float e = m == kNegInf ? 0.f : exp2f(m - mx);
      den = fmaf(e, __ldcg(p.ws_ml + (row0 + hd * S + sp) * 2 + 1), den);
      wgt[hd * S + sp] = e;
    }
    den = reduce_lanes<32, false>(den);
    for (int sp = L.lane; sp < S; sp += 32) wgt[hd * S + sp] /= den;
  }
  named_barrier(kConsumerBarrier, kConsumerThreads);
  const int c = L.tid;
  float acc[kN];
#pragma unroll
  for (int hd = 0; hd < kN; ++hd) acc[hd] = 0.f;
#pragma unroll 2
  for (int sp = 0; sp < S; ++sp) {
#pragma unroll
    for (int hd = 0; hd < kN; ++hd)
      if (hd < p.ratio) acc[hd] = fmaf(wgt[hd * S + sp], __ldcg(p.ws_o + (row0 + hd * S + sp) * kD + c), acc[hd]);
  }
#pragma unroll
  for (int hd = 0; hd < kN; ++hd)
    if (hd < p.ratio) p.o[((size_t)w.b * p.num_q_heads + hq0 + hd) * kD + c] = __float2bfloat16(acc[hd]);
  named_barrier(kConsumerBarrier, kConsumerThreads);  // s.last_split is read out
}

// ---------------------------------------------------------------------------------------
// The end of an item: the warpgroup's denominators, then the output or this split's partials;
// the last split of a (sequence, KV head) to finish merges all of them in the same launch.
template <class T, class VSide>
__device__ void finish_item(const DecodeParams& p, SharedStorage<T>& s, const Lane& L, const WorkItem& w,
                            const OnlineSoftmax& sm, VSide& vs) {
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const float v = sum_rows(sm.l[hh]);
    if (L.g == 0) s.red[L.warp][2 * L.t + hh][2] = v;
  }
  vs.finish(s, L);  // includes a barrier when it exchanges; the next one covers the rest
  named_barrier(kConsumerBarrier, kConsumerThreads);
  float l[2];
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    l[hh] = 0.f;
#pragma unroll
    for (int ww = 0; ww < 4; ++ww) l[hh] += s.red[ww][2 * L.t + hh][2];
  }
  const int hq0 = w.h * p.ratio;
  if (p.num_splits == 1) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int hd = 2 * L.t + (e & 1);
      if (hd >= p.ratio) continue;
#pragma unroll
      for (int i = 0; i < 2; ++i)
        p.o[((size_t)w.b * p.num_q_heads + hq0 + hd) * kD + L.channel(i, e)] = __float2bfloat16(vs.out[i][e] / l[e & 1]);
    }
    named_barrier(kConsumerBarrier, kConsumerThreads);  // s.red is read out before the next item
    return;
  }
  // Partials of this split: o (unnormalised, against this split's reference max), m and l.
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const int hd = 2 * L.t + (e & 1);
    if (hd >= p.ratio) continue;
    const size_t row = ((size_t)w.b * p.num_q_heads + hq0 + hd) * p.num_splits + w.split;
#pragma unroll
    for (int i = 0; i < 2; ++i) p.ws_o[row * kD + L.channel(i, e)] = vs.out[i][e];
    if (L.warp == 0 && L.g == 0 && e < 2) {
      p.ws_ml[row * 2] = sm.m[e & 1];
      p.ws_ml[row * 2 + 1] = l[e & 1];
    }
  }
  merge_splits<T>(p, s, L, w);
}

// ---------------------------------------------------------------------------------------
// Policies per (K mode, V mode, ablation).
template <class T>
using KSideOf = typename std::conditional<T::DEQ, KDequant<T>,
                                          typename std::conditional<T::KCH, KFoldChannel<T>, KFoldToken<T>>::type>::type;
template <class T>
using VSideOf = typename std::conditional<T::DEQ, VDequant<T>,
                                          typename std::conditional<T::VCH, VFoldChannel<T>, VFoldToken<T>>::type>::type;

}  // namespace foscar

#include "foscar_consume_warp.cuh"

namespace foscar {

template <int BITS, int G, bool KCH, bool VCH, bool DEQ>
__global__ void __launch_bounds__(DecodeTraits<BITS, G, KCH, VCH, DEQ>::kThreads,
                                  DecodeTraits<BITS, G, KCH, VCH, DEQ>::kCtasPerSm)
    foscar_decode_kernel(const __grid_constant__ DecodeParams p) {
  using T = DecodeTraits<BITS, G, KCH, VCH, DEQ>;
  SharedStorage<T>& s = *reinterpret_cast<SharedStorage<T>*>(dynamic_smem());
  if (threadIdx.x == 0) {
    for (int i = 0; i < T::kStages; ++i) {
      mbar_init(&s.full[i], 1);   // the producer's arrive (and the copies' bytes)
      mbar_init(&s.empty[i], 4);  // one arrive per consumer warp
    }
    mbar_init_fence();
  }
  __syncthreads();
  if constexpr (T::kSelfFed) {
    consume_warp<T, KSideOf<T>, VWarpSideOf<T>>(p, s);
  } else if (threadIdx.x < 128) {  // producer warpgroup: one lane streams, the rest leave
    setmaxnreg_dec<T::kProducerRegs>();
    if (threadIdx.x == 0) produce<T>(p, s);
  } else {
    setmaxnreg_inc<T::kConsumerRegs>();
    if constexpr (FOSCAR_WARP_PV) {
      consume_warp<T, KSideOf<T>, VWarpSideOf<T>>(p, s);
    } else {
      consume<T, KSideOf<T>, VSideOf<T>>(p, s);
    }
  }
}

}  // namespace foscar
