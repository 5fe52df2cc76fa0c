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
#define MAX_CAND 6                     /* candidate slices per regex */
#define REP_MIN 8                      /* {m,n} with n >= REP_MIN counts as repeated */
#define COVER_STATES 64                /* states a slice check follows before giving up */
#define BUILT 1
#define ACCEPT 2
#define CLOSED 4                       /* every state reachable from it has its row built */
#define FINAL 8                        /* a match that nothing extends: its row is all dead */
#define END_BIT 0x80000000u            /* in a row entry: the target is FINAL (walks skip its subtree) */
#define CLOSE_ROWS 1024u               /* rows close_state builds at most (per regex) */
#define EQ_RECENT 16                   /* masks computed lately, the candidates a new state may share */
#define EQ_PAIRS 2048u                 /* state pairs one same_masks check follows before giving up */
#define SLICES_AFTER 4u                /* default: masks walked whole before slices are built */

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
  /* masks shared between states that no token tells apart (see same_masks) */
  uint32_t eq_recent[EQ_RECENT], eq_sig[EQ_RECENT], eq_n, eq_next;  /* states whose masks were computed */
  uint64_t *eq_seen;                   /* same_masks' visited pairs (open addressing, 0 = empty) */
  uint32_t *eq_q;                      /* its queue: pair a, pair b, depth */
  bool overflow;
  bool use_slices;
  uint32_t slices_after, walks;        /* slices from the slices_after-th mask walked on */
  /* slices (see aici_regex_use_slices) */
  uint32_t n_cand;
  uint32_t cand[MAX_CAND][8];          /* byte sets the pattern repeats */
  const aici_trie_t *slice_trie;       /* the trie sl[] was resolved for */
  uint32_t n_sl;
  const aici_slice_t *sl[MAX_CAND];    /* the worthwhile ones, fewest rest nodes first */
  uint8_t sl_reps[MAX_CAND][256];      /* one byte per regex byte class within the slice */
  uint32_t sl_n_reps[MAX_CAND];
  uint8_t *pick;                       /* per DFA state: 0 unknown, 1 no slice, 2 + k: sl[k] */
  uint32_t *stamp, stamp_gen;          /* close_state's visited marks */
  bool close_failed;                   /* the DFA is too big to close: walks check rows */
};

/* ---- parser ----------------------------------------------------------------------------- */
typedef struct {
  const uint8_t *s;
  size_t n, i;
  ast_t *ast;
  uint32_t n_ast, cap_ast;
  aici_regex_t *re;
  const char *err;
  uint32_t lit[256];                   /* set id + 1 of each literal byte's set: one set per byte */
  uint32_t *set_ht, set_cap, set_n;    /* sets by content (ids + 1, open addressing): see own_set */
  bool text;                           /* aici_regex_compile_text: see own_set */
  uint32_t utf8;                       /* node id + 1 of "one multi-byte UTF-8 character" */
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

static inline bool same_set(const uint32_t *a, const uint32_t *b) {   /* 256-bit sets */
  uint32_t d = 0;
  for (int w = 0; w < 8; w++) d |= a[w] ^ b[w];
  return !d;
}

static uint32_t set_hash(const uint32_t *set) {
  uint32_t h = 2166136261u;
  for (int w = 0; w < 8; w++) h = (h ^ set[w]) * 16777619u;
  return h;
}

/* A node for set `id`, just made (the last) and filled: an earlier set with the same bytes is
 * used instead and this one given back, so that a pattern holds each byte set once (a schema's
 * pattern repeats a string's character class for every string). */
static uint32_t parse_alt(parser_t *p);

/* One well-formed multi-byte UTF-8 character (RFC 3629: no overlong forms, no surrogates, at most
 * U+10FFFF), parsed once per pattern and shared (the AST may share subtrees: compile memoizes). */
static uint32_t utf8_char(parser_t *p) {
  static const char U[] = "[\xc2-\xdf][\x80-\xbf]|\xe0[\xa0-\xbf][\x80-\xbf]|"
                          "[\xe1-\xec\xee\xef][\x80-\xbf]{2}|\xed[\x80-\x9f][\x80-\xbf]|"
                          "\xf0[\x90-\xbf][\x80-\xbf]{2}|[\xf1-\xf3][\x80-\xbf]{3}|\xf4[\x80-\x8f][\x80-\xbf]{2}";
  if (!p->utf8) {
    const uint8_t *s = p->s;
    size_t n = p->n, i = p->i;
    p->s = (const uint8_t *)U, p->n = sizeof U - 1, p->i = 0;
    p->utf8 = parse_alt(p) + 1;        /* its sets hold some bytes >= 0x80, never all: no recursion */
    p->s = s, p->n = n, p->i = i;
  }
  return p->utf8 - 1;
}

static uint32_t own_set(parser_t *p, uint32_t id) {
  aici_regex_t *re = p->re;
  /* Text mode: a set holding every byte >= 0x80 (`.`, `[^...]`, \D \W \S) means "any other
   * character": its ASCII part, or one whole UTF-8 character (bytes mode matches single bytes,
   * so a lone continuation byte could start an output that is no longer UTF-8) */
  if (p->text && (re->sets[id][4] & re->sets[id][5] & re->sets[id][6] & re->sets[id][7]) == ~0u) {
    re->sets[id][4] = re->sets[id][5] = re->sets[id][6] = re->sets[id][7] = 0;
    p->text = false;
    uint32_t ascii = own_set(p, id);
    p->text = true;
    return new_node(p, A_ALT, ascii, utf8_char(p));
  }
  if (2 * (p->set_n + 1) > p->set_cap) {
    uint32_t cap = p->set_cap ? 2 * p->set_cap : 64, *ht = aici_calloc(cap, 4);
    for (uint32_t i = 0; i < p->set_cap; i++)
      if (p->set_ht[i]) {
        uint32_t k = set_hash(re->sets[p->set_ht[i] - 1]) & (cap - 1);
        while (ht[k]) k = (k + 1) & (cap - 1);
        ht[k] = p->set_ht[i];
      }
    aici_free(p->set_ht);
    p->set_ht = ht, p->set_cap = cap;
  }
  uint32_t k = set_hash(re->sets[id]) & (p->set_cap - 1);
  for (; p->set_ht[k]; k = (k + 1) & (p->set_cap - 1))
    if (same_set(re->sets[p->set_ht[k] - 1], re->sets[id])) {
      re->n_sets--;                    /* id was the last set made */
      id = p->set_ht[k] - 1;
      break;
    }
  if (!p->set_ht[k]) p->set_ht[k] = id + 1, p->set_n++;
  uint32_t n = new_node(p, A_SET, 0, 0);
  p->ast[n].set = id;
  return n;
}

/* A set node for the literal byte c, its set shared by every copy of c */
static uint32_t lit_node(parser_t *p, uint8_t c) {
  if (!p->lit[c]) {
    uint32_t id = new_set(p);
    set_add(p->re->sets[id], c, c);
    uint32_t n = own_set(p, id);
    p->lit[c] = p->ast[n].set + 1;
    return n;
  }
  uint32_t n = new_node(p, A_SET, 0, 0);
  p->ast[n].set = p->lit[c] - 1;
  return n;
}


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
  return own_set(p, id);
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
      uint32_t id = new_set(p);
      set_add(p->re->sets[id], 0, 255);
      p->re->sets[id]['\n' >> 5] &= ~(1u << ('\n' & 31));
      return own_set(p, id);
    }
    case '\\': {
      uint32_t id = new_set(p);
      int b = parse_escape(p, p->re->sets[id]);
      if (b == -2) return 0;
      if (b >= 0) {                    /* one byte: the set just made (the last) goes back */
        p->re->n_sets--;
        return lit_node(p, (uint8_t)b);
      }
      return own_set(p, id);
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
  return lit_node(p, c);
}

static bool parse_int(parser_t *p, int32_t *v) {
  size_t s = p->i;
  int64_t x = 0;
  /* Read every digit, saturating: stopping early left digits before the '}', so `a{1000000}`
   * was not a quantifier at all but literal text, while `a{999999}` was an error. */
  while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9') {
    x = x * 10 + (p->s[p->i++] - '0');
    if (x > 0x7fffffff) x = 0x7fffffff;
  }
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

/* Fragment sharing: the NFA of a subexpression depends only on its structure and on its
 * successor, so structurally equal subexpressions (canon[]: one id per structure) compiled before
 * the same successor share one fragment. Schema-made patterns repeat the same pieces (a string
 * character, "any other key" after each key prefix): unshared, each copy got its own DFA states. */
typedef struct {
  const ast_t *ast;
  const uint32_t *canon;
  uint32_t *memo, cap, n;              /* open addressing: (canon node, next) -> NFA state + 1 */
} frag_t;

static uint32_t hash2(uint32_t a, uint32_t b) {
  uint32_t h = (a * 0x9e3779b1u) ^ (b + 0x7f4a7c15u + (a << 6) + (a >> 2));
  return h ^ (h >> 16);
}

static uint32_t *memo_slot(frag_t *f, uint32_t node, uint32_t next) {
  uint32_t k = hash2(f->canon[node], next) & (f->cap - 1);
  for (;; k = (k + 1) & (f->cap - 1)) {
    uint32_t *e = f->memo + 3 * k;
    if (!e[2] || (e[0] == f->canon[node] && e[1] == next)) return e;
  }
}

static void memo_put(frag_t *f, uint32_t node, uint32_t next, uint32_t state) {
  if (2 * (f->n + 1) > f->cap) {
    uint32_t *old = f->memo, oc = f->cap;
    f->cap = 2 * oc;
    f->memo = aici_calloc(f->cap, 12);
    f->n = 0;
    for (uint32_t i = 0; i < oc; i++)
      if (old[3 * i + 2]) {
        uint32_t k = hash2(old[3 * i], old[3 * i + 1]) & (f->cap - 1);
        while (f->memo[3 * k + 2]) k = (k + 1) & (f->cap - 1);
        __builtin_memcpy(f->memo + 3 * k, old + 3 * i, 12);
        f->n++;
      }
    aici_free(old);
  }
  uint32_t *e = memo_slot(f, node, next);
  if (!e[2]) f->n++;
  e[0] = f->canon[node], e[1] = next, e[2] = state + 1;
}

static uint32_t compile(aici_regex_t *re, frag_t *f, uint32_t node, uint32_t next) {
  const ast_t *x = &f->ast[node];
  if (x->kind == A_EMPTY) return next;
  uint32_t *e = memo_slot(f, node, next);
  if (e[2]) return e[2] - 1;
  uint32_t out;
  switch (x->kind) {
    case A_SET: out = nfa_new(re, N_CONSUME, next, 0, x->set); break;
    case A_CAT: out = compile(re, f, x->a, compile(re, f, x->b, next)); break;
    case A_ALT: {
      uint32_t a = compile(re, f, x->a, next), b = compile(re, f, x->b, next);
      out = nfa_new(re, N_SPLIT, a, b, 0);
      break;
    }
    default: {                         /* A_REP */
      uint32_t tail = next;
      if (x->max < 0) {                /* loop: L -> body -> L | next */
        uint32_t loop = nfa_new(re, N_SPLIT, 0, next, 0);
        uint32_t body = compile(re, f, x->a, loop);
        if (!re->overflow) re->nfa[loop].out = body;
        tail = loop;
      } else {
        for (int32_t i = x->min; i < x->max && !re->overflow; i++)  /* optional copies */
          tail = nfa_new(re, N_SPLIT, compile(re, f, x->a, tail), next, 0);
      }
      for (int32_t i = 0; i < x->min && !re->overflow; i++) tail = compile(re, f, x->a, tail);
      out = tail;
    }
  }
  memo_put(f, node, next, out);
  return out;
}

/* canon[i]: one id per structure (children come before parents: ids are in parse order); byte
 * sets by their id (each set is held once: own_set). */
static uint32_t *canonical_ids(const aici_regex_t *re, const ast_t *ast, uint32_t n) {
  uint32_t *canon = aici_malloc(n * 4 + 4);
  uint32_t cap = 16;
  while (cap < 2 * n) cap *= 2;
  uint32_t *ht = aici_calloc(cap, 4);      /* node ids + 1 */
  for (uint32_t i = 0; i < n; i++) {
    const ast_t *x = &ast[i];
    uint32_t a = x->kind == A_SET ? x->set : x->kind == A_EMPTY ? 0 : canon[x->a];
    uint32_t b = x->kind == A_CAT || x->kind == A_ALT ? canon[x->b] : (uint32_t)x->min * 65537u + (uint32_t)x->max;
    uint32_t k = hash2(hash2(x->kind, a), b) & (cap - 1);
    for (;; k = (k + 1) & (cap - 1)) {
      if (!ht[k]) { ht[k] = i + 1; canon[i] = i; break; }
      const ast_t *y = &ast[ht[k] - 1];
      if (y->kind != x->kind) continue;
      bool same = x->kind == A_EMPTY ||
                  (x->kind == A_SET && y->set == a) ||
                  ((x->kind == A_CAT || x->kind == A_ALT) && canon[y->a] == a && canon[y->b] == canon[x->b]) ||
                  (x->kind == A_REP && canon[y->a] == a && y->min == x->min && y->max == x->max);
      if (same) { canon[i] = canon[ht[k] - 1]; break; }
    }
  }
  aici_free(ht);
  return canon;
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

/* Byte classes: the partition of 0..255 that every set of the pattern respects, refined once per
 * set (each set is held once, own_set: a schema's pattern made one set per literal byte, and
 * refining by each of those thousands of copies cost most of a schema's compile). */
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

/* ---- candidate slices: the byte sets under repeats ------------------------------------------ */
static void add_cand(aici_regex_t *re, const uint32_t *set) {
  uint32_t any = 0;
  for (int i = 0; i < 8; i++) any |= set[i];
  if (!any) return;
  for (uint32_t k = 0; k < re->n_cand; k++)
    if (same_set(re->cand[k], set)) return;
  if (re->n_cand < MAX_CAND) __builtin_memcpy(re->cand[re->n_cand++], set, 32);
}

static bool alt_union(const aici_regex_t *re, const ast_t *ast, uint32_t node, uint32_t *u) {
  const ast_t *x = &ast[node];
  if (x->kind == A_SET) {
    for (int i = 0; i < 8; i++) u[i] |= re->sets[x->set][i];
    return true;
  }
  return x->kind == A_ALT && alt_union(re, ast, x->a, u) && alt_union(re, ast, x->b, u);
}

static void collect(aici_regex_t *re, const ast_t *ast, uint32_t node, bool rep) {
  for (;;) {
    const ast_t *x = &ast[node];
    switch (x->kind) {
      case A_SET:
        if (rep) add_cand(re, re->sets[x->set]);
        return;
      case A_CAT: case A_ALT:          /* CAT chains are left-deep: loop on the left side */
        collect(re, ast, x->b, rep);
        node = x->a;
        continue;
      case A_REP: {
        bool r = rep || x->max < 0 || x->max >= REP_MIN;
        uint32_t u[8] = {0};
        if (r && ast[x->a].kind == A_ALT && alt_union(re, ast, x->a, u)) add_cand(re, u);
        rep = r;
        node = x->a;
        continue;
      }
      default: return;
    }
  }
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
  re->pick = aici_realloc(re->pick, cap);
  re->stamp = aici_realloc(re->stamp, cap * 4);
  __builtin_memset(re->stamp + re->cap_states, 0, (cap - re->cap_states) * 4);
  __builtin_memset(re->pick + re->cap_states, 0, cap - re->cap_states);
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
  re->flags[d] = FINAL;
  for (uint32_t i = 0; i < n; i++)
    re->flags[d] = re->nfa[l[i]].kind == N_MATCH ? re->flags[d] | ACCEPT : re->flags[d] & ~FINAL;
  __builtin_memset(re->trans + (size_t)d * 256, 0, 1024);
  uint32_t k = h & (re->ht_cap - 1);
  while (re->ht[k]) k = (k + 1) & (re->ht_cap - 1);
  re->ht[k] = d;
  return d;
}

/* The row of DFA state d. Byte classes that the same members of d's NFA-state list consume
 * (the same signature) lead to the same state: each signature's closure and lookup are done
 * once (inside a JSON string, most of the pattern's classes share one or two signatures). */
static void build_row(aici_regex_t *re, uint32_t d) {
  if (re->flags[d] & BUILT) return;
  uint32_t next[256], len = re->set_len[d];
  const uint32_t *members = re->pool + re->set_off[d];
  if (len <= 64) {
    uint64_t sig[256], seen_sig[256];
    uint32_t seen_next[256], n_seen = 0;
    __builtin_memset(sig, 0, re->n_cls * sizeof sig[0]);
    for (uint32_t i = 0; i < len; i++) {
      const nfa_t *x = &re->nfa[members[i]];
      if (x->kind != N_CONSUME) continue;
      const uint32_t *bs = re->sets[x->set];
      for (uint32_t c = 0; c < re->n_cls; c++) {
        uint8_t b = re->rep[c];
        sig[c] |= (uint64_t)((bs[b >> 5] >> (b & 31)) & 1) << i;
      }
    }
    for (uint32_t c = 0; c < re->n_cls; c++) {
      uint32_t k = 0;
      while (k < n_seen && seen_sig[k] != sig[c]) k++;
      if (k == n_seen) {
        uint32_t n = 0;
        re->gen++;
        for (uint64_t m = sig[c]; m; m &= m - 1)   /* pool may move in intern: re-read members */
          closure(re, re->nfa[re->pool[re->set_off[d] + (uint32_t)__builtin_ctzll(m)]].out, &n);
        seen_sig[k] = sig[c], seen_next[k] = intern(re, n), n_seen++;
      }
      next[c] = seen_next[k];
    }
  } else {
    for (uint32_t c = 0; c < re->n_cls; c++) {
      uint8_t b = re->rep[c];
      uint32_t n = 0;
      re->gen++;
      for (uint32_t i = 0; i < len; i++) {
        nfa_t *x = &re->nfa[re->pool[re->set_off[d] + i]];
        if (x->kind == N_CONSUME && (re->sets[x->set][b >> 5] >> (b & 31)) & 1) closure(re, x->out, &n);
      }
      next[c] = intern(re, n);
    }
  }
  for (uint32_t c = 0; c < re->n_cls; c++)
    if (next[c] && (re->flags[next[c]] & FINAL)) next[c] |= END_BIT;
  uint32_t *row = re->trans + (size_t)d * 256;  /* after intern: trans may have moved */
  for (int b = 0; b < 256; b++) row[b] = next[re->cls[b]];
  re->flags[d] |= BUILT;
}

static aici_regex_t *regex_compile(const char *pattern, size_t len, char **err, bool text) {
  aici_regex_t *re = aici_calloc(1, sizeof *re);
  parser_t p = {.s = (const uint8_t *)pattern, .n = len, .re = re, .text = text};
  uint32_t root = parse_alt(&p);
  if (!p.err && p.i < p.n) p.err = "unbalanced )";
  if (!p.err) {
    nfa_new(re, N_FAIL, 0, 0, 0);      /* NFA state 0: the dead end */
    uint32_t match = nfa_new(re, N_MATCH, 0, 0, 0);
    frag_t f = {.ast = p.ast, .canon = canonical_ids(re, p.ast, p.n_ast), .cap = 256};
    f.memo = aici_calloc(f.cap, 12);
    re->start_nfa = compile(re, &f, root, match);
    aici_free(f.memo), aici_free((void *)f.canon);
    if (re->overflow) p.err = "pattern too large (over 200000 NFA states)";
    else collect(re, p.ast, root, false);
  }
  aici_free(p.ast), aici_free(p.set_ht);
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
  re->slices_after = SLICES_AFTER;
  re->overflow = false;
  return re;
}

aici_regex_t *aici_regex_compile(const char *pattern, size_t len, char **err) {
  return regex_compile(pattern, len, err, false);
}

aici_regex_t *aici_regex_compile_text(const char *pattern, size_t len, char **err) {
  return regex_compile(pattern, len, err, true);
}

uint32_t aici_regex_start(aici_regex_t *re) { return re->start; }
uint32_t aici_regex_num_states(const aici_regex_t *re) { return re->n_states; }

uint32_t aici_regex_step(aici_regex_t *re, uint32_t state, uint8_t byte) {
  if (!state) return 0;
  build_row(re, state);
  return re->trans[(size_t)state * 256 + byte] & ~END_BIT;
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

/* The hot loop, over nodes [p, end) (stack: the rows of the states above p). Per node: one row
 * load, one unconditional mask OR (tokenless nodes hit the spare word), one branch: descend into
 * the subtree, or skip it and climb `pop` levels. Row entries carry END_BIT for FINAL targets,
 * which makes them negative: such a node's token counts, its subtree is skipped unvisited.
 * `checked`: rows may be unbuilt (built on entry); unchecked walks start from a CLOSED state. */
static inline __attribute__((always_inline)) void walk_range(aici_regex_t *re, const aici_trie_node_t *nodes,
                                                             uint32_t p, uint32_t end, const uint32_t **stack,
                                                             uint32_t sp, uint32_t *mask, bool checked) {
  const uint32_t *trans = re->trans, *row = stack[sp - 1];
  while (p < end) {
    uint32_t w0 = nodes[p].w0, w1 = nodes[p].w1, tok = w0 >> 8;
    uint32_t ns = row[w0 & 255];
    mask[tok >> 5] |= (uint32_t)(ns != 0) << (tok & 31);
    if ((int32_t)ns > 0 && w1 >= (2u << 10)) {   /* live, not FINAL, and has children */
      if (checked && __builtin_expect(!(re->flags[ns] & BUILT), 0)) {
        const uint32_t *old = re->trans;
        build_row(re, ns);             /* may move the table: rebase the stack */
        trans = re->trans;
        if (trans != old)
          for (uint32_t i = 0; i < sp; i++) stack[i] = trans + (stack[i] - old);
      }
      row = trans + (size_t)ns * 256;
      stack[sp++] = row;
      p++;
    } else {
      p += w1 >> 10;
      sp -= w1 & 1023;
      row = stack[sp - 1];
    }
  }
}

static inline __attribute__((always_inline)) void walk_impl(aici_regex_t *re, const aici_trie_t *t,
                                                            uint32_t state, uint32_t *mask, bool checked) {
  const uint32_t *stack[1025];
  const aici_trie_node_t *nodes = t->nodes;
  stack[0] = re->trans + (size_t)state * 256;
  if (!t->root_kids) {
    walk_range(re, nodes, 1, t->n_nodes, stack, 1, mask, checked);
    return;
  }
  /* first level from the list: dead first bytes cost one row lookup, no node visit */
  for (uint32_t k = 0, nk = t->n_root_kids; k < nk; k++) {
    uint32_t e = t->root_kids[k], ns = stack[0][e & 255];
    if (!ns) continue;
    uint32_t c = e >> 8, w0 = nodes[c].w0, size = nodes[c].w1 >> 10, tok = w0 >> 8;
    mask[tok >> 5] |= 1u << (tok & 31);
    if (size < 2 || (int32_t)ns < 0) continue;
    if (checked && !(re->flags[ns] & BUILT)) {
      build_row(re, ns);
      stack[0] = re->trans + (size_t)state * 256;
    }
    stack[1] = re->trans + (size_t)ns * 256;
    walk_range(re, nodes, c + 1, c + size, stack, 2, mask, checked);
  }
}

static void walk_checked(aici_regex_t *re, const aici_trie_t *t, uint32_t state, uint32_t *mask) {
  walk_impl(re, t, state, mask, true);
}
static void walk_closed(aici_regex_t *re, const aici_trie_t *t, uint32_t state, uint32_t *mask) {
  walk_impl(re, t, state, mask, false);
}

/* Build every row reachable from `state` (up to CLOSE_ROWS new ones) and mark those states
 * CLOSED: walks from them need no per-node row check. */
static bool close_state(aici_regex_t *re, uint32_t state) {
  if (re->flags[state] & CLOSED) return true;
  if (re->close_failed) return false;
  uint32_t gen = ++re->stamp_gen, n = 0, cap = 64, built = 0;
  uint32_t *list = aici_malloc(cap * 4);
  list[n++] = state;
  re->stamp[state] = gen;
  for (uint32_t i = 0; i < n; i++) {
    uint32_t d = list[i];
    if (re->flags[d] & CLOSED) continue;
    if (!(re->flags[d] & BUILT)) {
      if (++built > CLOSE_ROWS) { re->close_failed = true; aici_free(list); return false; }
      build_row(re, d);
    }
    for (uint32_t c = 0; c < re->n_cls; c++) {
      uint32_t t = re->trans[(size_t)d * 256 + re->rep[c]] & ~END_BIT;
      if (!t || re->stamp[t] == gen) continue;
      re->stamp[t] = gen;
      if (n == cap) list = aici_realloc(list, (cap *= 2) * 4);
      list[n++] = t;
    }
  }
  for (uint32_t i = 0; i < n; i++) re->flags[list[i]] |= CLOSED;
  aici_free(list);
  return true;
}

static void walk(aici_regex_t *re, const aici_trie_t *t, uint32_t state, uint32_t *mask) {
  if (close_state(re, state)) walk_closed(re, t, state, mask);
  else walk_checked(re, t, state, mask);
}

/* The candidate slices that the trie makes worthwhile, fewest rest nodes first, each with one
 * representative byte per regex byte class it touches. */
static void resolve_slices(aici_regex_t *re, const aici_trie_t *tr) {
  re->slice_trie = tr;
  re->n_sl = 0;
  __builtin_memset(re->pick, 0, re->cap_states);
  for (uint32_t k = 0; k < re->n_cand; k++) {
    const aici_slice_t *s = aici_trie_slice(tr, re->cand[k]);
    if (!s) continue;
    uint32_t i = re->n_sl++;
    for (; i && re->sl[i - 1]->rest.n_nodes > s->rest.n_nodes; i--) re->sl[i] = re->sl[i - 1];
    re->sl[i] = s;
  }
  for (uint32_t k = 0; k < re->n_sl; k++) {
    uint32_t seen[8] = {0}, n = 0;
    for (int b = 0; b < 256; b++) {
      uint8_t c = re->cls[b];
      if ((re->sl[k]->bytes[b >> 5] >> (b & 31)) & 1 && !((seen[c >> 5] >> (c & 31)) & 1))
        seen[c >> 5] |= 1u << (c & 31), re->sl_reps[k][n++] = (uint8_t)b;
    }
    re->sl_n_reps[k] = n;
  }
}

/* Does every string over slice k's bytes, up to its longest token, keep the DFA live from
 * `state`? Breadth-first over the states those bytes reach (one byte per regex byte class
 * suffices), with their least depths: a state first reached at depth d < max_len must have a
 * live transition on every such byte. Gives up (no) past COVER_STATES states. */
static bool covers(aici_regex_t *re, uint32_t state, uint32_t k) {
  const uint8_t *reps = re->sl_reps[k];
  uint32_t n_reps = re->sl_n_reps[k], max_len = re->sl[k]->max_len;
  uint32_t seen[COVER_STATES], depth[COVER_STATES], n = 1;
  seen[0] = state, depth[0] = 0;
  for (uint32_t i = 0; i < n; i++) {
    if (depth[i] >= max_len) continue;
    build_row(re, seen[i]);
    const uint32_t *row = re->trans + (size_t)seen[i] * 256;
    for (uint32_t r = 0; r < n_reps; r++) {
      uint32_t t = row[reps[r]] & ~END_BIT, j = 0;
      if (!t) return false;
      while (j < n && seen[j] != t) j++;
      if (j == n) {
        if (n == COVER_STATES) return false;
        seen[n] = t, depth[n++] = depth[i] + 1;
      }
    }
  }
  return true;
}

/* The slice to use from `state` (NULL: walk the whole trie), decided once per DFA state. */
static const aici_slice_t *pick_slice(aici_regex_t *re, const aici_trie_t *tr, uint32_t state) {
  if (re->slice_trie != tr) resolve_slices(re, tr);
  if (!re->n_sl) return 0;
  uint8_t c = re->pick[state];
  if (!c) {
    c = 1;
    for (uint32_t k = 0; k < re->n_sl && c == 1; k++)
      if (covers(re, state, k)) c = (uint8_t)(2 + k);
    re->pick[state] = c;               /* after covers(): it may have grown the arrays */
  }
  return c > 1 ? re->sl[c - 2] : 0;
}

typedef uint32_t v128u __attribute__((vector_size(16), aligned(4)));

/* A vector loop: wasmtime's memory.copy (a libcall) costs more than this at mask sizes. */
static void copy_words(uint32_t *restrict d, const uint32_t *restrict s, uint32_t n) {
  uint32_t i = 0;
  for (; i + 4 <= n; i += 4) *(v128u *)(d + i) = *(const v128u *)(s + i);
  for (; i < n; i++) d[i] = s[i];
}

static void or_words(uint32_t *restrict d, const uint32_t *restrict s, uint32_t n) {
  uint32_t i = 0;
  for (; i + 4 <= n; i += 4) *(v128u *)(d + i) |= *(const v128u *)(s + i);
  for (; i < n; i++) d[i] |= s[i];
}

/* Whether this mask may use a slice: building one costs several walks of the whole trie (a pass
 * over it, and its rest trie's memory), more than a request that computes a mask or two saves,
 * so the first slices_after masks walk the whole trie (ski rental: rent, then buy). */
static bool slices_now(const aici_regex_t *re) { return re->use_slices && re->walks >= re->slices_after; }

/* `write`: out's old contents do not count, so a slice's dense mask is copied (memory.copy,
 * a native memcpy) instead of ORed word by word. */
static void mask_impl(aici_regex_t *re, const aici_trie_t *tr, uint32_t state, aici_tokset_t *out, bool write) {
  uint32_t *w = out->words, nw = out->n_words;
  const aici_slice_t *s = 0;
  if (state && tr) {
    build_row(re, state);
    if (slices_now(re)) s = pick_slice(re, tr, state);
    re->walks++;
  }
  if (s && s->dense) {
    if (write) copy_words(w, s->dense, nw);
    else or_words(w, s->dense, nw);
  } else {
    if (write) __builtin_memset(w, 0, nw * 4);
    if (s) {
      const uint32_t *idx = s->word_idx, *bits = s->word_bits;
      for (uint32_t i = 0, n = s->n_words; i < n; i++) w[idx[i]] |= bits[i];
    }
  }
  if (state && tr) walk(re, s ? &s->rest : tr, state, w);
  w[nw] = 0;
}

void aici_regex_mask(aici_regex_t *re, const aici_trie_t *tr, uint32_t state, aici_tokset_t *out) {
  mask_impl(re, tr, state, out, false);
}

void aici_regex_mask_write(aici_regex_t *re, const aici_trie_t *tr, uint32_t state, aici_tokset_t *out) {
  mask_impl(re, tr, state, out, true);
}

void aici_regex_use_slices(aici_regex_t *re, bool on) { re->use_slices = on; }
void aici_regex_slices_after(aici_regex_t *re, uint32_t masks) { re->slices_after = masks; }

const aici_slice_t *aici_regex_slice(aici_regex_t *re, const aici_trie_t *tr, uint32_t state) {
  if (!state || !tr || !slices_now(re)) return 0;
  build_row(re, state);
  return pick_slice(re, tr, state);
}

/* ---- masks shared between states no token tells apart --------------------------------------
 * A state's mask is the set of tokens whose bytes keep the DFA live from it. Two states whose
 * every string of up to `len` bytes (the trie's longest token) leaves both live or both dead have
 * the same mask: inside `( [a-z]+){100}` word 7 and word 8 do, until the end comes within a
 * token's reach. A state about to compute its mask first looks for such a state among the last
 * EQ_RECENT whose masks were computed (same accepting flag, same live byte classes), and takes
 * that mask instead of a walk of the trie. */

/* The state's accepting flag and which byte classes keep it live, hashed: states that differ here
 * cannot share a mask (callers add EOS to a cached mask of an accepting state). */
static uint32_t live_sig(aici_regex_t *re, uint32_t state) {
  build_row(re, state);
  const uint32_t *row = re->trans + (size_t)state * 256;
  uint32_t h = 2166136261u ^ (re->flags[state] & ACCEPT);
  for (uint32_t c = 0; c < re->n_cls; c++) h = (h ^ (row[re->rep[c]] != 0)) * 16777619u;
  return h;
}

/* Whether every string of up to `len` bytes keeps a and b both live or both dead: breadth first
 * over the pairs of states those strings reach (one byte per byte class), each at its least depth.
 * Gives up (false) past EQ_PAIRS pairs. */
static bool same_masks(aici_regex_t *re, uint32_t a, uint32_t b, uint32_t len) {
  const uint32_t cap = 2 * EQ_PAIRS;   /* seen: a power of two, at most half full */
  if (!re->eq_seen) {
    re->eq_seen = aici_malloc(cap * sizeof *re->eq_seen);
    re->eq_q = aici_malloc(EQ_PAIRS * 3 * sizeof *re->eq_q);
  }
  uint64_t *seen = re->eq_seen;
  uint32_t *q = re->eq_q, n = 1;
  __builtin_memset(seen, 0, cap * sizeof *seen);
  q[0] = a, q[1] = b, q[2] = 0;
  for (uint32_t i = 0; i < n; i++) {
    uint32_t x = q[3 * i], y = q[3 * i + 1], d = q[3 * i + 2];
    if (d >= len) continue;
    build_row(re, x);
    build_row(re, y);                  /* may move the table: rows read after both */
    const uint32_t *rx = re->trans + (size_t)x * 256, *ry = re->trans + (size_t)y * 256;
    for (uint32_t c = 0; c < re->n_cls; c++) {
      uint32_t tx = rx[re->rep[c]] & ~END_BIT, ty = ry[re->rep[c]] & ~END_BIT;
      if ((tx != 0) != (ty != 0)) return false;
      if (tx == ty) continue;          /* both dead, or one state: the same from here on */
      uint64_t key = (uint64_t)tx << 32 | ty;
      uint32_t k = (uint32_t)((key * 0x9E3779B97F4A7C15ull) >> 40) & (cap - 1);
      while (seen[k] && seen[k] != key) k = (k + 1) & (cap - 1);
      if (seen[k]) continue;
      if (n == EQ_PAIRS) return false;
      seen[k] = key;
      q[3 * n] = tx, q[3 * n + 1] = ty, q[3 * n + 2] = d + 1, n++;
    }
  }
  return true;
}

/* A state among the recent ones whose mask is `state`'s (0: none). */
static uint32_t shared_mask_state(aici_regex_t *re, const aici_trie_t *tr, uint32_t state, uint32_t sig) {
  for (uint32_t k = 0; k < re->eq_n; k++) {
    uint32_t i = (re->eq_next + EQ_RECENT - 1 - k) % EQ_RECENT;   /* the latest first */
    uint32_t r = re->eq_recent[i];
    if (re->eq_sig[i] == sig && (re->flags[r] & ACCEPT) == (re->flags[state] & ACCEPT)
        && same_masks(re, state, r, tr->max_depth))
      return r;
  }
  return 0;
}

const aici_tokset_t *aici_regex_mask_cached(aici_regex_t *re, const aici_trie_t *tr, uint32_t state) {
  if (state < re->cap_states && re->cache[state]) return re->cache[state];
  uint32_t sig = 0;
  if (state && tr && re->cache_limit) {
    sig = live_sig(re, state);
    uint32_t r = shared_mask_state(re, tr, state, sig);
    if (r) return re->cache[state] = re->cache[r];
  }
  aici_tokset_t *s;
  bool keep = state && re->cache_n < re->cache_limit;
  if (keep) {
    s = aici_tokset_new();
    re->cache[state] = s, re->cache_n++;
    re->eq_recent[re->eq_next] = state, re->eq_sig[re->eq_next] = sig;
    re->eq_next = (re->eq_next + 1) % EQ_RECENT;
    if (re->eq_n < EQ_RECENT) re->eq_n++;
  } else {
    if (!re->spare) re->spare = aici_tokset_new();
    s = re->spare;
  }
  aici_regex_mask_write(re, tr, state, s);
  return s;
}

void aici_regex_cache_limit(aici_regex_t *re, uint32_t limit) { re->cache_limit = limit; }

/* ---- raw rows, for walkers that drive several DFAs at once (controllers/json) ---------------- */
const uint32_t *aici_regex_row(aici_regex_t *re, uint32_t state) {
  build_row(re, state);
  return re->trans + (size_t)state * 256;
}

const uint8_t *aici_regex_classes(const aici_regex_t *re, uint32_t *n_classes) {
  if (n_classes) *n_classes = re->n_cls;
  return re->cls;
}
