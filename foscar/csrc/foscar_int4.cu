// All INT4 kernel instances (one translation unit per width so nvcc builds them in parallel).
#include "foscar_launch.cuh"

namespace foscar {
template int dispatch_bits<CudaLaunch, 4>(const FoscarDecodeArgs&, void*);
}
