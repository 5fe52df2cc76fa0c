/* json: constrain generation to documents valid under a JSON Schema (see README.md).
 *
 * The argument is the schema's text, optionally followed by NUL-separated options; the same
 * options may sit in the schema's root under "x-aicirt". The schema is compiled on the first
 * call; what cannot be enforced stops the sequence there with the log line
 * "json: unsupported: KEYWORD at POINTER". What depends only on the tokenizer (the token trie,
 * the token -> bytes table, the string slices and character counts) is built in the init, once
 * per tokenizer (docs/snapshots.md); what depends on the argument (the schema compiled, its
 * matcher's tables, the start configurations) in aicirt_prepare, which a Runtime runs once per
 * (schema, capabilities) and copies for every later request with it (core/prepared.py); the first
 * call then only records the prompt. A host that does not call aicirt_prepare gets the same from
 * the first call. What the compile logs is held and logged by every request's first call. On the
 * request whose state becomes that template, aicirt_prepare_template also builds the machines' DFA
 * rows ahead (option warm), for every request started from it.
 */
#include "matcher.h"

static matcher_t *M;
static const aici_trie_t *trie;
static aici_history_t sets;            /* the configurations after each generated token */
static bool fast_forward = true;
static bool check_only;                /* option check: compile, report, stop */
static bool reference_masks;           /* option reference_masks: see matcher_reference */
static uint32_t ff_streak;             /* fast-forwards in a row, without a sampled token */
static uint32_t caps;                  /* the host's capabilities (a host call: asked once) */
/* option memory_mib: guest memory (MiB) past which the document ends with a clear error instead
 * of trapping when an allocation finds the host's limit (64 MiB by default): DFA rows, frames and
 * key-set machines grow with what a document explores, and one step grows by far less than the
 * 8 MiB left */
static uint32_t memory_mib = 56;
/* option warm=N: DFA states (1 KiB of rows each, over all machines) built ahead, with their facts
 * (calls, accepting), in aicirt_prepare_template, so that the requests started from the template
 * find them built: otherwise every request builds them again as its masks first meet them (the
 * key positions: a few hundred states, ~0.4 ms a mask). A request that keeps its state to itself
 * (the first of an argument, or any on a host without templates) builds them as masks need them.
 * 0: none. */
static uint32_t warm_states = 4096;

static bool opt_is(const char *s, uint32_t n, const char *name, const char **val, uint32_t *vlen) {
  uint32_t k = 0;
  while (name[k]) k++;
  if (n < k || __builtin_memcmp(s, name, k)) return false;
  if (n == k) { *val = 0, *vlen = 0; return true; }
  if (s[k] != '=') return false;
  *val = s + k + 1, *vlen = n - k - 1;
  return true;
}

static uint32_t parse_uint(const char *s, uint32_t n) {
  uint32_t v = 0;
  for (uint32_t i = 0; i < n && s[i] >= '0' && s[i] <= '9' && v < 1000000; i++) v = v * 10 + (uint32_t)(s[i] - '0');
  return v;
}

/* name[=value] options, from the argument's NUL-separated tail */
static bool set_option(json_opts_t *o, aici_buf_t *ignore, const char *s, uint32_t n) {
  const char *v;
  uint32_t vl;
  if (opt_is(s, n, "whitespace", &v, &vl)) o->whitespace = v ? parse_uint(v, vl) : 1;
  else if (opt_is(s, n, "coerce_one_of", &v, &vl)) o->coerce_one_of = !v || v[0] != '0';
  else if (opt_is(s, n, "any_order", &v, &vl)) o->any_order = !v || v[0] != '0';
  else if (opt_is(s, n, "fast_forward", &v, &vl)) fast_forward = !v || v[0] != '0';
  else if (opt_is(s, n, "check", &v, &vl)) check_only = !v || v[0] != '0';
  else if (opt_is(s, n, "reference_masks", &v, &vl)) reference_masks = !v || v[0] != '0';
  else if (opt_is(s, n, "memory_mib", &v, &vl) && v) memory_mib = parse_uint(v, vl);
  else if (opt_is(s, n, "warm", &v, &vl) && v) warm_states = parse_uint(v, vl);
  else if (opt_is(s, n, "ignore", &v, &vl) && v) {
    if (ignore->n) aici_buf_putc(ignore, ',');
    aici_buf_putn(ignore, v, vl);
  } else {
    aici_logf("json: unknown option %.*s (options: whitespace=N, ignore=KEYWORD[,KEYWORD...], "
              "coerce_one_of, any_order, fast_forward=0, check, reference_masks, memory_mib=N, warm=N)\n", (int)n, s);
    return false;
  }
  return true;
}

/* The root's "x-aicirt": {"whitespace": 2, "ignore": ["format"], "coerce_one_of": true, ...} */
static bool schema_options(const jv_t *schema, json_opts_t *o, aici_buf_t *ignore) {
  const jv_t *x = jv_get(schema, "x-aicirt");
  if (!x) return true;
  if (x->kind != JV_OBJ) { aici_logs("json: x-aicirt must be an object\n"); return false; }
  for (uint32_t i = 0; i < x->n; i++) {
    const jv_t *k = &x->keys[i], *v = &x->items[i];
    aici_buf_t t = {0};
    aici_buf_putn(&t, k->s, k->n);
    if (v->kind == JV_ARR) {
      aici_buf_putc(&t, '=');
      for (uint32_t j = 0; j < v->n; j++) {
        if (j) aici_buf_putc(&t, ',');
        if (v->items[j].kind == JV_STR) aici_buf_putn(&t, v->items[j].s, v->items[j].n);
      }
    } else if (v->kind == JV_NUM || v->kind == JV_STR) aici_buf_putc(&t, '='), aici_buf_putn(&t, v->s, v->n);
    else if (v->kind == JV_FALSE) aici_buf_puts(&t, "=0");
    bool ok = set_option(o, ignore, t.p, t.n);
    aici_free(t.p);
    if (!ok) return false;
  }
  return true;
}

/* Once per tokenizer, before any request: no argument, no sequence (docs/snapshots.md). */
AICI_EXPORT_INIT void json_init(void) {
  trie = aici_trie();
  if (!trie) return;                   /* logged; the first call reports it again */
  aici_token_bytes(0, 0);
  matcher_prepare_tokenizer(trie);
}

/* The argument's work: parse the schema and options, compile, build the matcher's tables and the
 * start configurations (into `start`); false (with the reason logged) when it cannot be enforced. */
static cset_t start;
static bool compile_arg(void) {
  uint32_t n;
  char *a = (char *)aici_arg(&n);
  uint32_t len = 0;
  while (len < n && a[len]) len++;
  const char *err = 0;
  uint32_t at = 0;
  jv_t *schema = jv_parse(a, len, &err, &at);
  if (!schema) {
    aici_logf("json: bad schema: not JSON: %s at offset %u\n", err, at);
    return false;
  }
  json_opts_t o = {0};
  aici_buf_t ignore = {0};
  for (uint32_t i = len + 1; i < n;) {
    uint32_t k = i;
    while (k < n && a[k]) k++;
    if (k > i && !set_option(&o, &ignore, a + i, k - i)) return false;
    i = k + 1;
  }
  if (!schema_options(schema, &o, &ignore)) return false;
  o.ignore = ignore.p;
  compiled_t c = {0};
  char *cerr = 0;
  if (!schema_compile(schema, &o, &c, &cerr)) {
    aici_logf("json: %s\n", cerr);
    return false;
  }
  if (c.log.n) aici_log(c.log.p, c.log.n);
  M = matcher_new(&c, &cerr);          /* (under check too: its tables may refuse the schema) */
  if (!M) {
    aici_logf("json: %s\n", cerr);
    return false;
  }
  if (check_only) {
    aici_logf("json: schema ok (%u machines)\n", c.n);
    M = 0;
    return false;
  }
  if (!(trie = aici_trie())) return false;
  matcher_reference(M, reference_masks);
  caps = aici_capabilities();
  aici_token_bytes(0, 0);              /* the token -> bytes table now (from the init, if it ran) */
  matcher_prepare(M, trie);
  matcher_start(M, &start);
  if (!start.c[0].s) {
    aici_logs("json: the schema admits no document\n");
    M = 0;
    return false;
  }
  return true;
}

static aici_prepared_t prep;           /* compile_arg's verdict and log (aicirt_prepare or the first call) */

AICI_EXPORT_PREPARE void json_prepare(void) { aici_prepare_run(&prep, compile_arg); }

/* Only on the request whose state becomes the template (docs/protocol.md): the rows built here
 * are shared by every request started from it, and a schema's first request, which keeps its
 * state to itself, does not pay for them. */
AICI_EXPORT_PREPARE_TEMPLATE void json_prepare_template(void) {
  if (prep.ok && M) matcher_warm(M, warm_states);
}

static bool setup(const aici_arg_t *arg) {
  if (!aici_prepared(&prep, compile_arg)) return false;
  aici_history_init(&sets, arg, sizeof start, &start);
  return true;
}

/* One generated token from the configurations *set: false when the text leaves the schema. */
static bool feed(void *ctx, void *set, aici_token_t t) {
  (void)ctx;
  uint32_t len;
  const uint8_t *b = aici_token_bytes(t, &len);
  return matcher_advance(M, set, b, len);
}

/* Text the schema forces next, fast-forwarded as the tokenizer would write it: the last token
 * and the forced text are tokenized together (so the split is canonical), the final token is
 * left to sampling (it may merge with what follows), and the old last token is replaced only
 * if the new split starts differently. */
static bool try_fast_forward(const aici_arg_t *arg, aici_result_t *res, const cset_t *set) {
  if (!fast_forward || !(caps & AICI_CAP_FF_TOKENS) || ff_streak >= 4) return false;
  uint8_t forced[256];
  uint32_t nf = 0;
  cset_t s = *set;
  while (nf < sizeof forced) {
    int b = matcher_forced_byte(M, &s);
    if (b < 0) break;
    forced[nf++] = (uint8_t)b;
    cset_t t;
    matcher_step(M, &s, (uint8_t)b, &t);
    s = t;
  }
  uint32_t ok;
  aici_utf8_whole(forced, nf, &ok);
  if (ok < 2) return false;
  uint32_t gen = arg->n_all_tokens - sets.prompt_len;
  aici_token_t last = gen > 0 ? arg->all_tokens[arg->n_all_tokens - 1] : 0;
  aici_heal_t h;
  if (!aici_heal_tokenize(&h, gen > 0 && (caps & AICI_CAP_BACKTRACK) ? &last : 0, forced, ok)) return false;
  aici_token_t *toks = h.toks;
  uint32_t bt = h.joined, from = 0, n = h.nt ? h.nt - 1 : 0;   /* the final token stays open */
  if (bt && n && toks[0] == last) from = 1, bt = 0;
  bool done = false;
  if (n > from) {
    /* every token must keep the text valid (a tokenizer may normalize) */
    cset_t c = ((const cset_t *)sets.states)[gen - bt];
    bool valid = true;
    uint32_t pos = from ? h.plen : 0;  /* from == 1: toks[0] is the kept last token */
    for (uint32_t i = from; i < n && valid; i++) {
      uint32_t len;
      const uint8_t *b;
      valid = aici_heal_token_at(&h, toks[i], &pos, &b, &len) && matcher_advance(M, &c, b, len);
    }
    if (valid) {
      aici_ff(res, bt, toks + from, n - from);
      ff_streak++;
      done = true;
    }
  }
  aici_free(toks);
  return done;
}

/* false (logged, the sequence ends) once guest memory is past memory_mib */
static bool memory_ok(void) {
  size_t mib = __builtin_wasm_memory_size(0) / 16;
  if (mib <= memory_mib) return true;
  aici_logf("json: out of memory: guest memory reached %zu MiB (%u DFA states in %u machines), past the %u MiB "
            "this controller keeps below the host's limit; the document ends here (option memory_mib=N)\n",
            mib, matcher_dfa_states(M), matcher_machines(M), memory_mib);
  M = 0;
  return false;
}

static bool can_continue(const cset_t *set) {
  cset_t t;
  for (int b = 0; b < 256; b++)
    if (matcher_step(M, set, (uint8_t)b, &t)) return true;
  return false;
}

void aici_step(const aici_arg_t *arg, aici_result_t *res) {
  if (arg->call_index == 0 && !setup(arg)) return;
  if (!M || !memory_ok()) return;
  if (arg->n_all_tokens < sets.prompt_len) {
    aici_logs("json: backtracked into the prompt\n");
    return;
  }
  aici_token_t eos = aici_eos_token();
  if (arg->has_sampled) {
    if (arg->sampled == eos) return;   /* EOS chosen while the document was complete */
    ff_streak = 0;
  }
  if (!aici_history_update(&sets, arg, feed, 0)) {
    aici_logs("json: the text no longer matches the schema\n");
    return;
  }
  const cset_t *set = aici_history_state(&sets);
  bool accepting = matcher_accepting(M, set);
  if (accepting && !can_continue(set)) return;   /* a complete document: stop */
  if (!accepting && try_fast_forward(arg, res, set)) return;
  const aici_tokset_t *m = matcher_mask(M, trie, set, eos);
  if (!accepting && aici_tokset_empty(m)) {
    aici_logs("json: no token can continue the document\n");
    return;
  }
  aici_sample(res, m);
}
