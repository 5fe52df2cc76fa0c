/* Regex constraint: pattern -> AST -> Thompson NFA -> DFA built lazily -> masks by trie walk.
 *
 * Byte-oriented on purpose: tokens are byte strings (a token may end inside a UTF-8 character),
 * so the DFA steps on bytes and its semantics are Python's `re` on bytes patterns, which is what
 * the tests check against. DFA rows are 256 wide (1 KiB a state) so the mask walk does one load
 * per trie node; rows are filled per byte class, and only for states the walk actually enters.
 */
#include "aici.h"

enum { A_SET, A_CAT, A_ALT, A_REP, A_EMPTY };
typedef struct { uint8_t kind; uint32_t a, b, set; int32_t min, max; } ast_t;

enum { N_FAIL, N_CONSUME, N_SPLIT, N_MATCH };
typedef struct { uint8_t kind, live; uint32_t out, out1, set; } nfa_t;

#define MAX_NFA 200000u
#define MAX_DFA 16384u
#define BUILT 1
#define ACCEPT 2

struct aici_regex {
  uint32_t (*sets)[8];                 /* byte sets (256 bits) used by the pattern */
  uint32_t n_sets;
  nfa_t *nfa;
  uint32_t n_nfa, cap_nfa, start_nfa;
  uint8_t cls[256];                    /* byte -> equivalence class */
  uint8_t rep[256];                    /* class -> a representative byte */
  uint32_t n_cls;
  /* DFA: state 0 is dead */
  uint32_t n_states, cap_states;
  uint32_t *trans;                     /* [state * 256 + byte] */
  uint8_t *flags;
  uint32_t *set_off, *set_len, *set_hash;
  uint32_t *pool, pool_len, pool_cap;  /* sorted NFA-state lists of all DFA states */
  uint32_t *ht, ht_cap;                /* open addressing: DFA ids, 0 = empty slot */
  uint32_t *mark, gen, *list, *stk;    /* closure scratch, sized n_nfa */
  uint32_t start;
  aici_tokset_t **cache;               /* per DFA state, up to cache_limit */
  uint32_t cache_n, cache_limit;
  aici_tokset_t *spare;                /* mask_cached's result once the cache is full */
  bool overflow;
  bool use_slices;
};

/* ---- parser ----------------------------------------------------------------------------- */
typedef struct {
  const uint8_t *s;
  size_t n, i;
  ast_t *ast;
  uint32_t n_ast, cap_ast;
  aici_regex_t *re;
  const char *err;
} parser_t;

static uint32_t new_node(parser_t *p, uint8_t kind, uint32_t a, uint32_t b) {
  if (p->n_ast == p->cap_ast) {
    p->cap_ast = p->cap_ast ? 2 * p->cap_ast : 64;
    p->ast = aici_realloc(p->ast, p->cap_ast * sizeof(ast_t));
  }
  ast_t *x = &p->ast[p->n_ast];
  x->kind = kind, x->a = a, x->b = b, x->set = 0, x->min = x->max = 0;
  return p->n_ast++;
}

static uint32_t new_set(parser_t *p) {
  aici_regex_t *re = p->re;
  if ((re->n_sets & (re->n_sets - 1)) == 0)
    re->sets = aici_realloc(re->sets, (re->n_sets ? 2 * re->n_sets : 1) * 32);
  __builtin_memset(re->sets[re->n_sets], 0, 32);
  return re->n_sets++;
}

static void set_add(uint32_t *s, unsigned lo, unsigned hi) {
  for (unsigned b = lo; b <= hi; b++) s[b >> 5] |= 1u << (b & 31);
}

static void set_class(uint32_t *s, char c) {   /* \d \w \s and their negations */
  uint32_t t[8] = {0};
  switch (c | 0x20) {
    case 'd': set_add(t, '0', '9'); break;
    case 'w': set_add(t, '0', '9'), set_add(t, 'A', 'Z'), set_add(t, 'a', 'z'), set_add(t, '_', '_'); break;
    case 's': set_add(t, '\t', '\r'), set_add(t, ' ', ' '); break;
  }
  bool neg = c >= 'A' && c <= 'Z';
  for (int i = 0; i < 8; i++) s[i] |= neg ? ~t[i] : t[i];
}

static int hexval(uint8_t c) {
  if (c >= '0' && c <= '9') return c - '0';
  c |= 0x20;
  return c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

/* After a backslash: a single byte (returns it) or a class (ORed into *cls, returns -1). */
static int parse_escape(parser_t *p, uint32_t *cls) {
  if (p->i >= p->n) { p->err = "trailing backslash"; return -2; }
  uint8_t c = p->s[p->i++];
  switch (c) {
    case 'd': case 'D': case 'w': case 'W': case 's': case 'S': set_class(cls, (char)c); return -1;
    case 'n': return '\n';
    case 'r': return '\r';
    case 't': return '\t';
    case 'f': return '\f';
    case 'v': return '\v';
    case '0': return 0;
    case 'x': {
      int h = p->i + 1 < p->n ? hexval(p->s[p->i]) : -1, l = h >= 0 ? hexval(p->s[p->i + 1]) : -1;
      if (l < 0) { p->err = "\\x needs two hex digits"; return -2; }
      p->i += 2;
      return h * 16 + l;
    }
  }
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '1' && c <= '9')) {
    p->err = "unsupported escape (backreferences, \\b, \\A ... are not supported)";
    return -2;
  }
  return c;                            /* \. \* \\ \[ ... : the byte itself */
}

static uint32_t parse_alt(parser_t *p);

static uint32_t parse_class(parser_t *p) {   /* after '[' */
  uint32_t id = new_set(p);
  uint32_t s[8] = {0};
  bool neg = p->i < p->n && p->s[p->i] == '^';
  if (neg) p->i++;
  bool first = true;
  for (;;) {
    if (p->i >= p->n) { p->err = "unterminated [ ]"; return 0; }
    uint8_t c = p->s[p->i++];
    if (c == ']' && !first) break;
    first = false;
    int lo = c;
    if (c == '\\') {
      lo = parse_escape(p, s);
      if (lo == -2) return 0;
      if (lo == -1) continue;
    }
    if (p->i + 1 < p->n && p->s[p->i] == '-' && p->s[p->i + 1] != ']') {
      p->i++;
      int hi = p->s[p->i++];
      if (hi == '\\') {
        hi = parse_escape(p, s);
        if (hi == -2) return 0;
        if (hi == -1) { p->err = "a class escape cannot end a range"; return 0; }
      }
      if (hi < lo) { p->err = "bad range in [ ]"; return 0; }
      set_add(s, (unsigned)lo, (unsigned)hi);
    } else {
      set_add(s, (unsigned)lo, (unsigned)lo);
    }
  }
  for (int i = 0; i < 8; i++) p->re->sets[id][i] = neg ? ~s[i] : s[i];
  uint32_t n = new_node(p, A_SET, 0, 0);
  p->ast[n].set = id;
  return n;
}

static uint32_t byte_node(parser_t *p, int lo, int hi) {
  uint32_t id = new_set(p);
  set_add(p->re->sets[id], (unsigned)lo, (unsigned)hi);
  uint32_t n = new_node(p, A_SET, 0, 0);
  p->ast[n].set = id;
  return n;
}

static uint32_t parse_atom(parser_t *p) {
  uint8_t c = p->s[p->i++];
  switch (c) {
    case '(': {
      if (p->i < p->n && p->s[p->i] == '?') {
        if (p->i + 1 < p->n && p->s[p->i + 1] == ':') p->i += 2;
        else { p->err = "only (?: ) groups are supported"; return 0; }
      }
      uint32_t x = parse_alt(p);
      if (p->err) return 0;
      if (p->i >= p->n || p->s[p->i] != ')') { p->err = "missing )"; return 0; }
      p->i++;
      return x;
    }
    case '[': return parse_class(p);
    case '.': {
      uint32_t n = byte_node(p, 0, 255);
      p->re->sets[p->ast[n].set]['\n' >> 5] &= ~(1u << ('\n' & 31));
      return n;
    }
    case '\\': {
      uint32_t id = new_set(p);
      int b = parse_escape(p, p->re->sets[id]);
      if (b == -2) return 0;
      if (b >= 0) set_add(p->re->sets[id], (unsigned)b, (unsigned)b);
      uint32_t n = new_node(p, A_SET, 0, 0);
      p->ast[n].set = id;
      return n;
    }
    case '^':
      if (p->i == 1) return new_node(p, A_EMPTY, 0, 0);
      p->err = "^ is only supported at the start (matches are anchored anyway)";
      return 0;
    case '$':
      if (p->i == p->n) return new_node(p, A_EMPTY, 0, 0);
      p->err = "$ is only supported at the end (matches are anchored anyway)";
      return 0;
    case '*': case '+': case '?': p->err = "nothing to repeat"; return 0;
    case ')': p->err = "unbalanced )"; return 0;
  }
  return byte_node(p, c, c);
}

static bool parse_int(parser_t *p, int32_t *v) {
  size_t s = p->i;
  int64_t x = 0;
  while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9' && x < 100000)
    x = x * 10 + (p->s[p->i++] - '0');
  *v = (int32_t)x;
  return p->i > s;
}

/* {m} {m,} {m,n} {,n}; returns false (and rewinds) when the brace is not a quantifier. */
static bool parse_braces(parser_t *p, int32_t *min, int32_t *max) {
  size_t save = p->i;
  p->i++;
  bool has_min = parse_int(p, min);
  if (!has_min) *min = 0;
  *max = *min;
  if (p->i < p->n && p->s[p->i] == ',') {
    p->i++;
    if (!parse_int(p, max)) *max = -1;
  } else if (!has_min) {
    p->i = save;
    return false;
  }
  if (p->i >= p->n || p->s[p->i] != '}') { p->i = save; return false; }
  p->i++;
  return true;
}

static uint32_t parse_repeat(parser_t *p) {
  uint32_t x = parse_atom(p);
  bool repeated = false;
  while (!p->err && p->i < p->n) {
    int32_t min, max;
    uint8_t c = p->s[p->i];
    if (c == '*') min = 0, max = -1, p->i++;
    else if (c == '+') min = 1, max = -1, p->i++;
    else if (c == '?') min = 0, max = 1, p->i++;
    else if (c == '{' && parse_braces(p, &min, &max)) {}
    else break;
    if (repeated) { p->err = "multiple repeat"; return 0; }
    if (max >= 0 && max < min) { p->err = "min repeat greater than max repeat"; return 0; }
    if (min > 1000 || max > 1000) { p->err = "repeat count over 1000"; return 0; }
    uint32_t r = new_node(p, A_REP, x, 0);
    p->ast[r].min = min, p->ast[r].max = max;
    x = r;
    repeated = true;
    if (p->i < p->n && p->s[p->i] == '?') p->i++;   /* lazy: same language */
    else if (p->i < p->n && p->s[p->i] == '+') { p->err = "possessive repeats are not supported"; return 0; }
  }
  return x;
}

static uint32_t parse_cat(parser_t *p) {
  uint32_t x = new_node(p, A_EMPTY, 0, 0);
  bool any = false;
  while (!p->err && p->i < p->n && p->s[p->i] != '|' && p->s[p->i] != ')') {
    uint32_t y = parse_repeat(p);
    x = any ? new_node(p, A_CAT, x, y) : y;
    any = true;
  }
  return x;
}

static uint32_t parse_alt(parser_t *p) {
  uint32_t x = parse_cat(p);
  while (!p->err && p->i < p->n && p->s[p->i] == '|') {
    p->i++;
    uint32_t y = parse_cat(p);
    x = new_node(p, A_ALT, x, y);
  }
  return x;
}

/* ---- NFA (compiled back to front: each fragment is built knowing its successor) --------- */
static uint32_t nfa_new(aici_regex_t *re, uint8_t kind, uint32_t out, uint32_t out1, uint32_t set) {
  if (re->n_nfa >= MAX_NFA) { re->overflow = true; return 0; }
  if (re->n_nfa == re->cap_nfa) {
    re->cap_nfa = re->cap_nfa ? 2 * re->cap_nfa : 64;
    re->nfa = aici_realloc(re->nfa, re->cap_nfa * sizeof(nfa_t));
  }
  nfa_t *s = &re->nfa[re->n_nfa];
  s->kind = kind, s->live = 0, s->out = out, s->out1 = out1, s->set = set;
  return re->n_nfa++;
}

static uint32_t compile(aici_regex_t *re, const ast_t *ast, uint32_t node, uint32_t next) {
  const ast_t *x = &ast[node];
  switch (x->kind) {
    case A_EMPTY: return next;
    case A_SET: return nfa_new(re, N_CONSUME, next, 0, x->set);
    case A_CAT: return compile(re, ast, x->a, compile(re, ast, x->b, next));
    case A_ALT: {
      uint32_t a = compile(re, ast, x->a, next), b = compile(re, ast, x->b, next);
      return nfa_new(re, N_SPLIT, a, b, 0);
    }
    default: {                         /* A_REP */
      uint32_t tail = next;
      if (x->max < 0) {                /* loop: L -> body -> L | next */
        uint32_t loop = nfa_new(re, N_SPLIT, 0, next, 0);
        uint32_t body = compile(re, ast, x->a, loop);
        if (!re->overflow) re->nfa[loop].out = body;
        tail = loop;
      } else {
        for (int32_t i = x->min; i < x->max && !re->overflow; i++)  /* optional copies */
          tail = nfa_new(re, N_SPLIT, compile(re, ast, x->a, tail), next, 0);
      }
      for (int32_t i = 0; i < x->min && !re->overflow; i++) tail = compile(re, ast, x->a, tail);
      return tail;
    }
  }
}

/* Keep only NFA states from which MATCH is reachable, so that a non-empty DFA state is always
 * a live one (matters for empty classes like [^\x00-\xff]). */
static void mark_live(aici_regex_t *re) {
  for (bool changed = true; changed;) {
    changed = false;
    for (uint32_t i = 1; i < re->n_nfa; i++) {
      nfa_t *s = &re->nfa[i];
      if (s->live) continue;
      bool l = s->kind == N_MATCH ||
               (s->kind == N_CONSUME && re->nfa[s->out].live &&
                (re->sets[s->set][0] | re->sets[s->set][1] | re->sets[s->set][2] | re->sets[s->set][3] |
                 re->sets[s->set][4] | re->sets[s->set][5] | re->sets[s->set][6] | re->sets[s->set][7])) ||
               (s->kind == N_SPLIT && (re->nfa[s->out].live || re->nfa[s->out1].live));
      if (l) s->live = 1, changed = true;
    }
  }
}

static void byte_classes(aici_regex_t *re) {
  __builtin_memset(re->cls, 0, 256);
  re->n_cls = 1;
  uint8_t remap[256][2];
  for (uint32_t k = 0; k < re->n_sets; k++) {
    __builtin_memset(remap, 0xff, sizeof remap);
    uint32_t n = 0;
    for (int b = 0; b < 256; b++) {
      int in = (re->sets[k][b >> 5] >> (b & 31)) & 1;
      uint8_t *m = &remap[re->cls[b]][in];
      if (*m == 0xff) *m = (uint8_t)n++;
      re->cls[b] = *m;
    }
    re->n_cls = n;
  }
  for (int b = 255; b >= 0; b--) re->rep[re->cls[b]] = (uint8_t)b;
}

/* ---- DFA ---------------------------------------------------------------------------------- */
static void closure(aici_regex_t *re, uint32_t s, uint32_t *n) {
  uint32_t sp = 0;
  re->stk[sp++] = s;
  while (sp) {
    uint32_t q = re->stk[--sp];
    if (re->mark[q] == re->gen || !re->nfa[q].live) continue;
    re->mark[q] = re->gen;
    nfa_t *x = &re->nfa[q];
    if (x->kind == N_SPLIT) re->stk[sp++] = x->out1, re->stk[sp++] = x->out;
    else re->list[(*n)++] = q;         /* CONSUME or MATCH */
  }
}

static void sort_u32(uint32_t *a, uint32_t n) {   /* shellsort: sets are small, no recursion */
  for (uint32_t gap = n / 2; gap; gap /= 2)
    for (uint32_t i = gap; i < n; i++) {
      uint32_t v = a[i], j = i;
      for (; j >= gap && a[j - gap] > v; j -= gap) a[j] = a[j - gap];
      a[j] = v;
    }
}

static bool grow_states(aici_regex_t *re) {
  uint32_t cap = re->cap_states ? 2 * re->cap_states : 16;
  uint32_t *trans = aici_realloc(re->trans, (size_t)cap * 1024);
  if (!trans) return false;
  re->trans = trans;
  re->flags = aici_realloc(re->flags, cap);
  re->set_off = aici_realloc(re->set_off, cap * 4);
  re->set_len = aici_realloc(re->set_len, cap * 4);
  re->set_hash = aici_realloc(re->set_hash, cap * 4);
  re->cache = aici_realloc(re->cache, cap * sizeof(void *));
  __builtin_memset(re->cache + re->cap_states, 0, (cap - re->cap_states) * sizeof(void *));
  re->cap_states = cap;
  /* rehash into a table at most half full */
  aici_free(re->ht);
  re->ht_cap = 4 * cap;
  re->ht = aici_calloc(re->ht_cap, 4);
  for (uint32_t d = 1; d < re->n_states; d++) {
    uint32_t h = re->set_hash[d] & (re->ht_cap - 1);
    while (re->ht[h]) h = (h + 1) & (re->ht_cap - 1);
    re->ht[h] = d;
  }
  return true;
}

/* The DFA state for the NFA-state list in re->list[0..n); 0 if empty or out of room. */
static uint32_t intern(aici_regex_t *re, uint32_t n) {
  if (!n) return 0;
  uint32_t *l = re->list;
  sort_u32(l, n);
  uint32_t h = 2166136261u;
  for (uint32_t i = 0; i < n; i++) h = (h ^ l[i]) * 16777619u;
  if (re->ht_cap) {
    for (uint32_t k = h & (re->ht_cap - 1); re->ht[k]; k = (k + 1) & (re->ht_cap - 1)) {
      uint32_t d = re->ht[k];
      if (re->set_hash[d] == h && re->set_len[d] == n &&
          !__builtin_memcmp(re->pool + re->set_off[d], l, n * 4))
        return d;
    }
  }
  if (re->n_states >= MAX_DFA) {
    if (!re->overflow) aici_logs("aici: regex DFA over 16384 states; treating the rest as dead\n");
    re->overflow = true;
    return 0;
  }
  if (re->n_states + 1 > re->cap_states && !grow_states(re)) return 0;
  if (re->pool_len + n > re->pool_cap) {
    while (re->pool_len + n > re->pool_cap) re->pool_cap = re->pool_cap ? 2 * re->pool_cap : 1024;
    re->pool = aici_realloc(re->pool, re->pool_cap * 4);
  }
  uint32_t d = re->n_states++;
  __builtin_memcpy(re->pool + re->pool_len, l, n * 4);
  re->set_off[d] = re->pool_len, re->set_len[d] = n, re->set_hash[d] = h;
  re->pool_len += n;
  re->flags[d] = 0;
  for (uint32_t i = 0; i < n; i++)
    if (re->nfa[l[i]].kind == N_MATCH) re->flags[d] = ACCEPT;
  __builtin_memset(re->trans + (size_t)d * 256, 0, 1024);
  uint32_t k = h & (re->ht_cap - 1);
  while (re->ht[k]) k = (k + 1) & (re->ht_cap - 1);
  re->ht[k] = d;
  return d;
}

static void build_row(aici_regex_t *re, uint32_t d) {
  if (re->flags[d] & BUILT) return;
  uint32_t next[256];
  for (uint32_t c = 0; c < re->n_cls; c++) {
    uint8_t b = re->rep[c];
    uint32_t n = 0;
    re->gen++;
    for (uint32_t i = 0; i < re->set_len[d]; i++) {
      nfa_t *x = &re->nfa[re->pool[re->set_off[d] + i]];
      if (x->kind == N_CONSUME && (re->sets[x->set][b >> 5] >> (b & 31)) & 1) closure(re, x->out, &n);
    }
    next[c] = intern(re, n);
  }
  uint32_t *row = re->trans + (size_t)d * 256;  /* after intern: trans may have moved */
  for (int b = 0; b < 256; b++) row[b] = next[re->cls[b]];
  re->flags[d] |= BUILT;
}

aici_regex_t *aici_regex_compile(const char *pattern, size_t len, char **err) {
  aici_regex_t *re = aici_calloc(1, sizeof *re);
  parser_t p = {.s = (const uint8_t *)pattern, .n = len, .re = re};
  uint32_t root = parse_alt(&p);
  if (!p.err && p.i < p.n) p.err = "unbalanced )";
  if (!p.err) {
    nfa_new(re, N_FAIL, 0, 0, 0);      /* NFA state 0: the dead end */
    uint32_t match = nfa_new(re, N_MATCH, 0, 0, 0);
    re->start_nfa = compile(re, p.ast, root, match);
    if (re->overflow) p.err = "pattern too large (over 200000 NFA states)";
  }
  aici_free(p.ast);
  if (p.err) {
    if (err) {
      char *m = aici_malloc(160);
      const char *e = p.err;
      uint32_t k = 0;
      while (*e && k < 120) m[k++] = *e++;
      const char *at = " at offset ";
      while (*at) m[k++] = *at++;
      char tmp[12]; int t = 0;
      size_t off = p.i;
      do tmp[t++] = (char)('0' + off % 10), off /= 10; while (off);
      while (t) m[k++] = tmp[--t];
      m[k] = 0;
      *err = m;
    }
    aici_free(re->nfa), aici_free(re->sets), aici_free(re);
    return 0;
  }
  mark_live(re);
  byte_classes(re);
  re->mark = aici_calloc(re->n_nfa, 4);
  re->list = aici_malloc(re->n_nfa * 4);
  re->stk = aici_malloc(re->n_nfa * 8 + 8);   /* each state pushes at most two */
  grow_states(re);
  re->n_states = 1;                    /* state 0: dead, row all zero, built */
  __builtin_memset(re->trans, 0, 1024);
  re->flags[0] = BUILT, re->set_len[0] = 0, re->set_off[0] = 0, re->set_hash[0] = 0;
  uint32_t n = 0;
  re->gen++;
  closure(re, re->start_nfa, &n);
  re->start = intern(re, n);
  re->cache_limit = 1024;
  re->use_slices = true;
  re->overflow = false;
  return re;
}

uint32_t aici_regex_start(aici_regex_t *re) { return re->start; }
uint32_t aici_regex_num_states(const aici_regex_t *re) { return re->n_states; }

uint32_t aici_regex_step(aici_regex_t *re, uint32_t state, uint8_t byte) {
  if (!state) return 0;
  build_row(re, state);
  return re->trans[(size_t)state * 256 + byte];
}

uint32_t aici_regex_advance(aici_regex_t *re, uint32_t state, const uint8_t *bytes, size_t n) {
  for (size_t i = 0; i < n && state; i++) state = aici_regex_step(re, state, bytes[i]);
  return state;
}

bool aici_regex_accepting(aici_regex_t *re, uint32_t state) { return re->flags[state] & ACCEPT; }

bool aici_regex_can_continue(aici_regex_t *re, uint32_t state) {
  if (!state) return false;
  build_row(re, state);
  const uint32_t *row = re->trans + (size_t)state * 256;
  for (int b = 0; b < 256; b++)
    if (row[b]) return true;
  return false;
}

/* The hot loop. Per trie node: one row load, one unconditional mask OR (tokenless nodes hit the
 * spare word), one branch: descend into the subtree, or skip it and climb `pop` levels. */
static void walk(aici_regex_t *re, const aici_trie_node_t *nodes, uint32_t n, uint32_t state, uint32_t *mask) {
  uint32_t stack[1025];
  uint32_t sp = 1, p = 1;
  stack[0] = state;
  const uint32_t *row = re->trans + (size_t)state * 256;
  while (p < n) {
    uint32_t w0 = nodes[p].w0, w1 = nodes[p].w1, tok = w0 >> 8;
    uint32_t ns = row[w0 & 255];
    mask[tok >> 5] |= (uint32_t)(ns != 0) << (tok & 31);
    if (ns && w1 >= (2u << 10)) {      /* accepted, and has children */
      if (__builtin_expect(!(re->flags[ns] & BUILT), 0)) build_row(re, ns);
      stack[sp++] = ns;
      row = re->trans + (size_t)ns * 256;
      p++;
    } else {
      p += w1 >> 10;
      sp -= w1 & 1023;
      row = re->trans + (size_t)stack[sp - 1] * 256;
    }
  }
}

/* Does every non-empty string over `bytes` keep the DFA live from `state`? Follows the states
 * reachable through those bytes (one byte per regex byte class suffices), giving up past 8. */
static bool covers(aici_regex_t *re, uint32_t state, const uint32_t *bytes) {
  uint8_t reps[256];
  uint32_t n_reps = 0, seen_cls[8] = {0};
  for (int b = 0; b < 256; b++) {
    uint8_t c = re->cls[b];
    if ((bytes[b >> 5] >> (b & 31)) & 1 && !((seen_cls[c >> 5] >> (c & 31)) & 1))
      seen_cls[c >> 5] |= 1u << (c & 31), reps[n_reps++] = (uint8_t)b;
  }
  uint32_t seen[8], n = 1;
  seen[0] = state;
  for (uint32_t i = 0; i < n; i++) {
    build_row(re, seen[i]);
    const uint32_t *row = re->trans + (size_t)seen[i] * 256;
    for (uint32_t r = 0; r < n_reps; r++) {
      uint32_t t = row[reps[r]], j = 0;
      if (!t) return false;
      while (j < n && seen[j] != t) j++;
      if (j == n) {
        if (n == 8) return false;
        seen[n++] = t;
      }
    }
  }
  return true;
}

void aici_regex_mask(aici_regex_t *re, const aici_trie_t *tr, uint32_t state, aici_tokset_t *out) {
  if (!state || !tr) return;
  build_row(re, state);
  const aici_slice_t *sl = re->use_slices ? aici_trie_slices(tr) : 0;
  if (!sl) {
    walk(re, tr->nodes, tr->n_nodes, state, out->words);
  } else {
    for (uint32_t q = 0; q < AICI_N_SLICES; q++) {
      const aici_slice_t *s = &sl[q];
      if (s->n_tokens && covers(re, state, s->bytes)) {
        if (s->dense) {
          uint32_t *w = out->words;
          for (uint32_t i = 0; i < out->n_words; i++) w[i] |= s->dense[i];
        } else {
          for (uint32_t i = 0; i < s->n_words; i++) out->words[s->word_idx[i]] |= s->word_bits[i];
        }
      } else {
        walk(re, s->nodes, s->n_nodes, state, out->words);
      }
    }
  }
  out->words[out->n_words] = 0;
}

void aici_regex_use_slices(aici_regex_t *re, bool on) { re->use_slices = on; }

const aici_tokset_t *aici_regex_mask_cached(aici_regex_t *re, const aici_trie_t *tr, uint32_t state) {
  if (state < re->cap_states && re->cache[state]) return re->cache[state];
  aici_tokset_t *s;
  bool keep = state && re->cache_n < re->cache_limit;
  if (keep) {
    s = aici_tokset_new();
    re->cache[state] = s, re->cache_n++;
  } else {
    if (!re->spare) re->spare = aici_tokset_new();
    s = re->spare;
    aici_tokset_clear(s);
  }
  aici_regex_mask(re, tr, state, s);
  return s;
}

void aici_regex_cache_limit(aici_regex_t *re, uint32_t limit) { re->cache_limit = limit; }
