// Lab knob FOSCAR_PV_WGMMA: PV on wgmma in the kernels with token-wise V in groups of 128, the
// paired ones (FOSCAR_PV_WGMMA=1) or every one (2).
//
// The per-warp consumer (foscar_consume.cuh) runs each warp's PV on mma.sync: 16 HMMA a paired
// trip, issued by the warp and waited on by it (a sixth of INT2's stall samples at batch 128 wait
// on the MMA pipe, half of those products the other head's zeros). Here the warpgroup computes
// O^T = V^T P~^T on wgmma instead, like S: asynchronous, and issued beside S.
//  - A = V^T from registers. Warp w holds the 32-channel slice w of the staged V block as rows
//    16w .. 16w + 15 of two m64 tiles (tile i: channels 32w + 16i + (0..15), Lane::channel), over
//    all four k-steps: its injected operands are v_operands_kstep's, slice w at k-step kt.
//  - B = P~^T in shared memory, one fp16 tile per (trip parity, KV head, k-step): warp w writes
//    k-step w, its 16 tokens, after the two transposes that made mma.sync's B fragments. Head
//    hp's tile is zero in the other head's columns (written once, at the CTA's start), so that
//    both heads' products chain into one accumulator, as the per-warp consumer's do.
//  - One running maximum per column, shared by the warpgroup (WgSoftmax): the four warps'
//    tokens meet in one accumulator, so their probabilities must share it. A trip costs one
//    barrier (bar.red.or: P~ published, and whether any score passed the maximum); only then does
//    the maximum move for all (two barriers more, rare after an item's first chunks).
//  - Each trip's product from zero, folded into the fp32 output once (8 FFMA a thread, where the
//    per-warp consumer folds each of 8 tiles, 32), and no merge of warps' outputs at the end.
#pragma once

namespace foscar {

// The softmax of the warpgroup: a running maximum per column, the same in every warp; a chunk
// whose scores exceed it anywhere in the warpgroup rescales every warp's state, so p <= 1.
struct WgSoftmax {
  float m[2] = {kNegInf, kNegInf};  // columns 2t, 2t+1, log2 domain
  float ref[2] = {0.f, 0.f};        // m, or 0 while m is -inf
  float l[2] = {0.f, 0.f};          // this thread's partial denominators

  __device__ __forceinline__ void probabilities(const float (&x)[4], float (&pr)[4]) const {
#pragma unroll
    for (int e = 0; e < 4; ++e) pr[e] = exp2f(x[e] - ref[e & 1]);
  }
  // The chunk's probabilities against the shared maximum, handed to st(pr), which writes them as
  // B tiles and fences them for the async proxy; ls their sums per column. Returns whether any of
  // this thread's scores passed the maximum (publish() settles that).
  template <class Stage>
  __device__ __forceinline__ bool stage(const float (&x)[4], float (&ls)[2], Stage&& st) const {
    float pr[4];
    probabilities(x, pr);
    st(pr);
    ls[0] = pr[0] + pr[2], ls[1] = pr[1] + pr[3];
    return x[0] > m[0] || x[2] > m[0] || x[1] > m[1] || x[3] > m[1];
  }
  // One barrier publishes the staged P and tells whether any thread's scores passed the maximum;
  // if so, the warps' maxima meet in shared memory, the state is rescaled (rescale(alpha)) and P
  // staged again. Returns with P published and l summed. The trip calls it just before its first
  // wgmma, where the warpgroup meets anyway, with the next S's and this PV's operands built.
  template <class T, class Stage, class Rescale>
  __device__ __forceinline__ void publish(SharedStorage<T>& s, const Lane& L, const float (&x)[4], bool over,
                                          float (&ls)[2], Stage&& st, Rescale&& rescale) {
    if (named_barrier_any(kConsumerBarrier, kConsumerThreads, over)) {
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const float wm = max_rows(fmaxf(x[hh], x[hh + 2]));
        if (L.g == 0) s.red[L.warp][2 * L.t + hh][0] = wm;
      }
      named_barrier(kConsumerBarrier, kConsumerThreads);
      float alpha[2];
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        float mx = m[hh];
#pragma unroll
        for (int ww = 0; ww < 4; ++ww) mx = fmaxf(mx, s.red[ww][2 * L.t + hh][0]);
        alpha[hh] = mx == kNegInf ? 1.f : exp2f(m[hh] - mx);  // 0 on the item's first tokens
        m[hh] = mx;
        ref[hh] = mx == kNegInf ? 0.f : mx;
        l[hh] *= alpha[hh];
      }
      rescale(alpha);
      stage(x, ls, st);
      named_barrier(kConsumerBarrier, kConsumerThreads);  // P published; s.red read out
    }
    l[0] += ls[0], l[1] += ls[1];
  }
  // stage() and publish() at once (the BF16 tail's pieces).
  template <class T, class Stage, class Rescale>
  __device__ __forceinline__ void settle(SharedStorage<T>& s, const Lane& L, const float (&x)[4], Stage&& st,
                                         Rescale&& rescale) {
    float ls[2];
    const bool over = stage(x, ls, st);
    publish(s, L, x, over, ls, st, rescale);
  }
};

// Writes this warp's k-step of P^T into the B tile of its columns' KV head: pk[r] holds token g + 8 r
// of columns 2t, 2t + 1; transposed, this thread holds tokens 8 r + 2t, + 1 of column g.
// The B tile of k-step kt of the P~ of KV head hp, trip parity par, in the merge buffer.
template <class T>
__device__ __forceinline__ uint8_t* p_tile(SharedStorage<T>& s, int par, int hp, int kt) {
  static_assert(sizeof(s.merge) >= kPvTileBytes, "the merge buffer holds the P~ tiles");
  return reinterpret_cast<uint8_t*>(&s.merge[0][0][0]) + ((par * T::HP + hp) * 4 + kt) * kBTileBytes;
}

template <class T>
__device__ __forceinline__ void store_p_tile(SharedStorage<T>& s, const Lane& L, const uint32_t (&pk)[2], int par,
                                             int g_head) {
  uint8_t* tile = p_tile(s, par, g_head, L.warp);
#pragma unroll
  for (int r = 0; r < 2; ++r) *reinterpret_cast<uint32_t*>(tile + b_tile_offset(8 * r + 2 * L.t, L.g)) = movmatrix_trans(pk[r]);
  fence_proxy_async_smem();
}

// At an item's start, each thread's slots of the P~ tiles zeroed in the other heads' tiles, both
// parities: the slots it writes P~ into in its own column's head's tiles (tokens 8 r + 2t, + 1 of
// column g, k-step w), so every slot has one owner and no barrier is needed; the finish and the
// split merge reuse the buffer between items.
template <class T>
__device__ __forceinline__ void clear_pv_tiles(SharedStorage<T>& s, const Lane& L, int g_head) {
#pragma unroll
  for (int par = 0; par < 2; ++par)
#pragma unroll
    for (int hp = 0; hp < T::HP; ++hp) {
      if (hp == g_head) continue;
#pragma unroll
      for (int r = 0; r < 2; ++r)
        *reinterpret_cast<uint32_t*>(p_tile(s, par, hp, L.warp) + b_tile_offset(8 * r + 2 * L.t, L.g)) = 0u;
    }
}

template <class T>
struct VFoldTokenWg {
  // Token-wise V, operand fold, on wgmma: P~ = p s_t (fp16) is B; A the codes as injected
  // (f c 2^-24); the trip's product, both heads chained from zero, is folded once as raw / (f
  // 2^-24), and the offsets, sum p~ z / s, are summed apart per column and join every channel at
  // the item's end.
  static constexpr bool kWarpgroupPv = true;
  static_assert(T::kGroupsD == 1, "one V scale per token: groups of 128");
  float out[2][4];      // m64 tile i, element e: channel L.channel(i, e), column 2t + (e & 1)
  float raw[2][4];      // this trip's product
  float off[2];         // this thread's partial offsets per column
  float offd[2];        // the staged P~'s offsets per column, sum p~ z / s over this thread's tokens
  uint32_t a[2][4][4];  // one head's V operands: m64 tile i, k-step kt

  __device__ __forceinline__ void reset() {
    zero_accumulators(out);
    off[0] = off[1] = 0.f;
  }
  // P~ of the warp's 16 tokens (each column by its own KV head's scales) into the tiles of parity par,
  // and its offsets (offd, added by commit_p once P is final).
  __device__ __forceinline__ void stage_p(SharedStorage<T>& s, const Lane& L, const uint8_t* const (&v_par)[T::HP],
                                          const float (&pr)[4], int par, int g_head) {
    const __half2* sz2 = reinterpret_cast<const __half2*>(of_head(v_par, L.hp));
    uint32_t pk[2];  // tokens g + 8 r, columns 2t, 2t + 1
    offd[0] = offd[1] = 0.f;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float2 sz = __half22float2(sz2[L.token(2 * r)]);
      const float zs = sz.y / sz.x;  // the scale is never 0 (docs/FORMAT.md)
      pk[r] = pack_f16x2(pr[2 * r] * sz.x, pr[2 * r + 1] * sz.x);
      const float2 pt = unpack_f16x2(pk[r]);
      offd[0] = fmaf(pt.x, zs, offd[0]);
      offd[1] = fmaf(pt.y, zs, offd[1]);
    }
    store_p_tile(s, L, pk, par, g_head);
  }
  __device__ __forceinline__ void commit_p() { off[0] += offd[0], off[1] += offd[1]; }
  // Head hp's V operands from its staged block: slice w, every k-step.
  __device__ __forceinline__ void prepare(const uint8_t* block, const Lane& L) {
#pragma unroll
    for (int kt = 0; kt < 4; ++kt) {
      uint32_t ak[2][4];
      v_operands_kstep<T::BITS>(block, L.warp, kt, L.lane, ak);
#pragma unroll
      for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int r = 0; r < 4; ++r) a[i][kt][r] = ak[i][r];
    }
  }
  // Head hp's products into raw, after the caller's wgmma fence (fp16, or bf16 for the tail).
  template <bool F16 = true>
  __device__ __forceinline__ void issue(SharedStorage<T>& s, int hp, int par) {
    const uint32_t base = b_tile_desc(smem_u32(p_tile(s, par, hp, 0)));
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int kt = 0; kt < 4; ++kt)
        wgmma_m64n8k16<F16>(raw[i], a[i][kt][0], a[i][kt][1], a[i][kt][2], a[i][kt][3], base + kt * kBTileDescStep);
  }
  __device__ __forceinline__ void fold() {
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) out[i][e] = fmaf(raw[i][e], 1.f / v_block_radix<T::BITS>(2 * i + (e >> 1)), out[i][e]);
  }
  __device__ __forceinline__ void rescale(const float (&alpha)[2]) {
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) out[i][e] *= alpha[e & 1];
    off[0] *= alpha[0], off[1] *= alpha[1];
  }
};

// Trip c of an item's chunk loop on the warpgroup: chunk c's P~ staged and published, then, head
// by head, S of chunk c + 1 and chunk c's PV as one wgmma group.
template <class T, class KSide, class VSide>
__device__ __forceinline__ void run_trip_wg(SharedStorage<T>& s, const Lane& L, SStream<T, KSide>& ss, KSide& ks,
                                            VSide& vs, WgSoftmax& sm, int c, int chunk_end, int g_head) {
  const uint8_t* v_blk[T::HP];
  const uint8_t* v_par[T::HP];
  ss.v_of_trip(v_blk, v_par);
  const bool last = c == chunk_end - 1;
  const int par = c & 1;  // a tile is rewritten two trips on, after every warp's wait of its products

  if constexpr (KSide::kScoresReadStage) ss.wait();
  float x[4];
  ss.scores(c, x);
  if constexpr (!KSide::kScoresReadStage) ss.wait();
  // P staged now; published (and, rarely, the maximum moved) just before the first wgmma group.
  auto stage = [&](const float (&q)[4]) { vs.stage_p(s, L, v_par, q, par, g_head); };
  float ls[2];
  const bool over = sm.stage(x, ls, stage);

  zero_accumulators(ks.acc);
  zero_accumulators(vs.raw);
#pragma unroll
  for (int hp = 0; hp < T::HP; ++hp) {
    if (!last) ss.prepare(c + 1, hp);  // the last chunk's S runs on stale operands and is discarded
    vs.prepare(v_blk[hp], L);
    if (hp == 0) {
      sm.publish(s, L, x, over, ls, stage, [&](const float (&alpha)[2]) { vs.rescale(alpha); });
      vs.commit_p();
    }
    pin_operands(ss.a);
    pin_operands(vs.a);
    pin_accumulators(ks.acc);
    pin_accumulators(vs.raw);
    wgmma_fence();
    ks.issue(s, L, ss.a, hp);
    vs.issue(s, hp, par);
    wgmma_commit();
    ss.complete();
    pin_accumulators(vs.raw);
  }
  vs.fold();
  ss.release();
}

// The BF16 tail (split 0 of a channel-wise K cache) on the warpgroup: S per warp on mma.sync as
// in consume_tail, the shared softmax, P (bf16) in the B tiles, PV on wgmma from the tail's V.
template <class T, class VSide>
__device__ void consume_tail_wg(const DecodeParams& p, SharedStorage<T>& s, const Lane& L, const WorkItem& w,
                                WgSoftmax& sm, VSide& vs, int g_head) {
  const TailRows<T> rows(p, s, L, w);
  for (int t0 = 0, k = 0; t0 < w.tail_len; t0 += kChunk, ++k) {
    float x[4];
    rows.scores(t0, x);
    const int par = (w.chunk_end + k) & 1;  // the parity after the last trip's
    sm.settle(s, L, x,
              [&](const float (&q)[4]) {
                const uint32_t pb[2] = {pack_bf16x2(q[0], q[1]), pack_bf16x2(q[2], q[3])};
                store_p_tile(s, L, pb, par, g_head);
              },
              [&](const float (&alpha)[2]) { vs.rescale(alpha); });
    zero_accumulators(vs.raw);
#pragma unroll
    for (int hp = 0; hp < T::HP; ++hp) {
#pragma unroll
      for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int kt = 0; kt < 4; ++kt) {
          const int ch = L.channel(i, 0), tok = t0 + 16 * kt + 2 * L.t;
          vs.a[i][kt][0] = rows.v_pair(hp, tok, ch), vs.a[i][kt][1] = rows.v_pair(hp, tok, ch + 8);
          vs.a[i][kt][2] = rows.v_pair(hp, tok + 8, ch), vs.a[i][kt][3] = rows.v_pair(hp, tok + 8, ch + 8);
        }
      pin_operands(vs.a);
      pin_accumulators(vs.raw);
      wgmma_fence();
      vs.template issue<false>(s, hp, par);
      wgmma_commit();
      wgmma_wait<0>();
      pin_accumulators(vs.raw);
    }
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) vs.out[i][e] += vs.raw[i][e];  // output units
  }
}

// The end of an item on the warpgroup: no warps' outputs to merge (one maximum, one accumulator),
// only the offsets and denominators summed per column; then the output or this split's partials.
template <class T, class VSide>
__device__ void finish_item_wg(const DecodeParams& p, SharedStorage<T>& s, const Lane& L, const WorkItem& w,
                               const WgSoftmax& sm, VSide& vs, int sense0) {
  float* merged = &s.merge[0][0][0];  // [column][channel]
  static_assert(sizeof(s.merge) >= kN * kD * sizeof(float), "the merge buffer holds 8 columns x 128 channels");
  named_barrier(kConsumerBarrier, kConsumerThreads);  // every warp's last PV has read the P~ tiles there
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const float off = sum_rows(vs.off[hh]), l = sum_rows(sm.l[hh]);
    if (L.g == 0) s.red[L.warp][2 * L.t + hh][0] = off, s.red[L.warp][2 * L.t + hh][1] = l;
    if (L.g == 0 && L.warp == 0) s.pv.m[2 * L.t + hh] = sm.m[hh];
  }
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) merged[(2 * L.t + (e & 1)) * kD + L.channel(i, e)] = vs.out[i][e];
  named_barrier(kConsumerBarrier, kConsumerThreads);
  if (L.tid == 0) timeline_stamp<T>(p, w, kTlFolded);
  const int hq0 = w.h * p.ratio, c = L.tid;
  for (int hd = 0; hd < p.cols; ++hd) {
    float off = 0.f, l = 0.f;
#pragma unroll
    for (int ww = 0; ww < 4; ++ww) off += s.red[ww][hd][0], l += s.red[ww][hd][1];
    store_column(p, w, hq0, hd, c, merged[hd * kD + c] + off, s.pv.m[hd], l);
  }
  end_item<T>(p, s, L, w, sense0);
}

}  // namespace foscar
