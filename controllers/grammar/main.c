/* grammar: constrain generation to a context-free grammar given as the argument (Lark, as
 * llguidance reads it, or GBNF; see README.md and docs/grammar.md). The core is a library
 * (grammar.h); this file keeps one matcher position per generated token for backtracking. The
 * grammar is compiled in aicirt_prepare: once per (grammar, capabilities) in a Runtime, whose later
 * requests start from a copy (docs/snapshots.md#prepared-templates). */
#include "grammar.h"

static gr_grammar_t *gram;
static gr_matcher_t *mt;
static const aici_trie_t *trie;
static aici_history_t marks;           /* the matcher's position after each generated token */
static aici_tokset_t *mask;            /* this call's mask (gr_mask overwrites it: not an arena set,
                                        * which the SDK would clear first) */

AICI_EXPORT_INIT void grammar_init(void) {
  if (!(trie = aici_trie())) return;
  aici_token_bytes(0, 0);
  gr_prepare_tokenizer(trie);
}

static bool has_opt(const char *a, uint32_t from, uint32_t n, const char *opt) {
  uint32_t k = (uint32_t)__builtin_strlen(opt);
  for (uint32_t i = from; i + k <= n; i++)
    if ((i == from || a[i - 1] == 0) && !__builtin_memcmp(a + i, opt, k) && (i + k == n || a[i + k] == 0)) return true;
  return false;
}

/* The argument's work (aicirt_prepare, or the first call where no host ran it): the grammar
 * compiled, its matcher at the start. A bad grammar is an error (a trap, the reason logged). */
static bool compile_arg(void) {
  uint32_t n;
  char *a = (char *)aici_arg(&n);
  uint32_t glen = 0;                   /* "GRAMMAR" or "GRAMMAR\0option\0..." */
  while (glen < n && a[glen]) glen++;
  char *err = 0;
  if (has_opt(a, glen + 1, n, "gbnf")) gram = gr_compile_gbnf(a, glen, &err);
  else if (has_opt(a, glen + 1, n, "lark")) gram = gr_compile_lark(a, glen, &err);
  else gram = gr_compile(a, glen, &err);
  if (!gram) aici_fail("grammar: %s", err);          /* a bad argument is an error (first call) */
  bool check = has_opt(a, glen + 1, n, "check");
  aici_free(a);
  if (!(trie = aici_trie())) return false;
  aici_token_bytes(0, 0);
  mt = gr_matcher_new(gram);
  if (check) {
    aici_logf("grammar: ok, %u terminals, %u rules, %u productions\n", gram->n_terms, gram->n_nts, gram->n_prods);
    return false;
  }
  return true;
}

static aici_prepared_t prep;
static gr_mark_t start;

AICI_EXPORT_PREPARE void grammar_prepare(void) { aici_prepare_run(&prep, compile_arg); }

static bool setup(const aici_arg_t *arg) {
  if (!aici_prepared(&prep, compile_arg)) return false;
  start = gr_save(mt);
  aici_history_init(&marks, arg, sizeof start, &start);
  return true;
}

/* One generated token from the position *mark: false when it leaves the grammar. */
static bool feed(void *ctx, void *mark, aici_token_t t) {
  (void)ctx;
  uint32_t len;
  gr_restore(mt, *(gr_mark_t *)mark);
  const uint8_t *b = aici_token_bytes(t, &len);
  if (b ? !gr_advance(mt, b, len) : !gr_advance_token(mt, t)) return false;
  *(gr_mark_t *)mark = gr_save(mt);
  return true;
}

/* Bring the matcher up to date with the sequence: drop backtracked tokens, feed new ones.
 * false: a token the grammar does not allow (the host forced it). */
static bool catch_up(const aici_arg_t *arg) {
  bool ok = aici_history_update(&marks, arg, feed, 0);
  gr_restore(mt, *(gr_mark_t *)aici_history_state(&marks));
  return ok;
}

/* Whether m is {eos} (stops at the first other token: most masks hold one early). */
static bool only_eos(const aici_tokset_t *m, aici_token_t eos) {
  if (!aici_tokset_has(m, eos)) return false;
  for (uint32_t w = 0; w < m->n_words; w++)
    if (m->words[w] & ~(w == eos >> 5 ? 1u << (eos & 31) : 0u)) return false;
  return true;
}

void aici_step(const aici_arg_t *arg, aici_result_t *res) {
  if (arg->call_index == 0 && !setup(arg)) return;
  if (!mt) return;
  if (arg->n_all_tokens < marks.prompt_len) { aici_logs("grammar: backtracked into the prompt\n"); return; }
  aici_token_t eos = aici_eos_token();
  if (arg->has_sampled && arg->sampled == eos) return;   /* EOS chosen while accepting */
  if (!catch_up(arg)) { aici_logs("grammar: the text no longer matches the grammar\n"); return; }
  if (!mask) mask = aici_tokset_new();
  gr_mask(mt, trie, eos, mask);
  if (only_eos(mask, eos)) return;     /* complete: nothing can follow */
  if (aici_tokset_empty(mask)) { aici_logs("grammar: no token can continue the grammar\n"); return; }
  aici_sample(res, mask);
}
