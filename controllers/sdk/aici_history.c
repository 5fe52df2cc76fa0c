/* aici_history.c - a controller's state after each generated token, kept in step with the
 * sequence: what the host took back is dropped, what it appended is fed, one token at a time,
 * so a backtrack costs nothing but an index (the catch-up loop every constraint needs). */
#include "aici.h"

void aici_history_init(aici_history_t *h, const aici_arg_t *arg, uint32_t state_size, const void *start) {
  h->size = state_size;
  h->cap = 64;
  h->states = aici_malloc((size_t)h->cap * state_size);
  __builtin_memcpy(h->states, start, state_size);
  h->n_seen = 0;
  h->prompt_len = arg->n_all_tokens;
}

void *aici_history_state(const aici_history_t *h) { return (char *)h->states + (size_t)h->n_seen * h->size; }

bool aici_history_update(aici_history_t *h, const aici_arg_t *arg, aici_history_step_fn step, void *ctx) {
  if (arg->n_all_tokens < h->prompt_len) return false;
  uint32_t gen = arg->n_all_tokens - h->prompt_len;
  uint32_t keep = arg->backtrack > h->n_seen ? 0 : h->n_seen - arg->backtrack;
  if (keep > gen) keep = gen;
  if (gen + 1 > h->cap) {
    while (gen + 1 > h->cap) h->cap *= 2;
    h->states = aici_realloc(h->states, (size_t)h->cap * h->size);
  }
  h->n_seen = keep;
  for (uint32_t k = keep; k < gen; k++) {
    char *next = (char *)h->states + (size_t)(k + 1) * h->size;
    __builtin_memcpy(next, next - h->size, h->size);
    if (!step(ctx, next, arg->all_tokens[h->prompt_len + k])) return false;
    h->n_seen = k + 1;
  }
  return true;
}
