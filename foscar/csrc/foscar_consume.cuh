// The consumer warpgroup (foscar_decode.cuh has the producer, the ring, the K side and S).
//
// The warpgroup's wgmma computes each warp's 16 tokens x 8 heads of S. From there every warp
// works alone: its own online softmax over its own tokens, its P kept in registers (the S
// accumulator turned into the B fragments of P^T by two 8 x 8 transposes, movmatrix), and its own
// O^T over all 128 channels by mma.sync on the A operands of its k-step of the staged V block.
// No named barrier per chunk (the channel-wise Q~ rebuild keeps its one per token group); the
// warps meet at the item's end, where their (m, l, O) are merged through shared memory. S of
// chunk c + 1 is issued on wgmma before chunk c's PV runs on mma.sync, so the two overlap.
//
// Every PV product is one k-step (16 tokens) from zero, folded into the fp32 output at once, and
// the V operands are fp16 subnormals f c 2^-24 with no bias (inject_v): every product holds
// signal only, and the Tensor Cores' cut toward zero (harder on small patterns, since the H200
// aligns a subnormal as if it were 2^-14) stays below rounding at every context length with
// INT4's codes (up to 15 at f = 1) and INT2's at f >= 4 (foscar/precision.py, docs/PERFORMANCE.md
// "v23").
#pragma once

namespace foscar {

// V operands are fp16 f c 2^-24 (inject_v) and P / P~ fp16: the probabilities stay at or below
// 1 (WarpSoftmax rescales on any new maximum), so p~ = p s cannot overflow for any fp16 scale s.


// What one unit of a code of channel block b (0..3) of a 32-channel slice of the V block is
// worth in its operand, f 2^-24: where inject_v puts the block's code (INT4 position b; INT2 its
// first position, which shares its factor). The fold multiplies each product by its inverse.
template <int BITS>
__host__ __device__ __forceinline__ constexpr float v_block_radix(int b) {
  return v_radix<BITS>(BITS == 4 ? b : v2_position(b, 0)) * kVUnit;
}
// A warp's output tile j (0..7): channels 16 j + g (e < 2) and 16 j + g + 8 (e >= 2), heads
// 2t + (e & 1). Tile j is m16 tile i = j % 2 of the 32-channel slice j / 2 of the V block, its
// rows g / g + 8 channel blocks 2i / 2i + 1.
template <int BITS>
__device__ __forceinline__ constexpr float warp_tile_radix(int j, int hf) {
  return v_block_radix<BITS>(2 * (j % 2) + hf);
}

// The A operands of slice sl's two tiles for k-step kt (this warp's 16 tokens) of a staged V block.
template <int BITS>
__device__ __forceinline__ void v_operands_kstep(const uint8_t* block, int sl, int kt, int lane, uint32_t (&a)[2][4]) {
  constexpr int W = 2 * BITS;  // words per lane per slice
  const uint8_t* base = block + sl * 32 * W * 4;
  if constexpr (BITS == 4) {  // words 2kt (tokens 2t, 2t+1) and 2kt + 1 (+8): one 8-byte load
    const int i = 2 * kt;
    const uint2 x = *reinterpret_cast<const uint2*>(base + ((i / 4) * 128 + lane * 4 + i % 4) * 4);
    a[0][0] = inject_v<4, 0>(x.x), a[0][1] = inject_v<4, 1>(x.x);
    a[0][2] = inject_v<4, 0>(x.y), a[0][3] = inject_v<4, 1>(x.y);
    a[1][0] = inject_v<4, 2>(x.x), a[1][1] = inject_v<4, 3>(x.x);
    a[1][2] = inject_v<4, 2>(x.y), a[1][3] = inject_v<4, 3>(x.y);
  } else {
    const uint32_t x = *reinterpret_cast<const uint32_t*>(base + (lane * 4 + kt) * 4);
    a[0][0] = inject_v<2, v2_position(0, 0)>(x), a[0][1] = inject_v<2, v2_position(1, 0)>(x);
    a[0][2] = inject_v<2, v2_position(0, 1)>(x), a[0][3] = inject_v<2, v2_position(1, 1)>(x);
    a[1][0] = inject_v<2, v2_position(2, 0)>(x), a[1][1] = inject_v<2, v2_position(3, 0)>(x);
    a[1][2] = inject_v<2, v2_position(2, 1)>(x), a[1][3] = inject_v<2, v2_position(3, 1)>(x);
  }
}

// Visits the warp's output tiles j of 32-channel slices SL0 .. SL1 - 1 of the staged V blocks
// of the item's heads, with their A operands (the warp's k-step): f(j, a), a[hp] the tile's 4
// registers of head hp, which f may rewrite.
template <int BITS, int HP, int SL0, int SL1, class F>
__device__ __forceinline__ void for_each_v_tile(const uint8_t* const (&blocks)[HP], const Lane& L, F&& f) {
#pragma unroll
  for (int sl = SL0; sl < SL1; ++sl) {
    uint32_t a[HP][2][4];
#pragma unroll
    for (int hp = 0; hp < HP; ++hp) v_operands_kstep<BITS>(blocks[hp], sl, L.warp, L.lane, a[hp]);
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      uint32_t ai[HP][4];
#pragma unroll
      for (int hp = 0; hp < HP; ++hp)
#pragma unroll
        for (int r = 0; r < 4; ++r) ai[hp][r] = a[hp][i][r];
      f(2 * sl + i, ai);
    }
  }
}

// The B fragments of P^T (tokens x heads) from probabilities in the S accumulator layout,
// packed two a register as the conversion makes them (one F2FP a pair): pk[r] holds token
// g + 8 r of heads 2t (low half) and 2t + 1 (high half). Each 8 x 8 block transposed.
__device__ __forceinline__ void p_fragments(const uint32_t (&pk)[2], uint32_t (&b)[2]) {
  b[0] = movmatrix_trans(pk[0]);
  b[1] = movmatrix_trans(pk[1]);
}
// The B fragments of each KV head of the item: head hp's P^T keeps the columns of that head
// (the threads whose lane.hp is hp) and is zero in the others, so that the products of the
// heads' V blocks can share one accumulator (each column gets its own head's product and exact
// zeros).
template <int HP>
__device__ __forceinline__ void p_fragments_per_head(const Lane& L, const uint32_t (&pk)[2], uint32_t (&b)[HP][2]) {
#pragma unroll
  for (int hp = 0; hp < HP; ++hp) {
    const bool mine = HP == 1 || L.hp == hp;
    const uint32_t m[2] = {mine ? pk[0] : 0u, mine ? pk[1] : 0u};
    p_fragments(m, b[hp]);
  }
}

// One output tile's product over the warp's 16 tokens: acc += V^T P^T (fp16 operands).
__device__ __forceinline__ void pv_tile(float (&acc)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  mma_f16_16816(acc, a[0], a[1], a[2], a[3], b[0], b[1]);
}
// The product of every head of the item from zero: one k-step per head, chained (the columns
// of one head receive only exact zeros from the other's step).
template <int HP>
__device__ __forceinline__ void pv_tile_fresh(float (&raw)[4], const uint32_t (&a)[HP][4], const uint32_t (&b)[HP][2]) {
  raw[0] = raw[1] = raw[2] = raw[3] = 0.f;
#pragma unroll
  for (int hp = 0; hp < HP; ++hp) pv_tile(raw, a[hp], b[hp]);
}

// The online softmax of one warp: a running maximum per head over the warp's tokens; a chunk
// whose scores exceed it rescales the state (rare after the first chunks), so p <= 1.
struct WarpSoftmax {
  float m[2] = {kNegInf, kNegInf};  // heads 2t, 2t+1, log2 domain
  float ref[2] = {0.f, 0.f};        // m, or 0 while m is -inf (a warp whose tokens were all masked)
  float l[2] = {0.f, 0.f};          // this thread's partial denominators

  template <class T>
  __device__ __forceinline__ bool update(SharedStorage<T>&, const Lane&, const float (&x)[4], float (&alpha)[2]) {
    const bool over = x[0] > m[0] || x[2] > m[0] || x[1] > m[1] || x[3] > m[1];
    alpha[0] = alpha[1] = 1.f;
    if (!__any_sync(0xffffffffu, over)) return false;
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const float mx = fmaxf(m[hh], max_rows(fmaxf(x[hh], x[hh + 2])));
      alpha[hh] = mx == kNegInf ? 1.f : exp2f(m[hh] - mx);  // 0 on the warp's first tokens
      m[hh] = mx;
      ref[hh] = mx == kNegInf ? 0.f : mx;
      l[hh] *= alpha[hh];
    }
    return true;
  }
  __device__ __forceinline__ void probabilities(const float (&x)[4], float (&pr)[4]) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      pr[e] = exp2f(x[e] - ref[e & 1]);
      l[e & 1] += pr[e];
    }
  }
};

// A warp's output over all 128 channels (tile j, element e as above), which every V side of the
// per-warp consumer accumulates and the softmax rescales. add_real() adds values in output units
// (the BF16 tail's products).
struct WarpOut {
  float out[8][4];
  __device__ __forceinline__ void reset_out() {
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) out[j][e] = 0.f;
  }
  __device__ __forceinline__ void rescale_out(const float (&alpha)[2]) {
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) out[j][e] *= alpha[e & 1];
  }
};

// V sides: pv() attends the warp's 16 tokens of a chunk over all 128 channels; finish() adds
// what was summed apart (before the warps are merged).
template <class T>
struct VFoldToken : WarpOut {
  // Token-wise V, operand fold: P~ = p s_{t,gv} (fp16) per channel group. Each tile's product,
  // one k-step from zero, is folded at once as raw / (f 2^-24); the offsets, sum p~ z / s, are
  // summed apart per (group, head) and join every channel of their group at the item's end.
  static constexpr int kGroups = T::kGroupsD;
  float off[kGroups][2];   // this thread's partial offsets per (group, head)
  uint32_t b[kGroups][T::HP][2];  // this chunk's B fragments of P~^T per (group, KV head)

  __device__ __forceinline__ void reset() {
    reset_out();
#pragma unroll
    for (int gv = 0; gv < kGroups; ++gv) off[gv][0] = off[gv][1] = 0.f;
  }
  __host__ __device__ static constexpr int group_of(int j) { return 16 * j / T::G; }
  // P~ of the warp's 16 tokens, each column scaled by its own KV head's V scales.
  __device__ __forceinline__ void begin(SharedStorage<T>&, const Lane& L, const uint8_t* const (&v_par)[T::HP], bool,
                                        const float (&pr)[4]) {
    const __half2* par = reinterpret_cast<const __half2*>(of_head(v_par, L.hp));
#pragma unroll
    for (int gv = 0; gv < kGroups; ++gv) {
      float sc[2], zs[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const float2 sz = __half22float2(par[L.token(2 * r) * kGroups + gv]);
        sc[r] = sz.x;  // never 0 (docs/FORMAT.md)
        zs[r] = sz.y / sc[r];
      }
      uint32_t pk[2];  // token g + 8 r, heads 2t and 2t + 1
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        pk[r] = pack_f16x2(pr[2 * r] * sc[r], pr[2 * r + 1] * sc[r]);
        const float2 pt = unpack_f16x2(pk[r]);
        off[gv][0] = fmaf(pt.x, zs[r], off[gv][0]);
        off[gv][1] = fmaf(pt.y, zs[r], off[gv][1]);
      }
      p_fragments_per_head<T::HP>(L, pk, b[gv]);
    }
  }
  // The products of slices SL0 .. SL1 - 1 (channels 32 SL0 ..), folded.
  template <int SL0, int SL1>
  __device__ __forceinline__ void pv(SharedStorage<T>&, const Lane& L, const uint8_t* const (&blocks)[T::HP],
                                     const uint8_t* const (&)[T::HP], bool) {
    for_each_v_tile<T::BITS, T::HP, SL0, SL1>(blocks, L, [&](int j, uint32_t (&a)[T::HP][4]) {
      float raw[4];
      pv_tile_fresh<T::HP>(raw, a, b[group_of(j)]);
#pragma unroll
      for (int e = 0; e < 4; ++e) out[j][e] = fmaf(raw[e], 1.f / warp_tile_radix<T::BITS>(j, e >> 1), out[j][e]);
    });
  }
  __device__ __forceinline__ void rescale(const float (&alpha)[2]) {
    rescale_out(alpha);
#pragma unroll
    for (int gv = 0; gv < kGroups; ++gv) off[gv][0] *= alpha[0], off[gv][1] *= alpha[1];
  }
  __device__ __forceinline__ void add_real(int j, const float (&raw)[4]) {
#pragma unroll
    for (int e = 0; e < 4; ++e) out[j][e] += raw[e];
  }
  // The warp's offsets, summed over its tokens, into every channel of their group.
  __device__ __forceinline__ void finish(SharedStorage<T>&, const Lane&) {
#pragma unroll
    for (int gv = 0; gv < kGroups; ++gv)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const float total = sum_rows(off[gv][hh]);
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          if (group_of(j) != gv) continue;
          out[j][hh] += total, out[j][hh + 2] += total;
        }
      }
  }
};

template <class T>
struct VFoldChannel : WarpOut {
  // Channel-wise V, accumulator fold: B = p (fp16); each tile's product, from zero, folded with
  // its group's s / (f 2^-24) per channel (of the column's own KV head); when the warp's token
  // group closes, z times the warp's own p-sum (its O holds its own tokens only, so no exchange
  // between warps).
  float psum[2];
  float total[2];              // the p-sums of a closing group, for pv()
  uint32_t b[1][T::HP][2];     // this chunk's B fragments of P^T per KV head

  __device__ __forceinline__ void reset() {
    reset_out();
    psum[0] = psum[1] = 0.f;
  }
  __device__ __forceinline__ void begin(SharedStorage<T>&, const Lane& L, const uint8_t* const (&)[T::HP],
                                        bool group_ends, const float (&pr)[4]) {
    uint32_t pk[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      pk[r] = pack_f16x2(pr[2 * r], pr[2 * r + 1]);
      const float2 pt = unpack_f16x2(pk[r]);
      psum[0] += pt.x, psum[1] += pt.y;
    }
    p_fragments_per_head<T::HP>(L, pk, b[0]);
    total[0] = total[1] = 0.f;
    if (group_ends) {
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) total[hh] = sum_rows(psum[hh]), psum[hh] = 0.f;
    }
  }
  template <int SL0, int SL1>
  __device__ __forceinline__ void pv(SharedStorage<T>&, const Lane& L, const uint8_t* const (&blocks)[T::HP],
                                     const uint8_t* const (&v_par)[T::HP], bool group_ends) {
    // The warp's 16 tokens lie in one token group of the chunk: its (s, z) row, of this
    // thread's KV head.
    const __half2* row =
        reinterpret_cast<const __half2*>(of_head(v_par, L.hp)) + ((16 * L.warp) / T::G) * kD;
    for_each_v_tile<T::BITS, T::HP, SL0, SL1>(blocks, L, [&](int j, uint32_t (&a)[T::HP][4]) {
      float raw[4];
      pv_tile_fresh<T::HP>(raw, a, b[0]);
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const float2 sz = __half22float2(row[16 * j + L.g + 8 * hf]);
        const float sf = sz.x * (1.f / warp_tile_radix<T::BITS>(j, hf));
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          float& o = out[j][2 * hf + hh];
          o = fmaf(sf, raw[2 * hf + hh], o);
          if (group_ends) o = fmaf(sz.y, total[hh], o);
        }
      }
    });
  }
  __device__ __forceinline__ void rescale(const float (&alpha)[2]) {
    rescale_out(alpha);
    psum[0] *= alpha[0], psum[1] *= alpha[1];
  }
  __device__ __forceinline__ void add_real(int j, const float (&raw)[4]) {
#pragma unroll
    for (int e = 0; e < 4; ++e) out[j][e] += raw[e];
  }
  __device__ __forceinline__ void finish(SharedStorage<T>&, const Lane&) {}
};

template <class T>
struct VDequant : WarpOut {
  // The ablation: every element of the warp's A operands turned into s c + z (fp16, with its
  // own KV head's parameters) before the product; B = p (fp16).
  static constexpr int kGroups = T::kGroupsD;
  uint32_t b[1][T::HP][2];

  __device__ __forceinline__ void reset() {
    reset_out();
  }
  __device__ __forceinline__ void begin(SharedStorage<T>&, const Lane& L, const uint8_t* const (&)[T::HP], bool,
                                        const float (&pr)[4]) {
    const uint32_t pk[2] = {pack_f16x2(pr[0], pr[1]), pack_f16x2(pr[2], pr[3])};
    p_fragments_per_head<T::HP>(L, pk, b[0]);
  }
  template <int SL0, int SL1>
  __device__ __forceinline__ void pv(SharedStorage<T>&, const Lane& L, const uint8_t* const (&blocks)[T::HP],
                                     const uint8_t* const (&v_par)[T::HP], bool) {
    for_each_v_tile<T::BITS, T::HP, SL0, SL1>(blocks, L, [&](int j, uint32_t (&a)[T::HP][4]) {
      const int gv = 16 * j / T::G;
#pragma unroll
      for (int hp = 0; hp < T::HP; ++hp) {
        // (s, z) of this lane's A columns, tokens 16w + 2t + 8o + {0, 1}, of head hp.
        const __half2* par = reinterpret_cast<const __half2*>(v_par[hp]);
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          // (f c 2^-24) s / (f 2^-24) + z per token of the pair
          const float f = warp_tile_radix<T::BITS>(j, r & 1);
          const float2 v = unpack_f16x2(a[hp][r]);
          const int tok = 16 * L.warp + 2 * L.t + 8 * (r >> 1);
          const float2 sz0 = __half22float2(par[tok * kGroups + gv]), sz1 = __half22float2(par[(tok + 1) * kGroups + gv]);
          const float s0 = sz0.x / f, s1 = sz1.x / f;
          a[hp][r] = pack_f16x2(fmaf(v.x, s0, sz0.y), fmaf(v.y, s1, sz1.y));
        }
        pv_tile(out[j], a[hp], b[0][hp]);
      }
    });
  }
  __device__ __forceinline__ void rescale(const float (&alpha)[2]) {
    rescale_out(alpha);
  }
  __device__ __forceinline__ void add_real(int j, const float (&raw)[4]) {
#pragma unroll
    for (int e = 0; e < 4; ++e) out[j][e] += raw[e];
  }
  __device__ __forceinline__ void finish(SharedStorage<T>&, const Lane&) {}
};

// The BF16 tail's rows of an item (channel-wise caches, split 0): K, V and bf16 q straight from
// global and shared memory, and one warp's scores of a 64-token piece on mma.sync (16 tokens of
// the warp, each head's k-steps against its own B tiles, chained in one accumulator).
template <class T>
struct TailRows {
  const DecodeParams& p;
  const SharedStorage<T>& s;
  const Lane& L;
  const WorkItem& w;
  const __nv_bfloat16* kt_rows[T::HP];
  const __nv_bfloat16* vt_rows[T::HP];

  __device__ __forceinline__ TailRows(const DecodeParams& p_, const SharedStorage<T>& s_, const Lane& L_,
                                      const WorkItem& w_)
      : p(p_), s(s_), L(L_), w(w_) {
#pragma unroll
    for (int hp = 0; hp < T::HP; ++hp) {
      const size_t base = ((size_t)w.b * p.num_kv_heads + w.h + hp) * T::G * kD;
      kt_rows[hp] = p.k_tail + base, vt_rows[hp] = p.v_tail + base;
    }
  }
  __device__ __forceinline__ uint32_t k_pair(int hp, int tok, int c) const {
    return tok < w.tail_len ? *reinterpret_cast<const uint32_t*>(kt_rows[hp] + (size_t)tok * kD + c) : 0u;
  }
  __device__ __forceinline__ uint32_t v_pair(int hp, int tok, int c) const {  // channel c of tokens tok, tok + 1
    const uint32_t lo = tok < w.tail_len ? *reinterpret_cast<const uint16_t*>(vt_rows[hp] + (size_t)tok * kD + c) : 0u;
    const uint32_t hi =
        tok + 1 < w.tail_len ? *reinterpret_cast<const uint16_t*>(vt_rows[hp] + (size_t)(tok + 1) * kD + c) : 0u;
    return lo | (hi << 16);
  }
  __device__ __forceinline__ uint32_t b_frag(int hp, int kt, int hi) const {
    return *reinterpret_cast<const uint32_t*>(s.qt_tile[hp][kt] + b_tile_offset(2 * L.t + 8 * hi, L.g));
  }
  // Log2-domain scores of the warp's tokens of the piece at t0, -inf past the tail.
  __device__ __forceinline__ void scores(int t0, float (&x)[4]) const {
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    const int r0 = t0 + 16 * L.warp + L.g;
#pragma unroll
    for (int hp = 0; hp < T::HP; ++hp)
#pragma unroll
      for (int kt = 0; kt < 8; ++kt) {
        const int c = 16 * kt + 2 * L.t;
        mma_bf16_16816(acc, k_pair(hp, r0, c), k_pair(hp, r0 + 8, c), k_pair(hp, r0, c + 8), k_pair(hp, r0 + 8, c + 8),
                       b_frag(hp, kt, 0), b_frag(hp, kt, 1));
      }
#pragma unroll
    for (int e = 0; e < 4; ++e) x[e] = t0 + L.token(e) < w.tail_len ? acc[e] * p.sm_scale_log2 : kNegInf;
  }
};

// The BF16 tail, per warp: the scores (TailRows), the warp's own softmax and output; with two KV
// heads per item each head's V against its own P columns (PV), chained as in the main loop.
template <class T, class VSide>
__device__ void consume_tail(const DecodeParams& p, SharedStorage<T>& s, const Lane& L, const WorkItem& w,
                                  WarpSoftmax& sm, VSide& vs) {
  const TailRows<T> rows(p, s, L, w);
  for (int t0 = 0; t0 < w.tail_len; t0 += kChunk) {
    float x[4];
    rows.scores(t0, x);
    float alpha[2];
    if (sm.update(s, L, x, alpha)) vs.rescale(alpha);
    float pr[4];
    sm.probabilities(x, pr);
    const uint32_t pk[2] = {pack_bf16x2(pr[0], pr[1]), pack_bf16x2(pr[2], pr[3])};
    uint32_t b[T::HP][2];
    p_fragments_per_head<T::HP>(L, pk, b);
    const int tk = t0 + 16 * L.warp + 2 * L.t;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int ch = 16 * j + L.g;
      float raw[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int hp = 0; hp < T::HP; ++hp)
        mma_bf16_16816(raw, rows.v_pair(hp, tk, ch), rows.v_pair(hp, tk, ch + 8), rows.v_pair(hp, tk + 8, ch),
                       rows.v_pair(hp, tk + 8, ch + 8), b[hp][0], b[hp][1]);
      vs.add_real(j, raw);
    }
  }
}

// An item's start: its query (and the K side's constants) loaded, V's sums zeroed, and, where it
// has chunks, its first chunk's S, whose stage goes back to the producer.
template <class T, class KSide, class VSide>
__device__ __forceinline__ void begin_item(const DecodeParams& p, SharedStorage<T>& s, const Lane& L, const WorkItem& w,
                                           int item, KSide& ks, VSide& vs, SStream<T, KSide>& ss, RingCursor<T>& ring) {
  if (L.tid == 0) timeline_stamp(p, item, kTlItem);
  vs.reset();
  load_query<T>(p, s, L, w, ks);
  if (w.chunk_end > w.chunk_begin) {
    ss.first();
    if (L.tid == 0) timeline_stamp(p, item, kTlFirstS);
    ss.release();
    ring.next_trip();
  }
}

// Trip c of an item's chunk loop: V of chunk c against its P, S of chunk c + 1 issued beside it;
// the item's last (no next S to issue) where c == chunk_end - 1.
template <class T, class KSide, class VSide>
__device__ __forceinline__ void run_trip(SharedStorage<T>& s, const Lane& L, SStream<T, KSide>& ss, KSide& ks,
                                         VSide& vs, WarpSoftmax& sm, int c, int chunk_end) {
  // This trip's stages hold V of chunk c (codes, parameters) and K of chunk c + 1.
  const uint8_t* v_blk[T::HP];
  const uint8_t* v_par[T::HP];
  ss.v_of_trip(v_blk, v_par);
  const int tok0 = c * kChunk;
  const bool last = c == chunk_end - 1;
  const bool group_ends = last || (tok0 + kChunk) % T::G == 0;

  // Scores of this warp's 16 tokens of chunk c, its softmax, P in registers. (Token-wise K
  // reads the chunk's K scales from the stage; channel-wise K has them in its constants, so
  // it waits for the stage only after its softmax.)
  if constexpr (KSide::kScoresReadStage) ss.wait();
  float x[4];
  ss.scores(c, x);
  float alpha[2];
  if (sm.update(s, L, x, alpha)) vs.rescale(alpha);
  float pr[4];
  sm.probabilities(x, pr);
  if constexpr (!KSide::kScoresReadStage) ss.wait();
  vs.begin(s, L, v_par, group_ends, pr);

  // S of chunk c + 1 on wgmma, head by head (the last chunk's runs on stale operands and is
  // discarded), and chunk c's PV on this warp's mma.sync while each runs.
  zero_accumulators(ks.acc);
  if constexpr (T::HP == 1) {
    if (!last) ss.prepare(c + 1, 0);
    ss.issue(0);
    vs.template pv<0, 4>(s, L, v_blk, v_par, group_ends);
    ss.complete();
  } else {
    if (!last) ss.prepare(c + 1, 0);
    ss.issue(0);
    vs.template pv<0, FOSCAR_PV_SPLIT>(s, L, v_blk, v_par, group_ends);
    ss.complete();
    if (!last) ss.prepare(c + 1, 1);
    ss.issue(1);
    vs.template pv<FOSCAR_PV_SPLIT, 4>(s, L, v_blk, v_par, group_ends);
    ss.complete();
  }
  ss.release();
}

// Whether an item's output is written at once (one split), and otherwise the row of its partials
// for query head hq0 + hd.
__device__ __forceinline__ bool direct_output(const DecodeParams& p) { return p.num_splits == 1; }
__device__ __forceinline__ size_t partial_row(const DecodeParams& p, const WorkItem& w, int hq0, int hd) {
  return ((size_t)w.b * p.num_q_heads + hq0 + hd) * p.num_splits + w.split;
}

// Channel c of column hd's output (o / l, one split) or of this split's partials (o, and the
// column's (m, l) once).
__device__ __forceinline__ void store_column(const DecodeParams& p, const WorkItem& w, int hq0, int hd, int c, float o,
                                             float m, float l) {
  if (direct_output(p)) {
    p.o[((size_t)w.b * p.num_q_heads + hq0 + hd) * kD + c] = __float2bfloat16(o / l);
  } else {
    const size_t row = partial_row(p, w, hq0, hd);
    p.ws_o[row * kD + c] = o;
    if (c == 0) p.ws_ml[row * 2] = m, p.ws_ml[row * 2 + 1] = l;
  }
}
// An item's end once its stores are issued: the barrier before the next item's use of the
// exchange buffers, or, with splits, the count and the merge of the last to arrive.
template <class T>
__device__ __forceinline__ void end_item(const DecodeParams& p, SharedStorage<T>& s, const Lane& L, const WorkItem& w,
                                         int sense0) {
  if (L.tid == 0) timeline_stamp<T>(p, w, kTlStored);  // thread 0's stores issued (the others' may trail)
  if (direct_output(p)) {
    named_barrier(kConsumerBarrier, kConsumerThreads);  // s.red and s.merge are read out before the next item
    if (L.tid == 0) timeline_stamp<T>(p, w, kTlWritten);
    return;
  }
  merge_splits<T>(p, s, L, w, sense0);
}

// The end of an item: each warp's (m, l, O) merged through shared memory, then the output or
// this split's partials (and the merge of all splits by the last to arrive).
template <class T, class VSide>
__device__ void finish_item(const DecodeParams& p, SharedStorage<T>& s, const Lane& L, const WorkItem& w,
                                 const WarpSoftmax& sm, VSide& vs, int sense0) {
  vs.finish(s, L);
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const float l = sum_rows(sm.l[hh]);
    if (L.g == 0) s.red[L.warp][2 * L.t + hh][0] = sm.m[hh], s.red[L.warp][2 * L.t + hh][1] = l;
  }
  named_barrier(kConsumerBarrier, kConsumerThreads);
  if (L.tid == 0) timeline_stamp<T>(p, w, kTlFolded);
  // Columns in passes of four (the real ones, cols: 1, 2, 4 or 8): each warp's output against
  // the maximum over the warps into the merge buffer, then thread tid sums channel tid of each.
  const int hq0 = w.h * p.ratio, c = L.tid;
  // This warp's output of head 2t + hh (column 2t + hh) against the column's maximum over the
  // warps, into its slot of pass h0 in the merge buffer.
  auto warps_max = [&](int hd) {  // column hd's maximum over the four warps
    float mx = kNegInf;
#pragma unroll
    for (int ww = 0; ww < 4; ++ww) mx = fmaxf(mx, s.red[ww][hd][0]);
    return mx;
  };
  auto scale_into_merge = [&](int hh, int h0) {
    const int hd = 2 * L.t + hh;
    const float mx = warps_max(hd);
    const float scale = sm.m[hh] == kNegInf ? 0.f : exp2f(sm.m[hh] - mx);
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) s.merge[L.warp][hd - h0][16 * j + L.g + 8 * hf] = vs.out[j][hh + 2 * hf] * scale;
  };
  if constexpr (T::HP == 1) {
    // One branch on the output's kind for the whole finish, one on the pass per thread (heads 2t
    // and 2t + 1 share their pass); every column of a pass summed (rows past cols are stale) and
    // its stores skipped by predicate. A CTA runs this once, from a cold instruction cache, and a
    // warp cannot run past a branch until it resolves: v46's form, a branch or two around every
    // column and store, took 0.2 us more at batch 1-4 on an H100 (docs/PERFORMANCE.md, v47). The
    // paired kernels keep the loop below: unrolled there, their columns spilled (4-48 bytes in
    // six token-wise kernels), and their trips got slower (v21). The two forms repeat the column
    // sums on purpose: written once as a shared lambda (either way of adding the denominator),
    // 18-63 kernels' finishes were rescheduled, so the library would not be the one timed; share
    // them when the next change to the finish is timed anyway.
    auto columns = [&](auto direct) {
      for (int h0 = 0; h0 < p.cols; h0 += kN / 2) {
        if (h0 > 0) named_barrier(kConsumerBarrier, kConsumerThreads);  // the last pass is read out
        if (2 * L.t >= h0 && 2 * L.t < h0 + kN / 2) {  // heads 2t and 2t + 1 share their pass
#pragma unroll
          for (int hh = 0; hh < 2; ++hh) scale_into_merge(hh, h0);
        }
        named_barrier(kConsumerBarrier, kConsumerThreads);
        if (L.tid == 0 && h0 == 0) timeline_stamp<T>(p, w, kTlScaled);
#pragma unroll
        for (int i = 0; i < kN / 2; ++i) {
          const int hd = h0 + i;
          const float mx = warps_max(hd);
          float o = 0.f, l = 0.f;
#pragma unroll
          for (int ww = 0; ww < 4; ++ww) {
            o += s.merge[ww][i][c];
            const float m = s.red[ww][hd][0];
            l += m != kNegInf ? exp2f(m - mx) * s.red[ww][hd][1] : 0.f;
          }
          const bool real = hd < p.cols;
          if constexpr (decltype(direct)::value) {
            if (real) p.o[((size_t)w.b * p.num_q_heads + hq0 + hd) * kD + c] = __float2bfloat16(o / l);
          } else {
            const size_t row = partial_row(p, w, hq0, hd);
            if (real) p.ws_o[row * kD + c] = o;
            if (real && c == 0) *reinterpret_cast<float2*>(p.ws_ml + row * 2) = make_float2(mx, l);
          }
        }
      }
    };
    if (direct_output(p))
      columns(std::true_type{});
    else
      columns(std::false_type{});
  } else {
    for (int h0 = 0; h0 < p.cols; h0 += kN / 2) {
      if (h0 > 0) named_barrier(kConsumerBarrier, kConsumerThreads);  // the last pass is read out
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int hd = 2 * L.t + hh;
        if (hd < h0 || hd >= h0 + kN / 2) continue;
        scale_into_merge(hh, h0);
      }
      named_barrier(kConsumerBarrier, kConsumerThreads);
      if (L.tid == 0 && h0 == 0) timeline_stamp<T>(p, w, kTlScaled);
      // Thread tid's channel of each column: against the maximum over the warps, summed.
      auto sum_column = [&](int hd) {
        const float mx = warps_max(hd);
        float o = 0.f, l = 0.f;
#pragma unroll
        for (int ww = 0; ww < 4; ++ww) {
          o += s.merge[ww][hd - h0][c];
          const float m = s.red[ww][hd][0];
          if (m != kNegInf) l += exp2f(m - mx) * s.red[ww][hd][1];
        }
        store_column(p, w, hq0, hd, c, o, mx, l);
      };
      for (int hd = h0; hd < min(p.cols, h0 + kN / 2); ++hd) sum_column(hd);
    }
  }
  end_item<T>(p, s, L, w, sense0);
}

// The consumer warpgroup: the items of this CTA, chunk by chunk.
template <class T, class KSide, class VSide>
__device__ void consume(const DecodeParams& p, SharedStorage<T>& s) {
  const Lane L(threadIdx.x - 128, p.ratio, T::HP);
  RingCursor<T> ring;  // the current trip's stages
  for (int item = blockIdx.x; item < p.num_items; item += gridDim.x) {
    const WorkItem w = work_item<T>(p, item);
    KSide ks;
    VSide vs;
    WarpSoftmax sm;
    SStream<T, KSide> ss{p, s, L, w, ks, ring, {}};
    begin_item<T>(p, s, L, w, item, ks, vs, ss, ring);
    for (int c = w.chunk_begin; c < w.chunk_end; ++c, ring.next_trip()) {
#if FOSCAR_TIMELINE
      if (L.tid == 0) {  // how far the item has come (a CTA's rate changes as its SM's others end)
        const int k = c - w.chunk_begin, n = w.chunk_end - w.chunk_begin;
        if (k == n / 4) timeline_stamp(p, item, kTlQuarter1);
        if (k == n / 2) timeline_stamp(p, item, kTlHalf);
        if (k == 3 * n / 4) timeline_stamp(p, item, kTlQuarter3);
      }
#endif
      run_trip(s, L, ss, ks, vs, sm, c, w.chunk_end);  // V of chunk c against its P, S of chunk c + 1 beside it
    }

    if (L.tid == 0) timeline_stamp(p, item, kTlLastTrip);
    int sense0 = 0;  // FOSCAR_COOP_MERGE: the pair's sense word, read here, awaited after the count
    if constexpr (FOSCAR_COOP_MERGE) {
      if (L.tid == 0 && merge_together_launch(p, gridDim.x))
        sense0 = ld_relaxed_gpu(sense_word(p, w.b, w.h));
    }
    if constexpr (T::kHasTail) {
      if (w.split == 0 && w.tail_len > 0) consume_tail<T>(p, s, L, w, sm, vs);
    }
    finish_item<T>(p, s, L, w, sm, vs, sense0);
  }
}

// Policies per (K mode, V mode, ablation).
template <class T>
using KSideOf = typename std::conditional<T::DEQ, KDequant<T>,
                                          typename std::conditional<T::KCH, KFoldChannel<T>, KTokenSide<T>>::type>::type;
template <class T>
using VSideOf = typename std::conditional<T::DEQ, VDequant<T>,
                                          typename std::conditional<T::VCH, VFoldChannel<T>, VFoldToken<T>>::type>::type;

}  // namespace foscar
