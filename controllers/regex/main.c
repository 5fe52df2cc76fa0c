/* regex: constrain generation to a regex given as the argument (see README.md). The token trie
 * and the token -> bytes table depend only on the tokenizer: the init builds them once per
 * tokenizer (docs/snapshots.md), so a request's first call only compiles its pattern; and that in
 * aicirt_prepare, once per (pattern, capabilities) in a Runtime (docs/snapshots.md#prepared-templates). */
#include "aici.h"

static aici_regex_t *re;
static const aici_trie_t *trie;
static aici_history_t states;          /* the DFA state after each generated token */
static bool use_cache = true, use_slices = true, log_slice = false, slices_now = false;

AICI_EXPORT_INIT void regex_init(void) {
  uint32_t n;
  if ((trie = aici_trie())) aici_token_bytes(0, 0), aici_trie_std_slices(trie, true, &n);
}

/* The argument's work (aicirt_prepare, or the first call where no host ran it): options, the
 * pattern compiled. A bad pattern is an error (a trap, the reason logged). */
static bool compile_arg(void) {
  uint32_t n;
  char *a = (char *)aici_arg(&n);
  uint32_t plen = 0;                   /* "REGEX" or "REGEX\0option..." */
  while (plen < n && a[plen]) plen++;
  for (uint32_t i = plen + 1; i + 7 <= n; i++)
    if (!__builtin_memcmp(a + i, "nocache", 7)) use_cache = false;
  for (uint32_t i = plen + 1; i + 8 <= n; i++)
    if (!__builtin_memcmp(a + i, "noslices", 8)) use_slices = false;
  for (uint32_t i = plen + 1; i + 8 <= n; i++)
    if (!__builtin_memcmp(a + i, "logslice", 8)) log_slice = true;
  for (uint32_t i = plen + 1; i + 9 <= n; i++)
    if (!__builtin_memcmp(a + i, "slicesnow", 9)) slices_now = true;
  bool bytes = false;                  /* option bytes: `.` and [^...] match single bytes */
  for (uint32_t i = plen + 1; i + 5 <= n; i++)
    if (!__builtin_memcmp(a + i, "bytes", 5)) bytes = true;
  char *err = 0;
  re = bytes ? aici_regex_compile(a, plen, &err) : aici_regex_compile_text(a, plen, &err);
  if (!re) aici_fail("regex: %s in pattern '%.*s'", err, (int)plen, a);   /* a bad argument is an error */
  aici_free(a);
  if (!use_cache) aici_regex_cache_limit(re, 0);
  aici_regex_use_slices(re, use_slices);
  if (slices_now) aici_regex_slices_after(re, 0);
  if (!(trie = aici_trie())) return false;
  aici_token_bytes(0, 0);              /* the token -> bytes table now, not on step 1 (init built it) */
  return true;
}

static aici_prepared_t prep;

AICI_EXPORT_PREPARE void regex_prepare(void) { aici_prepare_run(&prep, compile_arg); }

static bool setup(const aici_arg_t *arg) {
  if (!aici_prepared(&prep, compile_arg)) return false;
  uint32_t start = aici_regex_start(re);
  aici_history_init(&states, arg, sizeof start, &start);
  return true;
}

/* One generated token from the DFA state *st: false when the text no longer matches. */
static bool feed(void *ctx, void *st, aici_token_t t) {
  (void)ctx;
  uint32_t len;
  const uint8_t *b = aici_token_bytes(t, &len);
  *(uint32_t *)st = aici_regex_advance(re, *(uint32_t *)st, b, len);
  return *(uint32_t *)st != 0;
}

void aici_step(const aici_arg_t *arg, aici_result_t *res) {
  if (arg->call_index == 0 && !setup(arg)) return;
  if (!re) return;
  if (arg->n_all_tokens < states.prompt_len) {
    aici_logs("regex: backtracked into the prompt\n");
    return;
  }
  aici_token_t eos = aici_eos_token();
  if (arg->has_sampled && arg->sampled == eos) return;     /* EOS chosen while accepting */
  uint32_t s = aici_history_update(&states, arg, feed, 0) ? *(uint32_t *)aici_history_state(&states) : 0;
  if (!s) {
    aici_logs("regex: the text no longer matches\n");
    return;
  }
  bool accepting = aici_regex_accepting(re, s);
  if (accepting && !aici_regex_can_continue(re, s)) return;  /* complete match: stop */
  if (log_slice) {
    const aici_slice_t *sl = aici_regex_slice(re, trie, s);
    if (sl) aici_logf("regex: slice of %u tokens, rest trie of %u nodes\n", sl->n_tokens, sl->rest.n_nodes);
    else aici_logs("regex: whole trie\n");
  }
  aici_tokset_t *m;
  if (use_cache) {
    m = (aici_tokset_t *)aici_regex_mask_now(re, trie, s);   /* EOS bit depends only on s */
  } else {
    m = aici_tokset_tmp();
    aici_regex_mask_write(re, trie, s, m);
  }
  if (accepting) aici_tokset_allow(m, eos);
  else if (aici_tokset_empty(m)) {
    aici_logs("regex: no token can continue the match\n");
    return;
  }
  aici_sample(res, m);
}
