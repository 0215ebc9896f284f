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

extern "C" int foscar_warps_per_cta(int bits) {
  // The knob does not depend on the mode or group size: any instance tells.
  return bits == 2 ? foscar::DecodeTraits<2, 128, 128, true, false, false>::kWarps
                   : foscar::DecodeTraits<4, 128, 128, true, false, false>::kWarps;
}
