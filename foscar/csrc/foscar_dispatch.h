// From the C ABI's runtime configuration to a kernel template instance, for any launcher:
// the CUDA one (foscar_launch.cuh) and the host emulation (foscar_emu.cpp) share it, so the
// emulator runs exactly the instances the GPU library builds.
//
// A launcher is a type with
//   template <int BITS, int G, bool KCH, bool VCH, bool DEQ, int HP, int CTAS>
//   static int run(const FoscarDecodeArgs&, void* stream);
// HP, the KV heads per work item, is the launch's kv_heads_per_item, and CTAS its ctas_per_sm: 0
// for the instance's own CTAs per SM, or the count of its second instance (alt_ctas_per_sm);
// both are the planner's choice.
#pragma once

#include <string>

#include "foscar_api.h"
#include "foscar_decode.cuh"

namespace foscar {

std::string& last_error();

// The most KV heads an item can hold for a head layout in this build (1 for a layout that is
// not valid: check_args reports those); the C entry points foscar_kv_heads_per_item and
// foscar_emu_kv_heads_per_item answer with it.
inline int max_kv_heads_per_item_of(int num_q_heads, int num_kv_heads) {
  return num_kv_heads > 0 && num_q_heads % num_kv_heads == 0
             ? max_kv_heads_per_item(num_q_heads / num_kv_heads, num_kv_heads) : 1;
}

// What only the C side can check before dispatch; 0, or 2 with last_error() set.
inline int check_args(const FoscarDecodeArgs& a) {
  if (a.head_dim != 128) {
    last_error() = "head_dim " + std::to_string(a.head_dim) + " is not built; expected 128";
    return 2;
  }
  if (a.batch < 1 || a.num_kv_heads < 1 || a.num_splits < 1 || a.units_per_split < 1 || a.num_ctas < 1) {
    last_error() = "batch, num_kv_heads, num_splits, units_per_split and num_ctas must be >= 1";
    return 2;
  }
  if (a.num_splits > 128) {  // the split merge keeps 8 heads x 128 splits of weights in shared memory
    last_error() = "num_splits " + std::to_string(a.num_splits) + " is over the 128 the split merge holds";
    return 2;
  }
  if (a.reserved0 != 0 || a.reserved1 != 0) {  // the retired stolen tail's fields (foscar_api.h)
    const bool first = a.reserved0 != 0;
    last_error() = std::string(first ? "reserved0 " : "reserved1 ") + std::to_string(first ? a.reserved0 : a.reserved1) +
                   " is not 0: the reserved fields of FoscarDecodeArgs must be 0";
    return 2;
  }
  if (a.num_q_heads % a.num_kv_heads || a.num_q_heads / a.num_kv_heads > 8) {
    last_error() = "query heads per KV head must be 1..8, got " + std::to_string(a.num_q_heads) + "/" +
                   std::to_string(a.num_kv_heads);
    return 2;
  }
  if (a.kv_heads_per_item != 1 && a.kv_heads_per_item != max_kv_heads_per_item_of(a.num_q_heads, a.num_kv_heads)) {
    last_error() = "kv_heads_per_item " + std::to_string(a.kv_heads_per_item) + " is not possible for " +
                   std::to_string(a.num_q_heads) + " query heads over " + std::to_string(a.num_kv_heads) +
                   " KV heads in this build; expected 1 or foscar_kv_heads_per_item()";
    return 2;
  }
  if (a.page_size % 64) {
    last_error() = "page_size " + std::to_string(a.page_size) + " is not a multiple of 64";
    return 2;
  }
  if (a.bits != 2 && a.bits != 4) {
    last_error() = "bits " + std::to_string(a.bits) + " is not built; expected 2 or 4";
    return 2;
  }
  if (a.ctas_per_sm < 0) {
    last_error() = "ctas_per_sm " + std::to_string(a.ctas_per_sm) +
                   " is not a CTA count; pass 0 (the kernel's own) or foscar_ctas_per_sm_alt()";
    return 2;
  }
  if (a.timeline != nullptr && !FOSCAR_TIMELINE) {
    last_error() = "this build records no timeline; build it with -DFOSCAR_TIMELINE=1 (foscar_decode.cuh)";
    return 2;
  }
  return 0;
}

template <class Launch, int BITS, int G, bool KCH, bool VCH, bool DEQ, int HP>
int dispatch_ctas(const FoscarDecodeArgs& a, void* s) {
  constexpr int alt = alt_ctas_per_sm<BITS, G, KCH, VCH, DEQ, HP>();
  if (a.ctas_per_sm == 0) return Launch::template run<BITS, G, KCH, VCH, DEQ, HP, 0>(a, s);
  if constexpr (alt > 0) {
    if (a.ctas_per_sm == alt) return Launch::template run<BITS, G, KCH, VCH, DEQ, HP, alt>(a, s);
  }
  last_error() = "ctas_per_sm " + std::to_string(a.ctas_per_sm) + " is not built for this kernel; pass 0 (its own)" +
                 (alt > 0 ? " or " + std::to_string(alt) : std::string());
  return 2;
}

template <class Launch, int BITS, int G, bool KCH, bool VCH, bool DEQ>
int dispatch_heads(const FoscarDecodeArgs& a, void* s) {
  if constexpr (FOSCAR_PAIR_HEADS) {
    if (a.kv_heads_per_item == 2) return dispatch_ctas<Launch, BITS, G, KCH, VCH, DEQ, 2>(a, s);
  }
  return dispatch_ctas<Launch, BITS, G, KCH, VCH, DEQ, 1>(a, s);
}

template <class Launch, int BITS, int G, bool KCH, bool VCH>
int dispatch_modes(const FoscarDecodeArgs& a, void* s) {
  if (a.dequant) {
    if constexpr (KCH && !VCH) return dispatch_heads<Launch, BITS, G, KCH, VCH, true>(a, s);
    last_error() = "the dequantize-first ablation is built for K channel-wise, V token-wise only";
    return 2;
  }
  return dispatch_heads<Launch, BITS, G, KCH, VCH, false>(a, s);
}

template <class Launch, int BITS, int G>
int dispatch_group(const FoscarDecodeArgs& a, void* s) {
  if (a.k_channel) {
    return a.v_channel ? dispatch_modes<Launch, BITS, G, true, true>(a, s)
                       : dispatch_modes<Launch, BITS, G, true, false>(a, s);
  }
  return a.v_channel ? dispatch_modes<Launch, BITS, G, false, true>(a, s)
                     : dispatch_modes<Launch, BITS, G, false, false>(a, s);
}

// Lab knob FOSCAR_ONLY_GROUP=G: a build with the instances of group size G alone (a third of the
// compile), for experiments and tests that run one group size; 0 (the default) builds 32, 64
// and 128. A launch of another size is refused by name.
#ifndef FOSCAR_ONLY_GROUP
#define FOSCAR_ONLY_GROUP 0
#endif
static_assert(FOSCAR_ONLY_GROUP == 0 || FOSCAR_ONLY_GROUP == 32 || FOSCAR_ONLY_GROUP == 64 || FOSCAR_ONLY_GROUP == 128,
              "FOSCAR_ONLY_GROUP must be 0 (every group size), 32, 64 or 128");
constexpr bool group_built(int g) { return FOSCAR_ONLY_GROUP == 0 || FOSCAR_ONLY_GROUP == g; }

// Every instance of one bit width (one translation unit per width builds in parallel).
template <class Launch, int BITS>
int dispatch_bits(const FoscarDecodeArgs& a, void* s) {
  switch (a.group_size) {
    case 32: if constexpr (group_built(32)) return dispatch_group<Launch, BITS, 32>(a, s); break;
    case 64: if constexpr (group_built(64)) return dispatch_group<Launch, BITS, 64>(a, s); break;
    case 128: if constexpr (group_built(128)) return dispatch_group<Launch, BITS, 128>(a, s); break;
    default: break;
  }
  last_error() = "group_size " + std::to_string(a.group_size) + " is not built; expected " +
                 (FOSCAR_ONLY_GROUP ? std::to_string(FOSCAR_ONLY_GROUP) + " (this build has FOSCAR_ONLY_GROUP=" +
                                          std::to_string(FOSCAR_ONLY_GROUP) + ")"
                                    : std::string("32, 64 or 128"));
  return 2;
}

// Launchers that answer a question about an instance instead of running it, through the same
// dispatch, so that they answer for exactly the instances the library builds. The answer goes
// to the int that the launch's stream argument points to.
struct SmemQuery {  // dynamic shared memory per CTA
  template <int BITS, int G, bool KCH, bool VCH, bool DEQ, int HP, int CTAS>
  static int run(const FoscarDecodeArgs&, void* answer) {
    *static_cast<int*>(answer) = DecodeTraits<BITS, G, KCH, VCH, DEQ, HP, CTAS>::kSmemBytes;
    return 0;
  }
};
struct CtasQuery {  // CTAs per SM (the planner sizes the persistent grid by it)
  template <int BITS, int G, bool KCH, bool VCH, bool DEQ, int HP, int CTAS>
  static int run(const FoscarDecodeArgs&, void* answer) {
    *static_cast<int*>(answer) = DecodeTraits<BITS, G, KCH, VCH, DEQ, HP, CTAS>::kCtasPerSm;
    return 0;
  }
};
struct AltCtasQuery {  // CTAs per SM of the instance's second instance, 0 where it has none
  template <int BITS, int G, bool KCH, bool VCH, bool DEQ, int HP, int CTAS>
  static int run(const FoscarDecodeArgs&, void* answer) {
    constexpr int alt = alt_ctas_per_sm<BITS, G, KCH, VCH, DEQ, HP>();
    *static_cast<int*>(answer) = alt > 0 ? DecodeTraits<BITS, G, KCH, VCH, DEQ, HP, alt>::kCtasPerSm : 0;
    return 0;
  }
};

// One instance's answer to a query, or -1 where that instance is not built.
template <class Query>
int query_instance(int bits, int group_size, int k_channel, int v_channel, int dequant, int heads_per_item) {
  if (bits != 2 && bits != 4) return -1;
  if (heads_per_item != 1 && (heads_per_item != 2 || !FOSCAR_PAIR_HEADS)) return -1;
  FoscarDecodeArgs a{};
  a.bits = bits, a.group_size = group_size, a.k_channel = k_channel, a.v_channel = v_channel, a.dequant = dequant;
  a.num_kv_heads = 2, a.num_q_heads = 8, a.kv_heads_per_item = heads_per_item;
  int answer = -1;
  const int rc = bits == 4 ? dispatch_bits<Query, 4>(a, &answer) : dispatch_bits<Query, 2>(a, &answer);
  return rc == 0 ? answer : -1;
}

}  // namespace foscar
