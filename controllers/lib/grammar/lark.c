/* lark.c - the Lark front-end (llguidance's dialect, its docs/syntax.md): text -> definitions
 * (expression trees) -> terminals as regex text (uppercase names, strings, /regex/) and
 * productions (lowercase names; * + ? {m,n} ~ [ ] become helper nonterminals, left-recursive).
 * Errors name the construct and the line. */
#include "grammar.h"

/* ---- expression trees -------------------------------------------------------------------- */
enum { E_SEQ, E_ALT, E_REP, E_STR, E_RE, E_NAME, E_RANGE, E_EMPTY, E_SPECIAL, E_JSON };
typedef struct ex {
  uint8_t kind;
  bool icase, dotall;
  uint32_t line, n, min, max;          /* REP: max UINT32_MAX = unbounded */
  const char *s;                       /* STR: bytes; RE: pattern; NAME: name */
  uint32_t slen, lo, hi;               /* RANGE: code points */
  struct ex **kids;
} ex_t;

typedef struct {
  const char *name;
  uint32_t nlen, line;
  ex_t *body;
  bool term, lazy, common;
  ex_t *stop;                          /* [stop="S"]: the lexeme ends at its first S (S included) */
  uint32_t max_tokens;                 /* [max_tokens=N]: N + 1 (0: none; 1: max_tokens=0) */
  uint32_t sym;                        /* resolved symbol (when `resolved`) */
  bool resolved;
} def_t;

typedef struct {
  const char *s;
  uint32_t i, n, line;
  char *err;
  def_t *defs;
  uint32_t n_defs, cap_defs;
  gr_grammar_t *g;
  ex_t **ignores;
  uint32_t n_ignores;
  char **imports;                      /* "NAME" or "ALIAS=NAME" of common */
  uint32_t n_imports;
  uint32_t n_helpers;
} lp_t;

static ex_t *ex_new(lp_t *p, uint8_t kind) {
  ex_t *e = aici_calloc(1, sizeof(ex_t));
  e->kind = kind;
  e->line = p->line;
  return e;
}
static void ex_push(ex_t *e, ex_t *k) {
  e->kids = aici_realloc(e->kids, (e->n + 1) * sizeof(ex_t *));
  e->kids[e->n++] = k;
}

static void fail(lp_t *p, const char *what) {
  if (!p->err) p->err = gr_fmt("line %u: %s", p->line, what);
}

/* ---- lexical ----------------------------------------------------------------------------- */
/* Skips spaces and comments; newlines only when `nl` (inside brackets). Returns true when a
 * newline was crossed. */
static bool skip_ws(lp_t *p, bool nl) {
  bool crossed = false;
  while (p->i < p->n) {
    char c = p->s[p->i];
    if (c == ' ' || c == '\t' || c == '\r') p->i++;
    else if (c == '#' || (c == '/' && p->i + 1 < p->n && p->s[p->i + 1] == '/')) {
      while (p->i < p->n && p->s[p->i] != '\n') p->i++;
    } else if (c == '\\' && p->i + 1 < p->n && p->s[p->i + 1] == '\n') { p->i += 2; p->line++; }
    else if (c == '\n' && nl) { p->i++; p->line++; crossed = true; }
    else break;
  }
  return crossed;
}

static bool is_name_start(char c) { return (c | 32) >= 'a' && (c | 32) <= 'z' ? true : c == '_'; }
static bool is_name_char(char c) { return is_name_start(c) || (c >= '0' && c <= '9') || c == '-'; }

static uint32_t read_name(lp_t *p) {
  uint32_t s = p->i;
  while (p->i < p->n && is_name_char(p->s[p->i])) p->i++;
  return p->i - s;
}

static bool is_term_name(const char *s, uint32_t n) {
  for (uint32_t i = 0; i < n; i++) {
    if (s[i] == '_') continue;
    return s[i] >= 'A' && s[i] <= 'Z';
  }
  return false;
}

/* "..." with Python-style escapes, then an optional `i` flag. */
static ex_t *read_string(lp_t *p) {
  ex_t *e = ex_new(p, E_STR);
  aici_buf_t b = {0};
  p->i++;
  while (p->i < p->n && p->s[p->i] != '"') {
    char c = p->s[p->i++];
    if (c == '\n') { fail(p, "newline in a string literal"); return e; }
    if (c != '\\') { aici_buf_putn(&b, &c, 1); continue; }
    if (p->i >= p->n) break;
    char x = p->s[p->i++];
    uint32_t digits = 0;
    switch (x) {
      case 'n': aici_buf_putn(&b, "\n", 1); break;
      case 't': aici_buf_putn(&b, "\t", 1); break;
      case 'r': aici_buf_putn(&b, "\r", 1); break;
      case 'f': aici_buf_putn(&b, "\f", 1); break;
      case 'v': aici_buf_putn(&b, "\v", 1); break;
      case 'b': aici_buf_putn(&b, "\b", 1); break;
      case '0': aici_buf_putn(&b, "\0", 1); break;
      case '\\': aici_buf_putn(&b, "\\", 1); break;
      case '"': aici_buf_putn(&b, "\"", 1); break;
      case 'x': digits = 2; break;
      case 'u': digits = 4; break;
      case 'U': digits = 8; break;
      default: aici_buf_putn(&b, "\\", 1); aici_buf_putn(&b, &x, 1);   /* kept as written, as Lark does */
    }
    if (digits) {
      int64_t v = aici_escape_hex((const uint8_t *)p->s, p->n, &p->i, digits);
      if (v == AICI_ESC_BAD_DIGITS) { fail(p, "bad escape in a string literal"); return e; }
      if (v == AICI_ESC_OUT_OF_RANGE) { fail(p, "escape out of range in a string literal"); return e; }
      if (v == AICI_ESC_SURROGATE) { fail(p, "surrogate escape in a string literal (not a Unicode scalar value)"); return e; }
      uint8_t u[4];
      aici_buf_putn(&b, u, aici_utf8_encode((uint32_t)v, u));
    }
  }
  if (p->i >= p->n) { fail(p, "unterminated string literal"); return e; }
  p->i++;
  if (p->i < p->n && p->s[p->i] == 'i' && !(p->i + 1 < p->n && is_name_char(p->s[p->i + 1]))) { e->icase = true; p->i++; }
  e->s = b.p ? b.p : gr_strdup("", 0);
  e->slen = b.n;
  return e;
}

static ex_t *read_regex(lp_t *p) {
  ex_t *e = ex_new(p, E_RE);
  uint32_t s = ++p->i;
  while (p->i < p->n && p->s[p->i] != '/') {
    if (p->s[p->i] == '\n') { fail(p, "newline in a /regex/"); return e; }
    if (p->s[p->i] == '\\' && p->i + 1 < p->n) p->i++;
    p->i++;
  }
  if (p->i >= p->n) { fail(p, "unterminated /regex/"); return e; }
  /* \/ stands for / */
  aici_buf_t b = {0};
  for (uint32_t k = s; k < p->i; k++) {
    if (p->s[k] == '\\' && k + 1 < p->i && p->s[k + 1] == '/') continue;
    aici_buf_putn(&b, &p->s[k], 1);
  }
  e->s = b.p ? b.p : gr_strdup("", 0);
  e->slen = b.n;
  p->i++;
  while (p->i < p->n && is_name_char(p->s[p->i])) {
    char f = p->s[p->i++];
    if (f == 'i') e->icase = true;
    else if (f == 's') e->dotall = true;
    else if (f == 'u') {}
    else { fail(p, "regex flags other than i, s are not supported"); return e; }
  }
  return e;
}

/* <|name|> or <name> (a special token by name), <[ids]> (by id: N, N-M, comma-separated, ^ to
 * negate, * for all). */
static ex_t *read_special(lp_t *p) {
  uint32_t s = p->i;
  while (p->i < p->n && p->s[p->i] != '>' && p->s[p->i] != '\n') p->i++;
  if (p->i >= p->n || p->s[p->i] != '>') { fail(p, "unterminated special token <...>"); return 0; }
  p->i++;
  ex_t *e = ex_new(p, E_SPECIAL);
  e->s = p->s + s;
  e->slen = p->i - s;
  return e;
}

/* %json {SCHEMA}: the schema's text, braces balanced outside JSON strings. */
static ex_t *read_json(lp_t *p) {
  while (p->i < p->n && (p->s[p->i] == ' ' || p->s[p->i] == '\t' || p->s[p->i] == '\r' || p->s[p->i] == '\n'))
    p->line += p->s[p->i++] == '\n';
  if (p->i >= p->n || p->s[p->i] != '{') { fail(p, "%json needs a schema: %json {...}"); return 0; }
  uint32_t s = p->i, depth = 0, line = p->line;
  bool str = false;
  for (; p->i < p->n; p->i++) {
    char c = p->s[p->i];
    if (c == '\n') p->line++;
    if (str) {
      if (c == '\\') p->i++;
      else if (c == '"') str = false;
    } else if (c == '"') str = true;
    else if (c == '{') depth++;
    else if (c == '}' && !--depth) break;
  }
  if (p->i >= p->n) { p->line = line; fail(p, "unterminated %json {...}"); return 0; }
  p->i++;
  ex_t *e = ex_new(p, E_JSON);
  e->line = line;
  e->s = p->s + s;
  e->slen = p->i - s;
  return e;
}

/* ---- expressions ------------------------------------------------------------------------- */
static ex_t *parse_alts(lp_t *p, int depth);

static bool at_def_end(lp_t *p, int depth) {
  if (p->i >= p->n) return true;
  if (depth) { skip_ws(p, true); return p->i >= p->n; }
  uint32_t save = p->i, line = p->line;
  if (skip_ws(p, true)) {
    if (p->i < p->n && p->s[p->i] == '|') return false;   /* continuation line */
    p->i = save, p->line = line;
    return true;
  }
  return false;
}

static ex_t *parse_atom(lp_t *p, int depth) {
  char c = p->s[p->i];
  if (c == '(' || c == '[') {
    p->i++;
    ex_t *e = parse_alts(p, depth + 1);
    skip_ws(p, true);
    char close = c == '(' ? ')' : ']';
    if (p->i >= p->n || p->s[p->i] != close) { fail(p, c == '(' ? "missing )" : "missing ]"); return e; }
    p->i++;
    if (c == '[') {
      ex_t *r = ex_new(p, E_REP);
      r->min = 0, r->max = 1;
      ex_push(r, e);
      return r;
    }
    return e;
  }
  if (c == '"') {
    ex_t *e = read_string(p);
    skip_ws(p, depth > 0);
    if (p->i + 1 < p->n && p->s[p->i] == '.' && p->s[p->i + 1] == '.') {   /* "a".."z" */
      p->i += 2;
      skip_ws(p, depth > 0);
      if (p->i >= p->n || p->s[p->i] != '"') { fail(p, "expected a string after .."); return e; }
      ex_t *hi = read_string(p);
      if (p->err) return e;
      aici_buf_t t = {0};
      (void)t;
      const uint8_t *a = (const uint8_t *)e->s, *z = (const uint8_t *)hi->s;
      uint32_t lo = 0, hv = 0, la = 0, lz = 0;
      /* each side must be one character */
      for (const uint8_t *x = a; x < a + e->slen; la++) { uint32_t k = *x < 0x80 ? 1 : *x < 0xE0 ? 2 : *x < 0xF0 ? 3 : 4; uint32_t v = k == 1 ? *x : *x & (0x7F >> k); for (uint32_t j = 1; j < k; j++) v = v << 6 | (x[j] & 63); lo = v; x += k; }
      for (const uint8_t *x = z; x < z + hi->slen; lz++) { uint32_t k = *x < 0x80 ? 1 : *x < 0xE0 ? 2 : *x < 0xF0 ? 3 : 4; uint32_t v = k == 1 ? *x : *x & (0x7F >> k); for (uint32_t j = 1; j < k; j++) v = v << 6 | (x[j] & 63); hv = v; x += k; }
      if (la != 1 || lz != 1 || hv < lo) { fail(p, "a range \"a\"..\"z\" needs one character on each side, in order"); return e; }
      ex_t *r = ex_new(p, E_RANGE);
      r->lo = lo, r->hi = hv;
      return r;
    }
    return e;
  }
  if (c == '/') return read_regex(p);
  if (c == '<') return read_special(p);
  if (c == '%') {
    uint32_t s = ++p->i, n = read_name(p);
    if (n == 4 && !__builtin_memcmp(p->s + s, "json", 4)) return read_json(p);
    else if (n == 5 && !__builtin_memcmp(p->s + s, "regex", 5)) fail(p, "unsupported: %regex");
    else fail(p, "unexpected % directive inside a rule");
    return 0;
  }
  if (c == '@') { fail(p, "unsupported: grammar references (@name)"); return 0; }
  if (c == '&' || c == '~') { fail(p, "unsupported: the & and ~ terminal operators"); return 0; }
  if (is_name_start(c)) {
    ex_t *e = ex_new(p, E_NAME);
    e->s = p->s + p->i;
    e->slen = read_name(p);
    return e;
  }
  fail(p, "unexpected character in a rule");
  return 0;
}

static bool read_uint(lp_t *p, uint32_t *v) {
  uint32_t s = p->i;
  uint64_t x = 0;
  while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9') { x = x * 10 + (uint32_t)(p->s[p->i++] - '0'); if (x > 1000000) x = 1000000; }
  *v = (uint32_t)x;
  return p->i > s;
}

static ex_t *parse_item(lp_t *p, int depth) {
  ex_t *e = parse_atom(p, depth);
  while (!p->err && p->i < p->n) {
    char c = p->s[p->i];
    uint32_t min, max;
    if (c == '*') min = 0, max = UINT32_MAX, p->i++;
    else if (c == '+') min = 1, max = UINT32_MAX, p->i++;
    else if (c == '?') min = 0, max = 1, p->i++;
    else if (c == '~') {                 /* item ~ n  or  item ~ n..m */
      p->i++;
      skip_ws(p, depth > 0);
      if (!read_uint(p, &min)) { fail(p, "expected a count after ~"); return e; }
      max = min;
      if (p->i + 1 < p->n && p->s[p->i] == '.' && p->s[p->i + 1] == '.') {
        p->i += 2;
        if (!read_uint(p, &max)) { fail(p, "expected a count after .."); return e; }
      }
    } else if (c == '{') {               /* {n} {m,n} {m,} {,n} */
      p->i++;
      bool has_min = read_uint(p, &min);
      if (!has_min) min = 0;
      max = min;
      if (p->i < p->n && p->s[p->i] == ',') { p->i++; if (!read_uint(p, &max)) max = UINT32_MAX; }
      else if (!has_min) { fail(p, "bad {m,n} repeat"); return e; }
      if (p->i >= p->n || p->s[p->i] != '}') { fail(p, "bad {m,n} repeat"); return e; }
      p->i++;
    } else break;
    if (max < min) { fail(p, "repeat with max < min"); return e; }
    if (min > 10000 || (max != UINT32_MAX && max > 10000)) { fail(p, "repeat count over 10000"); return e; }
    ex_t *r = ex_new(p, E_REP);
    r->min = min, r->max = max;
    ex_push(r, e);
    e = r;
  }
  return e;
}

static ex_t *parse_seq(lp_t *p, int depth) {
  ex_t *e = ex_new(p, E_SEQ);
  for (;;) {
    if (depth) skip_ws(p, true); else skip_ws(p, false);
    if (p->err || p->i >= p->n) break;
    char c = p->s[p->i];
    if (c == '|' || c == ')' || c == ']' || c == '\n') break;
    if (c == '-' && p->i + 1 < p->n && p->s[p->i + 1] == '>') {   /* alias: ignored (trees only) */
      p->i += 2;
      skip_ws(p, false);
      read_name(p);
      continue;
    }
    ex_t *k = parse_item(p, depth);
    if (p->err) break;
    ex_push(e, k);
  }
  if (e->n == 1) return e->kids[0];
  if (e->n == 0) e->kind = E_EMPTY;
  return e;
}

static ex_t *parse_alts(lp_t *p, int depth) {
  ex_t *e = ex_new(p, E_ALT);
  ex_push(e, parse_seq(p, depth));
  for (;;) {
    if (p->err) break;
    if (!depth && at_def_end(p, 0)) break;
    if (depth) skip_ws(p, true);
    if (p->i >= p->n || p->s[p->i] != '|') break;
    p->i++;
    ex_push(e, parse_seq(p, depth));
  }
  return e->n == 1 ? e->kids[0] : e;
}

/* ---- definitions and directives ---------------------------------------------------------- */
static def_t *add_def(lp_t *p, const char *name, uint32_t n) {
  if (p->n_defs == p->cap_defs) {
    p->cap_defs = p->cap_defs ? p->cap_defs * 2 : 32;
    p->defs = aici_realloc(p->defs, p->cap_defs * sizeof(def_t));
  }
  def_t *d = &p->defs[p->n_defs++];
  __builtin_memset(d, 0, sizeof *d);
  d->name = name, d->nlen = n, d->line = p->line;
  d->term = is_term_name(name, n);
  return d;
}

static void parse_options(lp_t *p, def_t *d) {   /* after '[' */
  while (!p->err) {
    skip_ws(p, true);
    if (p->i < p->n && p->s[p->i] == ']') { p->i++; return; }
    uint32_t s = p->i, n = read_name(p);
    if (!n) { fail(p, "bad rule option"); return; }
    const char *o = p->s + s;
    bool stop = false, maxt = false;
    if (n == 4 && !__builtin_memcmp(o, "lazy", 4)) d->lazy = true;
    else if (n == 7 && !__builtin_memcmp(o, "capture", 7)) {}
    else if (n == 4 && !__builtin_memcmp(o, "stop", 4)) stop = true;
    else if (n == 10 && !__builtin_memcmp(o, "max_tokens", 10)) maxt = true;
    else { p->err = gr_fmt("line %u: unsupported: rule option %.*s", p->line, (int)n, o); return; }
    skip_ws(p, true);
    if (maxt) {                                /* max_tokens=N: the lexeme spans at most N tokens */
      if (p->i >= p->n || p->s[p->i] != '=') { fail(p, "max_tokens needs a number: max_tokens=N"); return; }
      p->i++;
      skip_ws(p, true);
      uint64_t v = 0;
      uint32_t d0 = p->i;
      while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9' && v <= 0xFFFFFFF) v = v * 10 + (uint32_t)(p->s[p->i++] - '0');
      if (p->i == d0) { fail(p, "max_tokens needs a number: max_tokens=N"); return; }
      if (v > 0xFFFFFFF) { p->err = gr_fmt("line %u: max_tokens is over 268435455", p->line); return; }
      d->max_tokens = (uint32_t)v + 1;
    } else if (stop) {                                /* stop="S": lazy up to S */
      if (p->i >= p->n || p->s[p->i] != '=') { fail(p, "stop needs a string: stop=\"...\""); return; }
      p->i++;
      skip_ws(p, true);
      if (p->i >= p->n || p->s[p->i] != '"') { fail(p, "stop needs a string: stop=\"...\""); return; }
      ex_t *e = read_string(p);
      if (p->err) return;
      if (!e->slen) { p->err = gr_fmt("line %u: unsupported: stop=\"\" (a lexeme EOS ends)", p->line); return; }
      d->stop = e, d->lazy = true;
    } else if (p->i < p->n && p->s[p->i] == '=') {    /* capture="name" */
      p->i++;
      skip_ws(p, true);
      if (p->i < p->n && p->s[p->i] == '"') read_string(p);
      else read_name(p);
    }
    skip_ws(p, true);
    if (p->i < p->n && p->s[p->i] == ',') p->i++;
  }
}

static void directive(lp_t *p) {
  uint32_t s = ++p->i, n = read_name(p);
  const char *d = p->s + s;
  skip_ws(p, false);
  if (n == 6 && !__builtin_memcmp(d, "ignore", 6)) {
    ex_t *e = parse_alts(p, 0);
    p->ignores = aici_realloc(p->ignores, (p->n_ignores + 1) * sizeof(ex_t *));
    p->ignores[p->n_ignores++] = e;
    return;
  }
  if (n == 6 && !__builtin_memcmp(d, "import", 6)) {
    uint32_t ms = p->i, mn = read_name(p);
    if (mn != 6 || __builtin_memcmp(p->s + ms, "common", 6)) {
      p->err = gr_fmt("line %u: unsupported: %%import of %.*s (only %%import common.NAME)", p->line, (int)mn, p->s + ms);
      return;
    }
    skip_ws(p, false);
    if (p->i < p->n && p->s[p->i] == '.') {
      p->i++;
      uint32_t ns = p->i, nn = read_name(p);
      skip_ws(p, false);
      const char *alias = p->s + ns;
      uint32_t an = nn;
      if (p->i + 1 < p->n && p->s[p->i] == '-' && p->s[p->i + 1] == '>') {
        p->i += 2;
        skip_ws(p, false);
        alias = p->s + p->i;
        an = read_name(p);
      }
      p->imports = aici_realloc(p->imports, (p->n_imports + 1) * sizeof(char *));
      p->imports[p->n_imports++] = gr_fmt("%.*s=%.*s", (int)an, alias, (int)nn, p->s + ns);
      return;
    }
    if (p->i < p->n && p->s[p->i] == '(') {
      p->i++;
      while (!p->err) {
        skip_ws(p, true);
        if (p->i < p->n && p->s[p->i] == ')') { p->i++; return; }
        uint32_t ns = p->i, nn = read_name(p);
        if (!nn) { fail(p, "bad %import list"); return; }
        p->imports = aici_realloc(p->imports, (p->n_imports + 1) * sizeof(char *));
        p->imports[p->n_imports++] = gr_fmt("%.*s=%.*s", (int)nn, p->s + ns, (int)nn, p->s + ns);
        skip_ws(p, true);
        if (p->i < p->n && p->s[p->i] == ',') p->i++;
      }
      return;
    }
    fail(p, "bad %import");
    return;
  }
  if (n == 10 && !__builtin_memcmp(d, "llguidance", 10)) {   /* an options object */
    skip_ws(p, false);
    if (p->i >= p->n || p->s[p->i] != '{') { fail(p, "expected {...} after %llguidance"); return; }
    uint32_t depth = 0, line = p->line;
    bool in_str = false, want_key = false;
    for (; p->i < p->n; p->i++) {
      char c = p->s[p->i];
      if (c == '\n') p->line++;
      if (in_str) {
        if (c == '\\') p->i++;
        else if (c == '"') in_str = false;
        continue;
      }
      if (c == '"') {
        if (depth == 1 && want_key) {   /* a top-level key: only no_forcing (we never force) */
          uint32_t k = p->i + 1, e = k;
          while (e < p->n && p->s[e] != '"') e++;
          if (e - k != 10 || __builtin_memcmp(p->s + k, "no_forcing", 10)) {
            p->err = gr_fmt("line %u: unsupported: %%llguidance option %.*s", line, (int)(e - k), p->s + k);
            return;
          }
          want_key = false;
        }
        in_str = true;
      } else if (c == '{' || c == '[') { depth++; if (depth == 1) want_key = true; }
      else if (c == ',' && depth == 1) want_key = true;
      else if (c == '}' || c == ']') { if (--depth == 0) { p->i++; return; } }
    }
    fail(p, "unterminated %llguidance {...}");
    return;
  }
  p->err = gr_fmt("line %u: unsupported: %%%.*s", p->line, (int)n, d);
}

/* The common terminals (Lark's common.lark, written as llguidance reads it). */
static const char COMMON[] =
    "DIGIT: \"0\"..\"9\"\n"
    "HEXDIGIT: \"a\"..\"f\"|\"A\"..\"F\"|DIGIT\n"
    "INT: DIGIT+\n"
    "SIGNED_INT: [\"+\"|\"-\"] INT\n"
    "DECIMAL: INT \".\" INT? | \".\" INT\n"
    "_EXP: (\"e\"|\"E\") SIGNED_INT\n"
    "FLOAT: INT _EXP | DECIMAL _EXP?\n"
    "SIGNED_FLOAT: [\"+\"|\"-\"] FLOAT\n"
    "NUMBER: FLOAT | INT\n"
    "SIGNED_NUMBER: [\"+\"|\"-\"] NUMBER\n"
    "ESCAPED_STRING: /\"(?:[^\"\\\\]|\\\\.)*\"/\n"
    "LCASE_LETTER: \"a\"..\"z\"\n"
    "UCASE_LETTER: \"A\"..\"Z\"\n"
    "LETTER: UCASE_LETTER | LCASE_LETTER\n"
    "WORD: LETTER+\n"
    "CNAME: (\"_\"|LETTER) (\"_\"|LETTER|DIGIT)*\n"
    "WS_INLINE: (\" \"|/\\t/)+\n"
    "WS: /[ \\t\\f\\r\\n]/+\n"
    "CR: /\\r/\n"
    "LF: /\\n/\n"
    "NEWLINE: (CR? LF)+\n"
    "SH_COMMENT: /#[^\\n]*/\n"
    "CPP_COMMENT: /\\/\\/[^\\n]*/\n"
    "C_COMMENT: /\\/\\*(?:[^*]|\\*+[^*\\/])*\\*+\\//\n"
    "SQL_COMMENT: /--[^\\n]*/\n";

static void parse_defs(lp_t *p, bool common) {
  while (!p->err) {
    skip_ws(p, true);
    if (p->i >= p->n) return;
    char c = p->s[p->i];
    if (c == '%') { directive(p); continue; }
    if (c == '?' || c == '!') p->i++;   /* inline / keep-tokens markers: trees only */
    uint32_t s = p->i, n = read_name(p);
    if (!n) { fail(p, "expected a rule or terminal name"); return; }
    def_t *d = add_def(p, p->s + s, n);
    d->common = common;
    skip_ws(p, false);
    if (p->i < p->n && p->s[p->i] == '.') { fail(p, "priority not supported"); return; }
    if (p->i < p->n && p->s[p->i] == '{') { fail(p, "unsupported: templates (rule{params})"); return; }
    if (p->i < p->n && p->s[p->i] == '[') { p->i++; parse_options(p, d); if (p->err) return; skip_ws(p, false); }
    if (p->i >= p->n || p->s[p->i] != ':') {
      p->err = gr_fmt("line %u: expected ':' after %.*s", p->line, (int)n, p->s + s);
      return;
    }
    p->i++;
    d->body = parse_alts(p, 0);
  }
}

/* ---- lowering ---------------------------------------------------------------------------- */
static def_t *find_def(lp_t *p, const char *name, uint32_t n, bool common_scope) {
  for (uint32_t k = 0; k < p->n_defs; k++)
    if (p->defs[k].common == common_scope && p->defs[k].nlen == n && !__builtin_memcmp(p->defs[k].name, name, n))
      return &p->defs[k];
  if (common_scope) return 0;
  for (uint32_t k = 0; k < p->n_imports; k++) {   /* ALIAS=NAME */
    const char *im = p->imports[k];
    uint32_t eq = 0;
    while (im[eq] != '=') eq++;
    if (eq == n && !__builtin_memcmp(im, name, n)) {
      const char *real = im + eq + 1;
      def_t *d = find_def(p, real, (uint32_t)__builtin_strlen(real), true);
      if (!d) p->err = gr_fmt("line %u: %%import common.%s: no such terminal", p->line, real);
      return d;
    }
  }
  return 0;
}

static void term_regex(lp_t *p, ex_t *e, aici_buf_t *o, bool common, uint32_t depth);

static void def_regex(lp_t *p, def_t *d, aici_buf_t *o, uint32_t depth) {
  if (depth > 200) { p->err = gr_fmt("line %u: terminal %.*s is recursive", d->line, (int)d->nlen, d->name); return; }
  if (!d->term) { p->err = gr_fmt("line %u: a terminal cannot use rule %.*s", d->line, (int)d->nlen, d->name); return; }
  aici_buf_puts(o, "(?:");
  term_regex(p, d->body, o, d->common, depth + 1);
  aici_buf_puts(o, ")");
}

static void term_regex(lp_t *p, ex_t *e, aici_buf_t *o, bool common, uint32_t depth) {
  if (p->err) return;
  p->line = e->line;
  switch (e->kind) {
    case E_EMPTY: aici_buf_puts(o, "(?:)"); return;
    case E_SPECIAL: p->err = gr_fmt("line %u: special tokens cannot be used inside terminals", e->line); return;
    case E_JSON: p->err = gr_fmt("line %u: %%json cannot be used inside terminals", e->line); return;
    case E_STR: gr_regex_literal(o, (const uint8_t *)e->s, e->slen, e->icase); return;
    case E_RANGE: gr_regex_cp_range(o, e->lo, e->hi); return;
    case E_RE: {
      const char *why = 0;
      if (!gr_regex_translate(o, e->s, e->slen, e->icase, e->dotall, &why))
        p->err = gr_fmt("line %u: /%.*s/: %s", e->line, (int)e->slen, e->s, why);
      return;
    }
    case E_NAME: {
      def_t *d = find_def(p, e->s, e->slen, common);
      if (p->err) return;
      if (!d) { p->err = gr_fmt("line %u: undefined terminal %.*s", e->line, (int)e->slen, e->s); return; }
      if (!d->term) { p->err = gr_fmt("line %u: a terminal cannot use rule %.*s", e->line, (int)e->slen, e->s); return; }
      def_regex(p, d, o, depth);
      return;
    }
    case E_SEQ:
      aici_buf_puts(o, "(?:");
      for (uint32_t k = 0; k < e->n; k++) term_regex(p, e->kids[k], o, common, depth);
      aici_buf_puts(o, ")");
      return;
    case E_ALT:
      aici_buf_puts(o, "(?:");
      for (uint32_t k = 0; k < e->n; k++) { if (k) aici_buf_puts(o, "|"); term_regex(p, e->kids[k], o, common, depth); }
      aici_buf_puts(o, ")");
      return;
    case E_REP: {
      if (e->min > 1000 || (e->max != UINT32_MAX && e->max > 1000)) { p->err = gr_fmt("line %u: repeat count over 1000 in a terminal", e->line); return; }
      aici_buf_puts(o, "(?:");
      term_regex(p, e->kids[0], o, common, depth);
      aici_buf_puts(o, ")");
      char *q = e->max == UINT32_MAX ? gr_fmt("{%u,}", e->min) : gr_fmt("{%u,%u}", e->min, e->max);
      aici_buf_puts(o, q);
      aici_free(q);
      return;
    }
  }
}

static uint32_t lower(lp_t *p, ex_t *e);

static uint32_t anon_term(lp_t *p, ex_t *e) {
  aici_buf_t o = {0};
  term_regex(p, e, &o, false, 0);
  if (p->err) return 0;
  char *name = e->kind == E_STR ? gr_fmt("\"%.*s\"", (int)e->slen, e->s) : gr_fmt("/%.*s/", (int)(e->slen < 40 ? e->slen : 40), e->s ? e->s : "");
  uint32_t t = gr_add_term(p->g, name, (uint32_t)__builtin_strlen(name), o.p, o.n, false);
  aici_free(name);
  aici_free(o.p);
  return t;
}

static uint32_t special_term(lp_t *p, ex_t *e) {
  const char *s = e->s;
  uint32_t n = e->slen;
  if (n >= 4 && s[1] == '[' && s[n - 2] == ']') {   /* <[...]> */
    uint32_t *r = aici_malloc(8 * (n + 2)), nr = 0, i = 2, end = n - 2;
    bool neg = i < end && s[i] == '^';
    if (neg) i++;
    if (i < end && s[i] == '*') { r[0] = 0, r[1] = 0xFFFFFF, nr = 1, i++; }
    while (i < end) {
      uint32_t lo = 0, hi, k = i;
      while (i < end && s[i] >= '0' && s[i] <= '9') lo = lo * 10 + (uint32_t)(s[i++] - '0');
      if (i == k || lo > 0xFFFFFF) { aici_free(r); p->err = gr_fmt("line %u: bad token id in %.*s", e->line, (int)n, s); return 0; }
      hi = lo;
      if (i < end && s[i] == '-') {
        i++;
        k = i, hi = 0;
        if (i + 3 <= end && !__builtin_memcmp(s + i, "MAX", 3)) { hi = 0xFFFFFF; i += 3; }
        else while (i < end && s[i] >= '0' && s[i] <= '9') hi = hi * 10 + (uint32_t)(s[i++] - '0');
        if (i == k || hi < lo) { aici_free(r); p->err = gr_fmt("line %u: bad token range in %.*s", e->line, (int)n, s); return 0; }
      }
      r[2 * nr] = lo, r[2 * nr + 1] = hi, nr++;
      if (i < end && s[i] == ',') i++;
      else if (i < end) { aici_free(r); p->err = gr_fmt("line %u: bad token list %.*s", e->line, (int)n, s); return 0; }
    }
    if (neg) {                         /* the complement within [0, 0xFFFFFF] (sorted input) */
      uint32_t *c = aici_malloc(8 * (nr + 2)), nc = 0, next = 0;
      for (uint32_t k = 0; k < nr; k++) {
        if (r[2 * k] > next) c[2 * nc] = next, c[2 * nc + 1] = r[2 * k] - 1, nc++;
        if (r[2 * k + 1] + 1 > next) next = r[2 * k + 1] + 1;
      }
      if (next <= 0xFFFFFF) c[2 * nc] = next, c[2 * nc + 1] = 0xFFFFFF, nc++;
      aici_free(r);
      r = c, nr = nc;
    }
    uint32_t t = gr_add_special(p->g, s, n, r, nr);
    aici_free(r);
    return t;
  }
  /* <|name|> / <name>: the name is the whole text, resolved against the tokenizer */
  return gr_add_special(p->g, s, n, 0, 0);
}

static uint32_t def_symbol(lp_t *p, def_t *d) {
  if (d->resolved) return d->sym;
  if (d->max_tokens == 1) {            /* max_tokens=0: no token, so only "" (llguidance) */
    uint32_t nt = gr_add_nt(p->g, d->name, d->nlen);
    gr_add_prod(p->g, nt, 0, 0);
    d->sym = nt | GR_NT, d->resolved = true;
    return d->sym;
  }
  if (d->term || d->lazy || d->max_tokens) {
    aici_buf_t o = {0};
    if (d->term) def_regex(p, d, &o, 0);
    else {                             /* foo[lazy]: <terminal expression> */
      aici_buf_puts(&o, "(?:");
      term_regex(p, d->body, &o, false, 0);
      aici_buf_puts(&o, ")");
      if (p->err) { aici_free(p->err); p->err = gr_fmt("line %u: lexeme options need a terminal body in rule %.*s", d->line, (int)d->nlen, d->name); }
    }
    if (d->stop && !p->err) {          /* lazy: the lexeme ends where body + stop first matches */
      aici_buf_puts(&o, "(?:");
      gr_regex_literal(&o, (const uint8_t *)d->stop->s, d->stop->slen, false);
      aici_buf_puts(&o, ")");
    }
    if (p->err) return 0;
    uint32_t t = gr_add_term(p->g, d->name, d->nlen, o.p, o.n, d->lazy || d->max_tokens);
    if (d->lazy) p->g->terms[t].lazy = true;
    if (d->max_tokens) p->g->terms[t].max_tokens = d->max_tokens - 1, p->g->has_max_tokens = true;
    if (d->stop) p->g->terms[t].stop = true;
    aici_free(o.p);
    d->sym = t, d->resolved = true;
    return t;
  }
  uint32_t nt = gr_add_nt(p->g, d->name, d->nlen);
  d->sym = nt | GR_NT, d->resolved = true;
  ex_t *b = d->body;
  if (b->kind == E_ALT)
    for (uint32_t k = 0; k < b->n; k++) {
      ex_t *alt = b->kids[k];
      uint32_t n = alt->kind == E_SEQ ? alt->n : alt->kind == E_EMPTY ? 0 : 1;
      uint32_t *syms = aici_malloc((n ? n : 1) * 4);
      for (uint32_t j = 0; j < n; j++) syms[j] = lower(p, alt->kind == E_SEQ ? alt->kids[j] : alt);
      gr_add_prod(p->g, nt, syms, n);
      aici_free(syms);
    }
  else {
    uint32_t n = b->kind == E_SEQ ? b->n : b->kind == E_EMPTY ? 0 : 1;
    uint32_t *syms = aici_malloc((n ? n : 1) * 4);
    for (uint32_t j = 0; j < n; j++) syms[j] = lower(p, b->kind == E_SEQ ? b->kids[j] : b);
    gr_add_prod(p->g, nt, syms, n);
    aici_free(syms);
  }
  return d->sym;
}

static uint32_t helper(lp_t *p) {
  char *name = gr_fmt("<helper %u>", p->n_helpers++);
  uint32_t nt = gr_add_nt(p->g, name, (uint32_t)__builtin_strlen(name));
  aici_free(name);
  return nt;
}

/* A symbol standing for expression `e` inside a rule. */
static uint32_t lower(lp_t *p, ex_t *e) {
  if (p->err) return 0;
  p->line = e->line;
  switch (e->kind) {
    case E_STR: case E_RE: case E_RANGE: return anon_term(p, e);
    case E_SPECIAL: return special_term(p, e);
    case E_JSON: {
      char *err = 0;
      uint32_t t = gr_add_json(p->g, e->s, e->slen, &err);
      if (t == UINT32_MAX) { p->err = gr_fmt("line %u: %%json: %s", e->line, err); return 0; }
      return t;
    }
    case E_NAME: {
      def_t *d = find_def(p, e->s, e->slen, false);
      if (p->err) return 0;
      if (!d) { p->err = gr_fmt("line %u: undefined %s %.*s", e->line, is_term_name(e->s, e->slen) ? "terminal" : "rule", (int)e->slen, e->s); return 0; }
      return def_symbol(p, d);
    }
    case E_EMPTY: {
      uint32_t nt = helper(p);
      gr_add_prod(p->g, nt, 0, 0);
      return nt | GR_NT;
    }
    case E_SEQ: {
      uint32_t nt = helper(p), *syms = aici_malloc(e->n * 4);
      for (uint32_t k = 0; k < e->n; k++) syms[k] = lower(p, e->kids[k]);
      gr_add_prod(p->g, nt, syms, e->n);
      aici_free(syms);
      return nt | GR_NT;
    }
    case E_ALT: {
      uint32_t nt = helper(p);
      for (uint32_t k = 0; k < e->n; k++) {
        ex_t *a = e->kids[k];
        if (a->kind == E_SEQ) {
          uint32_t *syms = aici_malloc(a->n * 4);
          for (uint32_t j = 0; j < a->n; j++) syms[j] = lower(p, a->kids[j]);
          gr_add_prod(p->g, nt, syms, a->n);
          aici_free(syms);
        } else if (a->kind == E_EMPTY) gr_add_prod(p->g, nt, 0, 0);
        else { uint32_t s = lower(p, a); gr_add_prod(p->g, nt, &s, 1); }
      }
      return nt | GR_NT;
    }
    case E_REP: {
      uint32_t x = lower(p, e->kids[0]);
      if (p->err) return 0;
      /* X{min,max}: X^min then (max-min) optional copies (nested), or X* (left-recursive) */
      uint32_t tail;
      if (e->max == UINT32_MAX) {
        tail = helper(p);                /* T -> ε | T X */
        gr_add_prod(p->g, tail, 0, 0);
        uint32_t two[2] = {tail | GR_NT, x};
        gr_add_prod(p->g, tail, two, 2);
      } else {
        tail = helper(p);                /* T0 -> ε ; Tk -> ε | X T(k-1) */
        gr_add_prod(p->g, tail, 0, 0);
        for (uint32_t k = e->min; k < e->max; k++) {
          uint32_t t2 = helper(p);
          gr_add_prod(p->g, t2, 0, 0);
          uint32_t two[2] = {x, tail | GR_NT};
          gr_add_prod(p->g, t2, two, 2);
          tail = t2;
        }
      }
      uint32_t nt = helper(p), *syms = aici_malloc((e->min + 1) * 4);
      for (uint32_t k = 0; k < e->min; k++) syms[k] = x;
      syms[e->min] = tail | GR_NT;
      gr_add_prod(p->g, nt, syms, e->min + 1);
      aici_free(syms);
      return nt | GR_NT;
    }
  }
  return 0;
}

gr_grammar_t *gr_compile_lark(const char *text, uint32_t len, char **err) {
  lp_t p = {text, 0, len, 1};
  gr_grammar_t *g = aici_calloc(1, sizeof(gr_grammar_t));
  g->skip = -1;
  p.g = g;
  parse_defs(&p, false);
  lp_t c = {COMMON, 0, sizeof COMMON - 1, 1};
  if (!p.err) {
    c.defs = p.defs, c.n_defs = p.n_defs, c.cap_defs = p.cap_defs;
    parse_defs(&c, true);
    if (c.err) { p.err = gr_fmt("internal: common terminals: %s", c.err); }
    p.defs = c.defs, p.n_defs = c.n_defs, p.cap_defs = c.cap_defs;
  }
  def_t *start = p.err ? 0 : find_def(&p, "start", 5, false);
  if (!p.err && !start) p.err = gr_fmt("no 'start' rule");
  if (!p.err && start->term) p.err = gr_fmt("line %u: start must be a rule", start->line);
  if (!p.err) {
    uint32_t s = def_symbol(&p, start);
    g->start = s & ~GR_NT;
  }
  if (!p.err && p.n_ignores) {
    aici_buf_t o = {0};
    aici_buf_puts(&o, "(?:");
    for (uint32_t k = 0; k < p.n_ignores && !p.err; k++) {
      if (k) aici_buf_puts(&o, "|");
      term_regex(&p, p.ignores[k], &o, false, 0);
    }
    aici_buf_puts(&o, ")");
    if (!p.err) {
      g->skip = (int32_t)gr_add_term(g, "%ignore", 7, o.p, o.n, true);   /* its own lexeme */
    }
    aici_free(o.p);
  }
  if (!p.err) {
    /* every definition must be usable: resolve the unused ones too, for their errors */
    for (uint32_t k = 0; k < p.n_defs && !p.err; k++)
      if (!p.defs[k].common && !p.defs[k].resolved) def_symbol(&p, &p.defs[k]);
  }
  if (!p.err && !gr_finish(g, &p.err)) {}
  if (p.err) { *err = p.err; return 0; }
  return g;
}

