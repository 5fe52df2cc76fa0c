/* gbnf.c - the GBNF front-end (llama.cpp's grammars/README.md): GBNF text is rewritten into
 * Lark text line for line (so errors name the same line), then compiled by the Lark front-end.
 *
 * GBNF is a character-level grammar (no lexer), so every literal character and every character
 * class becomes a one-character lexeme: a lexeme then ends after exactly one character and the
 * Earley parser sees the text character by character, which is the character-level language
 * exactly (longer lexemes would let the longest-match lexer pick one split). Rule `root` is the
 * start; rule names get a `g-` prefix (GBNF allows names Lark reads as terminals).
 */
#include "grammar.h"

typedef struct { const char *s; uint32_t i, n, line; const char *err; aici_buf_t o; } gp_t;

static bool g_name_char(char c) {
  return ((c | 32) >= 'a' && (c | 32) <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
}

/* Spaces and comments; newlines too when nl > 0 (1: copied to the output, 2: dropped). */
static void g_space(gp_t *p, int nl) {
  while (p->i < p->n) {
    char c = p->s[p->i];
    if (c == ' ' || c == '\t' || c == '\r') p->i++;
    else if (c == '#') { while (p->i < p->n && p->s[p->i] != '\n') p->i++; }
    else if (c == '\n' && nl) { p->i++; p->line++; if (nl == 1) aici_buf_puts(&p->o, "\n"); }
    else break;
  }
}

/* One character of a literal or class (after escapes) as a code point; -1 on error. */
static int64_t g_char(gp_t *p) {
  uint8_t c = (uint8_t)p->s[p->i];
  if (c != '\\') {
    uint32_t v;
    p->i += aici_utf8_decode((const uint8_t *)p->s + p->i, p->n - p->i, &v);
    return v;
  }
  if (p->i + 1 >= p->n) { p->err = "trailing backslash"; return -1; }
  char e = p->s[p->i + 1];
  p->i += 2;
  uint32_t digits = e == 'x' ? 2 : e == 'u' ? 4 : e == 'U' ? 8 : 0;
  if (digits) {
    int64_t v = aici_escape_hex((const uint8_t *)p->s, p->n, &p->i, digits);
    if (v < 0) p->err = aici_escape_error(v);
    return v < 0 ? -1 : v;
  }
  switch (e) {
    case 'n': return '\n';
    case 'r': return '\r';
    case 't': return '\t';
    case '\\': case '"': case '[': case ']': case '-': case '^': return e;
  }
  p->err = "unknown escape";
  return -1;
}

/* A code point as text inside a Lark string ("...") or a regex class (/[...]/). */
static void g_emit_cp(gp_t *p, uint32_t v, bool in_class) {
  char t[2];
  if (v < 0x20 || v == 0x7F || (!in_class && (v == '"' || v == '\\')) ||
      (in_class && (v == '\\' || v == ']' || v == '[' || v == '-' || v == '^' || v == '/'))) {
    if (v < 0x20 || v == 0x7F) aici_buf_rx_byte(&p->o, (uint8_t)v);
    else { t[0] = '\\', t[1] = (char)v; aici_buf_putn(&p->o, t, 2); }
    return;
  }
  uint8_t b[4];
  aici_buf_putn(&p->o, b, aici_utf8_encode(v, b));
}

static void g_alts(gp_t *p, int depth);

static void g_seq(gp_t *p, int depth) {
  bool any = false;
  for (;;) {
    g_space(p, depth > 0 ? 1 : 0);
    if (p->err || p->i >= p->n) break;
    char c = p->s[p->i];
    if (c == '|' || c == ')' || c == '\n') break;
    any = true;
    aici_buf_puts(&p->o, " ");
    if (c == '"') {                    /* "abc" -> ("a" "b" "c") */
      p->i++;
      aici_buf_puts(&p->o, "(");
      bool empty = true;
      while (p->i < p->n && p->s[p->i] != '"') {
        if (p->s[p->i] == '\n') { p->err = "newline in a literal"; return; }
        int64_t v = g_char(p);
        if (v < 0) return;
        aici_buf_puts(&p->o, empty ? "\"" : " \"");
        g_emit_cp(p, (uint32_t)v, false);
        aici_buf_puts(&p->o, "\"");
        empty = false;
      }
      if (p->i >= p->n) { p->err = "unterminated literal"; return; }
      p->i++;
      aici_buf_puts(&p->o, ")");
    } else if (c == '[') {             /* one character of a class: a one-character lexeme */
      p->i++;
      aici_buf_puts(&p->o, "/[");
      if (p->i < p->n && p->s[p->i] == '^') { aici_buf_puts(&p->o, "^"); p->i++; }
      while (p->i < p->n && p->s[p->i] != ']') {
        if (p->s[p->i] == '\n') { p->err = "newline in a character class"; return; }
        int64_t lo = g_char(p);
        if (lo < 0) return;
        g_emit_cp(p, (uint32_t)lo, true);
        if (p->i + 1 < p->n && p->s[p->i] == '-' && p->s[p->i + 1] != ']') {
          p->i++;
          int64_t hi = g_char(p);
          if (hi < 0) return;
          aici_buf_puts(&p->o, "-");
          g_emit_cp(p, (uint32_t)hi, true);
        }
      }
      if (p->i >= p->n) { p->err = "unterminated character class"; return; }
      p->i++;
      aici_buf_puts(&p->o, "]/s");
    } else if (c == '.') {
      p->i++;
      aici_buf_puts(&p->o, "/./s");
    } else if (c == '(') {
      p->i++;
      aici_buf_puts(&p->o, "(");
      g_alts(p, depth + 1);
      if (p->err) return;
      g_space(p, 1);
      if (p->i >= p->n || p->s[p->i] != ')') { p->err = "missing )"; return; }
      p->i++;
      aici_buf_puts(&p->o, ")");
    } else if (g_name_char(c)) {
      uint32_t s = p->i;
      while (p->i < p->n && g_name_char(p->s[p->i])) p->i++;
      aici_buf_puts(&p->o, "g-");
      aici_buf_putn(&p->o, p->s + s, p->i - s);
    } else if (c == '*' || c == '+' || c == '?') {
      p->err = "nothing to repeat";
      return;
    } else { p->err = "unexpected character"; return; }
    /* repetition suffixes */
    while (p->i < p->n) {
      char q = p->s[p->i];
      if (q == '*' || q == '+' || q == '?') { aici_buf_putn(&p->o, &q, 1); p->i++; }
      else if (q == '{') {
        uint32_t s = p->i;
        while (p->i < p->n && p->s[p->i] != '}' && p->s[p->i] != '\n') p->i++;
        if (p->i >= p->n || p->s[p->i] != '}') { p->err = "bad {m,n} repeat"; return; }
        p->i++;
        aici_buf_putn(&p->o, p->s + s, p->i - s);
      } else break;
    }
  }
  if (!any) aici_buf_puts(&p->o, " ");    /* an empty alternative */
}

static void g_alts(gp_t *p, int depth) {
  g_seq(p, depth);
  while (!p->err && p->i < p->n && p->s[p->i] == '|') {
    p->i++;
    aici_buf_puts(&p->o, " |");
    g_space(p, 2);                     /* a newline may follow | (Lark continues only on a leading |) */
    g_seq(p, depth);
  }
}

gr_grammar_t *gr_compile_gbnf(const char *text, uint32_t len, char **err) {
  gp_t p = {text, 0, len, 1, 0, {0}};
  bool has_root = false;
  aici_buf_puts(&p.o, "");
  for (;;) {
    g_space(&p, 1);
    if (p.i >= p.n) break;
    uint32_t s = p.i;
    while (p.i < p.n && g_name_char(text[p.i])) p.i++;
    if (p.i == s) { p.err = "expected a rule name"; break; }
    uint32_t nlen = p.i - s;
    g_space(&p, 0);
    if (p.i + 3 > p.n || __builtin_memcmp(text + p.i, "::=", 3)) { p.err = "expected ::= after the rule name"; break; }
    p.i += 3;
    if (nlen == 4 && !__builtin_memcmp(text + s, "root", 4)) has_root = true;
    aici_buf_puts(&p.o, "g-");
    aici_buf_putn(&p.o, text + s, nlen);
    aici_buf_puts(&p.o, ":");
    g_space(&p, 2);                    /* the body may start on a later line */
    g_alts(&p, 0);
    if (p.err) break;
    g_space(&p, 0);
    if (p.i < p.n && text[p.i] != '\n') { p.err = "unexpected text after the rule"; break; }
  }
  if (p.err) {
    *err = gr_fmt("line %u: gbnf: %s", p.line, p.err);
    aici_free(p.o.p);
    return 0;
  }
  if (!has_root) { *err = gr_fmt("gbnf: no 'root' rule"); aici_free(p.o.p); return 0; }
  aici_buf_puts(&p.o, "\nstart: g-root\n");
  gr_grammar_t *g = gr_compile_lark(p.o.p, p.o.n, err);
  aici_free(p.o.p);
  return g;
}
