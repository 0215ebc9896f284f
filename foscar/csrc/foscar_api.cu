// The C entry points: validate what only the C side can, then dispatch by bit width.
#include "foscar_launch.cuh"

namespace foscar {
std::string& last_error() {
  static thread_local std::string msg;
  return msg;
}
extern template int dispatch_bits<CudaLaunch, 4>(const FoscarDecodeArgs&, void*);
extern template int dispatch_bits<CudaLaunch, 2>(const FoscarDecodeArgs&, void*);
}  // namespace foscar

extern "C" int foscar_decode(const FoscarDecodeArgs* a, void* stream) {
  if (const int rc = foscar::check_args(*a)) return rc;
  return a->bits == 4 ? foscar::dispatch_bits<foscar::CudaLaunch, 4>(*a, stream)
                      : foscar::dispatch_bits<foscar::CudaLaunch, 2>(*a, stream);
}

extern "C" const char* foscar_last_error(void) { return foscar::last_error().c_str(); }

extern "C" int foscar_ctas_per_sm(int bits) {
  // The knob does not depend on the mode or group size: any instance tells.
  return bits == 2 ? foscar::DecodeTraits<2, 128, true, false, false>::kCtasPerSm
                   : foscar::DecodeTraits<4, 128, true, false, false>::kCtasPerSm;
}

namespace foscar {
// A "launcher" that only reports an instance's dynamic shared memory, through the same
// dispatch as the real one (so it answers for exactly the instances that are built).
struct SmemQuery {
  template <int BITS, int G, bool KCH, bool VCH, bool DEQ, int HP>
  static int run(const FoscarDecodeArgs&, void*) {
    return decode_smem_bytes<BITS, G, KCH, VCH, DEQ, HP>();
  }
};
}  // namespace foscar

extern "C" int foscar_decode_smem_bytes(int bits, int group_size, int k_channel, int v_channel, int dequant,
                                        int heads_per_item) {
  FoscarDecodeArgs a{};
  a.bits = bits, a.group_size = group_size, a.k_channel = k_channel, a.v_channel = v_channel, a.dequant = dequant;
  if (bits != 2 && bits != 4) return -1;
  if (heads_per_item != 1 && (heads_per_item != 2 || !FOSCAR_PAIR_HEADS)) return -1;
  a.num_kv_heads = 2, a.num_q_heads = 8, a.kv_heads_per_item = heads_per_item;
  // The dispatch answers 2 for a configuration it does not build; a kernel's smem is KBs.
  const int rc = bits == 4 ? foscar::dispatch_bits<foscar::SmemQuery, 4>(a, nullptr)
                           : foscar::dispatch_bits<foscar::SmemQuery, 2>(a, nullptr);
  return rc > 2 ? rc : -1;
}

extern "C" int foscar_kv_heads_per_item(int num_q_heads, int num_kv_heads) {
  return foscar::max_kv_heads_per_item_of(num_q_heads, num_kv_heads);
}
