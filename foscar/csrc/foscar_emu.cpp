// The decode kernels' own source run on the host (foscar_emu.h): one fiber per CUDA thread, all
// taking turns on the calling host thread; the persistent CTAs one after another (or a few at
// once). Built by foscar/emu.py with a host C++20 compiler; for tests and debugging on machines
// without a GPU, never for speed. Pointers in the arguments are host memory.
#define FOSCAR_HOST_EMU 1

#include <sys/mman.h>
#include <unistd.h>

#include <cstdlib>
#include <memory>
#include <vector>

#include "foscar_decode.cuh"
#include "foscar_dispatch.h"

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

// ---- the fibers' context switch
//
// x86-64 (System V): foscar_emu_switch(save, to) pushes the callee-saved registers and the
// floating-point control words on the running stack, stores the stack pointer in *save, loads
// `to` and pops the same from there. A new fiber's stack is laid out as if it had switched out
// just before entering fiber_entry. Elsewhere, ucontext's swapcontext (a system call a switch).
#if defined(__x86_64__)
extern "C" void foscar_emu_switch(void** save, void* to);
asm(R"(
  .text
  .p2align 4
  .hidden foscar_emu_switch
  .type foscar_emu_switch, @function
foscar_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size foscar_emu_switch, .-foscar_emu_switch
)");
#endif

namespace foscar_emu {

namespace {

constexpr size_t kStackBytes = size_t(1) << 20;  // reserved, not committed: a page is used as touched

[[noreturn]] void fiber_entry() {
  Scheduler& s = scheduler();
  s.current->body();
  s.current->done = true;
  ++s.progress;
  s.yield();  // never resumed
  std::abort();
}

#if !defined(__x86_64__)
void fiber_entry_uc() { fiber_entry(); }
#endif

// A fiber's first context: its stack (with a guard page below) and where it starts.
void prepare(Fiber& f) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  void* mem = mmap(nullptr, kStackBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (mem == MAP_FAILED) {
    std::fprintf(stderr, "foscar emulation: no memory for a fiber's stack\n");
    std::abort();
  }
  mprotect(mem, page, PROT_NONE);  // an overflow faults instead of writing over another stack
  f.stack = mem, f.stack_bytes = kStackBytes;
#if defined(__x86_64__)
  uint64_t* top = reinterpret_cast<uint64_t*>(static_cast<uint8_t*>(mem) + kStackBytes);
  uint32_t csr[2];
  asm volatile("stmxcsr %0\n\tfnstcw %1" : "=m"(csr[0]), "=m"(csr[1]));
  *--top = 0;  // fiber_entry's own return address: none (it never returns)
  *--top = reinterpret_cast<uint64_t>(&fiber_entry);  // where the switch's ret lands
  for (int r = 0; r < 6; ++r) *--top = 0;  // rbp, rbx, r12-r15
  *--top = static_cast<uint64_t>(csr[0]) | (static_cast<uint64_t>(csr[1] & 0xFFFF) << 32);
  f.saved = top;  // fiber_entry starts with rsp = 8 mod 16, as after a call
#else
  auto* uc = new ucontext_t;
  getcontext(uc);
  uc->uc_stack.ss_sp = static_cast<uint8_t*>(mem) + page;
  uc->uc_stack.ss_size = kStackBytes - page;
  uc->uc_link = nullptr;
  makecontext(uc, fiber_entry_uc, 0);
  f.saved = uc;
#endif
}

void release(Fiber& f) {
  if (f.stack) munmap(f.stack, f.stack_bytes);
#if !defined(__x86_64__)
  delete static_cast<ucontext_t*>(f.saved);
#endif
  f.stack = nullptr;
}

void switch_context(void** save, void* to) {
#if defined(__x86_64__)
  foscar_emu_switch(save, to);
#else
  swapcontext(static_cast<ucontext_t*>(*save), static_cast<ucontext_t*>(to));
#endif
}

}  // namespace

void Scheduler::yield() { switch_context(&current->saved, home); }

void Scheduler::run() {
#if !defined(__x86_64__)
  ucontext_t home_uc;  // switch_context saves the scheduler's context here
  home = &home_uc;
#endif
  for (auto& f : fibers) prepare(*f);
  for (size_t live = fibers.size(); live > 0;) {
    const unsigned long long before = progress;
    live = 0;
    for (auto& f : fibers) {
      if (f->done) continue;
      if (!f->started) f->started = true, ++progress;
      current = f.get();
      switch_context(&home, f->saved);
      current = nullptr;
      if (!f->done) ++live;
    }
    if (live > 0 && progress == before) {
      std::fprintf(stderr, "foscar emulation: deadlock: %zu threads wait and none can proceed\n", live);
      std::abort();
    }
  }
  for (auto& f : fibers) release(*f);
  fibers.clear();
}

}  // namespace foscar_emu

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
    // One fiber per CUDA thread: `slots` CTAs at once (FOSCAR_EMU_CONCURRENT_CTAS, default 1),
    // slot c running CTAs c, c + slots, ... one after another, its threads meeting at the CTA's
    // barrier between two (shared memory is reused, as on a GPU). More than one slot lets the
    // CTAs of a launch meet in global memory as they do on a GPU (the split merge's counters).
    const char* env = std::getenv("FOSCAR_EMU_CONCURRENT_CTAS");
    int slots = std::max(1, std::min(env ? std::atoi(env) : 1, a.num_ctas));
    if (merge_together_launch(p, a.num_ctas)) slots = a.num_ctas;  // a cooperative launch: all at once
    std::vector<std::unique_ptr<foscar_emu::Cta>> ctas;
    for (int c = 0; c < slots; ++c)
      ctas.push_back(std::make_unique<foscar_emu::Cta>(threads, decode_smem_bytes<BITS, G, KCH, VCH, DEQ, HP, CTAS>()));
    foscar_emu::Scheduler& sched = foscar_emu::scheduler();
    for (int c = 0; c < slots; ++c)
      for (unsigned t = 0; t < threads; ++t) {
        auto f = std::make_unique<foscar_emu::Fiber>();
        f->ctx.thread_idx = {t, 0, 0};
        f->ctx.block_dim = dim3(threads);
        f->ctx.grid_dim = dim3(a.num_ctas);
        f->ctx.cta = ctas[c].get();
        f->body = [&, c, fiber = f.get()] {
          for (int x = c; x < a.num_ctas; x += slots) {
            fiber->ctx.block_idx = {static_cast<unsigned>(x), 0, 0};
            kernel(p);
            fiber->ctx.cta->bar.arrive_and_wait();
          }
        };
        sched.fibers.push_back(std::move(f));
      }
    sched.run();
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
