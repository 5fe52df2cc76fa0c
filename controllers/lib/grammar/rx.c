/* rx.c - regex text of the grammar's terminals: a Rust-`regex`-syntax pattern (what llguidance
 * reads in /.../) rewritten into the SDK's byte regex, with every character class expanded to
 * the UTF-8 byte sequences of its code points (so `.` and `[^a]` match whole characters, never a
 * stray byte, as llguidance's do). \d \w \s are ASCII here (Rust's are Unicode): a documented
 * difference (docs/grammar.md). Unsupported: lookaround, backreferences, anchors, \p{..},
 * lazy and possessive repeats; each is an error naming the construct. */
#include "grammar.h"
#include "unicode_tables.h"

/* ---- code-point sets (the SDK's, aici_cps.c; as regex text by aici_cps_regex.c) -------- */
typedef aici_cp_set_t cps_t;

static void cps_negate(cps_t *s) {      /* the scalar values not in s */
  aici_cps_scalars(s);
  aici_cps_negate(s);
  aici_cps_scalars(s);
}

static void cps_icase(cps_t *s) {      /* ASCII letters in either case, and their simple folds */
  uint32_t n = s->n;
  for (uint32_t i = 0; i < n; i++) {
    uint32_t lo = s->r[i].lo, hi = s->r[i].hi;
    if ((lo <= 's' && hi >= 's') || (lo <= 'S' && hi >= 'S')) aici_cps_add(s, 0x17F, 0x17F);   /* long s */
    if ((lo <= 'k' && hi >= 'k') || (lo <= 'K' && hi >= 'K')) aici_cps_add(s, 0x212A, 0x212A); /* Kelvin */
    uint32_t a = lo > 'a' ? lo : 'a', z = hi < 'z' ? hi : 'z';
    if (a <= z) aici_cps_add(s, a - 32, z - 32);
    a = lo > 'A' ? lo : 'A', z = hi < 'Z' ? hi : 'Z';
    if (a <= z) aici_cps_add(s, a + 32, z + 32);
  }
}

void gr_regex_cp_range(aici_buf_t *out, uint32_t lo, uint32_t hi) {
  cps_t s = {0};
  aici_cps_add(&s, lo, hi);
  aici_cps_regex(out, &s);
  aici_free(s.r);
}

void gr_regex_literal(aici_buf_t *out, const uint8_t *s, uint32_t len, bool icase) {
  for (uint32_t i = 0; i < len; i++) {
    uint8_t c = s[i];
    bool letter = (c | 32) >= 'a' && (c | 32) <= 'z';
    if (icase && ((c | 32) == 's' || (c | 32) == 'k')) {   /* the folds outside ASCII too */
      cps_t f = {0};
      aici_cps_add(&f, c, c);
      cps_icase(&f);
      aici_cps_regex(out, &f);
      aici_free(f.r);
    } else if (icase && letter) {
      aici_buf_putn(out, "[", 1); aici_buf_rx_byte(out, c | 32); aici_buf_rx_byte(out, c & ~32); aici_buf_putn(out, "]", 1);
    } else aici_buf_rx_byte(out, c);
  }
}

/* ---- the translator --------------------------------------------------------------------- */
typedef struct {
  const uint8_t *s;
  uint32_t i, n;
  bool icase, dotall;
  const char *err;
} rp_t;

static void rx_alt(rp_t *p, aici_buf_t *o);

static bool peek(rp_t *p, char c) { return p->i < p->n && p->s[p->i] == (uint8_t)c; }

static uint32_t read_cp(rp_t *p) {     /* one UTF-8 character of the pattern */
  uint32_t v;
  p->i += aici_utf8_decode(p->s + p->i, p->n - p->i, &v);
  return v;
}

static void class_named(cps_t *s, char c) {   /* \d \w \s (Unicode, as Rust's) and negations */
  cps_t t = {0};
  char l = c | 32;
  const uint32_t (*tab)[2] = l == 'd' ? UNI_D : l == 'w' ? UNI_W : UNI_S;
  uint32_t n = l == 'd' ? sizeof UNI_D / sizeof UNI_D[0] : l == 'w' ? sizeof UNI_W / sizeof UNI_W[0] : sizeof UNI_S / sizeof UNI_S[0];
  for (uint32_t i = 0; i < n; i++) aici_cps_add(&t, tab[i][0], tab[i][1]);
  if (c != l) cps_negate(&t);
  for (uint32_t i = 0; i < t.n; i++) aici_cps_add(s, t.r[i].lo, t.r[i].hi);
  aici_free(t.r);
}

/* After '\': a code point (>= 0), or -1 when it added a class to `cls` (NULL outside classes:
 * then the class is returned through *cls_out), -2 on error. */
static int64_t rx_escape(rp_t *p, cps_t *cls) {
  if (p->i >= p->n) { p->err = "trailing backslash"; return -2; }
  uint8_t c = p->s[p->i++];
  int ctl = aici_escape_char(c);
  if (ctl >= 0) return ctl;
  switch (c) {
    case 'd': case 'D': case 'w': case 'W': case 's': case 'S': class_named(cls, (char)c); return -1;
    case 'a': return 7;
    case 'e': return 27;
    case 'x': case 'u': case 'U': {
      int64_t v = aici_escape_hex(p->s, p->n, &p->i, c == 'U' ? 8 : peek(p, '{') ? 0 : c == 'x' ? 2 : 4);
      if (v < 0) { p->err = aici_escape_error(v); return -2; }
      return v;
    }
    case 'b': case 'B': case 'A': case 'z': case 'Z': case 'G':
      p->err = "anchors and word boundaries (\\b \\B \\A \\z) are not supported"; return -2;
    case 'p': case 'P': p->err = "Unicode classes (\\p{..}) are not supported"; return -2;
    case 'k': p->err = "backreferences are not supported"; return -2;
  }
  if (c >= '1' && c <= '9') { p->err = "backreferences are not supported"; return -2; }
  if ((c | 32) >= 'a' && (c | 32) <= 'z') { p->err = "unknown escape"; return -2; }
  p->i--;
  return read_cp(p);
}

static void rx_class(rp_t *p, aici_buf_t *o) {   /* after '[' */
  cps_t s = {0};
  bool neg = false;
  if (peek(p, '^')) { neg = true; p->i++; }
  bool first = true;
  while (p->i < p->n && (first || p->s[p->i] != ']')) {
    first = false;
    if (p->s[p->i] == '[') {
      if (p->i + 1 < p->n && p->s[p->i + 1] == ':') { p->err = "POSIX classes ([[:alpha:]]) are not supported"; goto out; }
      p->err = "nested classes are not supported";
      goto out;
    }
    if (p->i + 1 < p->n && (p->s[p->i] == '&' || p->s[p->i] == '-' || p->s[p->i] == '~') &&
        p->s[p->i + 1] == p->s[p->i] && p->s[p->i] != '-') {
      p->err = "class set operations (&& ~~) are not supported"; goto out;
    }
    int64_t lo;
    if (p->s[p->i] == '\\') {
      p->i++;
      lo = rx_escape(p, &s);
      if (lo == -2) goto out;
      if (lo == -1) continue;
    } else lo = read_cp(p);
    if (p->i + 1 < p->n && p->s[p->i] == '-' && p->s[p->i + 1] != ']') {
      p->i++;
      int64_t hi;
      if (p->s[p->i] == '\\') {
        p->i++;
        hi = rx_escape(p, &s);
        if (hi == -2) goto out;
        if (hi == -1) { p->err = "bad class range"; goto out; }
      } else hi = read_cp(p);
      if (hi < lo) { p->err = "class range out of order"; goto out; }
      aici_cps_add(&s, (uint32_t)lo, (uint32_t)hi);
    } else aici_cps_add(&s, (uint32_t)lo, (uint32_t)lo);
  }
  if (!peek(p, ']')) { p->err = "missing ]"; goto out; }
  p->i++;
  if (p->icase) cps_icase(&s);
  if (neg) cps_negate(&s);
  aici_cps_regex(o, &s);
out:
  aici_free(s.r);
}

static void rx_atom(rp_t *p, aici_buf_t *o) {
  uint8_t c = p->s[p->i];
  if (c == '(') {
    p->i++;
    bool icase = p->icase, dotall = p->dotall;
    if (peek(p, '?')) {
      p->i++;
      if (peek(p, '=') || peek(p, '!') || (peek(p, '<') && p->i + 1 < p->n &&
                                           (p->s[p->i + 1] == '=' || p->s[p->i + 1] == '!'))) {
        p->err = "lookaround is not supported"; return;
      }
      if (peek(p, 'P') || peek(p, '<')) {            /* named group */
        while (p->i < p->n && p->s[p->i] != '>') p->i++;
        if (!peek(p, '>')) { p->err = "bad group name"; return; }
        p->i++;
      } else {
        bool on = true;
        while (p->i < p->n && p->s[p->i] != ':' && p->s[p->i] != ')') {
          uint8_t f = p->s[p->i++];
          if (f == '-') on = false;
          else if (f == 'i') p->icase = on;
          else if (f == 's') p->dotall = on;
          else if (f == 'x' || f == 'm' || f == 'u' || f == 'U') { p->err = "regex flags other than i and s are not supported"; return; }
          else { p->err = "bad group flags"; return; }
        }
        if (peek(p, ')')) { p->i++; return; }        /* (?i): applies to the rest of the group */
        p->i++;
      }
    }
    aici_buf_puts(o, "(?:");
    rx_alt(p, o);
    if (p->err) return;
    if (!peek(p, ')')) { p->err = "missing )"; return; }
    p->i++;
    aici_buf_puts(o, ")");
    p->icase = icase, p->dotall = dotall;
    return;
  }
  if (c == '[') { p->i++; rx_class(p, o); return; }
  if (c == '.') {
    p->i++;
    cps_t s = {0};
    aici_cps_add(&s, 0, 0x10FFFF);
    if (!p->dotall) { s.n = 0; aici_cps_add(&s, 0, 9); aici_cps_add(&s, 11, 0x10FFFF); }
    aici_cps_regex(o, &s);
    aici_free(s.r);
    return;
  }
  if (c == '^' || c == '$') { p->err = "anchors (^ $) are not supported"; return; }
  if (c == '*' || c == '+' || c == '?' || c == '{') { p->err = "nothing to repeat"; return; }
  if (c == ')') { p->err = "unbalanced )"; return; }
  cps_t s = {0};
  int64_t cp;
  if (c == '\\') {
    p->i++;
    cp = rx_escape(p, &s);
    if (cp == -2) { aici_free(s.r); return; }
  } else cp = read_cp(p);
  if (cp >= 0) {
    if (cp > 0x10FFFF) { p->err = "code point out of range"; aici_free(s.r); return; }
    bool letter = cp < 128 && ((cp | 32) >= 'a' && (cp | 32) <= 'z');
    if (cp < 128 && !(p->icase && letter)) { aici_buf_rx_byte(o, (uint8_t)cp); aici_free(s.r); return; }
    aici_cps_add(&s, (uint32_t)cp, (uint32_t)cp);
    if (p->icase) cps_icase(&s);
  }
  aici_cps_regex(o, &s);
  aici_free(s.r);
}

static void rx_repeat(rp_t *p, aici_buf_t *o) {
  aici_buf_t a = {0};
  rx_atom(p, &a);
  while (!p->err && p->i < p->n) {
    uint8_t c = p->s[p->i];
    char q[32];
    uint32_t qn = 0;
    if (c == '*' || c == '+' || c == '?') { q[qn++] = (char)c; p->i++; }
    else if (c == '{') {
      uint32_t save = p->i, lo = 0, hi = 0;
      p->i++;
      bool has_lo = aici_read_uint(p->s, p->n, &p->i, 100000, &lo), open = false;
      hi = lo;
      if (peek(p, ',')) { p->i++; if (!aici_read_uint(p->s, p->n, &p->i, 100000, &hi)) open = true; }
      else if (!has_lo) { p->i = save; break; }
      if (!peek(p, '}')) { p->i = save; p->err = "bad {m,n} repeat"; break; }
      p->i++;
      if (!open && hi < lo) { p->err = "repeat {m,n} with n < m"; break; }
      if (lo > 1000 || (!open && hi > 1000)) { p->err = "repeat count over 1000"; break; }
      /* print the quantifier */
      char *w = q;
      *w++ = '{';
      uint32_t v = lo; char d[12]; int k = 0;
      do d[k++] = (char)('0' + v % 10); while (v /= 10);
      while (k) *w++ = d[--k];
      if (open || hi != lo) {
        *w++ = ',';
        if (!open) { v = hi; do d[k++] = (char)('0' + v % 10); while (v /= 10); while (k) *w++ = d[--k]; }
      }
      *w++ = '}';
      qn = (uint32_t)(w - q);
    } else break;
    if (peek(p, '?')) { p->err = "lazy repeats (*? +? ?\?) are not supported; use the lexeme option [lazy]"; break; }
    if (peek(p, '+')) { p->err = "possessive repeats are not supported"; break; }
    aici_buf_t w = {0};
    aici_buf_puts(&w, "(?:");
    aici_buf_putn(&w, a.p ? a.p : "", a.n);
    aici_buf_puts(&w, ")");
    aici_buf_putn(&w, q, qn);
    aici_free(a.p);
    a = w;
  }
  aici_buf_putn(o, a.p ? a.p : "", a.n);
  aici_free(a.p);
}

static void rx_cat(rp_t *p, aici_buf_t *o) {
  while (!p->err && p->i < p->n && p->s[p->i] != '|' && p->s[p->i] != ')') rx_repeat(p, o);
}

static void rx_alt(rp_t *p, aici_buf_t *o) {
  aici_buf_puts(o, "(?:");
  rx_cat(p, o);
  while (!p->err && peek(p, '|')) {
    p->i++;
    aici_buf_puts(o, "|");
    rx_cat(p, o);
  }
  aici_buf_puts(o, ")");
}

bool gr_regex_translate(aici_buf_t *out, const char *pat, uint32_t len, bool icase, bool dotall, const char **why) {
  rp_t p = {(const uint8_t *)pat, 0, len, icase, dotall, 0};
  rx_alt(&p, out);
  if (!p.err && p.i < p.n) p.err = "unbalanced )";
  if (p.err) { *why = p.err; return false; }
  return true;
}
