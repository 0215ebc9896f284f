// FOSCAR split-KV decode attention over a 2- or 4-bit paged KV cache (docs/FORMAT.md).
//
// One CTA handles one (sequence, KV head, split); each warp streams its own chunks of 64
// tokens into a shared-memory ring (the bulk copy engine, one lane issuing) and keeps its
// own online-softmax state. Both products put KV on the M side of mma.m16n8k16 so the
// packed codes become A operands in registers by mantissa injection, and the query heads
// of the KV head sit on N = 8:
//   S^T = K Q^T   (tokens x heads),   O^T = V^T P^T   (channels x heads).
// Scales and offsets are folded, never applied per element (FOSCAR.md section 3):
//   K token-wise   : accumulator fold per channel group (score = s * acc_g + const_g)
//   K channel-wise : operand fold, Q~ = q * s / f rebuilt once per token group
//   V token-wise   : operand fold, P~ = p * s; offsets and the injection bias folded into
//                    the output every 512 tokens of a warp
//   V channel-wise : accumulator fold, a raw accumulator flushed at each token-group end
// DEQ = true builds the ablation: every element is dequantized (s * c + z) before the mma.
//
// What costs instructions, and how this kernel keeps it down (docs/PERFORMANCE.md, v4):
// - the per-group and per-token divisions z / s are done once per value by the warp's lanes
//   together into a small fold table in shared memory, not once per lane that reads them;
// - the softmax scale rides on Q~ (channel-wise K) or on the K epilogue's constants, so
//   scores come out of the MMA already in the log2 domain;
// - masks run only on a chunk that crosses the sequence end, the softmax maximum is reduced
//   across lanes only when some lane saw a larger score, and the folded output is flushed
//   every 8 chunks, not once per chunk.
#pragma once

#include "foscar_api.h"
#include "foscar_common.cuh"

namespace foscar {

struct DecodeParams {
  const __nv_bfloat16* q;       // [batch, num_q_heads, D]
  __nv_bfloat16* o;             // [batch, num_q_heads, D]
  const uint32_t* k_codes;      // [pages, num_kv_heads, page_size / 16, words_per_tile]
  const uint32_t* v_codes;
  const __half2* k_params;      // [pages, num_kv_heads, page_size * D / G] of (scale, offset)
  const __half2* v_params;
  const int32_t* page_table;    // [batch, max_pages]
  const int32_t* seq_lens;      // [batch], tail included
  const __nv_bfloat16* k_tail;  // [batch, num_kv_heads, G, D]
  const __nv_bfloat16* v_tail;
  float* ws_o;                  // [batch, num_q_heads, num_splits, D] (num_splits > 1 only)
  float* ws_ml;                 // [batch, num_q_heads, num_splits, 2]
  int* ws_count;                // [batch, num_kv_heads] splits done; 0 between launches
  int batch, num_q_heads, num_kv_heads;
  int page_size, max_pages;
  int page_shift;               // log2(page_size) when it is a power of two, else -1
  // Staging address strides, in bytes (constant-bank operands, so the loop keeps no
  // registers for them): one head's codes / parameters within a page, and one whole page.
  int code_head_bytes, param_head_bytes;
  long long code_page_bytes, param_page_bytes;
  int num_splits, units_per_split;
  float sm_scale_log2;          // softmax scale times log2(e)
};

// The kernel's parameters from the C ABI's arguments (host side).
inline DecodeParams make_params(const FoscarDecodeArgs& a) {
  DecodeParams p;
  p.q = static_cast<const __nv_bfloat16*>(a.q);
  p.o = static_cast<__nv_bfloat16*>(a.o);
  p.k_codes = static_cast<const uint32_t*>(a.k_codes);
  p.v_codes = static_cast<const uint32_t*>(a.v_codes);
  p.k_params = static_cast<const __half2*>(a.k_params);
  p.v_params = static_cast<const __half2*>(a.v_params);
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
  p.page_size = a.page_size;
  p.max_pages = a.max_pages;
  p.page_shift = (a.page_size & (a.page_size - 1)) == 0 ? __builtin_ctz(static_cast<unsigned>(a.page_size)) : -1;
  p.code_head_bytes = a.page_size * a.head_dim * a.bits / 8;
  p.param_head_bytes = a.page_size * (a.head_dim / a.group_size) * 4;
  p.code_page_bytes = static_cast<long long>(p.code_head_bytes) * a.num_kv_heads;
  p.param_page_bytes = static_cast<long long>(p.param_head_bytes) * a.num_kv_heads;
  p.num_splits = a.num_splits;
  p.units_per_split = a.units_per_split;
  p.sm_scale_log2 = a.sm_scale * 1.4426950408889634f;
  return p;
}

constexpr int kChunk = 64;       // tokens a warp stages and scores at once
constexpr float kNegInf = -INFINITY;
// Stands in for a zero scale (a constant group, whose codes are all 0: docs/FORMAT.md) in the
// fold tables: the value s * (c + z / s) is z for any s when c = 0, so no lane needs a
// zero-scale branch, and the operand it multiplies keeps an ordinary magnitude.
constexpr float kZeroScaleStandIn = 1.0f;
// Channel-wise K runs its product in fp16 (8x finer rounding of q~ than bf16, one shift per
// word); q~ is scaled per token group by a power of two that puts max |q~| in [2^13, 2^14).
constexpr int kQTopExponent = 13;

// Build-time knobs for kernel experiments (foscar.build passes -D flags; scripts/kernel_lab.py
// times them; docs/PERFORMANCE.md says which defaults have been measured).
#ifndef FOSCAR_WARPS_INT4
#define FOSCAR_WARPS_INT4 8
#endif
#ifndef FOSCAR_WARPS_INT2
#define FOSCAR_WARPS_INT2 8
#endif
#ifndef FOSCAR_STAGES_INT4
#define FOSCAR_STAGES_INT4 2
#endif
#ifndef FOSCAR_STAGES_INT2
#define FOSCAR_STAGES_INT2 3
#endif
#ifndef FOSCAR_BULK
#define FOSCAR_BULK 1  // 1: one lane stages each chunk with the bulk copy engine; 0: cp.async
#endif
// INT2 at group size 128: one ring stage holds a whole unit (2 chunks, one page run), so a
// unit costs one round of copies and waits instead of two (0: a stage per chunk).
#ifndef FOSCAR_UNIT_STAGING
#define FOSCAR_UNIT_STAGING 1
#endif
#ifndef FOSCAR_UNIT_STAGES_INT2
#define FOSCAR_UNIT_STAGES_INT2 2
#endif

template <int BITS, int D, int G, bool KCH, bool VCH, bool DEQ>
struct DecodeTraits {
  static constexpr int kP = 16 / BITS;                  // code positions per 16-bit half
  static constexpr int kWordsPerLane = D * BITS / 64;   // words per lane per 16-token tile
  static constexpr int kHalfW = kWordsPerLane / 2;
  static constexpr int kWordsPerTile = kWordsPerLane * 32;
  static constexpr int kTiles = kChunk / 16;
  static constexpr int kUnit = G > kChunk ? G : kChunk;  // split / warp granularity (tokens)
  static constexpr int kChunksPerUnit = kUnit / kChunk;
  // Token-wise V folds `raw` into the output every this many chunks of a warp (512 tokens):
  // a chain of 32 MMAs keeps the 128 bias's accumulation error near 1e-4 of the signal
  // (scripts/probe_mma_precision.cu), and the flush's reductions run once per 8 chunks.
  static constexpr int kFlushChunks = 8;
  static constexpr int kNJ = D / 8;                      // channel blocks per lane (K side)
  static constexpr int kNKT = D / 16;                    // k-steps of S^T = K Q^T
  static constexpr int kNMT = D / 16;                    // m-tiles of O^T = V^T P^T
  static constexpr int kGroupsD = D / G;                 // channel groups (token-wise modes)
  // Token groups one chunk touches in channel-wise mode (2 when G = 32).
  static constexpr int kGroupsT = G >= kChunk ? 1 : kChunk / G;
  // Parameters one chunk stages, in half2: token-wise 64 * D / G, channel-wise one group row
  // per group the chunk touches.
  static constexpr int kParamsPerChunk = kGroupsT * D;
  static constexpr int kCodeBytes = kTiles * kWordsPerTile * 4;  // one tensor, one chunk
  // Chunks one ring stage holds: [K codes of each][V codes of each][K params][V params].
  static constexpr int kChunksPerStage = (FOSCAR_UNIT_STAGING && BITS == 2 && kChunksPerUnit == 2) ? 2 : 1;
  static constexpr int kStageBytes = kChunksPerStage * 2 * kCodeBytes + 2 * kParamsPerChunk * 4;
  static constexpr int kStages =
      BITS == 4 ? FOSCAR_STAGES_INT4 : (kChunksPerStage == 2 ? FOSCAR_UNIT_STAGES_INT2 : FOSCAR_STAGES_INT2);
  static_assert(kChunksPerStage * kChunk * kGroupsD <= kParamsPerChunk, "a stage's token-wise params fit its slot");
  static constexpr int kWarps = BITS == 4 ? FOSCAR_WARPS_INT4 : FOSCAR_WARPS_INT2;
  // Fold tables per warp, float2 entries: channel-wise K (s * scale / f, f z / s - 128) per
  // channel of each token group in the chunk; token-wise V (s, z / s) per token and group.
  static constexpr int kKTable = (KCH && !DEQ) ? kGroupsT * D : 0;
  static constexpr int kVTable = (!VCH && !DEQ) ? kChunk * kGroupsD : 0;
  static constexpr int kTableBytes = (kKTable + kVTable) * 8;
  static constexpr int kMaxRatio = 8;                    // query heads per KV head (N = 8)
  static_assert(kWordsPerLane % 4 == 0, "each lane loads whole 16-byte vectors");
};

// Shared memory: [staging ring, per warp][fold tables, per warp][q][ring barriers]; the
// cross-warp combine at the end reuses the front.
template <int BITS, int D, int G, bool KCH, bool VCH, bool DEQ>
struct SmemLayout {
  using T = DecodeTraits<BITS, D, G, KCH, VCH, DEQ>;
  static constexpr int kStaging = T::kWarps * T::kStages * T::kStageBytes;
  static constexpr int kTables = kStaging;
  static constexpr int kQ = kTables + T::kWarps * T::kTableBytes;
  // q twice: bf16 (the tail's MMA operand) and fp32 (what the folds multiply); the fp32 rows
  // are padded by 8 floats so that the 8 heads' lanes of a fragment load hit distinct banks.
  static constexpr int kQfRow = D + 8;
  static constexpr int kQf = kQ + T::kMaxRatio * D * 2;
  static constexpr int kBarriers = kQf + T::kMaxRatio * kQfRow * 4;
  static constexpr int kEnd = kBarriers + T::kWarps * T::kStages * 8;
  static constexpr int kCombine = T::kWarps * 8 * (D + 2) * 4 + 16;  // + the last-split flag
  static constexpr int kBytes = kEnd > kCombine ? kEnd : kCombine;
  static_assert(kTables % 16 == 0 && kQ % 16 == 0 && kQf % 16 == 0 && kBarriers % 8 == 0, "aligned regions");
  static_assert(kCombine <= kTables, "the combine must not overwrite q while warps still read it");
};

template <int BITS, int D, int G, bool KCH, bool VCH, bool DEQ>
constexpr int decode_smem_bytes() {
  return SmemLayout<BITS, D, G, KCH, VCH, DEQ>::kBytes;
}

template <int BITS, int D, int G, bool KCH, bool VCH, bool DEQ>
__global__ void __launch_bounds__(DecodeTraits<BITS, D, G, KCH, VCH, DEQ>::kWarps * 32, 1)
    foscar_decode_kernel(const __grid_constant__ DecodeParams p) {
  using T = DecodeTraits<BITS, D, G, KCH, VCH, DEQ>;
  using S = SmemLayout<BITS, D, G, KCH, VCH, DEQ>;
  constexpr int P = T::kP, HALFW = T::kHalfW, WPT = T::kWordsPerTile, NT = T::kTiles;
  constexpr int NJ = T::kNJ, NMT = T::kNMT, GD = T::kGroupsD, NW = T::kWarps;
  // Channel-wise K operands live per token group of a chunk; the others are fixed for the run.
  constexpr int NQB = (KCH && !DEQ) ? T::kGroupsT : 1;
  constexpr bool HAS_TAIL = KCH || VCH;
  constexpr bool RAW = !DEQ;        // the folds accumulate biased MMA results in `raw` first

  uint8_t* smem = dynamic_smem();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int r = lane >> 2, t4 = lane & 3;
  const int split = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int ratio = p.num_q_heads / p.num_kv_heads;
  const float scale = p.sm_scale_log2;

  const int L = p.seq_lens[b];
  const int tail_len = HAS_TAIL ? L % G : 0;
  const int Lp = L - tail_len;
  const int units = (Lp + T::kUnit - 1) / T::kUnit;
  const int u_begin = split * p.units_per_split;
  // The last split takes whatever remains, so a plan made before the cache grew stays correct.
  const int u_end = split == p.num_splits - 1 ? units : min(u_begin + p.units_per_split, units);

  // ---- the query heads of this KV head in shared memory, bf16 and fp32 (rows >= ratio are zero).
  __nv_bfloat16* sq = reinterpret_cast<__nv_bfloat16*>(smem + S::kQ);
  float2* sqf = reinterpret_cast<float2*>(smem + S::kQf);
  {
    const uint32_t* qsrc = reinterpret_cast<const uint32_t*>(p.q + ((size_t)b * p.num_q_heads + h * ratio) * D);
    uint32_t* qdst = reinterpret_cast<uint32_t*>(sq);
    for (int i = threadIdx.x; i < T::kMaxRatio * D / 2; i += NW * 32) {
      const uint32_t x = i < ratio * D / 2 ? qsrc[i] : 0u;
      qdst[i] = x;
      sqf[(i / (D / 2)) * (S::kQfRow / 2) + i % (D / 2)] = unpack_bf16x2(x);
    }
  }
  // Lane (r, t4) holds head r's channels 2*t4 + 8j + {0, 1}: the B fragment of S^T = K Q^T.
  auto q_pair = [&](int j) -> uint32_t { return *reinterpret_cast<const uint32_t*>(sq + r * D + 2 * t4 + 8 * j); };
  auto q_pair_f32 = [&](int j) -> float2 { return sqf[r * (S::kQfRow / 2) + t4 + 4 * j]; };
  // Per-head sums that the folds need, for this lane's two accumulator heads 2*t4 + {0,1}.
  auto to_acc_heads = [&](float per_row_head, float& h0, float& h1) {
    h0 = __shfl_sync(0xffffffffu, per_row_head, (2 * t4) * 4);
    h1 = __shfl_sync(0xffffffffu, per_row_head, (2 * t4 + 1) * 4);
  };

  // Channel-wise K runs its product in fp16, folded or (the ablation) dequantized alike, so
  // that the ablation differs from the fold in folding alone.
  constexpr bool F16K = KCH;
  // The largest |q| of this KV head's query heads (for the fold's fp16 prescale).
  float maxq = 0.f;
  auto reduce_maxq = [&]() {
#pragma unroll
    for (int j = 0; j < NJ; ++j) {
      const float2 q2 = q_pair_f32(j);
      maxq = fmaxf(maxq, fmaxf(fabsf(q2.x), fabsf(q2.y)));
    }
#pragma unroll
    for (int m = 1; m < 32; m *= 2) maxq = fmaxf(maxq, __shfl_xor_sync(0xffffffffu, maxq, m));
  };

  // ---- per-warp staging ring and fold tables.
  uint8_t* wsmem = smem + warp * T::kStages * T::kStageBytes;
  float2* ktab = reinterpret_cast<float2*>(smem + S::kTables + warp * T::kTableBytes);
  float2* vtab = ktab + T::kKTable;
  uint64_t* wbar = reinterpret_cast<uint64_t*>(smem + S::kBarriers) + warp * T::kStages;
  if constexpr (FOSCAR_BULK) {
    if (lane < T::kStages) mbar_init(wbar + lane, 1);
    mbar_init_fence();
  }
  __syncthreads();  // q is in place; every warp's barriers are initialised
  if constexpr (F16K && !DEQ) reduce_maxq();

  // K operand. Token-wise K (and the ablation): q / f, exact in bf16, fixed for the run; the
  // softmax scale goes into the epilogue constants. Channel-wise K: q * s * scale / f, rebuilt
  // per token group from the fold table.
  uint32_t qb[NQB][NJ];
  float kbias[NQB][2];
  float kq[GD][2], kb128[GD][2];  // token-wise K: per group, scale * sum q and scale * 128 sum q / f
  if constexpr (!KCH || DEQ) {
#pragma unroll
    for (int j = 0; j < NJ; ++j) {
      const float2 q2 = q_pair_f32(j);
      const float inv_f = DEQ ? 1.0f : 1.0f / radix_factor<BITS>(j % P);
      qb[0][j] = F16K ? pack_f16x2(q2.x, q2.y) : pack_bf16x2(q2.x * inv_f, q2.y * inv_f);
    }
    if constexpr (!KCH) {
#pragma unroll
      for (int g = 0; g < GD; ++g) {
        float qs = 0.f, bs = 0.f;
#pragma unroll
        for (int j = g * G / 8; j < (g + 1) * G / 8; ++j) {
          const float2 q2 = q_pair_f32(j), b2 = unpack_bf16x2(qb[0][j]);
          qs += q2.x + q2.y;
          bs += b2.x + b2.y;
        }
        to_acc_heads(warp_sum_quad(qs) * scale, kq[g][0], kq[g][1]);
        to_acc_heads(warp_sum_quad(bs) * (kBias * scale), kb128[g][0], kb128[g][1]);
      }
    }
  }
  // Channel-wise K, folded, in fp16. The warp's lanes turn the group rows' (s, z) into the
  // table (s * scale * 2^e / f, f z / s - 1024), 2^e chosen per group so that max |q~| sits in
  // [2^13, 2^14); then each lane builds its operand q~ = q * s * scale * 2^e / f and the bias
  // sum_d q~_d (f z_d / s_d - 1024): the offset rides on the same rounded q~ as the codes, so
  // each channel carries one rounding and the score error stays centred. Scores come out
  // times 2^e; kq_inv[gq] = 2^-e undoes it inside the softmax.
  float kq_inv[NQB];
  auto rebuild_k = [&](const __half2* gp) {
    constexpr int kPerLane = T::kKTable / 32, kPerGroup = D / 32;
    float2 ent[kPerLane > 0 ? kPerLane : 1];
    float smax[NQB];
#pragma unroll
    for (int gq = 0; gq < NQB; ++gq) smax[gq] = 0.f;
#pragma unroll
    for (int n = 0; n < kPerLane; ++n) {
      const int i = lane + 32 * n;
      const float2 sz = __half22float2(gp[i]);
      const float f = radix_factor_f16<BITS>(((i % D) / 8) % P);
      const float sc = sz.x != 0.f ? sz.x : kZeroScaleStandIn;
      ent[n] = make_float2(sc * (scale / f), f * __fdividef(sz.y, sc) - kBiasF16);
      smax[n / kPerGroup] = fmaxf(smax[n / kPerGroup], ent[n].x);
    }
    float factor[NQB];
#pragma unroll
    for (int gq = 0; gq < NQB; ++gq) {
#pragma unroll
      for (int m = 1; m < 32; m *= 2) smax[gq] = fmaxf(smax[gq], __shfl_xor_sync(0xffffffffu, smax[gq], m));
      // 2^(13 - floor(log2(max |q| * max s'))), built from the exponent bits (exact).
      const int ebits = (float_bits(maxq * smax[gq]) >> 23) & 0xff;
      const int fbits = min(max(127 + kQTopExponent + 127 - ebits, 1), 254);
      const bool live = maxq * smax[gq] > 0.f;
      factor[gq] = live ? bits_float(fbits << 23) : 1.f;
      kq_inv[gq] = live ? bits_float((254 - fbits) << 23) : 1.f;
    }
#pragma unroll
    for (int n = 0; n < kPerLane; ++n) {
      ent[n].x *= factor[n / kPerGroup];
      ktab[lane + 32 * n] = ent[n];
    }
    __syncwarp();
#pragma unroll
    for (int gq = 0; gq < NQB; ++gq) {
      float part = 0.f;
#pragma unroll
      for (int j = 0; j < NJ; ++j) {
        const float4 e = *reinterpret_cast<const float4*>(ktab + gq * D + 2 * t4 + 8 * j);
        const float2 q2 = q_pair_f32(j);
        qb[gq][j] = pack_f16x2(q2.x * e.x, q2.y * e.z);
        const float2 b2 = unpack_f16x2(qb[gq][j]);
        part = fmaf(b2.x, e.y, fmaf(b2.y, e.w, part));
      }
      to_acc_heads(warp_sum_quad(part), kbias[gq][0], kbias[gq][1]);
    }
  };
  // Ablation, channel-wise K: per channel pair, s / f and z - 1024 s / f in fp32 (fp16 operands).
  constexpr int NKD = DEQ ? NJ : 1;
  float kds[NKD][2], kdz[NKD][2];
  auto rebuild_k_dequant = [&](const __half2* gp) {
#pragma unroll
    for (int j = 0; j < NKD; ++j) {
      const int c = 2 * t4 + 8 * j;
      const float inv_f = 1.0f / radix_factor_f16<BITS>(j % P);
      const float2 sz0 = __half22float2(gp[c]), sz1 = __half22float2(gp[c + 1]);
      kds[j][0] = sz0.x * inv_f, kds[j][1] = sz1.x * inv_f;
      kdz[j][0] = sz0.y - kBiasF16 * kds[j][0], kdz[j][1] = sz1.y - kBiasF16 * kds[j][1];
    }
  };
  // Token-wise V: the chunk's (s, z) become (s, z / s), one entry per token and group.
  auto build_v_table = [&](const __half2* vp) {
#pragma unroll
    for (int i = lane; i < T::kVTable; i += 32) {
      const float2 sz = __half22float2(vp[i]);
      const float sc = sz.x != 0.f ? sz.x : kZeroScaleStandIn;
      vtab[i] = make_float2(sc, __fdividef(sz.y, sc));
    }
  };

  // ---- running state: O^T accumulators (channels 16mt + r (+8), heads 2*t4 + {0,1}), kept
  // as plain attention output. The biased, scale-free MMA results land in `raw` first and are
  // folded into o every kFlushChunks chunks (token-wise V) or per token group (channel-wise
  // V): a short span keeps the 128 bias from eating the accumulation's precision.
  float o[NMT][4];
  float raw[RAW ? NMT : 1][4];
#pragma unroll
  for (int mt = 0; mt < NMT; ++mt)
#pragma unroll
    for (int e = 0; e < 4; ++e) o[mt][e] = 0.f, raw[RAW ? mt : 0][e] = 0.f;
  float m_run[2] = {kNegInf, kNegInf}, l_part[2] = {0.f, 0.f};
  float vps[GD][2], vpz[GD][2];  // token-wise V: sums of rounded p~ and of p~ z / s since the flush
#pragma unroll
  for (int g = 0; g < GD; ++g) vps[g][0] = vps[g][1] = vpz[g][0] = vpz[g][1] = 0.f;
  float gps[2] = {0.f, 0.f};     // channel-wise V: sum of rounded p in the open token group

  // Channel-wise V: the token group closes; fold its scale and offset into o.
  auto flush_v_channel = [&](const __half2* gp) {
    const float ps0 = warp_sum_rows(gps[0]), ps1 = warp_sum_rows(gps[1]);
#pragma unroll
    for (int mt = 0; mt < NMT; ++mt)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int c = 16 * mt + r + 8 * half;
        const float2 sz = __half22float2(gp[c]);
        const float sf = sz.x / radix_factor<BITS>((2 * mt + half) % P);
        o[mt][2 * half] += sf * (raw[mt][2 * half] - kBias * ps0) + sz.y * ps0;
        o[mt][2 * half + 1] += sf * (raw[mt][2 * half + 1] - kBias * ps1) + sz.y * ps1;
        raw[mt][2 * half] = raw[mt][2 * half + 1] = 0.f;
      }
    gps[0] = gps[1] = 0.f;
  };
  // Token-wise V, every kFlushChunks chunks: cancel the bias, divide out radix factors, add offsets.
  auto flush_v_token = [&]() {
    float add[GD][2];
#pragma unroll
    for (int g = 0; g < GD; ++g)
#pragma unroll
      for (int hd = 0; hd < 2; ++hd) {
        vps[g][hd] = warp_sum_rows(vps[g][hd]);
        add[g][hd] = warp_sum_rows(vpz[g][hd]);
        vpz[g][hd] = 0.f;
      }
#pragma unroll
    for (int mt = 0; mt < NMT; ++mt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int g = (16 * mt) / G;
        const float inv_f = 1.0f / radix_factor<BITS>((2 * mt + (e >> 1)) % P);
        o[mt][e] += fmaf(raw[mt][e], inv_f, fmaf(-kBias * inv_f, vps[g][e & 1], add[g][e & 1]));
        raw[mt][e] = 0.f;
      }
#pragma unroll
    for (int g = 0; g < GD; ++g) vps[g][0] = vps[g][1] = 0.f;
  };

  // ---- chunk schedule: warp w takes units u_begin + w, + NW, ...; each unit is whole groups.
  auto chunk_token = [&](int n) {
    const int u = u_begin + warp + (n / T::kChunksPerUnit) * NW;
    return u < u_end ? u * T::kUnit + (n % T::kChunksPerUnit) * kChunk : Lp;
  };
  const int32_t* page_row = p.page_table + (size_t)b * p.max_pages;
  constexpr int CPS = T::kChunksPerStage;
  // Stages the chunks n * CPS .. n * CPS + CPS - 1 of this warp (consecutive tokens of a page).
  auto issue = [&](int n, int stage) {
    const int tok0 = chunk_token(n * CPS);
    if (tok0 >= Lp) return;
    // Power-of-two pages (the usual case) skip the integer division.
    const int lpage = p.page_shift >= 0 ? tok0 >> p.page_shift : tok0 / p.page_size;
    const unsigned long long page = static_cast<unsigned>(page_row[lpage]);
    const int tip = tok0 - lpage * p.page_size;
    uint8_t* st = wsmem + stage * T::kStageBytes;
    // Byte offsets: the page, this head's slice of it (pages hold every head: docs/FORMAT.md),
    // the chunk's first tile; parameters from the chunk's first token (token-wise) or its group.
    const unsigned long long code_off =
        page * p.code_page_bytes + (unsigned)(h * p.code_head_bytes + (tip / 16) * (WPT * 4));
    const unsigned long long param_off =
        page * p.param_page_bytes + (unsigned)(h * p.param_head_bytes);
    const uint8_t* kc_src = reinterpret_cast<const uint8_t*>(p.k_codes) + code_off;
    const uint8_t* vc_src = reinterpret_cast<const uint8_t*>(p.v_codes) + code_off;
    const uint8_t* kp_src =
        reinterpret_cast<const uint8_t*>(p.k_params) + param_off + (KCH ? (tip / G) * D * 4 : tip * GD * 4);
    const uint8_t* vp_src =
        reinterpret_cast<const uint8_t*>(p.v_params) + param_off + (VCH ? (tip / G) * D * 4 : tip * GD * 4);
    constexpr int kKParamBytes = (KCH ? T::kParamsPerChunk : CPS * kChunk * GD) * 4;
    constexpr int kVParamBytes = (VCH ? T::kParamsPerChunk : CPS * kChunk * GD) * 4;
    constexpr int kCodes = CPS * T::kCodeBytes;  // per tensor
    // A channel-wise group row is read where the group starts (K: the operand rebuild) or
    // ends (V: the flush); when a group spans two stages the other stage skips the copy.
    const bool k_params = !KCH || tip % G == 0;
    const bool v_params = !VCH || (tip + CPS * kChunk) % G == 0;
    if constexpr (FOSCAR_BULK) {
      if (lane == 0) {
        uint64_t* bar = wbar + stage;
        mbar_arrive_expect_tx(bar, 2 * kCodes + (k_params ? kKParamBytes : 0) + (v_params ? kVParamBytes : 0));
        bulk_copy_g2s(st, kc_src, kCodes, bar);
        bulk_copy_g2s(st + kCodes, vc_src, kCodes, bar);
        if (k_params) bulk_copy_g2s(st + 2 * kCodes, kp_src, kKParamBytes, bar);
        if (v_params) bulk_copy_g2s(st + 2 * kCodes + T::kParamsPerChunk * 4, vp_src, kVParamBytes, bar);
      }
    } else {
#pragma unroll
      for (int i = lane; i < kCodes / 16; i += 32) {
        cp_async_16(st + 16 * i, kc_src + 16 * i);
        cp_async_16(st + kCodes + 16 * i, vc_src + 16 * i);
      }
      uint8_t* kp_dst = st + 2 * kCodes;
      uint8_t* vp_dst = kp_dst + T::kParamsPerChunk * 4;
      for (int i = lane; k_params && i < kKParamBytes / 16; i += 32) cp_async_16(kp_dst + 16 * i, kp_src + 16 * i);
      for (int i = lane; v_params && i < kVParamBytes / 16; i += 32) cp_async_16(vp_dst + 16 * i, vp_src + 16 * i);
    }
  };

  // ---- online softmax over one chunk of scores (log2 domain). The maximum is reduced across
  // lanes, and the running state rescaled, only when some lane saw a score above the running
  // maximum: after the first chunks of a sequence that is rare.
  // s[t] holds tile t's scores up to the positive factor ts[t] (log2 domain after it).
  float s[NT][4], ts[NT];
  auto softmax_update = [&]() {
    float mx[2];
#pragma unroll
    for (int hd = 0; hd < 2; ++hd) {
      mx[hd] = fmaxf(s[0][hd], s[0][hd + 2]) * ts[0];
#pragma unroll
      for (int t = 1; t < NT; ++t) mx[hd] = fmaxf(mx[hd], fmaxf(s[t][hd], s[t][hd + 2]) * ts[t]);
    }
    if (__any_sync(0xffffffffu, mx[0] > m_run[0] || mx[1] > m_run[1])) {
#pragma unroll
      for (int hd = 0; hd < 2; ++hd) {
        const float m_new = fmaxf(m_run[hd], warp_max_rows(mx[hd]));
        const float alpha = exp2f(m_run[hd] - m_new);  // 0 on the first chunk
        m_run[hd] = m_new;
        l_part[hd] *= alpha;
#pragma unroll
        for (int mt = 0; mt < NMT; ++mt) {
          o[mt][hd] *= alpha;
          o[mt][hd + 2] *= alpha;
          if constexpr (RAW) {
            raw[mt][hd] *= alpha;
            raw[mt][hd + 2] *= alpha;
          }
        }
        if constexpr (VCH && RAW) gps[hd] *= alpha;
        if constexpr (!VCH && RAW) {
#pragma unroll
          for (int g = 0; g < GD; ++g) vps[g][hd] *= alpha, vpz[g][hd] *= alpha;
        }
      }
    }
  };
  // p = 2^(s - m) for tile t, in the accumulator layout; the softmax denominator takes the
  // unrounded p.
  auto probabilities = [&](int t, float (&pr)[4]) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      pr[e] = exp2f(fmaf(s[t][e], ts[t], -m_run[e & 1]));
      l_part[e & 1] += pr[e];
    }
  };

  auto k_operands = [&](const uint32_t (&kw)[T::kWordsPerLane], int kt, uint32_t (&a)[4]) {
    const int jq = (2 * kt) / P;
    switch ((2 * kt) % P) {
#define FOSCAR_K_CASE(K0)                                                            \
  case K0:                                                                           \
    a[0] = inject_as<BITS, F16K, K0>(kw[jq]), a[1] = inject_as<BITS, F16K, K0>(kw[HALFW + jq]);                 \
    a[2] = inject_as<BITS, F16K, K0 + 1>(kw[jq]), a[3] = inject_as<BITS, F16K, K0 + 1>(kw[HALFW + jq]);         \
    break;
      FOSCAR_K_CASE(0)
      FOSCAR_K_CASE(2)
      FOSCAR_K_CASE(4)
      FOSCAR_K_CASE(6)
#undef FOSCAR_K_CASE
    }
    if constexpr (DEQ) {
      a[0] = dequant_f16x2(a[0], kds[2 * kt], kdz[2 * kt]);
      a[1] = dequant_f16x2(a[1], kds[2 * kt], kdz[2 * kt]);
      a[2] = dequant_f16x2(a[2], kds[2 * kt + 1], kdz[2 * kt + 1]);
      a[3] = dequant_f16x2(a[3], kds[2 * kt + 1], kdz[2 * kt + 1]);
    }
  };
  auto v_operands = [&](const uint32_t (&vw)[T::kWordsPerLane], int mt, uint32_t (&a)[4]) {
    const int iq = (2 * mt) / P;
    switch ((2 * mt) % P) {
#define FOSCAR_V_CASE(K0)                                                            \
  case K0:                                                                           \
    a[0] = inject<BITS, K0>(vw[iq]), a[1] = inject<BITS, K0 + 1>(vw[iq]);             \
    a[2] = inject<BITS, K0>(vw[HALFW + iq]), a[3] = inject<BITS, K0 + 1>(vw[HALFW + iq]); \
    break;
      FOSCAR_V_CASE(0)
      FOSCAR_V_CASE(2)
      FOSCAR_V_CASE(4)
      FOSCAR_V_CASE(6)
#undef FOSCAR_V_CASE
    }
  };
  auto load_tile = [&](const uint32_t* src, uint32_t (&w)[T::kWordsPerLane]) {
#pragma unroll
    for (int v = 0; v < T::kWordsPerLane / 4; ++v) {
      const uint4 x = lds128(src + v * 128 + lane * 4);
      w[4 * v] = x.x, w[4 * v + 1] = x.y, w[4 * v + 2] = x.z, w[4 * v + 3] = x.w;
    }
  };

  // ---- main loop over this warp's packed chunks.
#pragma unroll
  for (int st = 0; st < T::kStages - 1; ++st) {
    issue(st, st);
    if constexpr (!FOSCAR_BULK) cp_async_commit();
  }
  for (int n = 0;; ++n) {
    const int tok_chunk = chunk_token(n);
    if (tok_chunk >= Lp) break;
    const int ns = n / CPS, c = n % CPS;  // the chunk's stage trip and its place in the stage
    if (c == 0) {
      if constexpr (FOSCAR_BULK) {
        // The stage refilled now was read in the previous trip: each lane orders its reads
        // before the copy engine's writes, and the warp meets before lane 0 issues.
        fence_proxy_async_smem();
        __syncwarp();
        issue(ns + T::kStages - 1, (ns + T::kStages - 1) % T::kStages);
        mbar_wait(wbar + ns % T::kStages, (ns / T::kStages) & 1);
      } else {
        issue(ns + T::kStages - 1, (ns + T::kStages - 1) % T::kStages);
        cp_async_commit();
        cp_async_wait<T::kStages - 1>();
        __syncwarp();
      }
    }

    const uint8_t* st = wsmem + (ns % T::kStages) * T::kStageBytes;
    const uint32_t* sk = reinterpret_cast<const uint32_t*>(st + c * T::kCodeBytes);
    const uint32_t* sv = reinterpret_cast<const uint32_t*>(st + (CPS + c) * T::kCodeBytes);
    // Group rows (channel-wise) serve the whole stage; token-wise runs are per chunk.
    const __half2* skp = reinterpret_cast<const __half2*>(st + 2 * CPS * T::kCodeBytes) + (KCH ? 0 : c * kChunk * GD);
    const __half2* svp =
        reinterpret_cast<const __half2*>(st + 2 * CPS * T::kCodeBytes) + T::kParamsPerChunk + (VCH ? 0 : c * kChunk * GD);
    // Channel-wise runs start at the group holding the chunk's first token; with G >= 64 a
    // chunk never crosses a group, with G = 32 it holds two whole groups.
    const bool group_start = tok_chunk % G == 0;
    // Only a chunk that crosses the end of the packed tokens needs masks (warp-uniform).
    const bool partial = tok_chunk + kChunk > Lp;
    // Token-wise V flushes after every kFlushChunks chunks and after the warp's last one.
    const bool flush_now = (n + 1) % T::kFlushChunks == 0 || chunk_token(n + 1) >= Lp;

    if constexpr (KCH && !DEQ) {
      if (group_start) rebuild_k(skp);
    }
    if constexpr (!VCH && !DEQ) build_v_table(svp);

    // -------- scores S^T = K Q^T for the chunk's tiles, in the log2 domain
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      uint32_t kw[T::kWordsPerLane];
      load_tile(sk + t * WPT, kw);
      if constexpr (DEQ) {
        if ((16 * t) % G == 0 && ((tok_chunk + 16 * t) % G == 0)) rebuild_k_dequant(skp + ((16 * t) / G) * D);
      }
      if constexpr (KCH) {
        const int gq = NQB == 1 ? 0 : (16 * t) / G;
        float acc[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[e] = DEQ ? 0.f : kbias[gq][e & 1];  // the bias seeds the chain
#pragma unroll
        for (int kt = 0; kt < T::kNKT; ++kt) {
          uint32_t a[4];
          k_operands(kw, kt, a);
          if constexpr (F16K) mma_f16_16816(acc, a[0], a[1], a[2], a[3], qb[gq][2 * kt], qb[gq][2 * kt + 1]);
          else mma_bf16_16816(acc, a[0], a[1], a[2], a[3], qb[gq][2 * kt], qb[gq][2 * kt + 1]);
        }
#pragma unroll
        for (int e = 0; e < 4; ++e) s[t][e] = acc[e];
        ts[t] = DEQ ? scale : kq_inv[gq];
      } else {
        // K token-wise: one accumulator per channel group, scaled per token before adding.
        ts[t] = 1.f;
#pragma unroll
        for (int e = 0; e < 4; ++e) s[t][e] = 0.f;
#pragma unroll
        for (int g = 0; g < GD; ++g) {
          float acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
          for (int kt = g * G / 16; kt < (g + 1) * G / 16; ++kt) {
            uint32_t a[4];
            k_operands(kw, kt, a);
            mma_bf16_16816(acc, a[0], a[1], a[2], a[3], qb[0][2 * kt], qb[0][2 * kt + 1]);
          }
#pragma unroll
          for (int hr = 0; hr < 2; ++hr) {
            const float2 sz = __half22float2(skp[(16 * t + r + 8 * hr) * GD + g]);
            const float sx = sz.x * scale;
#pragma unroll
            for (int hd = 0; hd < 2; ++hd) {
              const int e = 2 * hr + hd;
              s[t][e] += fmaf(sx, acc[e], fmaf(sz.y, kq[g][hd], -sz.x * kb128[g][hd]));
            }
          }
        }
      }
    }
    if (partial) {
#pragma unroll
      for (int t = 0; t < NT; ++t)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          if (tok_chunk + 16 * t + r + 8 * (e >> 1) >= Lp) s[t][e] = kNegInf;
    }

    softmax_update();
    if constexpr (!VCH && !DEQ) __syncwarp();  // the V table is complete

    // -------- O^T += V^T P^T, tile by tile
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      float pr[4];
      probabilities(t, pr);
      uint32_t vw[T::kWordsPerLane];
      load_tile(sv + t * WPT, vw);
      // B operands, one per channel group for token-wise V (p~ = p * s per group).
      constexpr int NB = (!VCH && !DEQ) ? GD : 1;
      uint32_t b0[NB], b1[NB];
#pragma unroll
      for (int g = 0; g < NB; ++g) {
        uint32_t lo, hi;
        if constexpr (!VCH && !DEQ) {
          const float2 e0 = vtab[(16 * t + r) * GD + g], e1 = vtab[(16 * t + r + 8) * GD + g];
          lo = pack_bf16x2(pr[0] * e0.x, pr[1] * e0.x);
          hi = pack_bf16x2(pr[2] * e1.x, pr[3] * e1.x);
          // Offsets ride on the same rounded p~ as the codes (p~ z / s), so each token's value
          // is weighted by one rounded p~: a centred error.
          const float2 fl = unpack_bf16x2(lo), fh = unpack_bf16x2(hi);
          vps[g][0] += fl.x + fh.x;
          vps[g][1] += fl.y + fh.y;
          vpz[g][0] = fmaf(fl.x, e0.y, fmaf(fh.x, e1.y, vpz[g][0]));
          vpz[g][1] = fmaf(fl.y, e0.y, fmaf(fh.y, e1.y, vpz[g][1]));
        } else {
          lo = pack_bf16x2(pr[0], pr[1]);
          hi = pack_bf16x2(pr[2], pr[3]);
          if constexpr (VCH && !DEQ) {
            const float2 fl = unpack_bf16x2(lo), fh = unpack_bf16x2(hi);
            gps[0] += fl.x + fh.x;
            gps[1] += fl.y + fh.y;
          }
        }
        b0[g] = movmatrix_trans(lo);
        b1[g] = movmatrix_trans(hi);
      }
      // Ablation, token-wise V: s / f and z - 128 s / f of this lane's A columns (token pairs).
      constexpr int NF = radix_classes<BITS>();  // distinct radix factors
      float vds[DEQ ? 2 * GD * NF : 1][2], vdz[DEQ ? 2 * GD * NF : 1][2];
      if constexpr (DEQ) {
#pragma unroll
        for (int tau = 0; tau < 2; ++tau)
#pragma unroll
          for (int g = 0; g < GD; ++g) {
            const int tt = 16 * t + 2 * t4 + 8 * tau;
            const float2 s0 = __half22float2(svp[tt * GD + g]), s1 = __half22float2(svp[(tt + 1) * GD + g]);
#pragma unroll
            for (int fc = 0; fc < NF; ++fc) {
              const float inv_f = 1.0f / class_factor<BITS>(fc);
              const int i = (tau * GD + g) * NF + fc;
              vds[i][0] = s0.x * inv_f, vds[i][1] = s1.x * inv_f;
              vdz[i][0] = s0.y - kBias * vds[i][0], vdz[i][1] = s1.y - kBias * vds[i][1];
            }
          }
      }
#pragma unroll
      for (int mt = 0; mt < NMT; ++mt) {
        uint32_t a[4];
        v_operands(vw, mt, a);
        const int g = (16 * mt) / G;
        if constexpr (DEQ) {
          const int fc0 = radix_class<BITS>((2 * mt) % P), fc1 = radix_class<BITS>((2 * mt + 1) % P);
          a[0] = dequant_bf16x2(a[0], vds[g * NF + fc0], vdz[g * NF + fc0]);
          a[1] = dequant_bf16x2(a[1], vds[g * NF + fc1], vdz[g * NF + fc1]);
          a[2] = dequant_bf16x2(a[2], vds[(GD + g) * NF + fc0], vdz[(GD + g) * NF + fc0]);
          a[3] = dequant_bf16x2(a[3], vds[(GD + g) * NF + fc1], vdz[(GD + g) * NF + fc1]);
          mma_bf16_16816(o[mt], a[0], a[1], a[2], a[3], b0[0], b1[0]);
        } else {
          mma_bf16_16816(raw[mt], a[0], a[1], a[2], a[3], b0[NB == 1 ? 0 : g], b1[NB == 1 ? 0 : g]);
        }
      }
      if constexpr (VCH && RAW && G == 32) {
        if (t % 2 == 1) flush_v_channel(svp + (t / 2) * D);  // two groups per chunk
      }
    }
    if constexpr (VCH && RAW && G >= kChunk) {
      if ((tok_chunk + kChunk) % G == 0) flush_v_channel(svp);
    }
    if constexpr (!VCH && RAW) {
      if (flush_now) flush_v_token();
    }
    __syncwarp();
  }
  if constexpr (!FOSCAR_BULK) cp_async_wait<0>();

  // ---- the BF16 tail of incomplete channel-wise groups: split 0, last warp.
  if constexpr (HAS_TAIL) {
    if (split == 0 && warp == NW - 1 && tail_len > 0) {
      const size_t tbase = ((size_t)b * p.num_kv_heads + h) * G * D;
      for (int c0 = 0; c0 < tail_len; c0 += kChunk) {
#pragma unroll
        for (int t = 0; t < NT; ++t) {
          float acc[4] = {0.f, 0.f, 0.f, 0.f};
          const int row0 = c0 + 16 * t + r, row1 = row0 + 8;
#pragma unroll
          for (int kt = 0; kt < T::kNKT; ++kt) {
            const int ch = 16 * kt + 2 * t4;
            auto ld = [&](int row, int c) -> uint32_t {
              return row < tail_len ? *reinterpret_cast<const uint32_t*>(p.k_tail + tbase + (size_t)row * D + c) : 0u;
            };
            mma_bf16_16816(acc, ld(row0, ch), ld(row1, ch), ld(row0, ch + 8), ld(row1, ch + 8), q_pair(2 * kt),
                           q_pair(2 * kt + 1));
          }
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int row = c0 + 16 * t + r + 8 * (e >> 1);
            s[t][e] = row < tail_len ? acc[e] : kNegInf;
          }
          ts[t] = scale;
        }
        softmax_update();
#pragma unroll
        for (int t = 0; t < NT; ++t) {
          float pr[4];
          probabilities(t, pr);
          const uint32_t b0 = movmatrix_trans(pack_bf16x2(pr[0], pr[1]));
          const uint32_t b1 = movmatrix_trans(pack_bf16x2(pr[2], pr[3]));
          const int tk = c0 + 16 * t + 2 * t4;
#pragma unroll 2  // a cold path (one warp, < G tokens): o may live in local memory here
          for (int mt = 0; mt < NMT; ++mt) {
            // The folds' epilogues have run, so o is plain attention output here.
            auto ld = [&](int tok, int c) -> uint32_t {
              const __nv_bfloat16 zero = __float2bfloat16(0.f);
              __nv_bfloat162 v2;
              v2.x = tok < tail_len ? p.v_tail[tbase + (size_t)tok * D + c] : zero;
              v2.y = tok + 1 < tail_len ? p.v_tail[tbase + (size_t)(tok + 1) * D + c] : zero;
              return *reinterpret_cast<uint32_t*>(&v2);
            };
            const int ch = 16 * mt + r;
            mma_bf16_16816(o[mt], ld(tk, ch), ld(tk, ch + 8), ld(tk + 8, ch), ld(tk + 8, ch + 8), b0, b1);
          }
        }
      }
    }
  }

  // ---- combine the warps of this CTA through shared memory.
  const float l0 = warp_sum_rows(l_part[0]), l1 = warp_sum_rows(l_part[1]);
  __syncthreads();  // every warp is done with its staging buffers
  float* so = reinterpret_cast<float*>(smem);           // [NW][8 heads][D]
  float* sml = so + NW * 8 * D;                         // [NW][8 heads][2]
#pragma unroll
  for (int mt = 0; mt < NMT; ++mt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int c = 16 * mt + r + 8 * (e >> 1), hd = 2 * t4 + (e & 1);
      so[(warp * 8 + hd) * D + c] = o[mt][e];
    }
  if (r == 0) {
    sml[(warp * 8 + 2 * t4) * 2] = m_run[0];
    sml[(warp * 8 + 2 * t4) * 2 + 1] = l0;
    sml[(warp * 8 + 2 * t4 + 1) * 2] = m_run[1];
    sml[(warp * 8 + 2 * t4 + 1) * 2 + 1] = l1;
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < ratio * D; idx += NW * 32) {
    const int hd = idx / D, c = idx % D;
    float mx = kNegInf;
#pragma unroll
    for (int w = 0; w < NW; ++w) mx = fmaxf(mx, sml[(w * 8 + hd) * 2]);
    float acc = 0.f, l = 0.f;
    if (mx != kNegInf) {
#pragma unroll
      for (int w = 0; w < NW; ++w) {
        const float wgt = exp2f(sml[(w * 8 + hd) * 2] - mx);
        acc += wgt * so[(w * 8 + hd) * D + c];
        l += wgt * sml[(w * 8 + hd) * 2 + 1];
      }
    }
    const int hq = h * ratio + hd;
    if (p.num_splits == 1) {
      p.o[((size_t)b * p.num_q_heads + hq) * D + c] = __float2bfloat16(acc / l);
    } else {
      const size_t row = ((size_t)b * p.num_q_heads + hq) * p.num_splits + split;
      p.ws_o[row * D + c] = acc;
      if (c == 0) {
        p.ws_ml[row * 2] = mx;
        p.ws_ml[row * 2 + 1] = l;
      }
    }
  }
  if (p.num_splits == 1) return;

  // ---- split-KV: the last split of this (sequence, KV head) to finish merges them all,
  // out = sum_s w_s o_s / sum_s w_s l_s with w_s = 2^(m_s - M), in the same launch. Each CTA
  // makes its partials visible before it counts itself; the one that counts last reads them.
  int* last = reinterpret_cast<int*>(sml + NW * 8 * 2);
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    int* count = p.ws_count + (size_t)b * p.num_kv_heads + h;
    const int done = atomicAdd(count, 1);
    *last = done == p.num_splits - 1;
    if (*last) *count = 0;  // every split has counted: ready for the next launch
  }
  __syncthreads();
  if (!*last) return;
  __threadfence();
  for (int idx = threadIdx.x; idx < ratio * D; idx += NW * 32) {
    const int hd = idx / D, c = idx % D;
    const size_t row0 = ((size_t)b * p.num_q_heads + h * ratio + hd) * p.num_splits;
    float mx = kNegInf;
    for (int sp = 0; sp < p.num_splits; ++sp) mx = fmaxf(mx, __ldcg(p.ws_ml + (row0 + sp) * 2));
    float acc = 0.f, l = 0.f;
    for (int sp = 0; sp < p.num_splits; ++sp) {
      const float m = __ldcg(p.ws_ml + (row0 + sp) * 2);
      if (m == kNegInf) continue;  // a split with no tokens of this sequence
      const float wgt = exp2f(m - mx);
      acc += wgt * __ldcg(p.ws_o + (row0 + sp) * D + c);
      l += wgt * __ldcg(p.ws_ml + (row0 + sp) * 2 + 1);
    }
    p.o[((size_t)b * p.num_q_heads + h * ratio + hd) * D + c] = __float2bfloat16(acc / l);
  }
}

}  // namespace foscar
