// FOSCAR decode attention over a 2- or 4-bit paged KV cache (docs/FORMAT.md), for Hopper.
//
// A persistent CTA of two warpgroups loops over work items (sequence, KV head, split):
//   - the producer (warp 0) streams each item's 64-token chunks into a shared-memory ring with
//     the bulk copy engine, skewed by one chunk: the stage of trip c holds chunk c's V codes and
//     (scale, offset) run and chunk c + 1's K (fill_stage), completing on its "full" mbarrier;
//   - the consumer warpgroup turns the packed codes into Tensor Core A operands in registers
//     (K: int8, four codes a register; V: fp16 mantissa injection). S^T = K Q^T (tokens x
//     heads) runs on wgmma, u8 x s8 into int32, Q~ (or Q') the B operand in shared memory, a
//     15-bit integer in two s8 parts (N = 16: the 8 query columns' low parts, then their high
//     parts); warp w holds tokens 16w .. 16w+15 of each chunk. From
//     there each warp works alone (foscar_consume.cuh): its own online softmax, its P kept in
//     registers as the B fragments of P^T, and its O^T = V^T P^T over all 128 channels on
//     mma.sync from its k-step of the staged V block. S of chunk c + 1 runs on wgmma while chunk
//     c's PV runs on mma.sync; the warps meet at the item's end, where their (m, l, O) merge.
// Scales and offsets are folded, never applied per element (FOSCAR.md section 3); each (K mode,
// V mode) is a pair of policy types:
//   KFoldToken8  : accumulator fold per channel group, score = s 2^-e acc + z sum q, B = Q' =
//                  round(q 2^e / f) (KFoldToken, its fp16 form, for INT2 with groups of 32)
//   KFoldChannel : operand fold, Q~ = round(q s 2^e / f) rebuilt in shared memory once per
//                  token group
//   VFoldToken   : operand fold, P~ = p s; the offsets summed apart per (group, head)
//   VFoldChannel : accumulator fold, each product folded with s / f, z at the group's end
// and the dequantize-first ablation is KDequant / VDequant: the same data path, with every
// element turned into s c + z before the MMA.
//
// Precision (docs/PERFORMANCE.md, "v7" and "v23"): the Tensor Cores cut every addend towards
// zero at the alignment of the largest (foscar/tcmodel.py), so an accumulator fed with biased
// operands (1024 + f c, positive probabilities) loses a part of the signal of one sign, in
// proportion to how many MMAs it chains and to the bias over the radix factor f. v4 chained 32
// and failed past 32K tokens. Here the V operands carry no bias (fp16 subnormals f c 2^-24,
// inject_v) and every PV product is one k-step from zero, folded into the fp32 output at once:
// the cut stays below rounding at every context length (INT2's codes at f >= 4: the H200 aligns
// a subnormal by its exponent field; foscar/precision.py models it).
#pragma once

#include <math.h>

#include <type_traits>

#include "foscar_api.h"
#include "foscar_common.cuh"
#include "foscar_hopper.cuh"

namespace foscar {

// Two KV heads per work item where their query heads fill N = 8 together (2 or 4 query heads
// per KV head): S's columns 0 .. ratio - 1 are the first head's queries, the next ratio the
// second's, so no thread of the softmax, the score fold or the P~ scaling works on padding
// (docs/KERNELS.md, "Paired heads"). The planner pairs where the batch gives enough items
// (foscar/kernels.py); lab knob FOSCAR_PAIR_HEADS=0 builds one head per item only.
#ifndef FOSCAR_PAIR_HEADS
#define FOSCAR_PAIR_HEADS 1
#endif
__host__ __device__ inline int max_kv_heads_per_item(int ratio, int num_kv_heads) {
  return FOSCAR_PAIR_HEADS && (ratio == 2 || ratio == 4) && num_kv_heads % 2 == 0 ? 2 : 1;
}

// Lab knob FOSCAR_TIMELINE=1 (scripts/kernel_lab.py --timeline): one thread stamps %globaltimer
// at the phases of each CTA's first kTimelineItems items into p.timeline (int64, zeroed by the
// caller), so that one launch shows where its time goes, CTA by CTA. Stamp index
// (cta * kTimelineItems + k) * kTimelinePhases + phase, k counting the CTA's items (its item
// blockIdx.x + k gridDim.x); 0 where the phase was not reached. Off (the default), the parameter
// and every stamp are compiled out. foscar/kernels.py mirrors the layout (TIMELINE_*).
#ifndef FOSCAR_TIMELINE
#define FOSCAR_TIMELINE 0
#endif
enum TimelinePhase : int {
  kTlEntry,      // the CTA's barriers initialised, before its first __syncthreads (k = 0 only)
  kTlItem,       // the consumers start the item (before reading its query)
  kTlFirstCopy,  // the producer lane, the item's first stage free, issues its first bulk copy
  kTlFirstS,     // the consumers passed the first stage's full barrier and hold the first S (SStream::first)
  kTlLastTrip,   // the consumers ended the last trip (before the BF16 tail and the item's finish)
  kTlFolded,     // the item's finish: V's fold closed and each warp's (m, l) in shared memory
  kTlStored,     // the item's finish: the partials (or the output) stored, before the barrier and the count
  kTlWritten,    // the split's partials written, before the merge counter's atomic (the output, with one split)
  kTlCounted,    // the merge counter's atomic returned (every split's CTA)
  kTlMergeFenced,    // the merge: past the barrier after the count, before the (m, l) loads (the CTA whose split arrived last only)
  kTlMergeWeighted,  // the merge: column 0 weighed by warp 0, its first partials loaded with the (m, l) (the same)
  kTlMerged,     // the merge of every split written (the CTA whose split arrived last only)
  kTlQuarter1,   // the consumers begin the item's trip n / 4 (n its trips): its progress, with
  kTlHalf,       // trip n / 2
  kTlQuarter3,   // and trip 3 n / 4
  kTlScaled,     // the item's finish: the warps' outputs of its first columns scaled into shared memory (past the barrier)
  kTimelinePhases
};
constexpr int kTimelineItems = 4;

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
  int* ws_count;                // [batch, num_kv_heads] splits done (0 between launches), then
                                // FOSCAR_COOP_MERGE's sense words (sense_word)
  int batch, num_q_heads, num_kv_heads, ratio;
  // KV heads per work item (kv_heads_per_item) and the real columns of S and O they fill:
  // cols = heads_per_item * ratio, column n the query head (first KV head) * ratio + n.
  int heads_per_item, cols;
  int page_size, max_pages, page_shift;  // page_shift = log2(page_size) for powers of two, else -1
  // Byte strides of the staged runs: one head's codes / parameters inside a page, one page.
  int code_head_bytes, param_head_bytes;
  long long code_page_bytes, param_page_bytes;
  int num_splits, chunks_per_split, num_items;
  float sm_scale_log2;          // softmax scale times log2(e)
#if FOSCAR_TIMELINE
  uint64_t* timeline;           // [ctas, kTimelineItems, kTimelinePhases] or null
#endif
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
  p.heads_per_item = a.kv_heads_per_item;
  p.cols = p.heads_per_item * p.ratio;
  p.page_size = a.page_size;
  p.max_pages = a.max_pages;
  p.page_shift = (a.page_size & (a.page_size - 1)) == 0 ? __builtin_ctz(static_cast<unsigned>(a.page_size)) : -1;
  p.code_head_bytes = a.page_size * a.head_dim * a.bits / 8;
  p.param_head_bytes = a.page_size * (a.head_dim / a.group_size) * 4;
  p.code_page_bytes = static_cast<long long>(p.code_head_bytes) * a.num_kv_heads;
  p.param_page_bytes = static_cast<long long>(p.param_head_bytes) * a.num_kv_heads;
  p.num_splits = a.num_splits;
  p.chunks_per_split = a.units_per_split;
  p.num_items = a.batch * (a.num_kv_heads / p.heads_per_item) * a.num_splits;
  p.sm_scale_log2 = a.sm_scale * 1.4426950408889634f;
#if FOSCAR_TIMELINE
  p.timeline = a.timeline;
#endif
  return p;
}

constexpr int kD = 128;           // head dim (the one instantiated)
constexpr int kChunk = 64;        // tokens per ring stage and per S = K Q^T wgmma (M = 64)
constexpr int kN = 8;             // query heads on N
constexpr int kConsumerThreads = 128;
constexpr int kConsumerBarrier = 1;  // named barrier of the consumer warpgroup (0 is __syncthreads)
constexpr float kNegInf = -INFINITY;

// Build knobs (foscar.build passes -D flags; scripts/kernel_lab.py compares them).
// CTAs per SM, for every kernel of a width; 0 (the default) lets each kernel take its measured
// choice, DecodeTraits::kCtasTuned. Every kernel must hold kMinCtasPerSm.
constexpr int kMinCtasPerSm = 3;
#ifndef FOSCAR_CTAS_INT4
#define FOSCAR_CTAS_INT4 0
#endif
#ifndef FOSCAR_CTAS_INT2
#define FOSCAR_CTAS_INT2 0
#endif
#ifndef FOSCAR_STAGES_INT4
#define FOSCAR_STAGES_INT4 4
#endif
#ifndef FOSCAR_STAGES_INT2
#define FOSCAR_STAGES_INT2 6
#endif
// Lab: the 32-channel V slices of a paired trip's PV run while its first head's S is in flight
// (the rest while the second's is).
#ifndef FOSCAR_PV_SPLIT
#define FOSCAR_PV_SPLIT 2
#endif
// Stages of the paired kernels (a trip takes two; 4 for INT4 measured 12 % slower than 6).
#ifndef FOSCAR_PAIR_STAGES_INT4
#define FOSCAR_PAIR_STAGES_INT4 6
#endif
#ifndef FOSCAR_PAIR_STAGES_INT2
#define FOSCAR_PAIR_STAGES_INT2 6
#endif
// Lab: the split merge shared by every split's CTA where a launch's items all run at once (no
// more items than CTAs, a cooperative launch): each waits for the last to count, then merges a
// slice of the output (merge_together), so that no one SM reads every split's partials.
#ifndef FOSCAR_COOP_MERGE
#define FOSCAR_COOP_MERGE 0
#endif
// A kernel's shape: everything but its occupancy (DecodeTraits adds that, from the shared memory
// this shape takes).
template <int BITS_, int G_, bool KCH_, bool VCH_, bool DEQ_, int HP_ = 1>
struct DecodeShape {
  static constexpr int BITS = BITS_, G = G_;
  static constexpr bool KCH = KCH_, VCH = VCH_, DEQ = DEQ_;
  static constexpr int HP = HP_;  // KV heads per item (1, or 2 paired: kv_heads_per_item)
  static_assert(HP == 1 || HP == 2, "an item holds one KV head or a pair");
  static constexpr int kCodeBytes = kChunk * kD * BITS / 8;     // one tensor's codes of one chunk
  static constexpr int kGroupsD = kD / G;                        // channel groups (token-wise modes)
  static constexpr int kGroupsT = G >= kChunk ? 1 : kChunk / G;  // token groups in a chunk (channel-wise)
  static constexpr int kKParamBytes = (KCH ? kGroupsT * kD : kChunk * kGroupsD) * 4;
  static constexpr int kVParamBytes = (VCH ? kGroupsT * kD : kChunk * kGroupsD) * 4;
  static constexpr int kStageBytes = 2 * kCodeBytes + kKParamBytes + kVParamBytes;
  // The chunk whose K parameters a ring stage holds, after the chunk of its V (the skewed ring,
  // fill_stage()): channel-wise K reads them where it builds the next chunk's S operands (the Q~
  // rebuild, the ablation's dequantization), token-wise K where it turns this chunk's S into
  // scores.
  static constexpr int kKParamLead = KCH ? 1 : 0;
  // INT4's paired kernels with groups of 128 run four CTAs per SM (DecodeTraits::kFourCtas) on
  // the 4 paired stages that let four fit, but channel-wise K and V together (v26: token-wise
  // K / V; v27: one side channel-wise).
  static constexpr bool kInt4FourCtas =
      BITS == 4 && HP == 2 && G == 128 && !(KCH && VCH) && !DEQ && FOSCAR_CTAS_INT4 == 0;
  // Ring stages, each one KV head's share of a trip (a paired item's trip takes two): at least
  // the current trip's and the next one's.
  // (INT4 with groups of 32 keeps one stage fewer, so that three CTAs fit an SM.)
  static constexpr int kStagesKnob =
      HP == 1 ? (BITS == 4 ? FOSCAR_STAGES_INT4 : FOSCAR_STAGES_INT2)
              : (BITS == 4 ? (kInt4FourCtas ? 4 : FOSCAR_PAIR_STAGES_INT4 - (G == 32)) : FOSCAR_PAIR_STAGES_INT2);
  static constexpr int kStages = kStagesKnob > 2 * HP ? kStagesKnob : 2 * HP;
  static constexpr int kThreads = 256;  // producer warpgroup + consumer warpgroup
  static constexpr int kWordsK = kD * BITS / 64;  // K words per lane of one 16-token tile
  static constexpr bool kHasTail = KCH || VCH;
  // A cache with a tail packs whole groups only: with groups of whole chunks, no chunk is partial
  // and the scores need no mask (SStream::scores).
  static constexpr bool kWholeChunks = kHasTail && G % kChunk == 0;
  static_assert(kStageBytes % 16 == 0 && kCodeBytes % 16 == 0, "bulk copies move multiples of 16 bytes");
};

// ---------------------------------------------------------------------------------------
// Shared memory, one typed struct: the ring, the B operands, the query, exchange slots.
template <class T>
struct SharedStorage {
  static constexpr int kQTiles = T::KCH && !T::DEQ ? T::kGroupsT : 1;   // S's B per token group
  alignas(128) uint8_t ring[T::kStages][T::kStageBytes];
  // S's B operand per token group and KV head of the item (the other head's rows zero): fp16
  // q'/f, or Q~, per k-step.
  alignas(128) uint8_t q_tile[kQTiles][T::HP][8][kBTileBytes];
  alignas(128) uint8_t qt_tile[T::HP][8][kBTileBytes];  // bf16 q for the BF16 tail, the same way
  float q32[kN][kD];                                      // the query columns; zero rows past cols
  float kconst[T::KCH ? T::kGroupsT : T::kGroupsD][kN][4];  // per (group, head) constants of the K fold
  float red[4][kN][2];  // [warp][head]: each warp's maximum and denominator at the item's end
  // Each warp's output at the item's end, 4 heads a pass; the split merge's weights (8 heads x
  // 128 splits).
  float merge[4][kN / 2][kD];
  uint64_t full[T::kStages], empty[T::kStages];
  int last_split;
};

// The CTAs per SM of a kernel's second instance, or 0 where it has none; the planner launches it
// instead of the first where its splits are long (kernels.ALT_MIN_CHUNKS). v37 gives one, at
// four CTAs, to the one-head G = 128 kernels (batch 1-5) with K channel-wise and V token-wise,
// both widths, and to INT2's token/token. At four (104 registers, no spill since K's operands
// are int8) they were 3-8 % faster where a split runs 8 chunks or more (batch 1 from 32K, batches
// 2-5 at 8K and 32K: a fourth CTA's warps keep the bus busy between trips) and 1-7 % slower where
// splits are short (batch 1 at 2K-16K), where the three-CTA instance runs (docs/PERFORMANCE.md,
// v35 in the eighteenth and nineteenth sessions). INT4 token/token was level at four, and
// channel/channel 2 % slower, so they have none.
template <int BITS, int G, bool KCH, bool VCH, bool DEQ, int HP>
constexpr int alt_ctas_per_sm() {
  return HP == 1 && G == 128 && !DEQ && ((KCH && !VCH) || (BITS == 2 && !KCH && !VCH)) ? 4 : 0;
}

// A kernel's traits: its shape, and how many CTAs share an SM: CTAS_ for a second instance, else
// the build's knob or the kernel's measured choice, or fewer where this kernel's shared memory
// does not let that many fit (228 KB an SM, 1 KB of each CTA's the system's), so that a lab build
// asking for more CTAs than some kernels hold still builds every kernel. Every kernel must hold
// three (or the knob, if fewer): a ring that silently dropped a kernel to two would lose a third
// of its warps (docs/PERFORMANCE.md). The registers follow from the CTAs.
template <int BITS_, int G_, bool KCH_, bool VCH_, bool DEQ_, int HP_ = 1, int CTAS_ = 0>
struct DecodeTraits : DecodeShape<BITS_, G_, KCH_, VCH_, DEQ_, HP_> {
  using Shape = DecodeShape<BITS_, G_, KCH_, VCH_, DEQ_, HP_>;
  static constexpr int kSmemBytes = static_cast<int>(sizeof(SharedStorage<Shape>));
  // Measured (docs/PERFORMANCE.md, v14, v15): four CTAs of INT2's paired G = 128 kernels are 4-7 %
  // faster at batch 128 (1-2 % slower at batch 8), and of its paired G = 64 channel/channel kernel
  // 5-6 %; INT2's one-head kernels lose 0-7 % at batch 1, its G = 64 paired token-wise kernel 18 %
  // (it spills at 104 registers; channel-wise K or V level), INT4 level to 3 % (its ring cut to 4
  // paired stages to fit). With K's int8 operands (v24, v25) INT4's paired token-wise K / V
  // kernel at G = 128 gained 4.8 % at batch 128 from four CTAs (level at 32; PERFORMANCE.md,
  // ninth session): v26 gives it four; v27 its K channel-wise / V token-wise and K token-wise / V
  // channel-wise kernels too (2-5 % at batch 128, 1 % slower at 32; channel/channel lost 2-6 %).
  static constexpr bool kFourCtas =
      (BITS_ == 2 && HP_ == 2 && !DEQ_ && (G_ == 128 || (G_ == 64 && KCH_ && VCH_))) || Shape::kInt4FourCtas;
  static constexpr int kCtasTuned = kFourCtas ? 4 : kMinCtasPerSm;
  static constexpr int kCtasWidthKnob = BITS_ == 4 ? FOSCAR_CTAS_INT4 : FOSCAR_CTAS_INT2;
  static constexpr int kCtasKnob = CTAS_ > 0 ? CTAS_ : kCtasWidthKnob > 0 ? kCtasWidthKnob : kCtasTuned;
  static constexpr int kCtasFit = 228 * 1024 / (kSmemBytes + 1024);
  static constexpr int kCtasPerSm = kCtasKnob < kCtasFit ? kCtasKnob : kCtasFit;
  static_assert(kCtasPerSm >= (kCtasKnob < kMinCtasPerSm ? kCtasKnob : kMinCtasPerSm),
                "this build's ring does not let three CTAs share an SM: fewer stages");
  // Registers: the cap at entry, then the producer gives its share to the consumers.
  static constexpr int kEntryRegs = (65536 / (Shape::kThreads * kCtasPerSm)) / 8 * 8;
  static constexpr int kProducerRegs = 24;
  static constexpr int kConsumerRegs = (2 * kEntryRegs - kProducerRegs) / 8 * 8;
  // How many splits' partials a merging thread loads at once (merge_batched; a float4 each): the
  // merge is a chain of round trips to L2, ceil(splits / kMergeBatch) of them. As many as the
  // consumers' registers hold with no more spilled into the trip loop (ptxas, v44): 16 at three
  // CTAs an SM, 12 in the one-head kernels at four, 8 in the paired ones at four and at G = 32.
  static constexpr int kMergeBatch = G_ < 64 ? 8 : kCtasPerSm < 4 ? 16 : HP_ == 1 ? 12 : 8;
};

template <int BITS, int G, bool KCH, bool VCH, bool DEQ, int HP, int CTAS = 0>
constexpr int decode_smem_bytes() {
  return DecodeTraits<BITS, G, KCH, VCH, DEQ, HP, CTAS>::kSmemBytes;
}

// ---------------------------------------------------------------------------------------
// Work items: (sequence, KV head, split), the split a run of 64-token chunks; the last split
// takes whatever remains, so a plan made before the cache grew stays correct.
// FOSCAR_COOP_MERGE's launches (merge_together): a split merge to do, and every item on a CTA of
// its own, all resident (the launcher launches them cooperatively).
__host__ __device__ inline bool merge_together_launch(const DecodeParams& p, int ctas) {
  return FOSCAR_COOP_MERGE && p.num_splits > 1 && p.num_items <= ctas;
}
// Its sense word of a (sequence, first KV head) pair, after the counters, 32 words (an L2 line)
// apart: polls of one never meet another pair's, nor a counter's atomics (foscar.kernels.SENSE_STRIDE).
constexpr int kSenseStride = 32;
__host__ __device__ inline int* sense_word(const DecodeParams& p, int b, int h) {
  return p.ws_count + (size_t)p.batch * p.num_kv_heads + ((size_t)b * p.num_kv_heads + h) * kSenseStride;
}

struct WorkItem {
  int b, h, split;  // h: the item's first KV head (T::HP consecutive heads)
  int chunk_begin, chunk_end;  // packed chunks of this split
  int packed_len, tail_len;
};

// Phase `phase` of this CTA's item `item` on the timeline (FOSCAR_TIMELINE; nothing without it).
__device__ __forceinline__ void timeline_stamp(const DecodeParams& p, int item, int phase) {
#if FOSCAR_TIMELINE
  const int k = (item - static_cast<int>(blockIdx.x)) / static_cast<int>(gridDim.x);
  if (p.timeline != nullptr && k < kTimelineItems)
    p.timeline[((size_t)blockIdx.x * kTimelineItems + k) * kTimelinePhases + phase] = globaltimer_ns();
#else
  (void)p, (void)item, (void)phase;
#endif
}
// The same for a work item (work_item's inverse).
template <class T>
__device__ __forceinline__ void timeline_stamp(const DecodeParams& p, const WorkItem& w, int phase) {
  timeline_stamp(p, (w.b * (p.num_kv_heads / T::HP) + w.h / T::HP) * p.num_splits + w.split, phase);
}

template <class T>
__device__ __forceinline__ WorkItem work_item(const DecodeParams& p, int item) {
  WorkItem w;
  w.split = item % p.num_splits;
  const int rest = item / p.num_splits, per_seq = p.num_kv_heads / T::HP;
  w.h = rest % per_seq * T::HP;
  w.b = rest / per_seq;
  const int len = p.seq_lens[w.b];
  w.tail_len = T::kHasTail ? len % T::G : 0;
  w.packed_len = len - w.tail_len;
  const int chunks = (w.packed_len + kChunk - 1) / kChunk;
  w.chunk_begin = min(w.split * p.chunks_per_split, chunks);
  w.chunk_end = w.split == p.num_splits - 1 ? chunks : min(w.chunk_begin + p.chunks_per_split, chunks);
  return w;
}

// ---------------------------------------------------------------------------------------
// The skewed ring (docs/KERNELS.md): stage j of an item holds what the consumers' trip j reads,
// the V codes and parameters of chunk j and the K codes of chunk j + 1 (the S that trip j
// issues), with the K parameters of chunk j + kKParamLead, so a trip holds one stage and
// releases it whole. An item of n chunks takes n + 1 stages, the first (j = chunk_begin - 1)
// holding only the first chunk's K. A paired item's stage j is two, its first head's then its
// second's. Each stage is filled by up to four bulk copies completing on its "full" mbarrier.
//
// Stage j of KV head h of sequence b (chunks chunk_begin .. chunk_end - 1) into ring slot
// `stage` (freed by the consumers). Both chunks' pages are read before the first copy is
// issued: a copy's asm orders memory, so a page read after it would wait its full latency.
// The producer reads the page of an item's first chunk beside the sequence's length (the split's
// nominal first chunk, read before the length says where the split starts), so that the item's
// first copy waits two DRAM round trips instead of three; fill_stage takes it as (early_lpage,
// early_page). Measured 0.2-0.6 us (1-2 %) off batch 1 and 8 at 4K-128K (docs/PERFORMANCE.md, v20).
template <class T>
__device__ __forceinline__ void fill_stage(const DecodeParams& p, SharedStorage<T>& s, int stage, int b, int h,
                                           int chunk_begin, int chunk_end, int j, int early_lpage,
                                           unsigned early_page) {
  const bool has_k = j + 1 < chunk_end, has_v = j >= chunk_begin;
  // The K parameters ride with the K codes (lead 1) or with the V (lead 0): same chunk, same page.
  const bool has_kp = T::kKParamLead ? has_k : has_v;
  const int32_t* row = p.page_table + (size_t)b * p.max_pages;
  // The chunk's page and its first token in it.
  auto locate = [&](int c, unsigned long long& page, int& tip) {
    const int tok = c * kChunk, lpage = p.page_shift >= 0 ? tok >> p.page_shift : tok / p.page_size;
    page = lpage == early_lpage ? early_page : static_cast<unsigned>(row[lpage]);
    tip = tok - lpage * p.page_size;
  };
  unsigned long long page_v = 0, page_k = 0;
  int tip_v = 0, tip_k = 0;
  if (has_v) locate(j, page_v, tip_v);
  if (has_k) locate(j + 1, page_k, tip_k);
  const unsigned long long page_kp = T::kKParamLead ? page_k : page_v;
  const int tip_kp = T::kKParamLead ? tip_k : tip_v;
  const unsigned long long code_page = p.code_page_bytes, param_page = p.param_page_bytes;
  const unsigned code_head = h * p.code_head_bytes, param_head = h * p.param_head_bytes;
  // Codes: the page, this head's slice, the chunk's first 16-token row; parameters: its first
  // token group (channel-wise) or token (token-wise).
  auto codes = [&](unsigned long long page, int tip) {
    return page * code_page + code_head + (unsigned)(tip / 16 * (16 * kD * T::BITS / 8));
  };
  auto params = [&](unsigned long long page, int tip, bool channel) {
    return page * param_page + param_head + (unsigned)(channel ? (tip / T::G) * kD * 4 : tip * T::kGroupsD * 4);
  };
  uint8_t* st = s.ring[stage];
  uint64_t* full = &s.full[stage];
  mbar_arrive_expect_tx(full, (has_k ? T::kCodeBytes : 0) + (has_kp ? T::kKParamBytes : 0) +
                                  (has_v ? T::kCodeBytes + T::kVParamBytes : 0));
  if (has_k) bulk_copy_g2s(st, p.k_codes + codes(page_k, tip_k), T::kCodeBytes, full);
  if (has_kp) bulk_copy_g2s(st + 2 * T::kCodeBytes, p.k_params + params(page_kp, tip_kp, T::KCH), T::kKParamBytes, full);
  if (has_v) {
    bulk_copy_g2s(st + T::kCodeBytes, p.v_codes + codes(page_v, tip_v), T::kCodeBytes, full);
    bulk_copy_g2s(st + 2 * T::kCodeBytes + T::kKParamBytes, p.v_params + params(page_v, tip_v, T::VCH),
                  T::kVParamBytes, full);
  }
}

// A place in the ring: a slot and the parity of its use, kept as it advances (a division by the
// ring's size per stage otherwise). The producer's is the next stage to fill, the consumers' the
// first stage of their current trip.
template <class T>
struct RingCursor {
  int slot = 0;
  uint32_t phase = 0;
  // Head hp's slot and parity in a trip that starts here. A trip starts on a multiple of HP when
  // kStages is one, so its stages never wrap within the trip.
  __device__ __forceinline__ int slot_of(int hp) const {
    if constexpr (T::kStages % T::HP == 0) return slot + hp;
    return slot + hp < T::kStages ? slot + hp : slot + hp - T::kStages;
  }
  __device__ __forceinline__ uint32_t phase_of(int hp) const {
    if constexpr (T::kStages % T::HP == 0) return phase;
    return slot + hp < T::kStages ? phase : phase ^ 1u;
  }
  __device__ __forceinline__ void advance(int stages) {  // stages <= kStages
    slot += stages;
    if (slot >= T::kStages) slot -= T::kStages, phase ^= 1u;
  }
  __device__ __forceinline__ void next_trip() { advance(T::HP); }
};

// The page of an item's nominal first chunk (the split's, before the sequence's length says where
// it starts), its load issued before the length's returns (fill_stage's early page).
struct EarlyPage {
  int lpage = -1;
  unsigned page = 0;
};
template <class T>
__device__ __forceinline__ EarlyPage early_page_of(const DecodeParams& p, int item) {
  EarlyPage e;
  const int b = item / p.num_splits / (p.num_kv_heads / T::HP);  // work_item()'s w.b, before its length load
  const int tok = (item % p.num_splits) * p.chunks_per_split * kChunk;
  const int lpage = p.page_shift >= 0 ? tok >> p.page_shift : tok / p.page_size;
  if (lpage < p.max_pages) e.lpage = lpage, e.page = static_cast<unsigned>(p.page_table[(size_t)b * p.max_pages + lpage]);
  return e;
}

// The producer warpgroup: one lane streams every stage of the CTA's items into the ring.
template <class T>
__device__ void produce(const DecodeParams& p, SharedStorage<T>& s) {
  RingCursor<T> ring;  // the next stage to fill
  for (int item = blockIdx.x; item < p.num_items; item += gridDim.x) {
    const EarlyPage ep = early_page_of<T>(p, item);
    const WorkItem w = work_item<T>(p, item);
    if (w.chunk_end == w.chunk_begin) continue;
    for (int j = w.chunk_begin - 1; j < w.chunk_end; ++j)
#pragma unroll
      for (int hp = 0; hp < T::HP; ++hp, ring.advance(1)) {
        mbar_wait(&s.empty[ring.slot], ring.phase ^ 1u);  // the consumers freed its last use
        if (hp == 0 && j < w.chunk_begin) timeline_stamp(p, item, kTlFirstCopy);
        fill_stage<T>(p, s, ring.slot, w.b, w.h + hp, w.chunk_begin, w.chunk_end, j, ep.lpage, ep.page);
      }
  }
}

// ---------------------------------------------------------------------------------------
// The consumer's view of itself: warp w (0..3) of the warpgroup, lane (g, t), and hp, the KV
// head of the item (0 or 1) whose query heads are this thread's columns 2t, 2t + 1 of S and O
// (ratio is even when an item holds two heads; padding columns count as the last head's).
struct Lane {
  int tid, warp, lane, g, t, hp;
  __device__ __forceinline__ Lane(int consumer_tid, int ratio, int heads_per_item)
      : tid(consumer_tid), warp(consumer_tid >> 5), lane(consumer_tid & 31), g((consumer_tid & 31) >> 2),
        t(consumer_tid & 3), hp(heads_per_item == 1 ? 0 : 2 * (consumer_tid & 3) >= ratio) {}
  // Token (within a chunk) of S accumulator element e: rows g and g + 8 of warp w's 16.
  __device__ __forceinline__ int token(int e) const { return 16 * warp + g + 8 * (e >> 1); }
};

// fp32 accumulators [N][4] (fp16 wgmma) or int32 [N][8] (int8 wgmma, two parts).
template <class A, int N, int E>
__device__ __forceinline__ void zero_accumulators(A (&acc)[N][E]) {
#pragma unroll
  for (int i = 0; i < N; ++i)
#pragma unroll
    for (int e = 0; e < E; ++e) acc[i][e] = A(0);
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

// Per-thread query staging: thread tid owns column n = tid / 16, channels 8 (tid % 16) .. + 7.
struct QSlice {
  int n, d0;
  __device__ __forceinline__ explicit QSlice(int tid) : n(tid >> 4), d0(8 * (tid & 15)) {}
  // The item's KV head whose B tiles hold this column (padding columns: the last head's, zero).
  template <class T>
  __device__ __forceinline__ int head(const DecodeParams& p) const {
    return T::HP == 1 ? 0 : n >= p.ratio;
  }
  // The slice's 8-channel block within a packed word (its injection position, so its radix factor).
  template <int BITS>
  __device__ __forceinline__ int block() const { return (d0 / 8) % (16 / BITS); }
  // Byte offset of this slice in a B tile stack (8 k-steps): 8 consecutive K values of row n.
  __device__ __forceinline__ int tile_offset() const { return (d0 / 16) * kBTileBytes + b_tile_offset(d0 % 16, n); }
};

// The int8 Q~ rebuild's staging (KFoldChannel): thread tid owns column n = tid / 16 and 8
// consecutive k-columns 16 hf + 8 m .. of k-step ks (tid % 16 = 4 ks + 2 hf + m), which hold
// channels 4m .. 4m + 3 of two 8-channel blocks (byte runs r = 0, 1; k8_block), interleaved:
// byte 2c + r of the slice is channel 8 block(r) + 4m + c.
struct Q8Slice {
  int n, ks, hf, m;
  __device__ __forceinline__ explicit Q8Slice(int tid)
      : n(tid >> 4), ks((tid >> 2) & 3), hf((tid >> 1) & 1), m(tid & 1) {}
  template <class T>
  __device__ __forceinline__ int head(const DecodeParams& p) const {
    return T::HP == 1 ? 0 : n >= p.ratio;
  }
  template <int BITS>
  __device__ __forceinline__ int channel(int r) const {
    return 8 * k8_block<BITS>(k8_word<BITS>(ks, hf), k8_reg<BITS>(ks, hf), r) + 4 * m;
  }
  // Byte offset of the slice in a stack of 4 int8 B tiles: part 0 (low byte) in rows n, part 1
  // (high) in rows n + 8.
  __device__ __forceinline__ int tile_offset(int part) const {
    return ks * kB8TileBytes + b8_tile_offset(16 * hf + 8 * m, n + 8 * part);
  }
};

// Entry hp (0 or 1) of a per-head array by selection, not indexing: an array indexed by a
// runtime value would live in local memory.
template <int HP, class P>
__device__ __forceinline__ P of_head(const P (&a)[HP], int hp) {
  return HP == 1 || hp == 0 ? a[0] : a[HP - 1];
}

// A column's row of 8 k-values into the B tiles of its KV head, zero into the other head's.
template <class T>
__device__ __forceinline__ void store_b_row(const DecodeParams& p, uint8_t (&tiles)[T::HP][8][kBTileBytes],
                                            const QSlice& qs, uint4 row) {
#pragma unroll
  for (int hp = 0; hp < T::HP; ++hp)
    *reinterpret_cast<uint4*>(tiles[hp][0] + qs.tile_offset()) =
        hp == qs.head<T>(p) ? row : make_uint4(0u, 0u, 0u, 0u);
}

// ---------------------------------------------------------------------------------------
// K side. Each policy builds the A operands of S = K Q^T from a staged 16-token tile, issues the
// chunk's wgmmas, and turns the accumulators into log2-domain scores.
// What both token-wise K folds keep per thread: 2^-e lambda (or 2^e lambda) of heads 2t, 2t+1
// (kconst[0][n][2]) and lambda sum q per channel group (kconst[gk][n][1]); no per-chunk work
// before the operands.
template <class T>
struct KTokenConstants {
  static constexpr int kAcc = T::kGroupsD;
  static constexpr bool kScoresReadStage = true;  // the chunk's per-token (scale, offset)
  float kscale[2];
  float c2[kAcc][2];
  __device__ __forceinline__ void load_constants(SharedStorage<T>& s, const Lane& L) {
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      kscale[hh] = s.kconst[0][2 * L.t + hh][2];
#pragma unroll
      for (int gk = 0; gk < kAcc; ++gk) c2[gk][hh] = s.kconst[gk][2 * L.t + hh][1];
    }
  }
  __device__ __forceinline__ void begin_chunk(const DecodeParams&, SharedStorage<T>&, const Lane&,
                                              const uint8_t* const (&)[T::HP], bool) {}
  __device__ __forceinline__ void publish(SharedStorage<T>&, const Lane&, bool) {}
  // log2-domain scores of this thread's (token, head) pairs, `par` the chunk's K params:
  // sum over the channel groups gk of kscale s_{t,gk} dot(gk, e) + z_{t,gk} c2.
  template <class Dot>
  __device__ __forceinline__ void fold_scores(const Lane& L, const uint8_t* par, float (&x)[4], Dot&& dot) const {
#pragma unroll
    for (int e = 0; e < 4; ++e) x[e] = 0.f;
#pragma unroll
    for (int gk = 0; gk < kAcc; ++gk)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float2 sz = __half22float2(reinterpret_cast<const __half2*>(par)[L.token(e) * T::kGroupsD + gk]);
        const float d = dot(gk, e);
        x[e] = fmaf(kscale[e & 1] * sz.x, d, fmaf(sz.y, c2[gk][e & 1], x[e]));
      }
  }
};

template <class T>
struct KFoldToken : KTokenConstants<T> {
  // Token-wise K, accumulator fold, fp16 operands: INT2 with groups of 32 only, whose int8
  // k-step (64 channels) would span two groups (KTokenSide). B = q' / f (fp16, q' = q 2^-e, e
  // keeping |q'| < 2^14); per channel group gk an accumulator acc_gk = sum_d q'_d / f_d
  // (1024 + f_d c) and
  //   score log2 = 2^e lambda s_{t,gk} (acc - 1024 sum q'/f) + lambda z_{t,gk} sum q.
  using Base = KTokenConstants<T>;
  using Base::kAcc, Base::kscale, Base::c2;
  static constexpr bool kInt8 = false;  // fp16 operands (k_operands)
  float acc[kAcc][4];
  float c1[kAcc][2];  // 1024 sum q'/f per channel group, heads 2t, 2t+1 (kscale: 2^e lambda)

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
    store_b_row<T>(p, s.q_tile[0], qs, make_uint4(h[0], h[1], h[2], h[3]));
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
    Base::load_constants(s, L);
#pragma unroll
    for (int hh = 0; hh < 2; ++hh)
#pragma unroll
      for (int gk = 0; gk < kAcc; ++gk) c1[gk][hh] = s.kconst[gk][2 * L.t + hh][0];
  }

  __device__ __forceinline__ void issue(SharedStorage<T>& s, const Lane&, const uint32_t (&a)[8][4], int hp) {
    const uint32_t base = b_tile_desc(smem_u32(s.q_tile[0][hp][0]));
#pragma unroll
    for (int kt = 0; kt < 8; ++kt) {
      const int gk = kt * 16 / T::G;
      wgmma_m64n8k16<true>(acc[gk], a[kt][0], a[kt][1], a[kt][2], a[kt][3], base + kt * kBTileDescStep);
    }
  }
  __device__ __forceinline__ void scores(SharedStorage<T>&, const Lane& L, const uint8_t* par, float (&x)[4]) const {
    Base::fold_scores(L, par, x, [&](int gk, int e) { return acc[gk][e] - c1[gk][e & 1]; });
  }
};

template <class T>
struct KFoldToken8 : KTokenConstants<T> {
  // Token-wise K, accumulator fold, int8 operands. B = Q' = round(q 2^e / f), an integer of at
  // most 2^14 in magnitude (2^e per head keeping max |Q'| in [2^13, 2^14)), in two s8 parts on
  // N = 16 as KFoldChannel's Q~ (the same rounding and split); per channel group gk an int32
  // accumulator acc_gk = sum_d Q'_d f_d c, exact, and
  //   score log2 = 2^-e lambda s_{t,gk} (256 acc_hi + acc_lo) + lambda z_{t,gk} sum q.
  // A k-step lies in one channel group: 32 channels (INT4) or 64 (INT2; INT2 with groups of 32
  // keeps KFoldToken).
  using Base = KTokenConstants<T>;
  using Base::kAcc, Base::kscale, Base::c2;  // kscale: 2^-e lambda
  static constexpr bool kInt8 = true;         // k8_operands
  static_assert(T::G >= (T::BITS == 4 ? 32 : 64), "an int8 k-step spans 32 (INT4) or 64 (INT2) channels");
  int acc[kAcc][8];

  __device__ __forceinline__ void setup(const DecodeParams& p, SharedStorage<T>& s, const Lane& L) {
    const QSlice qs(L.tid);  // the group sums over 8 consecutive channels
    float qsum = 0.f;
#pragma unroll
    for (int j = 0; j < 8; ++j) qsum += s.q32[qs.n][qs.d0 + j];
    qsum = reduce_lanes<T::G / 8, false>(qsum);
    const Q8Slice q8(L.tid);
    const float inv_f = 1.f / k8_radix<T::BITS>(k8_reg<T::BITS>(q8.ks, q8.hf));
    float x[8], amax = 0.f;  // [4 r + c]: q / f of channel ch(r) + c
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float4 q = *reinterpret_cast<const float4*>(&s.q32[q8.n][q8.channel<T::BITS>(r)]);
      x[4 * r] = q.x * inv_f, x[4 * r + 1] = q.y * inv_f, x[4 * r + 2] = q.z * inv_f, x[4 * r + 3] = q.w * inv_f;
#pragma unroll
      for (int c = 0; c < 4; ++c) amax = fmaxf(amax, fabsf(x[4 * r + c]));
    }
    amax = reduce_lanes<16, true>(amax);
    const int e = max(min(amax > 0.f ? 13 - ilog2f(amax) : 0, 126), -126);
    const Q15Parts parts = q15_parts(x, exp2_int(e));
#pragma unroll
    for (int hp = 0; hp < T::HP; ++hp) {  // the other head's tiles get zeros in this column
      const bool mine = hp == q8.head<T>(p);
      *reinterpret_cast<uint2*>(s.q_tile[0][hp][0] + q8.tile_offset(0)) = mine ? parts.lo : make_uint2(0u, 0u);
      *reinterpret_cast<uint2*>(s.q_tile[0][hp][0] + q8.tile_offset(1)) = mine ? parts.hi : make_uint2(0u, 0u);
    }
    if ((L.tid & (T::G / 8 - 1)) == 0) {
      const int gk = qs.d0 / T::G;
      s.kconst[gk][qs.n][1] = p.sm_scale_log2 * qsum;
      s.kconst[gk][qs.n][2] = p.sm_scale_log2 * exp2_int(-e);
    }
  }
  __device__ __forceinline__ void issue(SharedStorage<T>& s, const Lane&, const uint32_t (&a)[4][4], int hp) {
    const uint32_t base = b_tile_desc(smem_u32(s.q_tile[0][hp][0]));
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {
      const int gk = (T::BITS == 4 ? 32 * ks : 64 * (ks / 2)) / T::G;
      wgmma_m64n16k32_u8s8(acc[gk], a[ks][0], a[ks][1], a[ks][2], a[ks][3], base + ks * kB8TileDescStep);
    }
  }
  __device__ __forceinline__ void scores(SharedStorage<T>&, const Lane& L, const uint8_t* par, float (&x)[4]) const {
    Base::fold_scores(L, par, x, [&](int gk, int e) { return static_cast<float>(acc[gk][4 + e] * 256 + acc[gk][e]); });
  }
};

// Token-wise K's policy: int8 operands where a k-step fits a channel group (all but INT2 with
// groups of 32, which keeps the fp16 operands of KFoldToken).
template <class T>
using KTokenSide =
    typename std::conditional<T::G >= (T::BITS == 4 ? 32 : 64), KFoldToken8<T>, KFoldToken<T>>::type;

template <class T>
struct KFoldChannel {
  // Channel-wise K, operand fold, int8 operands. The A operands are the codes f c (f = k8_radix,
  // 1 or 4), four to a register (k8_operands); once per token group the warpgroup builds
  // Q~ = round(q s lambda 2^e / f), an integer of at most 2^14 in magnitude (2^e per head keeping
  // max |Q~| in [2^13, 2^14)), in two s8 parts Q~ = 256 hi + lo (lo the sign-extended low byte)
  // on N = 16: columns 0-7 lo, 8-15 hi. The
  // u8 x s8 wgmma sums exactly in int32, so  score log2 = 2^-e (256 acc_hi + acc_lo) + bias. No
  // rounding but Q~'s own, and no bias in the operands to cut. The bias is centred (v27): with
  // e_d = 2^-e f Q~_d - q_d lambda s_d, Q~'s rounding in real units,
  //   bias = lambda sum_d q_d z_d - m sum_d e_d = lambda sum_d q_d (z_d + m s_d) - m 2^-e f sum_d Q~_d,
  //   m = (2^BITS - 1) / 2,
  // so that the scores err by sum_d e_d (c_d - m), centred whatever the offsets z; and it needs
  // no 1 / s. (v24-v26 put the offset on the rounded Q~, sum Q~ f z / s 2^-e, erring by
  // sum e_d (c_d + z_d / s_d): centred only where z / s is near -m; from the exact q alone,
  // lambda sum q z, the error sum e_d c_d carries m sum e_d into every score of the group, 5 %
  // more error at INT2 on centred data.)
  static constexpr float kMidCode = 0.5f * ((1 << T::BITS) - 1);
  static constexpr int kGroups = T::kGroupsT;
  static constexpr bool kScoresReadStage = false;
  static constexpr bool kInt8 = true;  // k8_operands
  int acc[kGroups][8];
  float bias[2], inv[2];  // of this thread's group, heads 2t, 2t+1

  // Once per item: the slices begin_chunk may not write (padding columns, the other head's
  // columns in each head's tiles) zeroed, with the padding columns' constants; q lambda / f.
  __device__ __forceinline__ void setup(const DecodeParams& p, SharedStorage<T>& s, const Lane& L) {
    const Q8Slice q8(L.tid);
    const bool pad = q8.n >= p.cols;
#pragma unroll
    for (int gq = 0; gq < kGroups; ++gq) {
#pragma unroll
      for (int hp = 0; hp < T::HP; ++hp)
        if (pad || hp != q8.head<T>(p)) {
          *reinterpret_cast<uint2*>(s.q_tile[gq][hp][0] + q8.tile_offset(0)) = make_uint2(0u, 0u);
          *reinterpret_cast<uint2*>(s.q_tile[gq][hp][0] + q8.tile_offset(1)) = make_uint2(0u, 0u);
        }
      if (pad && (L.tid & 15) == 0) s.kconst[gq][q8.n][0] = 0.f, s.kconst[gq][q8.n][1] = 1.f;
    }
    const QSlice qs(L.tid);
    const float c = p.sm_scale_log2 / k8_block_radix<T::BITS>(qs.d0 / 8);
#pragma unroll
    for (int j = 0; j < 8; ++j) s.q32[qs.n][qs.d0 + j] *= c;  // load_query's barrier follows
  }
  __device__ __forceinline__ void load_constants(SharedStorage<T>&, const Lane&) {}
  __device__ __forceinline__ int my_group(const Lane& L) const { return kGroups == 1 ? 0 : (16 * L.warp) / T::G; }

  // Rebuild Q~ when a token group starts: each thread its Q8Slice from the K parameters of its
  // column's KV head; the column's maximum and bias reduced over its 16 threads.
  __device__ __forceinline__ void begin_chunk(const DecodeParams& p, SharedStorage<T>& s, const Lane& L,
                                              const uint8_t* const (&par)[T::HP], bool group_starts) {
    if (!group_starts || 2 * L.warp >= p.cols) return;
    const Q8Slice q8(L.tid);
    const int hp = q8.head<T>(p);
    const float f = k8_radix<T::BITS>(k8_reg<T::BITS>(q8.ks, q8.hf));
    const int ch[2] = {q8.channel<T::BITS>(0), q8.channel<T::BITS>(1)};
    float qc[8];  // [4 r + c]: q lambda / f (setup) of channel ch[r] + c
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float4 q = *reinterpret_cast<const float4*>(&s.q32[q8.n][ch[r]]);
      qc[4 * r] = q.x, qc[4 * r + 1] = q.y, qc[4 * r + 2] = q.z, qc[4 * r + 3] = q.w;
    }
#pragma unroll
    for (int gq = 0; gq < kGroups; ++gq) {
      const uint8_t* head_par = of_head(par, hp) + gq * kD * 4;
      // qt = q s lambda / f; qz = sum of q lambda (z + m s) / f over the slice, m the middle code.
      float qt[8], qz = 0.f, amax = 0.f;
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const uint4 raw = lds128(head_par + ch[r] * 4);  // 4 (scale, offset) pairs
        const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const float2 sz = unpack_f16x2(words[c]);
          const int j = 4 * r + c;
          qt[j] = qc[j] * sz.x;
          qz = fmaf(qc[j], fmaf(kMidCode, sz.x, sz.y), qz);
          amax = fmaxf(amax, fabsf(qt[j]));
        }
      }
      amax = reduce_lanes<16, true>(amax);
      const int e = max(min(amax > 0.f ? 13 - ilog2f(amax) : 0, 126), -126);
      const Q15Parts parts = q15_parts(qt, exp2_int(e));  // byte 2c + r is channel ch[r] + c
      uint8_t* tiles = s.q_tile[gq][hp][0];
      *reinterpret_cast<uint2*>(tiles + q8.tile_offset(0)) = parts.lo;
      *reinterpret_cast<uint2*>(tiles + q8.tile_offset(1)) = parts.hi;
      // The bias, centred: f qz - m f 2^-e sum Q~ (f = 1 or 4: exact).
      const float bias =
          reduce_lanes<16, false>(fmaf(-kMidCode * f * exp2_int(-e), static_cast<float>(parts.sum), qz * f));
      if ((L.tid & 15) == 0) s.kconst[gq][q8.n][0] = bias, s.kconst[gq][q8.n][1] = exp2_int(-e);
    }
    fence_proxy_async_smem();
  }
  __device__ __forceinline__ void publish(SharedStorage<T>& s, const Lane& L, bool group_starts) {
    if (!group_starts) return;
    named_barrier(kConsumerBarrier, kConsumerThreads);
    const int gq = my_group(L);
    bias[0] = s.kconst[gq][2 * L.t][0], bias[1] = s.kconst[gq][2 * L.t + 1][0];
    inv[0] = s.kconst[gq][2 * L.t][1], inv[1] = s.kconst[gq][2 * L.t + 1][1];
  }

  __device__ __forceinline__ void issue(SharedStorage<T>& s, const Lane&, const uint32_t (&a)[4][4], int hp) {
#pragma unroll
    for (int gq = 0; gq < kGroups; ++gq) {
      const uint32_t base = b_tile_desc(smem_u32(s.q_tile[gq][hp][0]));
#pragma unroll
      for (int ks = 0; ks < 4; ++ks)
        wgmma_m64n16k32_u8s8(acc[gq], a[ks][0], a[ks][1], a[ks][2], a[ks][3], base + ks * kB8TileDescStep);
    }
  }
  __device__ __forceinline__ void scores(SharedStorage<T>&, const Lane& L, const uint8_t*, float (&x)[4]) const {
    const bool second = kGroups > 1 && my_group(L) > 0;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int lo = second ? acc[kGroups - 1][e] : acc[0][e];
      const int hi = second ? acc[kGroups - 1][4 + e] : acc[0][4 + e];
      x[e] = fmaf(static_cast<float>(hi * 256 + lo), inv[e & 1], bias[e & 1]);
    }
  }
};

template <class T>
struct KDequant {
  // The ablation, channel-wise K: every element becomes s c + z (fp32, rounded once to fp16)
  // before the MMA; B = q' = q 2^-e (fp16).  score log2 = 2^e lambda acc.
  static constexpr bool kScoresReadStage = false;
  static constexpr bool kInt8 = false;  // fp16 operands (k_operands)
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
    store_b_row<T>(p, s.q_tile[0], qs, make_uint4(h[0], h[1], h[2], h[3]));
    if ((L.tid & 15) == 0) s.kconst[0][qs.n][2] = p.sm_scale_log2 * exp2_int(e);
  }
  __device__ __forceinline__ void load_constants(SharedStorage<T>& s, const Lane& L) {
    kscale[0] = s.kconst[0][2 * L.t][2];
    kscale[1] = s.kconst[0][2 * L.t + 1][2];
  }
  // The K operands are dequantized in place: (x - 1024) / f s + z per element.
  __device__ __forceinline__ void begin_chunk(const DecodeParams&, SharedStorage<T>&, const Lane&,
                                              const uint8_t* const (&)[T::HP], bool) {}
  __device__ __forceinline__ void publish(SharedStorage<T>&, const Lane&, bool) {}
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
  __device__ __forceinline__ void issue(SharedStorage<T>& s, const Lane&, const uint32_t (&a)[8][4], int hp) {
    const uint32_t base = b_tile_desc(smem_u32(s.q_tile[0][hp][0]));
#pragma unroll
    for (int kt = 0; kt < 8; ++kt)
      wgmma_m64n8k16<true>(acc[0], a[kt][0], a[kt][1], a[kt][2], a[kt][3], base + kt * kBTileDescStep);
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

// The int8 A operands of S for warp w's 16-token tile (KFoldChannel): k-step ks, half hf from
// register k8_reg of word k8_word of rows g (a0, a2) and g + 8 (a1, a3).
template <int BITS>
__device__ __forceinline__ void k8_operands(const uint8_t* tile, int lane, uint32_t (&a)[4][4]) {
  constexpr int W = kD * BITS / 64, HALF = W / 2;
  uint32_t w[W];
  lane_words(tile, lane, w);
#pragma unroll
  for (int ks = 0; ks < 4; ++ks)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int j = k8_word<BITS>(ks, hf), i = k8_reg<BITS>(ks, hf);
      a[ks][2 * hf] = extract_k8<BITS>(w[j], i);
      a[ks][2 * hf + 1] = extract_k8<BITS>(w[HALF + j], i);
    }
}

// The query heads of an item's KV heads, column n query head w.h * ratio + n: fp32 in shared
// memory (zero rows past cols), bf16 B tiles for the BF16 tail, then the K side's setup and
// constants.
template <class T, class KSide>
__device__ __forceinline__ void load_query(const DecodeParams& p, SharedStorage<T>& s, const Lane& L, const WorkItem& w,
                                           KSide& ks) {
  const QSlice qs(L.tid);
  float x[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  uint4 raw = make_uint4(0u, 0u, 0u, 0u);
  if (qs.n < p.cols) {
    raw = *reinterpret_cast<const uint4*>(p.q + ((size_t)w.b * p.num_q_heads + w.h * p.ratio + qs.n) * kD + qs.d0);
    const uint32_t u[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float2 f = unpack_bf16x2(u[j]);
      x[2 * j] = f.x, x[2 * j + 1] = f.y;
    }
  }
  if constexpr (T::kHasTail) store_b_row<T>(p, s.qt_tile, qs, raw);  // bf16 q for the tail (exact: q is bf16)
#pragma unroll
  for (int j = 0; j < 8; ++j) s.q32[qs.n][qs.d0 + j] = x[j];
  __syncwarp();
  ks.setup(p, s, L);
  fence_proxy_async_smem();
  named_barrier(kConsumerBarrier, kConsumerThreads);
  ks.load_constants(s, L);
}

// The S side of an item's chunk loop: the ring stage of the current trip (T::HP stages, one per
// KV head of the item; the skewed ring of fill_stage()), the next chunk's S operands built from it
// (the B tiles when a token group starts, the A operands of warp w's 16-token tile of one head),
// the first chunk's S, and a chunk's masked scores.
template <class T, class KSide>
struct SStream {
  const DecodeParams& p;
  SharedStorage<T>& s;
  const Lane& L;
  const WorkItem& w;
  KSide& ks;
  const RingCursor<T>& ring;  // the current trip's stages
  // The S operands prepared last (one head's): 8 fp16 k-steps, or 4 int8.
  typename std::conditional<KSide::kInt8, uint32_t[4][4], uint32_t[8][4]>::type a;

  // Head hp's stage of the current trip.
  __device__ __forceinline__ const uint8_t* stage(int hp = 0) const { return s.ring[ring.slot_of(hp)]; }
  // Each head's V codes and V parameters in the current trip's stages (those of chunk c in trip c).
  __device__ __forceinline__ void v_of_trip(const uint8_t* (&blk)[T::HP], const uint8_t* (&par)[T::HP]) const {
#pragma unroll
    for (int hp = 0; hp < T::HP; ++hp) {
      blk[hp] = stage(hp) + T::kCodeBytes;
      par[hp] = stage(hp) + 2 * T::kCodeBytes + T::kKParamBytes;
    }
  }
  __device__ __forceinline__ void wait() const {
#pragma unroll
    for (int hp = 0; hp < T::HP; ++hp) mbar_wait(&s.full[ring.slot_of(hp)], ring.phase_of(hp));
  }
  // The current trip's stages back to the producer, once every lane of the warp is done with them.
  // The fence first: ptxas issues the arrive without waiting for the lane's loads of the stage
  // still in flight (whose results the code after it uses), and the producer's next copy into
  // the slot then overwrote data those loads had not yet read. Without it the paired K
  // token-wise / V channel-wise kernels returned a wrong output in 0.03-8 % of launches (the
  // parameters of channel-wise V are loaded last in a trip); with it none in 4000
  // (scripts/probe_race.py; docs/PERFORMANCE.md, twelfth session, v31).
  __device__ __forceinline__ void release() const {
    fence_acq_rel_cta();
    __syncwarp();
    if (L.lane == 0) {
#pragma unroll
      for (int hp = 0; hp < T::HP; ++hp) mbar_arrive(&s.empty[ring.slot_of(hp)]);
    }
  }
  // Head hp's S operands of chunk c from the current trip's stages; before the wgmma fence. The
  // first head's call rebuilds the B tiles of every head when a token group starts.
  __device__ __forceinline__ void prepare(int c, int hp) {
    const bool group_starts = c == w.chunk_begin || (c * kChunk) % T::G == 0;
    const uint8_t* st = stage(hp);
    if (hp == 0) {
      const uint8_t* k_par[T::HP];
#pragma unroll
      for (int h = 0; h < T::HP; ++h) k_par[h] = stage(h) + 2 * T::kCodeBytes;
      ks.begin_chunk(p, s, L, k_par, group_starts);
    }
    if constexpr (KSide::kInt8) {
      k8_operands<T::BITS>(st + L.warp * (T::kCodeBytes / 4), L.lane, a);
    } else {
      k_operands<T::BITS>(st + L.warp * (T::kCodeBytes / 4), L.lane, a);
      if constexpr (T::DEQ) ks.dequantize(L, st + 2 * T::kCodeBytes, a);
    }
    if (hp == 0) ks.publish(s, L, group_starts);
  }
  // Head hp's wgmmas as one group, accumulating into ks.acc (zeroed before the first head's).
  __device__ __forceinline__ void issue(int hp) {
    pin_operands(a);
    pin_accumulators(ks.acc);
    wgmma_fence();
    ks.issue(s, L, a, hp);
    wgmma_commit();
  }
  __device__ __forceinline__ void complete() {
    wgmma_wait<0>();
    pin_accumulators(ks.acc);
  }
  // S of the item's first chunk from the item's first stage (its K only), completed; the caller
  // releases that stage.
  __device__ __forceinline__ void first() {
    wait();
    zero_accumulators(ks.acc);
#pragma unroll
    for (int hp = 0; hp < T::HP; ++hp) {  // one head at a time (one operand set)
      prepare(w.chunk_begin, hp);
      issue(hp);
      complete();
    }
  }
  // Log2-domain scores of chunk c (its S completed), -inf past the packed length.
  __device__ __forceinline__ void scores(int c, float (&x)[4]) const {
    ks.scores(s, L, stage(L.hp) + 2 * T::kCodeBytes, x);
    const int tok0 = c * kChunk;
    if (!T::kWholeChunks && tok0 + kChunk > w.packed_len) {  // (predicated by ptxas: 4 FSEL a trip)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        if (tok0 + L.token(e) >= w.packed_len) x[e] = kNegInf;
    }
  }
};

// The split merges' arithmetic: acc += wv x, and four sums as four bf16 at dst (8 bytes).
__device__ __forceinline__ void add_weighted(float4& acc, float wv, const float4& x) {
  acc.x = fmaf(wv, x.x, acc.x), acc.y = fmaf(wv, x.y, acc.y);
  acc.z = fmaf(wv, x.z, acc.z), acc.w = fmaf(wv, x.w, acc.w);
}
__device__ __forceinline__ void store_bf16x4(__nv_bfloat16* dst, const float4& v) {
  *reinterpret_cast<uint2*>(dst) = make_uint2(pack_bf16x2(v.x, v.y), pack_bf16x2(v.z, v.w));
}

// One column's weights from its splits' (m, l) pairs, lane l holding those of splits l, l + 32, ..
// in v: wc[i] = exp2(m - max) / denominator for split i < n (0 for a split with no token).
__device__ __forceinline__ void weigh_splits(const float2 (&v)[4], const Lane& L, float* wc, int n) {
  float mx = kNegInf;
#pragma unroll
  for (int k = 0; k < 4; ++k) mx = fmaxf(mx, v[k].x);
  mx = reduce_lanes<32, true>(mx);
  float e[4], den = 0.f;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    e[k] = v[k].x == kNegInf ? 0.f : exp2f(v[k].x - mx);  // a split with no tokens weighs 0
    den = fmaf(e[k], v[k].y, den);
  }
  den = reduce_lanes<32, false>(den);
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const int i = L.lane + 32 * k;
    if (i < n) wc[i] = e[k] / den;
  }
}

// The merge of every split of a (sequence, KV head) by the CTA of the last to arrive: warp w
// merges columns w, w + 4 alone, lane l channels 4 l .. 4 l + 3 of the output (S splits of column
// hd's partials at rows row0 + hd S .. of p.ws_o and p.ws_ml, the output's columns from query head
// hq0, wgt[hd S + split] the weights' shared-memory buffer). Its time is its count of dependent
// round trips to L2, while at batch 1 the rest of the GPU waits for it:
// - lane l holds the (m, l) pairs of splits l, l + 32, .. (at most 128 splits: 4 a lane) as one
//   float2 each, loaded with the first kMergeBatch splits' partials (DecodeTraits), so the weights,
//   exp2(m - max) / denominator (0 for a split with no token), cost no round trip of their own;
//   they pass through shared memory to the lanes that sum, within the warp (no CTA barrier);
// - the partials are float4 with independent loads (one SM reads 64 KB of them in 2.1 us so, in
//   5.0 us as 4-byte loads: scripts/probe_merge_read.cu; v22, batch 1 2.5-10 % faster), the rest
//   kMergeBatch at a time with predicated loads, no serial remainder.
// Before (v38-v43): a round trip for the weights and a CTA barrier, then the partials 8 at a time
// with the remainder one by one. Against that, on an H100: batch 1 and 2 2-5.5 % faster from 4K to
// 16K, 0.6-2 % at 32K, level at 128K, batch 8 / 4K 5.6 % (v44, the one-head kernels); the paired
// kernels 2.6 % at batch 32 / 4K and level from 32K, the paper point within the noise of one
// library timed twice (v45 INT4, v46 INT2; docs/PERFORMANCE.md).
template <class T>
__device__ __forceinline__ void merge_batched(const DecodeParams& p, const Lane& L, const WorkItem& w, int hq0,
                                              int S, size_t row0, float* wgt) {
  const float2* ml = reinterpret_cast<const float2*>(p.ws_ml);
  const int ch = 4 * L.lane;
  const float4 zero = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int hd = L.warp; hd < p.cols; hd += 4) {
    const float4* src = reinterpret_cast<const float4*>(p.ws_o + (row0 + (size_t)hd * S) * kD + ch);
    float2 v[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int i = L.lane + 32 * k;
      v[k] = i < S ? __ldcg(ml + row0 + hd * S + i) : make_float2(kNegInf, 0.f);
    }
    float4 o[T::kMergeBatch];
#pragma unroll
    for (int k = 0; k < T::kMergeBatch; ++k) o[k] = k < S ? __ldcg(src + k * (kD / 4)) : zero;
    float* wc = wgt + hd * S;
    weigh_splits(v, L, wc, S);
    __syncwarp();
    if (L.tid == 0 && hd == 0) timeline_stamp<T>(p, w, kTlMergeWeighted);
    float4 acc = zero;
    for (int sp0 = 0;;) {
#pragma unroll
      for (int k = 0; k < T::kMergeBatch; ++k) {
        add_weighted(acc, sp0 + k < S ? wc[sp0 + k] : 0.f, o[k]);
      }
      sp0 += T::kMergeBatch;
      if (sp0 >= S) break;
#pragma unroll
      for (int k = 0; k < T::kMergeBatch; ++k) o[k] = sp0 + k < S ? __ldcg(src + (size_t)(sp0 + k) * (kD / 4)) : zero;
    }
    store_bf16x4(p.o + ((size_t)w.b * p.num_q_heads + hq0 + hd) * kD + ch, acc);
  }
}

// Lab knob FOSCAR_COOP_MERGE: the merge of a (sequence, KV head) shared by its S splits' CTAs,
// all resident (a cooperative launch of no more items than CTAs). Each CTA counts; the last
// resets the counter and flips the pair's sense word (release); the others wait for the flip
// (acquire; a sense word, not the counter, so that nothing is left to reset after the launch).
// Then CTA `split` merges slice `split` of the cols x 128 outputs: n = 4 ceil(cols 128 / 4 S)
// floats, as Q float4 quads, thread t taking quad t % Q of splits t / Q, t / Q + R, .. (R = 128 / Q
// threads a quad), loaded before the weights (one round trip for partials and (m, l) alike),
// summed through shared memory. Its wait for the sense word (one L2 round trip after the last
// count, on average) buys one SM's read of 4 cols x 128 x S bytes instead of S times as much.
// `sense0` is the sense word as thread 0 read it before counting. Measured on an H100 in its first
// form (acquiring polls back to back, sense words beside the counters): 1.1-2.2 us slower at batch
// 1-8, the polls slowing the last counts and trips (docs/PERFORMANCE.md, thirty-seventh session).
template <class T>
__device__ void merge_together(const DecodeParams& p, SharedStorage<T>& s, const Lane& L, const WorkItem& w,
                               int hq0, int sense0) {
  const int S = p.num_splits;
  named_barrier(kConsumerBarrier, kConsumerThreads);  // the partials stores, before thread 0's release
  if (L.tid == 0) {
    timeline_stamp<T>(p, w, kTlWritten);
    const size_t pair = (size_t)w.b * p.num_kv_heads + w.h;
    int* count = p.ws_count + pair;
    int* sense = sense_word(p, w.b, w.h);
    if (atomic_add_acq_rel_gpu(count, 1) == S - 1) {
      *count = 0;  // every split has counted (the flip below orders it before the launch's end)
      st_release_gpu(sense, sense0 ^ 1);
    } else {
      wait_until_changed_gpu(sense, sense0);
    }
    timeline_stamp<T>(p, w, kTlCounted);
  }
  named_barrier(kConsumerBarrier, kConsumerThreads);  // thread 0's acquire, before every thread's loads
  if (L.tid == 0) timeline_stamp<T>(p, w, kTlMergeFenced);
  const int total = p.cols * kD;
  const int n = 4 * ((total + 4 * S - 1) / (4 * S));
  const int lo = min(total, w.split * n), hi = min(total, lo + n);
  const int quads = (hi - lo) / 4;  // 0 for the splits past the outputs (S > total / 4)
  const int per_quad = quads ? kConsumerThreads / quads : 0;
  const int q = quads ? L.tid % quads : 0, r = quads ? L.tid / quads : per_quad;
  const bool active = r < per_quad;
  const int e = lo + 4 * q, hd = e / kD, ch = e % kD, hd_lo = lo / kD;
  const size_t row0 = ((size_t)w.b * p.num_q_heads + hq0) * S;  // column c, split sp: row0 + c S + sp
  const float4* src = reinterpret_cast<const float4*>(p.ws_o + (row0 + (size_t)hd * S) * kD + ch);
  const float4 zero = make_float4(0.f, 0.f, 0.f, 0.f);
  constexpr int kLoads = 4;  // a thread's splits in flight; more (S > 4 R) follow one by one
  float4 o[kLoads];
#pragma unroll
  for (int k = 0; k < kLoads; ++k) {
    const int sp = r + k * per_quad;
    o[k] = active && sp < S ? __ldcg(src + (size_t)sp * (kD / 4)) : zero;
  }
  // The weights of the columns this slice touches (at most 5), warp c % 4 for column hd_lo + c.
  float* wgt = &s.merge[0][0][0];                    // [column - hd_lo][split]
  float4* red = reinterpret_cast<float4*>(wgt + 8 * 128);  // [r][q] thread sums
  static_assert(sizeof(s.merge) >= (8 * 128 + kConsumerThreads * 4) * sizeof(float), "weights and sums");
  const int touched = quads ? (hi - 1) / kD - hd_lo + 1 : 0;
  const float2* ml = reinterpret_cast<const float2*>(p.ws_ml);
  for (int c = L.warp; c < touched; c += 4) {
    float2 v[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int i = L.lane + 32 * k;
      v[k] = i < S ? __ldcg(ml + row0 + (size_t)(hd_lo + c) * S + i) : make_float2(kNegInf, 0.f);
    }
    weigh_splits(v, L, wgt + c * S, S);
  }
  named_barrier(kConsumerBarrier, kConsumerThreads);  // the weights, before the sums
  if (L.tid == 0) timeline_stamp<T>(p, w, kTlMergeWeighted);
  float4 acc = zero;
  const float* wc = wgt + (hd - hd_lo) * S;
  if (active) {
#pragma unroll
    for (int k = 0; k < kLoads; ++k) {
      const int sp = r + k * per_quad;
      add_weighted(acc, sp < S ? wc[sp] : 0.f, o[k]);
    }
    for (int sp = r + kLoads * per_quad; sp < S; sp += per_quad) add_weighted(acc, wc[sp], __ldcg(src + (size_t)sp * (kD / 4)));
    if (r > 0) red[(r - 1) * quads + q] = acc;
  }
  named_barrier(kConsumerBarrier, kConsumerThreads);  // the threads' sums, before the quads' owners read them
  if (active && r == 0) {
    for (int rr = 1; rr < per_quad; ++rr) {
      const float4 x = red[(rr - 1) * quads + q];
      acc.x += x.x, acc.y += x.y, acc.z += x.z, acc.w += x.w;
    }
    store_bf16x4(p.o + ((size_t)w.b * p.num_q_heads + hq0 + hd) * kD + ch, acc);
  }
  named_barrier(kConsumerBarrier, kConsumerThreads);  // s.merge is read out before the next item
  if (L.tid == 0) timeline_stamp<T>(p, w, kTlMerged);
}

// After every split of an item wrote its partials (o against its own maximum m, and l): the
// last split of a (sequence, KV head) to arrive merges them all into the output and resets the
// counter for the next launch (or, FOSCAR_COOP_MERGE, all of them merge it together).
template <class T>
__device__ void merge_splits(const DecodeParams& p, SharedStorage<T>& s, const Lane& L, const WorkItem& w,
                             int sense0) {
  const int hq0 = w.h * p.ratio;
  if constexpr (FOSCAR_COOP_MERGE) {
    if (merge_together_launch(p, gridDim.x)) return merge_together<T>(p, s, L, w, hq0, sense0);
  }
  // The consumers' partials stores are ordered before thread 0's release by the barrier; its
  // acquire, when it counts last, before their reads of the other splits' partials by the next.
  named_barrier(kConsumerBarrier, kConsumerThreads);
  if (L.tid == 0) {
    timeline_stamp<T>(p, w, kTlWritten);
    int* count = p.ws_count + (size_t)w.b * p.num_kv_heads + w.h;
    const int done = atomic_add_acq_rel_gpu(count, 1);
    s.last_split = done == p.num_splits - 1;
    if (s.last_split) *count = 0;  // every split has counted: ready for the next launch
    timeline_stamp<T>(p, w, kTlCounted);
  }
  named_barrier(kConsumerBarrier, kConsumerThreads);
  if (!s.last_split) return;
  if (L.tid == 0) timeline_stamp<T>(p, w, kTlMergeFenced);
  const int S = p.num_splits;  // at most 8 columns x 128 splits (foscar_dispatch.h)
  float* wgt = &s.merge[0][0][0];  // [column][split]
  static_assert(sizeof(s.merge) >= kN * kD * sizeof(float), "the merge buffer holds 8 columns x 128 splits");
  const size_t row0 = ((size_t)w.b * p.num_q_heads + hq0) * S;  // column hd, split sp: row0 + hd S + sp
  merge_batched<T>(p, L, w, hq0, S, row0, wgt);
  named_barrier(kConsumerBarrier, kConsumerThreads);  // s.last_split is read out
  if (L.tid == 0) timeline_stamp<T>(p, w, kTlMerged);
}

}  // namespace foscar

#include "foscar_consume.cuh"

namespace foscar {

template <int BITS, int G, bool KCH, bool VCH, bool DEQ, int HP, int CTAS = 0>
__global__ void __launch_bounds__(256, DecodeTraits<BITS, G, KCH, VCH, DEQ, HP, CTAS>::kCtasPerSm)
    foscar_decode_kernel(const __grid_constant__ DecodeParams p) {
  using T = DecodeTraits<BITS, G, KCH, VCH, DEQ, HP, CTAS>;
  SharedStorage<T>& s = *reinterpret_cast<SharedStorage<T>*>(dynamic_smem());
  if (threadIdx.x == 0) {
    for (int i = 0; i < T::kStages; ++i) {
      mbar_init(&s.full[i], 1);   // the producer's arrive (and the copies' bytes)
      mbar_init(&s.empty[i], 4);  // one arrive per consumer warp
    }
    mbar_init_fence();
    timeline_stamp(p, blockIdx.x, kTlEntry);  // before the barrier: the CTA's other stamps follow it
  }
  __syncthreads();
  if (threadIdx.x < 128) {  // producer warpgroup: one lane streams, the rest leave
    setmaxnreg_dec<T::kProducerRegs>();
    if (threadIdx.x == 0) produce<T>(p, s);
  } else {
    setmaxnreg_inc<T::kConsumerRegs>();
    consume<T, KSideOf<T>, VSideOf<T>>(p, s);
  }
}

}  // namespace foscar
