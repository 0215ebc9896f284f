/* C ABI of the FOSCAR kernels, loaded from Python with ctypes (foscar/kernels.py).
 * A plain C struct keeps the binding free of any framework's headers and ABI: the
 * library builds in seconds with nvcc alone, and CI compiles it with no GPU and no torch. */
#ifndef FOSCAR_API_H_
#define FOSCAR_API_H_
#include <stdint.h>

/* The library is built with hidden visibility (a second variant library loaded beside the
 * first must not share its internal state); these are the only exported symbols. */
#if defined(__GNUC__)
#define FOSCAR_EXPORT __attribute__((visibility("default")))
#else
#define FOSCAR_EXPORT
#endif

#ifdef __cplusplus
extern "C" {
#endif

typedef struct FoscarDecodeArgs {
  const void* q;          /* bf16 [batch, num_q_heads, head_dim] */
  void* o;                /* bf16 [batch, num_q_heads, head_dim] */
  const void* k_codes;    /* int32, docs/FORMAT.md */
  const void* v_codes;
  const void* k_params;   /* fp16 (scale, offset) pairs */
  const void* v_params;
  const int32_t* page_table;
  const int32_t* seq_lens;
  const void* k_tail;     /* bf16 [batch, num_kv_heads, group_size, head_dim] */
  const void* v_tail;
  float* ws_o;            /* fp32 [batch, num_q_heads, num_splits, head_dim] when num_splits > 1 */
  float* ws_ml;           /* fp32 [batch, num_q_heads, num_splits, 2] */
  int32_t* ws_count;      /* int32 [batch, num_kv_heads], zero before the first launch (kept zero) */
  int32_t batch, num_q_heads, num_kv_heads, head_dim;
  int32_t bits, group_size, k_channel, v_channel, dequant;
  int32_t page_size, max_pages;
  int32_t num_splits, units_per_split; /* splits per (sequence, KV head); 64-token chunks per split */
  int32_t num_ctas;       /* persistent CTAs to launch (they loop over the work items) */
  int32_t kv_heads_per_item; /* 1, or 2 (two KV heads' queries share S's columns) where
                              * foscar_kv_heads_per_item allows it; the planner chooses */
  float sm_scale;
  int32_t device;         /* CUDA device index of every pointer above; the launch goes there */
  uint64_t* timeline;     /* lab knob FOSCAR_TIMELINE only (foscar_decode.cuh): int64 [num_ctas,
                           * kTimelineItems, kTimelinePhases] of %globaltimer stamps, zeroed by the
                           * caller; NULL otherwise */
  int32_t reserved0;            /* reserved0 and reserved1 were the retired stolen tail's (v36); both */
  int32_t reserved1;            /* must be 0. Kept so that the fields after them stay in place: fields
                                 * are only ever appended (kernel_lab --prebuilt loads other commits) */
  int32_t ctas_per_sm;          /* 0: the kernel instance of foscar_ctas_per_sm; or the count of
                                 * foscar_ctas_per_sm_alt, its second instance (the planner's choice) */
} FoscarDecodeArgs;

/* Launches the decode on `stream` (splits of one sequence merge in the same launch). Returns 0
 * on success; otherwise foscar_last_error() says what was wrong. */
FOSCAR_EXPORT int foscar_decode(const FoscarDecodeArgs* args, void* stream);
FOSCAR_EXPORT const char* foscar_last_error(void);
/* CTAs per SM one decode kernel instance is made for (the planner sizes the persistent grid by
 * it), or -1 if it is not built. */
FOSCAR_EXPORT int foscar_ctas_per_sm(int bits, int group_size, int k_channel, int v_channel, int dequant,
                                     int heads_per_item);
/* CTAs per SM of an instance's second instance, built at another count (the planner launches it
 * where splits are long: foscar/kernels.py, ALT_MIN_CHUNKS), 0 where it has none, -1 if the
 * instance is not built. */
FOSCAR_EXPORT int foscar_ctas_per_sm_alt(int bits, int group_size, int k_channel, int v_channel, int dequant,
                                         int heads_per_item);
/* Dynamic shared memory per CTA of one decode kernel instance, or -1 if it is not built. */
FOSCAR_EXPORT int foscar_decode_smem_bytes(int bits, int group_size, int k_channel, int v_channel, int dequant,
                                           int heads_per_item);
/* The most KV heads one work item can hold for this head layout in this build: 2 where two KV
 * heads' query heads fill the 8 columns of S together (2 or 4 query heads per KV head, an even
 * number of KV heads), else 1. */
FOSCAR_EXPORT int foscar_kv_heads_per_item(int num_q_heads, int num_kv_heads);

#ifdef __cplusplus
}
#endif
#endif
