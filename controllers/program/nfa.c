/* The interpreter: a set of live states over the program's NFA (program.h), stepped by bytes
 * (and by whole tokens for token-level leaves), with the closure that crosses epsilon edges, and
 * the mask: one walk of the token trie over the set (cached per set), or, when the set is one
 * leaf with nothing but the end after it, that leaf's own cached mask. */
#include "program.h"


static uint32_t *seen, seen_gen;       /* per node: the closure generation that visited it */
static bool overflow_logged, lost_logged;

/* ---- grammar leaves: one matcher per node, positions checked against the text it holds ---- */

#define GH0 0xcbf29ce484222325ull
static uint64_t gh(uint64_t h, uint8_t b) { return (h ^ b) * 0x100000001b3ull; }

void gram_init(gnode_t *g) {
  g->gm = gr_matcher_new(g->gram);
  g->g0 = gr_save(g->gm);
  g->ph_cap = 64, g->ph = aici_malloc(g->ph_cap * 8), g->ph[0] = GH0, g->ph_len = 0;
}

static gst_t gram_start(const gnode_t *g) { return (gst_t){g->g0, 0, GH0}; }

/* Puts g's matcher at x; false when it no longer holds x's text (a position of this node that
 * another path of the same node overwrote: a grammar re-entered while it is live, e.g. in a
 * `star`; logged once, the state dies). */
static bool gram_at(gnode_t *g, const gst_t *x) {
  if (x->len > g->ph_len || g->ph[x->len] != x->h) {
    if (!lost_logged) aici_logs("program: a grammar was re-entered while live; the older position is dropped\n");
    lost_logged = true;
    return false;
  }
  gr_restore(g->gm, x->mark);
  g->ph_len = x->len;
  return true;
}

static bool gram_step(gnode_t *g, const gst_t *x, uint8_t b, gst_t *y) {
  if (!gram_at(g, x) || !gr_advance(g->gm, &b, 1)) return false;
  *y = (gst_t){gr_save(g->gm), x->len + 1, gh(x->h, b)};
  if (y->len >= g->ph_cap) g->ph_cap *= 2, g->ph = aici_realloc(g->ph, g->ph_cap * 8);
  g->ph[y->len] = y->h, g->ph_len = y->len;
  return true;
}

/* The grammar's own mask at x (EOS where it accepts), in the node's buffer. */
static const aici_tokset_t *gram_mask(gnode_t *g, const aici_trie_t *trie, const gst_t *x, aici_token_t eos) {
  if (!g->gmask) g->gmask = aici_tokset_new();
  if (!gram_at(g, x)) {
    aici_tokset_clear(g->gmask);
    return g->gmask;
  }
  gr_mask(g->gm, trie, eos, g->gmask);
  g->ph_len = x->len;                  /* the walk overwrote what lay beyond x */
  return g->gmask;
}

/* A state's matcher data: json configurations, a grammar position, or nothing. */
static const void *extra_of(const program_t *p, const sset_t *set, const st_t *st) {
  uint8_t k = p->g[st->node].kind;
  return k == G_JSON ? (const void *)&set->js[st->s] : k == G_GRAM ? (const void *)&set->gs[st->s] : 0;
}

/* ---- leaves ------------------------------------------------------------------------------- */

static bool leaf_accepting(const program_t *p, const sset_t *set, const st_t *st) {
  const gnode_t *g = &p->g[st->node];
  switch (g->kind) {
    case G_LIT: return st->s == g->lit_len + 1;
    case G_RE: return aici_regex_accepting(g->re, st->s);
    case G_JSON: return matcher_accepting(g->json, &set->js[st->s]);
    case G_TEXT: return true;
    case G_TOK: return st->s == 2;
    case G_GRAM: return gram_at((gnode_t *)g, &set->gs[st->s]) && gr_accepting(g->gm);
    default: return false;
  }
}

static bool leaf_can_continue(const program_t *p, const sset_t *set, const st_t *st) {
  const gnode_t *g = &p->g[st->node];
  switch (g->kind) {
    case G_LIT: return st->s <= g->lit_len;
    case G_RE: return aici_regex_can_continue(g->re, st->s);
    case G_JSON: {
      cset_t t;
      for (int b = 0; b < 256; b++)
        if (matcher_step(g->json, &set->js[st->s], (uint8_t)b, &t)) return true;
      return false;
    }
    case G_TEXT: return st->n_tok <= g->max_tokens;   /* n_tok counts the token being read */
    case G_TOK: return st->s == 1;
    case G_GRAM: return gram_at((gnode_t *)g, &set->gs[st->s]) && gr_can_continue(g->gm);
    default: return false;
  }
}

/* ---- sets --------------------------------------------------------------------------------- */

typedef struct {
  stepctx_t *c;
  sset_t *out;
  path_t *paths;                       /* out's paths (advance mode) */
} adder_t;

static bool same_state(const sset_t *a, const st_t *x, const sset_t *b, const st_t *y, const program_t *p) {
  if (x->node != y->node) return false;
  if (p->g[x->node].kind == G_GRAM) {
    const gst_t *u = &a->gs[x->s], *v = &b->gs[y->s];
    return u->len == v->len && u->h == v->h && u->mark.n_sets == v->mark.n_sets && u->mark.lex == v->mark.lex &&
           u->mark.at_start == v->mark.at_start;
  }
  if (p->g[x->node].kind != G_JSON) return x->s == y->s;
  const cset_t *u = &a->js[x->s], *v = &b->js[y->s];
  return u->n == v->n && !__builtin_memcmp(u->c, v->c, u->n * sizeof(cfg_t));
}

/* Adds `st` (whose matcher data, for a json or grammar leaf, is *x: extra_of) unless already there. */
static bool add(adder_t *a, st_t st, const void *x, const path_t *path) {
  sset_t *o = a->out;
  program_t *p = a->c->p;
  bool is_json = p->g[st.node].kind == G_JSON, is_gram = p->g[st.node].kind == G_GRAM;
  sset_t tmp;
  if (is_json) tmp.js[0] = *(const cset_t *)x;
  if (is_gram) tmp.gs[0] = *(const gst_t *)x;
  for (uint32_t i = 0; i < o->n; i++) {
    st_t probe = st;
    if (is_json || is_gram) probe.s = 0;
    if (same_state(o, &o->st[i], is_json || is_gram ? &tmp : o, &probe, p)) return false;
  }
  if (o->n == MAX_STATES || (is_json && o->nj == MAX_JSON) || (is_gram && o->ng == MAX_GRAM)) {
    if (!overflow_logged) aici_logs("program: over 16 live states (or 2 JSON or 2 grammar ones); the extra are dropped\n");
    overflow_logged = true;
    return false;
  }
  if (is_json) o->js[o->nj] = *(const cset_t *)x, st.s = o->nj++;
  if (is_gram) o->gs[o->ng] = *(const gst_t *)x, st.s = o->ng++;
  if (a->paths && path) a->paths[o->n] = *path;
  o->st[o->n++] = st;
  return true;
}

static void enter(adder_t *a, uint32_t n, const path_t *path, uint32_t pos, uint32_t depth);

static void follow(adder_t *a, uint32_t n, const path_t *path, uint32_t pos, uint32_t depth) {
  const gnode_t *g = &a->c->p->g[n];
  for (uint32_t i = 0; i < g->n_next; i++) enter(a, g->next[i], path, pos, depth + 1);
}

/* A leaf's state after its bytes: add it (unless it can only end here) and, where it accepts,
 * what follows it. */
static void arrive(adder_t *a, st_t st, const void *x, const path_t *path, uint32_t pos, uint32_t depth) {
  program_t *p = a->c->p;
  sset_t one;
  one.n = 1, one.nj = one.ng = 0;
  uint8_t kind = p->g[st.node].kind;
  if (kind == G_JSON) one.js[0] = *(const cset_t *)x, one.nj = 1;
  if (kind == G_GRAM) one.gs[0] = *(const gst_t *)x, one.ng = 1;
  st_t local = st;
  if (kind == G_JSON || kind == G_GRAM) local.s = 0;
  bool acc = leaf_accepting(p, &one, &local);
  if (!acc || leaf_can_continue(p, &one, &local)) add(a, st, x, path);
  if (acc) follow(a, st.node, path, pos, depth);
}

static bool vars_set(const gnode_t *g) {
  for (uint32_t i = 0; i < g->n_vars; i++) {
    uint32_t len;
    uint8_t *v = aici_var_get(g->vars[i], &len);
    if (!v) return false;
    aici_free(v);
  }
  return true;
}

static void enter(adder_t *a, uint32_t n, const path_t *path, uint32_t pos, uint32_t depth) {
  program_t *p = a->c->p;
  const gnode_t *g = &p->g[n];
  if (depth > 512) return;
  if (g->kind == G_EPS || g->kind == G_OPEN || g->kind == G_CLOSE) {
    if (seen[n] == seen_gen) return;   /* an epsilon cycle (a repeat of something nullable) */
    seen[n] = seen_gen;
  }
  switch (g->kind) {
    case G_LIT: arrive(a, (st_t){n, 1, 0}, 0, path, pos, depth); break;
    case G_RE: arrive(a, (st_t){n, aici_regex_start(g->re), 0}, 0, path, pos, depth); break;
    case G_JSON: {
      cset_t js;
      matcher_start(g->json, &js);
      if (js.n && js.c[0].s) arrive(a, (st_t){n, 0, 0}, &js, path, pos, depth);
      break;
    }
    case G_GRAM: {
      gst_t x = gram_start(g);
      arrive(a, (st_t){n, 0, 0}, &x, path, pos, depth);
      break;
    }
    case G_TEXT:
      if (g->max_tokens) add(a, (st_t){n, 1, 0}, 0, path);
      follow(a, n, path, pos, depth);
      break;
    case G_TOK: add(a, (st_t){n, 1, 0}, 0, path); break;
    case G_EPS: follow(a, n, path, pos, depth); break;
    case G_OPEN:
    case G_CLOSE: {
      if (!a->paths || !path) { follow(a, n, path, pos, depth); break; }
      path_t q = *path;
      if (g->kind == G_OPEN) q.open[g->cap] = pos;
      else if (q.n_ev < MAX_EV) q.ev[q.n_ev++] = (cev_t){g->cap, q.open[g->cap], pos};
      follow(a, n, &q, pos, depth);
      break;
    }
    case G_WAIT:
      if (a->c->barriers_open && vars_set(g)) follow(a, n, path, pos, depth);
      else add(a, (st_t){n, 0, 0}, 0, path);
      break;
    case G_FORK:
    case G_BT:
    case G_END: add(a, (st_t){n, 0, 0}, 0, path); break;
  }
}

static void new_gen(program_t *p) {
  if (!seen) seen = aici_calloc(p->n, 4);
  if (++seen_gen == 0) __builtin_memset(seen, 0, p->n * 4), seen_gen = 1;
}

void nfa_start(program_t *p, sset_t *out, path_t *caps) {
  stepctx_t c = {.p = p, .caps = caps, .barriers_open = true};
  out->n = out->nj = out->ng = 0;
  path_t path;
  __builtin_memset(&path, 0xff, sizeof path);
  path.n_ev = 0;
  adder_t a = {&c, out, caps};
  new_gen(p);
  enter(&a, p->start, caps ? &path : 0, 0, 0);
}

/* One byte for every byte-level state of `in`. first_byte: the first byte of a token (free text
 * counts the tokens it has taken). */
static void step_into(stepctx_t *c, const sset_t *in, uint8_t byte, adder_t *a, bool first_byte) {
  program_t *p = c->p;
  const path_t *inp = c->in_caps;
  for (uint32_t i = 0; i < in->n; i++) {
    st_t st = in->st[i];
    const gnode_t *g = &p->g[st.node];
    const path_t *path = inp ? &inp[i] : 0;
    new_gen(p);
    switch (g->kind) {
      case G_LIT:
        if (st.s <= g->lit_len && g->lit[st.s - 1] == byte) st.s++, arrive(a, st, 0, path, c->pos + 1, 0);
        break;
      case G_RE: {
        uint32_t ns = aici_regex_step(g->re, st.s, byte);
        if (ns) st.s = ns, arrive(a, st, 0, path, c->pos + 1, 0);
        break;
      }
      case G_JSON: {
        cset_t js;
        if (matcher_step(g->json, &in->js[st.s], byte, &js)) arrive(a, st, &js, path, c->pos + 1, 0);
        break;
      }
      case G_GRAM: {
        gst_t y;
        if (gram_step((gnode_t *)g, &in->gs[st.s], byte, &y)) arrive(a, st, &y, path, c->pos + 1, 0);
        break;
      }
      case G_TEXT: {
        uint32_t ns = g->ac.go[st.s * 256 + byte];
        if (g->ac.hit[ns]) break;
        st.s = ns;
        if (first_byte) st.n_tok++;
        arrive(a, st, 0, path, c->pos + 1, 0);
        break;
      }
      default: break;                  /* token leaves, barriers and the end take no bytes */
    }
  }
}

bool nfa_step(stepctx_t *c, const sset_t *in, uint8_t byte, sset_t *out) {
  out->n = out->nj = out->ng = 0;
  adder_t a = {c, out, c->caps};
  step_into(c, in, byte, &a, false);
  return out->n > 0;
}

static sset_t buf[2];
static path_t bufp[2][MAX_STATES];

bool nfa_advance_token(stepctx_t *c, const sset_t *in, aici_token_t t, sset_t *out) {
  program_t *p = c->p;
  uint32_t len = 0;
  const uint8_t *b = aici_token_bytes(t, &len);
  path_t *pout = c->caps;
  uint32_t pos0 = c->pos;
  const path_t *in_caps = c->in_caps;
  out->n = out->nj = out->ng = 0;
  adder_t ao = {c, out, pout};
  /* token leaves take the token whole */
  for (uint32_t i = 0; i < in->n; i++) {
    const gnode_t *g = &p->g[in->st[i].node];
    if (g->kind != G_TOK || in->st[i].s != 1 || !aici_tokset_has(g->toks, t)) continue;
    new_gen(p);
    arrive(&ao, (st_t){in->st[i].node, 2, 0}, 0, in_caps ? in_caps + i : 0, pos0 + len, 0);
  }
  /* the byte-level states take its bytes, ping-ponging between two buffers */
  const sset_t *from = in;
  const path_t *fromp = in_caps;
  uint32_t k = 0;
  for (; b && k < len; k++) {
    sset_t *to = &buf[k & 1];
    path_t *top = pout ? bufp[k & 1] : 0;
    to->n = to->nj = to->ng = 0;
    adder_t a = {c, to, top};
    c->in_caps = fromp, c->pos = pos0 + k;
    step_into(c, from, b[k], &a, k == 0);
    from = to, fromp = top;
    if (!to->n) break;
  }
  c->pos = pos0, c->in_caps = in_caps;
  if (b && len && k == len)
    for (uint32_t i = 0; i < from->n; i++) {
      const st_t *st = &from->st[i];
      add(&ao, *st, extra_of(p, from, st), fromp ? &fromp[i] : 0);
    }
  /* free text that has spent its token budget can only end (its continuations are in the set) */
  uint32_t w = 0;
  for (uint32_t i = 0; i < out->n; i++) {
    const gnode_t *g = &p->g[out->st[i].node];
    if (g->kind == G_TEXT && out->st[i].n_tok >= g->max_tokens) continue;
    if (pout) pout[w] = pout[i];
    out->st[w++] = out->st[i];
  }
  out->n = w;
  return out->n > 0;
}

void nfa_resume(stepctx_t *c, uint32_t bt, const path_t *path, uint32_t cut, sset_t *out) {
  path_t q = *path;
  for (uint32_t k = 0; k < MAX_CAPS; k++)
    if (q.open[k] != NO_POS && q.open[k] > cut) q.open[k] = NO_POS;
  q.n_ev = 0;
  out->n = out->nj = out->ng = 0;
  adder_t a = {c, out, c->caps};
  c->barriers_open = true;
  new_gen(c->p);
  follow(&a, bt, c->caps ? &q : 0, c->pos, 0);
}

void nfa_reopen(stepctx_t *c, sset_t *set, int fork_branch) {
  program_t *p = c->p;
  bool any = false;
  for (uint32_t i = 0; i < set->n; i++) {
    const gnode_t *g = &p->g[set->st[i].node];
    any |= (g->kind == G_WAIT && vars_set(g)) || (g->kind == G_FORK && fork_branch >= 0);
  }
  if (!any) return;
  sset_t in = *set;
  path_t *inp = 0;
  if (c->caps) {
    inp = aici_tmp_alloc(sizeof(path_t) * MAX_STATES);
    __builtin_memcpy(inp, c->caps, sizeof(path_t) * in.n);
  }
  set->n = set->nj = set->ng = 0;
  adder_t a = {c, set, c->caps};
  c->barriers_open = true;
  for (uint32_t i = 0; i < in.n; i++) {
    st_t st = in.st[i];
    const gnode_t *g = &p->g[st.node];
    const path_t *path = inp ? &inp[i] : 0;
    new_gen(p);
    if (g->kind == G_WAIT && vars_set(g)) follow(&a, st.node, path, c->pos, 0);
    else if (g->kind == G_FORK && fork_branch >= 0 && (uint32_t)fork_branch < g->n_next)
      enter(&a, g->next[fork_branch], path, c->pos, 0);
    else if (g->kind == G_FORK && fork_branch >= 0) continue;
    else add(&a, st, extra_of(p, &in, &st), path);
  }
}

/* Breadth first over the document's configurations (equal ones merged), bytes 0x20-0x7e plus
 * \n: the first accepting one found is a shortest completion. */
uint8_t *nfa_json_completion(program_t *p, const sset_t *set, uint32_t i, uint32_t *n) {
  enum { MAX_Q = 4096, HT = 8192, MAX_LEN = 512 };
  matcher_t *m = p->g[set->st[i].node].json;
  const cset_t *start = &set->js[set->st[i].s];
  *n = 0;
  if (matcher_accepting(m, start)) return aici_malloc(1);
  typedef struct { cset_t c; uint32_t parent, depth; uint8_t byte; } qn_t;
  qn_t *q = aici_malloc(MAX_Q * sizeof(qn_t));
  uint32_t *ht = aici_calloc(HT, 4), qh = 0, qt = 1, found = 0;
  q[0].c = *start, q[0].parent = 0, q[0].depth = 0, q[0].byte = 0;
  while (qh < qt && !found) {
    uint32_t cur = qh++;
    if (q[cur].depth >= MAX_LEN) continue;
    for (int b = 0x0a; b < 0x7f && !found; b = b == 0x0a ? 0x20 : b + 1) {
      if (qt == MAX_Q) break;
      qn_t *x = &q[qt];
      if (!matcher_step(m, &q[cur].c, (uint8_t)b, &x->c)) continue;
      uint32_t h = 2166136261u;
      const uint8_t *kb = (const uint8_t *)x->c.c;
      for (uint32_t k = 0; k < x->c.n * sizeof(cfg_t); k++) h = (h ^ kb[k]) * 16777619u;
      uint32_t slot = h & (HT - 1);
      bool dup = false;
      while (ht[slot]) {
        const cset_t *y = &q[ht[slot] - 1].c;
        if (y->n == x->c.n && !__builtin_memcmp(y->c, x->c.c, x->c.n * sizeof(cfg_t))) { dup = true; break; }
        slot = (slot + 1) & (HT - 1);
      }
      if (dup) continue;
      ht[slot] = qt + 1;
      x->parent = cur, x->depth = q[cur].depth + 1, x->byte = (uint8_t)b;
      if (matcher_accepting(m, &x->c)) found = qt;
      qt++;
    }
  }
  uint8_t *out = 0;
  if (found) {
    uint32_t len = q[found].depth;
    out = aici_malloc(len + 1);
    for (uint32_t k = found, d = len; k; k = q[k].parent) out[--d] = q[k].byte;
    *n = len;
  }
  aici_free(q);
  aici_free(ht);
  return out;
}

uint32_t nfa_forced_after(program_t *p, const sset_t *set, uint32_t i, const uint8_t *bytes, uint32_t n) {
  static sset_t a, b;
  stepctx_t c = {.p = p};
  a.n = 1, a.nj = a.ng = 0, a.st[0] = set->st[i];
  const void *x = extra_of(p, set, &set->st[i]);
  if (p->g[set->st[i].node].kind == G_JSON) a.js[0] = *(const cset_t *)x, a.st[0].s = 0, a.nj = 1;
  for (uint32_t k = 0; k < n; k++) {
    if (!nfa_step(&c, &a, bytes[k], &b)) return 0;
    a = b;
  }
  uint32_t forced = 0;
  while (forced < 256) {
    int byte = nfa_forced_byte(p, &a);
    if (byte < 0 || !nfa_step(&c, &a, (uint8_t)byte, &b)) break;
    a = b, forced++;
  }
  return forced;
}

bool nfa_at_end(const program_t *p, const sset_t *set) {
  for (uint32_t i = 0; i < set->n; i++)
    if (p->g[set->st[i].node].kind == G_END) return true;
  return false;
}

bool nfa_only_end(const program_t *p, const sset_t *set) {
  return set->n == 1 && p->g[set->st[0].node].kind == G_END;
}

int nfa_forced_byte(const program_t *p, const sset_t *set) {
  int found = -1;
  for (uint32_t i = 0; i < set->n; i++) {
    const st_t *st = &set->st[i];
    const gnode_t *g = &p->g[st->node];
    int b = -1;
    if (g->kind == G_LIT && st->s <= g->lit_len) b = g->lit[st->s - 1];
    else if (g->kind == G_RE && !aici_regex_accepting(g->re, st->s)) {
      const uint32_t *row = aici_regex_row(g->re, st->s);
      for (int k = 0; k < 256; k++)
        if (row[k]) {
          if (b >= 0) { b = -1; break; }
          b = k;
        }
    } else if (g->kind == G_JSON) b = matcher_forced_byte(g->json, &set->js[st->s]);
    if (b < 0 || (found >= 0 && b != found)) return -1;
    found = b;
  }
  return found;
}

/* ---- masks -------------------------------------------------------------------------------- */

#define CACHE_N 128u
typedef struct {
  uint32_t hash;
  sset_t key;
  aici_tokset_t *mask;
} mcache_t;
static mcache_t *cache;
static uint32_t cache_n, cache_next;
static sset_t *walk_stack;
static aici_tokset_t *out_mask;

/* The set as a cache key: states in a canonical order, the token counts cleared. */
static void key_of(const program_t *p, const sset_t *s, sset_t *k) {
  __builtin_memset(k, 0, sizeof *k);
  k->n = s->n;
  for (uint32_t i = 0; i < s->n; i++) k->st[i] = s->st[i], k->st[i].n_tok = 0;
  for (uint32_t i = 0; i < s->n; i++)  /* insertion sort by (node, s); json states keep their slot order */
    for (uint32_t j = i; j > 0 && (k->st[j].node < k->st[j - 1].node ||
                                   (k->st[j].node == k->st[j - 1].node && k->st[j].s < k->st[j - 1].s)); j--) {
      st_t t = k->st[j];
      k->st[j] = k->st[j - 1], k->st[j - 1] = t;
    }
  k->nj = s->nj, k->ng = s->ng;
  for (uint32_t j = 0; j < s->ng; j++) k->gs[j] = s->gs[j];
  for (uint32_t j = 0; j < s->nj; j++) {
    k->js[j].n = s->js[j].n;
    __builtin_memcpy(k->js[j].c, s->js[j].c, s->js[j].n * sizeof(cfg_t));
  }
}

static uint32_t hash_key(const sset_t *k) {
  const uint8_t *b = (const uint8_t *)k;
  uint32_t h = 2166136261u;
  for (size_t i = 0; i < sizeof *k; i++) h = (h ^ b[i]) * 16777619u;
  return h;
}

void nfa_prepare(program_t *p, const aici_trie_t *trie) {
  for (uint32_t i = 0; i < p->n; i++)
    if (p->g[i].kind == G_JSON) matcher_prepare(p->g[i].json, trie);
  if (!walk_stack) walk_stack = aici_malloc((trie->max_depth + 2) * sizeof(sset_t));
  if (!out_mask) out_mask = aici_tokset_new();
  if (!cache) cache = aici_calloc(CACHE_N, sizeof(mcache_t));
  if (!seen) seen = aici_calloc(p->n, 4);
}

static void walk(program_t *p, const aici_trie_t *tr, const sset_t *start, aici_tokset_t *out) {
  stepctx_t c = {.p = p};
  uint32_t sp = 1, n = tr->n_nodes, pnode = 1;
  const aici_trie_node_t *nodes = tr->nodes;
  uint32_t *mask = out->words;
  walk_stack[0] = *start;
  while (pnode < n) {
    uint32_t w0 = nodes[pnode].w0, w1 = nodes[pnode].w1, tok = w0 >> 8;
    sset_t *ns = &walk_stack[sp];
    bool live = nfa_step(&c, &walk_stack[sp - 1], (uint8_t)w0, ns);
    mask[tok >> 5] |= (uint32_t)live << (tok & 31);
    if (live && (w1 >> 10) > 1) sp++, pnode++;
    else pnode += w1 >> 10, sp -= w1 & 1023;
  }
  out->words[out->n_words] = 0;        /* the spare word (scratch bits) */
}

/* The literals that may follow leaf `n` (through epsilons); false if anything else that takes
 * bytes may follow it. */
static bool next_lits(const program_t *p, uint32_t n, const gnode_t **lits, uint32_t *count, uint32_t depth) {
  const gnode_t *g = &p->g[n];
  if (depth > 64) return false;
  switch (g->kind) {
    case G_LIT:
      if (*count == 16) return false;
      lits[(*count)++] = g;
      return true;
    case G_EPS: case G_OPEN: case G_CLOSE:
      for (uint32_t i = 0; i < g->n_next; i++)
        if (!next_lits(p, g->next[i], lits, count, depth + 1)) return false;
      return true;
    case G_END: case G_WAIT: case G_FORK: case G_BT: case G_TOK: return true;   /* take no bytes */
    default: return false;
  }
}

/* Tokens whose bytes may run from leaf g into the literals after it: some suffix of the token is
 * compatible with (a prefix of, or extends) one of them. Any token that crosses is one of these. */
static void build_cross(const program_t *p, gnode_t *g, const aici_trie_t *trie) {
  const gnode_t *lits[16];
  uint32_t count = 0;
  g->cross = 2;
  for (uint32_t i = 0; i < g->n_next; i++)
    if (!next_lits(p, g->next[i], lits, &count, 0)) return;
  uint32_t cap = 256, n = 0;
  aici_token_t *out = aici_malloc(cap * 4);
  for (aici_token_t t = 0; t < trie->vocab; t++) {
    uint32_t len;
    const uint8_t *b = aici_token_bytes(t, &len);
    bool hit = false;
    for (uint32_t j = 0; j < len && !hit; j++)
      for (uint32_t k = 0; k < count && !hit; k++) {
        const gnode_t *l = lits[k];
        uint32_t m = len - j < l->lit_len ? len - j : l->lit_len;
        hit = !__builtin_memcmp(b + j, l->lit, m);
      }
    if (!hit) continue;
    if (n == cap) cap *= 2, out = aici_realloc(out, cap * 4);
    out[n++] = t;
  }
  g->cross_toks = out, g->n_cross = n, g->cross = 1;
}

/* The leaf's own mask (tokens that stay inside it), EOS not included. */
static const aici_tokset_t *inside_mask(const gnode_t *g, const aici_trie_t *trie, const sset_t *set, const st_t *st,
                                        aici_token_t eos) {
  if (g->kind == G_JSON) return matcher_mask(g->json, trie, &set->js[st->s], eos);
  if (g->kind == G_GRAM) return gram_mask((gnode_t *)g, trie, &set->gs[st->s], eos);
  return aici_regex_mask_cached(g->re, trie, st->s);
}

/* The mask of one state (cached by state): its leaf's own mask where nothing but the end follows
 * the leaf, else a walk of the trie from that state alone. NULL: the state takes no bytes. */
static const aici_tokset_t *state_mask(program_t *p, const aici_trie_t *trie, const sset_t *set, uint32_t i,
                                       aici_token_t eos) {
  const st_t *st = &set->st[i];
  const gnode_t *g = &p->g[st->node];
  if (g->kind == G_END || g->kind == G_WAIT || g->kind == G_FORK || g->kind == G_BT || g->kind == G_TOK) return 0;
  if (g->tail_is_end && g->kind == G_JSON) return matcher_mask(g->json, trie, &set->js[st->s], eos);
  if (g->tail_is_end && g->kind == G_RE) return aici_regex_mask_cached(g->re, trie, st->s);
  if (g->tail_is_end && g->kind == G_GRAM) return gram_mask((gnode_t *)g, trie, &set->gs[st->s], eos);
  sset_t one;
  one.n = 1, one.nj = one.ng = 0, one.st[0] = *st, one.st[0].n_tok = 0;
  if (g->kind == G_JSON) one.js[0] = set->js[st->s], one.st[0].s = 0, one.nj = 1;
  if (g->kind == G_GRAM) one.gs[0] = set->gs[st->s], one.st[0].s = 0, one.ng = 1;
  sset_t key;
  key_of(p, &one, &key);
  uint32_t h = hash_key(&key);
  for (uint32_t k = 0; k < cache_n; k++)
    if (cache[k].hash == h && !__builtin_memcmp(&cache[k].key, &key, sizeof key)) return cache[k].mask;
  mcache_t *e = &cache[cache_n < CACHE_N ? cache_n++ : (cache_next++ % CACHE_N)];
  if (!e->mask) e->mask = aici_tokset_new();
  e->hash = h, e->key = key;
  gnode_t *gw = &p->g[st->node];
  bool crossing = g->kind == G_JSON || g->kind == G_RE || g->kind == G_GRAM;
  if (crossing && !gw->cross) build_cross(p, gw, trie);
  if (crossing && gw->cross == 1) {
    /* inside the leaf (its own mask) or across into the literals after it (the candidates, each
     * checked by stepping this state alone through its bytes) */
    aici_tokset_copy(e->mask, inside_mask(g, trie, set, st, eos));
    aici_tokset_deny(e->mask, eos);
    stepctx_t c = {.p = p};
    static sset_t a, b;
    for (uint32_t k = 0; k < gw->n_cross; k++) {
      aici_token_t t = gw->cross_toks[k];
      if (aici_tokset_has(e->mask, t)) continue;
      uint32_t len;
      const uint8_t *bytes = aici_token_bytes(t, &len);
      const sset_t *from = &one;
      bool live = true;
      for (uint32_t j = 0; j < len && live; j++) {
        sset_t *to = (j & 1) ? &b : &a;
        live = nfa_step(&c, from, bytes[j], to);
        from = to;
      }
      if (live) aici_tokset_allow(e->mask, t);
    }
    return e->mask;
  }
  aici_tokset_clear(e->mask);
  walk(p, trie, &one, e->mask);
  return e->mask;
}

/* A token is allowed iff some state survives its bytes, and states step independently: the
 * mask of the set is the union of its states' masks (each cached on its own), plus the token
 * leaves' sets, plus EOS where the end is live. */
bool nfa_token_may_grow(program_t *p, const aici_trie_t *tr, aici_token_t t, const sset_t *after) {
  uint32_t len;
  const uint8_t *b = aici_token_bytes(t, &len);
  if (!b || !len) return false;
  /* the node of t's bytes: descend, children follow their parent, siblings skip subtrees */
  uint32_t node = 0;
  for (uint32_t d = 0; d < len; d++) {
    uint32_t c = node + 1, end = node + (tr->nodes[node].w1 >> 10);
    while (c < end && (tr->nodes[c].w0 & 255) != b[d]) c += tr->nodes[c].w1 >> 10;
    if (c >= end) return false;
    node = c;
  }
  uint32_t size = tr->nodes[node].w1 >> 10;
  if (size <= 1) return false;
  /* a walk of the subtree below it from `after` (depth counted from the node) */
  stepctx_t c = {.p = p};
  uint32_t sp = 1, q = node + 1, end = node + size, depth = 1;
  walk_stack[0] = *after;
  while (q < end) {
    uint32_t w0 = tr->nodes[q].w0, w1 = tr->nodes[q].w1, tok = w0 >> 8;
    bool live = nfa_step(&c, &walk_stack[sp - 1], (uint8_t)w0, &walk_stack[sp]);
    if (live && tok < tr->vocab) return true;
    if (live && (w1 >> 10) > 1) sp++, q++, depth++;
    else {
      q += w1 >> 10;
      uint32_t pop = w1 & 1023;      /* levels up to the next node (docs/token-trie.md) */
      if (pop >= depth) break;       /* climbed out of the subtree */
      sp -= pop, depth -= pop;
    }
  }
  return false;
}

const aici_tokset_t *nfa_mask(program_t *p, const aici_trie_t *trie, const sset_t *set, aici_token_t eos) {
  const aici_tokset_t *only = 0;
  uint32_t n_masks = 0;
  bool other = false;                  /* token leaves, or EOS, to add */
  for (uint32_t i = 0; i < set->n; i++) {
    uint8_t k = p->g[set->st[i].node].kind;
    if (k == G_TOK || k == G_END) other = true;
  }
  aici_tokset_t *m = out_mask;
  for (uint32_t i = 0; i < set->n; i++) {
    /* a leaf's own mask lives in a buffer its next mask may reuse: copy the first out before */
    if (n_masks == 1 && only != m) aici_tokset_copy(m, only), only = m;
    const aici_tokset_t *sm = state_mask(p, trie, set, i, eos);
    if (!sm) continue;
    if (n_masks == 0) only = sm;
    else aici_tokset_or(m, sm);
    n_masks++;
  }
  if (n_masks == 1 && !other) return only;
  if (n_masks == 0) aici_tokset_clear(m);
  else if (only != m) aici_tokset_copy(m, only);
  for (uint32_t i = 0; i < set->n; i++) {
    const gnode_t *g = &p->g[set->st[i].node];
    if (g->kind == G_TOK && set->st[i].s == 1) aici_tokset_or(m, g->toks);
  }
  if (nfa_at_end(p, set)) aici_tokset_allow(m, eos);
  return m;
}
