/* Regex constraint: pattern -> AST -> Thompson NFA -> DFA built lazily -> masks by trie walk.
 *
 * Byte-oriented on purpose: tokens are byte strings (a token may end inside a UTF-8 character),
 * so the DFA steps on bytes; aici_regex_compile's semantics are Python's `re` on bytes patterns,
 * which is what the tests check against (aici_regex_compile_text: sets of every byte >= 0x80 are
 * whole UTF-8 characters, own_set). DFA rows are 256 wide (1 KiB a state) so the mask walk does one load
 * per trie node; rows are filled per byte class, and only for states the walk actually enters.
 */
#include "aici_regex_int.h"

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

/* After a backslash: a single byte (returns it) or a class (ORed into *cls, returns -1). */
static int parse_escape(parser_t *p, uint32_t *cls) {
  if (p->i >= p->n) { p->err = "trailing backslash"; return -2; }
  uint8_t c = p->s[p->i++];
  int e = aici_escape_char(c);         /* n t r f v 0 */
  if (e >= 0) return e;
  switch (c) {
    case 'd': case 'D': case 'w': case 'W': case 's': case 'S': set_class(cls, (char)c); return -1;
    case 'x': {
      uint32_t i = (uint32_t)p->i;
      int64_t v = aici_escape_hex(p->s, (uint32_t)p->n, &i, 2);
      if (v < 0) { p->err = "\\x needs two hex digits"; return -2; }
      p->i = i;
      return (int)v;
    }
  }
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '1' && c <= '9')) {
    p->err = "unsupported escape (backreferences, \\b, \\A ... are not supported)";
    return -2;
  }
  return c;                            /* \. \* \\ \[ ... : the byte itself */
}

inline 
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
      if (p->i < p->n && p->s[p->i] == 'M') {   /* \M: one multi-byte UTF-8 character (aici.h) */
        p->i++;
        return utf8_char(p);
      }
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

/* {m} {m,} {m,n} {,n}; returns false (and rewinds) when the brace is not a quantifier. */
static bool parse_braces(parser_t *p, int32_t *min, int32_t *max) {
  uint32_t i = (uint32_t)p->i + 1, n = (uint32_t)p->n, lo, hi;
  bool has_min = aici_read_uint(p->s, n, &i, 0x7fffffff, &lo);
  hi = lo;
  if (i < n && p->s[i] == ',') {
    i++;
    if (!aici_read_uint(p->s, n, &i, 0x7fffffff, &hi)) hi = (uint32_t)-1;
  } else if (!has_min) return false;
  if (i >= n || p->s[i] != '}') return false;
  p->i = i + 1;
  *min = (int32_t)lo, *max = (int32_t)hi;
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

static aici_regex_t *regex_compile(const char *pattern, size_t len, char **err, bool text) {
  aici_regex_t *re = aici_calloc(1, sizeof *re);
  parser_t p = {.s = (const uint8_t *)pattern, .n = len, .re = re, .text = text};
  uint32_t root = parse_alt(&p);
  if (!p.err && p.i < p.n) p.err = "unbalanced )";
  if (!p.err) {
    rx_nfa_new(re, N_FAIL, 0, 0, 0);      /* NFA state 0: the dead end */
    uint32_t match = rx_nfa_new(re, N_MATCH, 0, 0, 0);
    frag_t f = {.ast = p.ast, .canon = rx_canonical_ids(re, p.ast, p.n_ast), .cap = 256};
    f.memo = aici_calloc(f.cap, 12);
    re->start_nfa = rx_compile(re, &f, root, match);
    aici_free(f.memo), aici_free((void *)f.canon);
    if (re->overflow) p.err = "pattern too large (over 200000 NFA states)";
    else re->utf8_node = p.utf8, rx_collect(re, p.ast, root, false);
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
  rx_mark_live(re);
  rx_byte_classes(re);
  re->mark = aici_calloc(re->n_nfa, 4);
  re->list = aici_malloc(re->n_nfa * 4);
  re->stk = aici_malloc(re->n_nfa * 8 + 8);   /* each state pushes at most two */
  rx_grow_states(re);
  re->n_states = 1;                    /* state 0: dead, row all zero, built */
  __builtin_memset(re->trans, 0, 1024);
  re->flags[0] = BUILT, re->set_len[0] = 0, re->set_off[0] = 0, re->set_hash[0] = 0;
  uint32_t n = 0;
  re->gen++;
  rx_closure(re, re->start_nfa, &n);
  re->start = rx_intern(re, n);
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

/* A depth-first search over the NFA's live states, each state visited once per phase: 0 (text),
 * 1 (after a marker), 2 (after a marker and hi: once per hi, in `seen2`). */
typedef struct { uint32_t q, tag; } prod_item_t;   /* tag: phase | hi << 2 */

bool aici_regex_productive(const aici_regex_t *re, uint8_t marker, bool (*ok)(void *ctx, uint32_t id), void *ctx) {
  uint32_t words = (re->n_nfa + 31) / 32, cap = 64, n = 0, cap2 = 64, n2 = 0;
  uint32_t *seen = aici_calloc(2 * words, 4), *seen2 = aici_calloc(cap2, 4);
  prod_item_t *stk = aici_malloc(cap * sizeof *stk);
  bool found = false;
  stk[n++] = (prod_item_t){re->start_nfa, 0};
#define PUSH(q_, tag_) do { if (n == cap) stk = aici_realloc(stk, (cap *= 2) * sizeof *stk); \
    stk[n++] = (prod_item_t){(q_), (tag_)}; } while (0)
  while (n && !found) {
    prod_item_t it = stk[--n];
    const nfa_t *s = &re->nfa[it.q];
    uint32_t phase = it.tag & 3, hi = it.tag >> 2;
    if (!s->live) continue;
    if (phase < 2) {
      uint32_t *w = seen + phase * words;
      if (w[it.q >> 5] >> (it.q & 31) & 1) continue;
      w[it.q >> 5] |= 1u << (it.q & 31);
    } else {                           /* (q, hi) in an open-addressing set of q << 8 | hi, + 1 */
      uint32_t key = (it.q << 8 | hi) + 1, k = key * 2654435761u & (cap2 - 1);
      while (seen2[k] && seen2[k] != key) k = (k + 1) & (cap2 - 1);
      if (seen2[k]) continue;
      seen2[k] = key;
      if (2 * ++n2 > cap2) {
        uint32_t *old = seen2, oc = cap2;
        seen2 = aici_calloc(cap2 *= 2, 4);
        for (uint32_t i = 0; i < oc; i++)
          if (old[i]) {
            uint32_t j = old[i] * 2654435761u & (cap2 - 1);
            while (seen2[j]) j = (j + 1) & (cap2 - 1);
            seen2[j] = old[i];
          }
        aici_free(old);
      }
    }
    if (s->kind == N_MATCH) found = phase == 0;
    else if (s->kind == N_SPLIT) { PUSH(s->out, it.tag); PUSH(s->out1, it.tag); }
    else if (s->kind == N_CONSUME) {
      const uint32_t *set = re->sets[s->set];
      if (phase == 0) {
        uint32_t other = 0;
        for (int w = 0; w < 8; w++) other |= set[w] & ~(w == marker >> 5 ? 1u << (marker & 31) : 0u);
        if (other) PUSH(s->out, 0);
        if (set[marker >> 5] >> (marker & 31) & 1) PUSH(s->out, 1);
      } else {
        for (uint32_t b = 0; b < 256; b++) {
          if (!(set[b >> 5] >> (b & 31) & 1)) continue;
          if (phase == 1) PUSH(s->out, 2 | b << 2);
          else if (ok(ctx, hi << 8 | b)) { PUSH(s->out, 0); break; }
        }
      }
    }
  }
#undef PUSH
  aici_free(seen), aici_free(seen2), aici_free(stk);
  return found;
}
