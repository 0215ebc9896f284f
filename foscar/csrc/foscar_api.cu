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

extern "C" int foscar_ctas_per_sm(int bits, int group_size, int k_channel, int v_channel, int dequant,
                                  int heads_per_item) {
  return foscar::query_instance<foscar::CtasQuery>(bits, group_size, k_channel, v_channel, dequant, heads_per_item);
}

extern "C" int foscar_ctas_per_sm_alt(int bits, int group_size, int k_channel, int v_channel, int dequant,
                                      int heads_per_item) {
  return foscar::query_instance<foscar::AltCtasQuery>(bits, group_size, k_channel, v_channel, dequant, heads_per_item);
}

extern "C" int foscar_decode_smem_bytes(int bits, int group_size, int k_channel, int v_channel, int dequant,
                                        int heads_per_item) {
  return foscar::query_instance<foscar::SmemQuery>(bits, group_size, k_channel, v_channel, dequant, heads_per_item);
}

extern "C" int foscar_kv_heads_per_item(int num_q_heads, int num_kv_heads) {
  return foscar::max_kv_heads_per_item_of(num_q_heads, num_kv_heads);
}
