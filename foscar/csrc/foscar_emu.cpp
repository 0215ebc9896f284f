// The decode kernels' own source run on the host (foscar_emu.h): one host thread per CUDA
// thread, the persistent CTAs one after another (or a few at once). Built by foscar/emu.py with
// a host C++20 compiler; for tests and debugging on machines without a GPU, never for speed.
// Pointers in the arguments are host memory.
#define FOSCAR_HOST_EMU 1

#include <cstdlib>
#include <memory>
#include <thread>
#include <vector>

#include "foscar_decode.cuh"
#include "foscar_dispatch.h"

namespace foscar {

std::string& last_error() {
  static thread_local std::string msg;
  return msg;
}

struct EmuLaunch {
  template <int BITS, int G, bool KCH, bool VCH, bool DEQ, int HP, int CTAS>
  static int run(const FoscarDecodeArgs& a, void*) {
    using T = DecodeTraits<BITS, G, KCH, VCH, DEQ, HP, CTAS>;
    const DecodeParams p = make_params(a);
    const auto kernel = foscar_decode_kernel<BITS, G, KCH, VCH, DEQ, HP, CTAS>;
    const unsigned threads = T::kThreads;
    // One host thread per CUDA thread: `slots` CTAs at once (FOSCAR_EMU_CONCURRENT_CTAS, default
    // 1), slot c running CTAs c, c + slots, ... one after another, its threads meeting at the
    // CTA's barrier between two (shared memory is reused, as on a GPU). More than one slot lets
    // the CTAs of a launch meet in global memory as they do on a GPU (the split merge's counters).
    const char* env = std::getenv("FOSCAR_EMU_CONCURRENT_CTAS");
    const int slots = std::max(1, std::min(env ? std::atoi(env) : 1, a.num_ctas));
    std::vector<std::unique_ptr<foscar_emu::Cta>> ctas;
    for (int c = 0; c < slots; ++c)
      ctas.push_back(std::make_unique<foscar_emu::Cta>(threads, decode_smem_bytes<BITS, G, KCH, VCH, DEQ, HP, CTAS>()));
    std::vector<std::thread> lanes;
    lanes.reserve(threads * slots);
    for (int c = 0; c < slots; ++c)
      for (unsigned t = 0; t < threads; ++t) {
        lanes.emplace_back([&, c, t] {
          foscar_emu::ThreadCtx& ctx = foscar_emu::tls();
          ctx.thread_idx = {t, 0, 0};
          ctx.block_dim = dim3(threads);
          ctx.grid_dim = dim3(a.num_ctas);
          ctx.cta = ctas[c].get();
          for (int x = c; x < a.num_ctas; x += slots) {
            ctx.block_idx = {static_cast<unsigned>(x), 0, 0};
            kernel(p);
            ctx.cta->bar.arrive_and_wait();
          }
        });
      }
    for (auto& th : lanes) th.join();
    return 0;
  }
};

}  // namespace foscar

extern "C" FOSCAR_EXPORT int foscar_emu_decode(const FoscarDecodeArgs* a) {
  if (const int rc = foscar::check_args(*a)) return rc;
  return a->bits == 4 ? foscar::dispatch_bits<foscar::EmuLaunch, 4>(*a, nullptr)
                      : foscar::dispatch_bits<foscar::EmuLaunch, 2>(*a, nullptr);
}

extern "C" FOSCAR_EXPORT const char* foscar_emu_last_error(void) { return foscar::last_error().c_str(); }

extern "C" FOSCAR_EXPORT int foscar_emu_ctas_per_sm(int bits, int group_size, int k_channel, int v_channel,
                                                    int dequant, int heads_per_item) {
  return foscar::query_instance<foscar::CtasQuery>(bits, group_size, k_channel, v_channel, dequant, heads_per_item);
}

extern "C" FOSCAR_EXPORT int foscar_emu_ctas_per_sm_alt(int bits, int group_size, int k_channel, int v_channel,
                                                        int dequant, int heads_per_item) {
  return foscar::query_instance<foscar::AltCtasQuery>(bits, group_size, k_channel, v_channel, dequant, heads_per_item);
}

extern "C" FOSCAR_EXPORT int foscar_emu_kv_heads_per_item(int num_q_heads, int num_kv_heads) {
  return foscar::max_kv_heads_per_item_of(num_q_heads, num_kv_heads);
}
