// FOSCAR split-KV decode attention over a 2- or 4-bit paged KV cache (docs/FORMAT.md).
//
// One CTA handles one (sequence, KV head, split); each warp streams its own chunks of 64
// tokens through a cp.async shared-memory pipeline and keeps its own online-softmax state.
// Both products put KV on the M side of mma.m16n8k16 so the packed codes become A operands
// in registers by mantissa injection, and the query heads of the KV head sit on N = 8:
//   S^T = K Q^T   (tokens x heads),   O^T = V^T P^T   (channels x heads).
// Scales and offsets are folded, never applied per element (FOSCAR.md section 3):
//   K token-wise   : accumulator fold per channel group (score += s * acc_g + const_g)
//   K channel-wise : operand fold, Q~ = q * s / f rebuilt once per token group
//   V token-wise   : operand fold, P~ = p * s; offsets and the injection bias folded into
//                    the output once per chunk
//   V channel-wise : accumulator fold, a raw accumulator flushed at each token-group end
// F16 picks the Tensor Core operand type (bf16 or fp16; foscar_common.cuh says why both).
// DEQ = true builds the ablation: every element is dequantized (s * c + z) before the mma.
#pragma once

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
  int batch, num_q_heads, num_kv_heads;
  int page_size, max_pages;
  int num_splits, units_per_split;
  float sm_scale_log2;          // softmax scale times log2(e)
};

constexpr int kChunk = 64;       // tokens a warp stages and scores at once
constexpr float kNegInf = -INFINITY;

template <int BITS, int D, int G, bool KCH, bool VCH, bool DEQ, bool F16>
struct DecodeTraits {
  static constexpr int kP = 16 / BITS;                  // code positions per 16-bit half
  static constexpr int kWordsPerLane = D * BITS / 64;   // words per lane per 16-token tile
  static constexpr int kHalfW = kWordsPerLane / 2;
  static constexpr int kWordsPerTile = kWordsPerLane * 32;
  static constexpr int kTiles = kChunk / 16;
  static constexpr int kUnit = G > kChunk ? G : kChunk;  // split / warp granularity (tokens)
  static constexpr int kChunksPerUnit = kUnit / kChunk;
  static constexpr int kNJ = D / 8;                      // channel blocks per lane (K side)
  static constexpr int kNKT = D / 16;                    // k-steps of S^T = K Q^T
  static constexpr int kNMT = D / 16;                    // m-tiles of O^T = V^T P^T
  static constexpr int kGroupsD = D / G;                 // channel groups (token-wise modes)
  // Parameters one chunk stages, in half2: token-wise 64 * D / G, channel-wise one group row
  // per group the chunk touches.
  static constexpr int kParamsPerChunk = (G >= kChunk ? 1 : kChunk / G) * D;
  static constexpr int kCodeBytes = kTiles * kWordsPerTile * 4;
  static constexpr int kStageBytes = 2 * kCodeBytes + 2 * kParamsPerChunk * 4;
  static constexpr int kStages = BITS == 4 ? 2 : 3;
  static constexpr int kWarps = 8;
  static_assert(kWordsPerLane % 4 == 0, "each lane loads whole 16-byte vectors");
  static_assert(kParamsPerChunk == kChunk * D / G || G >= kChunk, "param run size");
};

template <int BITS, int D, int G, bool KCH, bool VCH, bool DEQ, bool F16>
constexpr int decode_smem_bytes() {
  using T = DecodeTraits<BITS, D, G, KCH, VCH, DEQ, F16>;
  const int staging = T::kWarps * T::kStages * T::kStageBytes;
  const int combine = T::kWarps * 8 * (D + 2) * 4;
  return staging > combine ? staging : combine;
}

template <int BITS, int D, int G, bool KCH, bool VCH, bool DEQ, bool F16>
__global__ void __launch_bounds__(256, 1) foscar_decode_kernel(const __grid_constant__ DecodeParams p) {
  using T = DecodeTraits<BITS, D, G, KCH, VCH, DEQ, F16>;
  constexpr int P = T::kP, HALFW = T::kHalfW, WPT = T::kWordsPerTile, NT = T::kTiles;
  constexpr int NJ = T::kNJ, NMT = T::kNMT, GD = T::kGroupsD, NW = T::kWarps;
  constexpr bool HAS_TAIL = KCH || VCH;
  using Op = Operand<F16>;

  extern __shared__ __align__(16) uint8_t smem[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int r = lane >> 2, t4 = lane & 3;
  const int split = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int ratio = p.num_q_heads / p.num_kv_heads;

  const int L = p.seq_lens[b];
  const int tail_len = HAS_TAIL ? L % G : 0;
  const int Lp = L - tail_len;
  const int units = (Lp + T::kUnit - 1) / T::kUnit;
  const int u_begin = split * p.units_per_split;
  // The last split takes whatever remains, so a plan made before the cache grew stays correct.
  const int u_end = split == p.num_splits - 1 ? units : min(u_begin + p.units_per_split, units);

  // ---- query: B fragment of S^T = K Q^T, head r of this KV head, channels 2*t4 + 8j + {0,1}.
  uint32_t qraw[NJ];
  {
    const bool live = r < ratio;
    const __nv_bfloat16* qp = p.q + ((size_t)b * p.num_q_heads + h * ratio + (live ? r : 0)) * D;
#pragma unroll
    for (int j = 0; j < NJ; ++j) {
      qraw[j] = live ? *reinterpret_cast<const uint32_t*>(qp + 2 * t4 + 8 * j) : 0u;
    }
  }
  // Per-head sums that the folds need, for this lane's two accumulator heads 2*t4 + {0,1}.
  auto to_acc_heads = [&](float per_row_head, float& h0, float& h1) {
    h0 = __shfl_sync(0xffffffffu, per_row_head, (2 * t4) * 4);
    h1 = __shfl_sync(0xffffffffu, per_row_head, (2 * t4 + 1) * 4);
  };

  // K operand. Token-wise K (and the ablation): b = q / f, exact in bf16, fixed for the run.
  // Channel-wise K: b = q * s / f, rebuilt per token group; a chunk of 64 tokens spans NQB
  // groups (2 when G = 32), each with its own operand and bias.
  constexpr int NQB = (KCH && !DEQ && G < kChunk) ? kChunk / G : 1;
  uint32_t qb[NQB][NJ];
  float kbias[NQB][2];
  float kq[GD][2], kb128[GD][2];
  if constexpr (!KCH || DEQ) {
#pragma unroll
    for (int j = 0; j < NJ; ++j) {
      const float2 q2 = unpack_bf16x2(qraw[j]);
      const float inv_f = DEQ ? 1.0f : 1.0f / radix_factor<BITS, F16>(j % P);
      qb[0][j] = Op::pack(q2.x * inv_f, q2.y * inv_f);
    }
    if constexpr (!KCH) {
#pragma unroll
      for (int g = 0; g < GD; ++g) {
        float qs = 0.f, bs = 0.f;
#pragma unroll
        for (int j = g * G / 8; j < (g + 1) * G / 8; ++j) {
          const float2 q2 = unpack_bf16x2(qraw[j]), b2 = Op::unpack(qb[0][j]);
          qs += q2.x + q2.y;
          bs += b2.x + b2.y;
        }
        to_acc_heads(warp_sum_quad(qs), kq[g][0], kq[g][1]);
        to_acc_heads(warp_sum_quad(bs) * Op::kBias, kb128[g][0], kb128[g][1]);
      }
    }
  }
  // Channel-wise K, folded: q~ = q * s / f; bias = sum_d q~_d (f z / s - 128) (the offset
  // rides on the same rounded q~ as the codes, so each channel carries one rounding and the
  // score error stays centred; a channel with s = 0 holds only z and takes the exact q).
  auto rebuild_k = [&](const __half2* gp, uint32_t (&qbg)[NJ], float (&bias)[2]) {
    float part = 0.f;
#pragma unroll
    for (int j = 0; j < NJ; ++j) {
      const int c = 2 * t4 + 8 * j;
      const float2 sz0 = __half22float2(gp[c]), sz1 = __half22float2(gp[c + 1]);
      const float2 q2 = unpack_bf16x2(qraw[j]);
      const float f = radix_factor<BITS, F16>(j % P), inv_f = 1.0f / f;
      qbg[j] = Op::pack(q2.x * sz0.x * inv_f, q2.y * sz1.x * inv_f);
      const float2 b2 = Op::unpack(qbg[j]);
      part += (sz0.x != 0.f ? b2.x * (f * __fdividef(sz0.y, sz0.x)) : q2.x * sz0.y) +
              (sz1.x != 0.f ? b2.y * (f * __fdividef(sz1.y, sz1.x)) : q2.y * sz1.y) -
              Op::kBias * (b2.x + b2.y);
    }
    to_acc_heads(warp_sum_quad(part), bias[0], bias[1]);
  };
  // Ablation, channel-wise K: per channel pair, s / f and z - 128 s / f in fp32.
  constexpr int NKD = DEQ ? NJ : 1;
  float kds[NKD][2], kdz[NKD][2];
  auto rebuild_k_dequant = [&](const __half2* gp) {
#pragma unroll
    for (int j = 0; j < NKD; ++j) {
      const int c = 2 * t4 + 8 * j;
      const float inv_f = 1.0f / radix_factor<BITS, F16>(j % P);
      const float2 sz0 = __half22float2(gp[c]), sz1 = __half22float2(gp[c + 1]);
      kds[j][0] = sz0.x * inv_f, kds[j][1] = sz1.x * inv_f;
      kdz[j][0] = sz0.y - Op::kBias * kds[j][0], kdz[j][1] = sz1.y - Op::kBias * kds[j][1];
    }
  };

  // ---- running state: O^T accumulators (channels 16mt + r (+8), heads 2*t4 + {0,1}), kept
  // as plain attention output. The biased, scale-free MMA results land in `raw` first and are
  // folded into o once per chunk (token-wise V) or per token group (channel-wise V): a short
  // span keeps the 128 bias from eating fp32 precision over long contexts.
  constexpr bool RAW = !DEQ;
  float o[NMT][4];
  float raw[RAW ? NMT : 1][4];
#pragma unroll
  for (int mt = 0; mt < NMT; ++mt)
#pragma unroll
    for (int e = 0; e < 4; ++e) o[mt][e] = 0.f, raw[RAW ? mt : 0][e] = 0.f;
  float m_run[2] = {kNegInf, kNegInf}, l_part[2] = {0.f, 0.f};
  float vps[GD][2], vpz[GD][2];  // token-wise V: this chunk's sums of rounded p~ and of p^ z
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
        const float sf = sz.x / radix_factor<BITS, F16>((2 * mt + half) % P);
        o[mt][2 * half] += sf * (raw[mt][2 * half] - Op::kBias * ps0) + sz.y * ps0;
        o[mt][2 * half + 1] += sf * (raw[mt][2 * half + 1] - Op::kBias * ps1) + sz.y * ps1;
        raw[mt][2 * half] = raw[mt][2 * half + 1] = 0.f;
      }
    gps[0] = gps[1] = 0.f;
  };
  // Token-wise V: the chunk ends; cancel the bias, divide out radix factors, add offsets.
  auto flush_v_token = [&]() {
#pragma unroll
    for (int g = 0; g < GD; ++g)
#pragma unroll
      for (int hd = 0; hd < 2; ++hd) {
        vps[g][hd] = warp_sum_rows(vps[g][hd]);
        vpz[g][hd] = warp_sum_rows(vpz[g][hd]);
      }
#pragma unroll
    for (int mt = 0; mt < NMT; ++mt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int g = (16 * mt) / G;
        const float inv_f = 1.0f / radix_factor<BITS, F16>((2 * mt + (e >> 1)) % P);
        o[mt][e] += (raw[mt][e] - Op::kBias * vps[g][e & 1]) * inv_f + vpz[g][e & 1];
        raw[mt][e] = 0.f;
      }
  };

  // ---- chunk schedule: warp w takes units u_begin + w, + NW, ...; each unit is whole groups.
  auto chunk_token = [&](int n) {
    const int u = u_begin + warp + (n / T::kChunksPerUnit) * NW;
    return u < u_end ? u * T::kUnit + (n % T::kChunksPerUnit) * kChunk : Lp;
  };
  uint8_t* wsmem = smem + warp * T::kStages * T::kStageBytes;
  auto issue = [&](int n, int stage) {
    const int tok0 = chunk_token(n);
    if (tok0 >= Lp) return;
    const int page = p.page_table[(size_t)b * p.max_pages + tok0 / p.page_size];
    const int tip = tok0 % p.page_size;
    const size_t ph = (size_t)page * p.num_kv_heads + h;
    const size_t code_off = (ph * (p.page_size / 16) + tip / 16) * WPT;
    uint8_t* st = wsmem + stage * T::kStageBytes;
#pragma unroll
    for (int i = lane; i < T::kCodeBytes / 16; i += 32) {
      cp_async_16(st + 16 * i, reinterpret_cast<const uint8_t*>(p.k_codes + code_off) + 16 * i);
      cp_async_16(st + T::kCodeBytes + 16 * i, reinterpret_cast<const uint8_t*>(p.v_codes + code_off) + 16 * i);
    }
    // Parameters: token-wise runs start at the chunk's first token; channel-wise at its group.
    const size_t kpo = ph * (p.page_size * D / G) + (KCH ? (size_t)(tip / G) * D : (size_t)tip * GD);
    const size_t vpo = ph * (p.page_size * D / G) + (VCH ? (size_t)(tip / G) * D : (size_t)tip * GD);
    constexpr int kKParamVec = (KCH ? T::kParamsPerChunk : kChunk * GD) / 4;
    constexpr int kVParamVec = (VCH ? T::kParamsPerChunk : kChunk * GD) / 4;
    uint8_t* kp_dst = st + 2 * T::kCodeBytes;
    uint8_t* vp_dst = kp_dst + T::kParamsPerChunk * 4;
    for (int i = lane; i < kKParamVec; i += 32)
      cp_async_16(kp_dst + 16 * i, reinterpret_cast<const uint8_t*>(p.k_params + kpo) + 16 * i);
    for (int i = lane; i < kVParamVec; i += 32)
      cp_async_16(vp_dst + 16 * i, reinterpret_cast<const uint8_t*>(p.v_params + vpo) + 16 * i);
  };

  // ---- online softmax over one chunk of scores (log2 domain). Rescaling the running state
  // is skipped, warp-uniformly, when no head's maximum grew: after the first chunks of a
  // sequence that is the common case.
  float s[NT][4];
  auto softmax_update = [&](float (&m_new)[2]) {
    bool grew = false;
#pragma unroll
    for (int hd = 0; hd < 2; ++hd) {
      float mx = kNegInf;
#pragma unroll
      for (int t = 0; t < NT; ++t) mx = fmaxf(mx, fmaxf(s[t][hd], s[t][hd + 2]));
      m_new[hd] = fmaxf(m_run[hd], warp_max_rows(mx));
      grew |= m_new[hd] > m_run[hd];
    }
    if (__any_sync(0xffffffffu, grew)) {
#pragma unroll
      for (int hd = 0; hd < 2; ++hd) {
        const float alpha = exp2f(m_run[hd] - m_new[hd]);  // 0 on the first chunk
        l_part[hd] *= alpha;
#pragma unroll
        for (int mt = 0; mt < NMT; ++mt) {
          o[mt][hd] *= alpha;
          o[mt][hd + 2] *= alpha;
          if constexpr (VCH && RAW) {
            raw[mt][hd] *= alpha;
            raw[mt][hd + 2] *= alpha;
          }
        }
        if constexpr (VCH && RAW) gps[hd] *= alpha;
      }
    }
    m_run[0] = m_new[0], m_run[1] = m_new[1];
  };

  // p = 2^(s - m) for tile t, in the accumulator layout; the softmax denominator takes the
  // unrounded p.
  auto probabilities = [&](int t, const float (&m_new)[2], float (&pr)[4]) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      pr[e] = exp2f(s[t][e] - m_new[e & 1]);
      l_part[e & 1] += pr[e];
    }
  };

  // S^T tile = K tile x operand, with the chain of k-steps split in two for latency.
  auto k_operands = [&](const uint32_t (&kw)[T::kWordsPerLane], int kt, uint32_t (&a)[4]) {
    const int jq = (2 * kt) / P;
    switch ((2 * kt) % P) {
#define FOSCAR_K_CASE(K0)                                                     \
  case K0:                                                                      \
    a[0] = inject<BITS, K0, F16>(kw[jq]), a[1] = inject<BITS, K0, F16>(kw[HALFW + jq]);   \
    a[2] = inject<BITS, K0 + 1, F16>(kw[jq]), a[3] = inject<BITS, K0 + 1, F16>(kw[HALFW + jq]); \
    break;
      FOSCAR_K_CASE(0)
      FOSCAR_K_CASE(2)
      FOSCAR_K_CASE(4)
      FOSCAR_K_CASE(6)
#undef FOSCAR_K_CASE
    }
    if constexpr (DEQ) {
      a[0] = Op::dequant(a[0], kds[2 * kt], kdz[2 * kt]);
      a[1] = Op::dequant(a[1], kds[2 * kt], kdz[2 * kt]);
      a[2] = Op::dequant(a[2], kds[2 * kt + 1], kdz[2 * kt + 1]);
      a[3] = Op::dequant(a[3], kds[2 * kt + 1], kdz[2 * kt + 1]);
    }
  };
  auto v_operands = [&](const uint32_t (&vw)[T::kWordsPerLane], int mt, uint32_t (&a)[4]) {
    const int iq = (2 * mt) / P;
    switch ((2 * mt) % P) {
#define FOSCAR_V_CASE(K0)                                                     \
  case K0:                                                                      \
    a[0] = inject<BITS, K0, F16>(vw[iq]), a[1] = inject<BITS, K0 + 1, F16>(vw[iq]);       \
    a[2] = inject<BITS, K0, F16>(vw[HALFW + iq]), a[3] = inject<BITS, K0 + 1, F16>(vw[HALFW + iq]); \
    break;
      FOSCAR_V_CASE(0)
      FOSCAR_V_CASE(2)
      FOSCAR_V_CASE(4)
      FOSCAR_V_CASE(6)
#undef FOSCAR_V_CASE
    }
  };

  // ---- main loop over this warp's packed chunks.
#pragma unroll
  for (int st = 0; st < T::kStages - 1; ++st) {
    issue(st, st);
    cp_async_commit();
  }
  for (int n = 0;; ++n) {
    const int tok_chunk = chunk_token(n);
    if (tok_chunk >= Lp) break;
    issue(n + T::kStages - 1, (n + T::kStages - 1) % T::kStages);
    cp_async_commit();
    cp_async_wait<T::kStages - 1>();
    __syncwarp();

    const uint8_t* st = wsmem + (n % T::kStages) * T::kStageBytes;
    const uint32_t* sk = reinterpret_cast<const uint32_t*>(st);
    const uint32_t* sv = reinterpret_cast<const uint32_t*>(st + T::kCodeBytes);
    const __half2* skp = reinterpret_cast<const __half2*>(st + 2 * T::kCodeBytes);
    const __half2* svp = skp + T::kParamsPerChunk;
    // Channel-wise runs start at the group holding the chunk's first token; with G >= 64 a
    // chunk never crosses a group, with G = 32 it holds two whole groups.
    const bool group_start = tok_chunk % G == 0;

    if constexpr (KCH && !DEQ) {
      if (group_start) {
#pragma unroll
        for (int gq = 0; gq < NQB; ++gq) rebuild_k(skp + gq * D, qb[gq], kbias[gq]);
      }
    }
    if constexpr (!VCH && !DEQ) {
#pragma unroll
      for (int g = 0; g < GD; ++g) vps[g][0] = vps[g][1] = vpz[g][0] = vpz[g][1] = 0.f;
    }

    // -------- scores S^T = K Q^T for the chunk's tiles
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      const int tok0 = tok_chunk + 16 * t;
      uint32_t kw[T::kWordsPerLane];
#pragma unroll
      for (int v = 0; v < T::kWordsPerLane / 4; ++v) {
        uint4 x = lds128(sk + t * WPT + v * 128 + lane * 4);
        kw[4 * v] = x.x, kw[4 * v + 1] = x.y, kw[4 * v + 2] = x.z, kw[4 * v + 3] = x.w;
      }
      if constexpr (DEQ) {
        if ((16 * t) % G == 0 && (tok0 % G == 0)) rebuild_k_dequant(skp + ((16 * t) / G) * D);
      }
      if constexpr (KCH) {
        const int gq = NQB == 1 ? 0 : (16 * t) / G;
        float acc0[4] = {0.f, 0.f, 0.f, 0.f}, acc1[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
        for (int kt = 0; kt < T::kNKT; ++kt) {
          uint32_t a[4];
          k_operands(kw, kt, a);
          Op::mma(kt % 2 ? acc1 : acc0, a[0], a[1], a[2], a[3], qb[gq][2 * kt], qb[gq][2 * kt + 1]);
        }
#pragma unroll
        for (int e = 0; e < 4; ++e) s[t][e] = acc0[e] + acc1[e] + (DEQ ? 0.f : kbias[gq][e & 1]);
      } else {
        // K token-wise: one accumulator per channel group, scaled per token before adding.
#pragma unroll
        for (int e = 0; e < 4; ++e) s[t][e] = 0.f;
#pragma unroll
        for (int g = 0; g < GD; ++g) {
          float acc0[4] = {0.f, 0.f, 0.f, 0.f}, acc1[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
          for (int kt = g * G / 16; kt < (g + 1) * G / 16; ++kt) {
            uint32_t a[4];
            k_operands(kw, kt, a);
            Op::mma(kt % 2 ? acc1 : acc0, a[0], a[1], a[2], a[3], qb[0][2 * kt], qb[0][2 * kt + 1]);
          }
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const float2 sz = __half22float2(skp[(16 * t + r + 8 * (e >> 1)) * GD + g]);
            s[t][e] += sz.x * (acc0[e] + acc1[e]) + (sz.y * kq[g][e & 1] - sz.x * kb128[g][e & 1]);
          }
        }
      }
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int tok = tok0 + r + 8 * (e >> 1);
        s[t][e] = tok < Lp ? s[t][e] * p.sm_scale_log2 : kNegInf;
      }
    }

    float m_new[2];
    softmax_update(m_new);

    // -------- O^T += V^T P^T, tile by tile
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      float pr[4];
      probabilities(t, m_new, pr);
      uint32_t vw[T::kWordsPerLane];
#pragma unroll
      for (int v = 0; v < T::kWordsPerLane / 4; ++v) {
        uint4 x = lds128(sv + t * WPT + v * 128 + lane * 4);
        vw[4 * v] = x.x, vw[4 * v + 1] = x.y, vw[4 * v + 2] = x.z, vw[4 * v + 3] = x.w;
      }
      // B operands, one per channel group for token-wise V (p~ = p * s per group).
      constexpr int NB = (!VCH && !DEQ) ? GD : 1;
      uint32_t b0[NB], b1[NB];
#pragma unroll
      for (int g = 0; g < NB; ++g) {
        float pv[4], zs[2] = {0.f, 0.f};
        bool zero_scale[2] = {false, false};
        if constexpr (!VCH && !DEQ) {
#pragma unroll
          for (int hr = 0; hr < 2; ++hr) {
            const float2 sz = __half22float2(svp[(16 * t + r + 8 * hr) * GD + g]);
            pv[2 * hr] = pr[2 * hr] * sz.x, pv[2 * hr + 1] = pr[2 * hr + 1] * sz.x;
            zero_scale[hr] = sz.x == 0.f;
            zs[hr] = zero_scale[hr] ? sz.y : __fdividef(sz.y, sz.x);
          }
        } else {
#pragma unroll
          for (int e = 0; e < 4; ++e) pv[e] = pr[e];
        }
        const uint32_t lo = Op::pack(pv[0], pv[1]), hi = Op::pack(pv[2], pv[3]);
        if constexpr (!DEQ) {
          const float2 fl = Op::unpack(lo), fh = Op::unpack(hi);
          if constexpr (VCH) {
            gps[0] += fl.x + fh.x;
            gps[1] += fl.y + fh.y;
          } else {
            vps[g][0] += fl.x + fh.x;
            vps[g][1] += fl.y + fh.y;
            // Offsets ride on the same rounded p~ as the codes (p~ z / s = p^ z), so each
            // token's value is weighted by one rounded p^: a centred error. A token with
            // scale 0 holds only z and takes the exact p.
            vpz[g][0] += zero_scale[0] ? pr[0] * zs[0] : fl.x * zs[0];
            vpz[g][1] += zero_scale[0] ? pr[1] * zs[0] : fl.y * zs[0];
            vpz[g][0] += zero_scale[1] ? pr[2] * zs[1] : fh.x * zs[1];
            vpz[g][1] += zero_scale[1] ? pr[3] * zs[1] : fh.y * zs[1];
          }
        }
        b0[g] = movmatrix_trans(lo);
        b1[g] = movmatrix_trans(hi);
      }
      // Ablation, token-wise V: s / f and z - 128 s / f of this lane's A columns (token pairs).
      constexpr int NF = radix_classes<BITS, F16>();  // distinct radix factors
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
              const float inv_f = 1.0f / class_factor<BITS, F16>(fc);
              const int i = (tau * GD + g) * NF + fc;
              vds[i][0] = s0.x * inv_f, vds[i][1] = s1.x * inv_f;
              vdz[i][0] = s0.y - Op::kBias * vds[i][0], vdz[i][1] = s1.y - Op::kBias * vds[i][1];
            }
          }
      }
#pragma unroll
      for (int mt = 0; mt < NMT; ++mt) {
        uint32_t a[4];
        v_operands(vw, mt, a);
        const int g = (16 * mt) / G;
        if constexpr (DEQ) {
          const int fc0 = radix_class<BITS, F16>((2 * mt) % P), fc1 = radix_class<BITS, F16>((2 * mt + 1) % P);
          a[0] = Op::dequant(a[0], vds[g * NF + fc0], vdz[g * NF + fc0]);
          a[1] = Op::dequant(a[1], vds[g * NF + fc1], vdz[g * NF + fc1]);
          a[2] = Op::dequant(a[2], vds[(GD + g) * NF + fc0], vdz[(GD + g) * NF + fc0]);
          a[3] = Op::dequant(a[3], vds[(GD + g) * NF + fc1], vdz[(GD + g) * NF + fc1]);
          Op::mma(o[mt], a[0], a[1], a[2], a[3], b0[0], b1[0]);
        } else {
          Op::mma(raw[mt], a[0], a[1], a[2], a[3], b0[NB == 1 ? 0 : g], b1[NB == 1 ? 0 : g]);
        }
      }
      if constexpr (VCH && RAW && G == 32) {
        if (t % 2 == 1) flush_v_channel(svp + (t / 2) * D);  // two groups per chunk
      }
    }
    if constexpr (VCH && RAW && G >= kChunk) {
      if ((tok_chunk + kChunk) % G == 0) flush_v_channel(svp);
    }
    if constexpr (!VCH && RAW) flush_v_token();
    __syncwarp();
  }
  cp_async_wait<0>();

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
              return row < tail_len ? Op::from_bf16(*reinterpret_cast<const uint32_t*>(p.k_tail + tbase + (size_t)row * D + c)) : 0u;
            };
            Op::mma(acc, ld(row0, ch), ld(row1, ch), ld(row0, ch + 8), ld(row1, ch + 8), Op::from_bf16(qraw[2 * kt]),
                    Op::from_bf16(qraw[2 * kt + 1]));
          }
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int row = c0 + 16 * t + r + 8 * (e >> 1);
            s[t][e] = row < tail_len ? acc[e] * p.sm_scale_log2 : kNegInf;
          }
        }
        float m_new[2];
        softmax_update(m_new);
#pragma unroll
        for (int t = 0; t < NT; ++t) {
          float pr[4];
          probabilities(t, m_new, pr);
          const uint32_t b0 = movmatrix_trans(Op::pack(pr[0], pr[1]));
          const uint32_t b1 = movmatrix_trans(Op::pack(pr[2], pr[3]));
          const int tk = c0 + 16 * t + 2 * t4;
#pragma unroll 2
          for (int mt = 0; mt < NMT; ++mt) {
            // The folds' epilogues have run, so o is plain attention output here.
            auto ld = [&](int tok, int c) -> uint32_t {
              const __nv_bfloat16 zero = __float2bfloat16(0.f);
              __nv_bfloat162 v2;
              v2.x = tok < tail_len ? p.v_tail[tbase + (size_t)tok * D + c] : zero;
              v2.y = tok + 1 < tail_len ? p.v_tail[tbase + (size_t)(tok + 1) * D + c] : zero;
              return Op::from_bf16(*reinterpret_cast<uint32_t*>(&v2));
            };
            const int ch = 16 * mt + r;
            Op::mma(o[mt], ld(tk, ch), ld(tk, ch + 8), ld(tk + 8, ch), ld(tk + 8, ch + 8), b0, b1);
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
}

// Merges the per-split partial results: out = sum_s w_s o_s / sum_s w_s l_s, w_s = 2^(m_s - M).
template <int D>
__global__ void foscar_combine_kernel(const float* __restrict__ ws_o, const float* __restrict__ ws_ml,
                                      __nv_bfloat16* __restrict__ out, int num_splits) {
  const size_t bh = blockIdx.x;
  const float* ml = ws_ml + bh * num_splits * 2;
  float mx = kNegInf;
  for (int s = 0; s < num_splits; ++s) mx = fmaxf(mx, ml[2 * s]);
  for (int c = threadIdx.x; c < D; c += blockDim.x) {
    float acc = 0.f, l = 0.f;
    for (int s = 0; s < num_splits; ++s) {
      const float m = ml[2 * s];
      if (m == kNegInf) continue;
      const float w = exp2f(m - mx);
      acc += w * ws_o[(bh * num_splits + s) * D + c];
      l += w * ml[2 * s + 1];
    }
    out[bh * D + c] = __float2bfloat16(acc / l);
  }
}

}  // namespace foscar
