// All INT2 kernel instances (one translation unit per width so nvcc builds them in parallel).
#include "foscar_launch.cuh"

namespace foscar {
template int launch_bits<2>(const FoscarDecodeArgs&, cudaStream_t);
}
