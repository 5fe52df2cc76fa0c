/* lark_parse.c - the Lark front-end's parser: grammar text -> definitions (expression trees,
 * lark_impl.h): the lexical level (names, "strings" with their escapes, /regex/, <special>,
 * %json{...}), expressions, definitions with their options, and the directives. Errors name the
 * construct and the line. */
#include "lark_impl.h"

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

bool lk_is_term_name(const char *s, uint32_t n) {
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
    int ctl = aici_escape_char((uint8_t)x);
    if (ctl >= 0) { aici_buf_putc(&b, (char)ctl); continue; }
    switch (x) {
      case 'b': aici_buf_putn(&b, "\b", 1); break;
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
  d->term = lk_is_term_name(name, n);
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

void lk_parse_defs(lp_t *p, bool common) {
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
