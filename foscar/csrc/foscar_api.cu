// The C entry points: validate what only the device side can, then dispatch by bit width.
#include "foscar_launch.cuh"

namespace foscar {
std::string& last_error() {
  static thread_local std::string msg;
  return msg;
}
extern template int launch_bits<4>(const FoscarDecodeArgs&, cudaStream_t);
extern template int launch_bits<2>(const FoscarDecodeArgs&, cudaStream_t);
}  // namespace foscar

extern "C" int foscar_decode(const FoscarDecodeArgs* a, void* stream) {
  using foscar::last_error;
  if (a->head_dim != 128) {
    last_error() = "head_dim " + std::to_string(a->head_dim) + " is not built; expected 128";
    return 2;
  }
  if (a->batch < 1 || a->num_kv_heads < 1 || a->num_splits < 1 || a->units_per_split < 1) {
    last_error() = "batch, num_kv_heads, num_splits and units_per_split must be >= 1";
    return 2;
  }
  if (a->num_q_heads % a->num_kv_heads || a->num_q_heads / a->num_kv_heads > 8) {
    last_error() = "query heads per KV head must be 1..8, got " +
                   std::to_string(a->num_q_heads) + "/" + std::to_string(a->num_kv_heads);
    return 2;
  }
  if (a->page_size % 64) {
    last_error() = "page_size " + std::to_string(a->page_size) + " is not a multiple of 64";
    return 2;
  }
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  switch (a->bits) {
    case 4: return foscar::launch_bits<4>(*a, s);
    case 2: return foscar::launch_bits<2>(*a, s);
    default:
      last_error() = "bits " + std::to_string(a->bits) + " is not built; expected 2 or 4";
      return 2;
  }
}

extern "C" const char* foscar_last_error(void) { return foscar::last_error().c_str(); }
