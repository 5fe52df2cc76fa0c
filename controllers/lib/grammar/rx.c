/* rx.c - regex text of the grammar's terminals: a Rust-`regex`-syntax pattern (what llguidance
 * reads in /.../) rewritten into the SDK's byte regex, with every character class expanded to
 * the UTF-8 byte sequences of its code points (so `.` and `[^a]` match whole characters, never a
 * stray byte, as llguidance's do). \d \w \s are ASCII here (Rust's are Unicode): a documented
 * difference (docs/grammar.md). Unsupported: lookaround, backreferences, anchors, \p{..},
 * lazy and possessive repeats; each is an error naming the construct. */
#include "grammar.h"
#include "unicode_tables.h"

void gb_putn(gr_buf_t *b, const char *s, uint32_t n) {
  if (b->n + n + 1 > b->cap) {
    uint32_t c = b->cap ? b->cap : 64;
    while (c < b->n + n + 1) c *= 2;
    b->p = aici_realloc(b->p, c);
    b->cap = c;
  }
  __builtin_memcpy(b->p + b->n, s, n);
  b->n += n;
  b->p[b->n] = 0;
}
void gb_puts(gr_buf_t *b, const char *s) { gb_putn(b, s, (uint32_t)__builtin_strlen(s)); }
static const char HEX[] = "0123456789abcdef";
void gb_byte(gr_buf_t *b, uint8_t c) {
  char t[4] = {'\\', 'x', HEX[c >> 4], HEX[c & 15]};
  gb_putn(b, t, 4);
}

/* ---- code-point sets (the SDK's, aici_cps.c) ------------------------------------------- */
typedef aici_cp_set_t cps_t;

static void cps_normalize(cps_t *s) {   /* the SDK's sort and merge, then surrogates and anything past U+10FFFF dropped */
  aici_cps_normalize(s);
  cps_t o = {0};
  for (uint32_t i = 0; i < s->n; i++) {
    uint32_t lo = s->r[i].lo, hi = s->r[i].hi > 0x10FFFF ? 0x10FFFF : s->r[i].hi;
    if (lo <= 0xDFFF && hi >= 0xD800) {
      if (lo < 0xD800) aici_cps_add(&o, lo, 0xD7FF);
      if (hi > 0xDFFF) aici_cps_add(&o, 0xE000, hi);
    } else aici_cps_add(&o, lo, hi);
  }
  aici_free(s->r);
  *s = o;
}

static void cps_negate(cps_t *s) {      /* the scalar values not in s */
  cps_normalize(s);
  aici_cps_negate(s);
  cps_normalize(s);
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

static uint32_t utf8_len(uint32_t c) { return c < 0x80 ? 1 : c < 0x800 ? 2 : c < 0x10000 ? 3 : 4; }
static void utf8_enc(uint32_t c, uint8_t *o) {
  switch (utf8_len(c)) {
    case 1: o[0] = (uint8_t)c; break;
    case 2: o[0] = 0xC0 | (c >> 6); o[1] = 0x80 | (c & 63); break;
    case 3: o[0] = 0xE0 | (c >> 12); o[1] = 0x80 | ((c >> 6) & 63); o[2] = 0x80 | (c & 63); break;
    default: o[0] = 0xF0 | (c >> 18); o[1] = 0x80 | ((c >> 12) & 63); o[2] = 0x80 | ((c >> 6) & 63);
      o[3] = 0x80 | (c & 63);
  }
}

/* A UTF-8 sequence of byte ranges: [lo[k], hi[k]] for k < n. */
typedef struct { uint8_t n, lo[4], hi[4]; } seq_t;
typedef struct { seq_t *s; uint32_t n, cap; } seqs_t;

/* [lo, hi] of one encoded length as sequences of byte ranges (regex-syntax's utf8 split). */
static void utf8_seqs(seqs_t *o, uint32_t lo, uint32_t hi) {
  uint32_t n = utf8_len(lo);
  for (uint32_t i = 1; i < n; i++) {
    uint32_t m = (1u << (6 * i)) - 1;
    if ((lo & ~m) != (hi & ~m)) {
      if (lo & m) { utf8_seqs(o, lo, lo | m); utf8_seqs(o, (lo | m) + 1, hi); return; }
      if ((hi & m) != m) { utf8_seqs(o, lo, (hi & ~m) - 1); utf8_seqs(o, hi & ~m, hi); return; }
    }
  }
  if (o->n == o->cap) { o->cap = o->cap ? o->cap * 2 : 64; o->s = aici_realloc(o->s, o->cap * sizeof(seq_t)); }
  seq_t *q = &o->s[o->n++];
  q->n = (uint8_t)n;
  utf8_enc(lo, q->lo);
  utf8_enc(hi, q->hi);
}

static void emit_range(gr_buf_t *b, uint8_t lo, uint8_t hi) {
  if (lo == hi) { gb_byte(b, lo); return; }
  gb_putn(b, "[", 1); gb_byte(b, lo); gb_putn(b, "-", 1); gb_byte(b, hi); gb_putn(b, "]", 1);
}

/* Sequences s[0..n) (sorted, from position `at` on) as an alternation factored by shared
 * leading ranges: a trie of byte ranges, so the NFA (and the DFA states the SDK builds) stay
 * small for big classes such as Unicode \w. */
static void emit_seqs(gr_buf_t *b, const seq_t *s, uint32_t n, uint32_t at) {
  bool many = n > 1;
  if (many) gb_puts(b, "(?:");
  for (uint32_t i = 0; i < n;) {
    uint32_t j = i + 1;
    while (j < n && s[j].n > at && s[i].n > at && s[j].lo[at] == s[i].lo[at] && s[j].hi[at] == s[i].hi[at]) j++;
    if (i) gb_puts(b, "|");
    emit_range(b, s[i].lo[at], s[i].hi[at]);
    if (s[i].n > at + 1) emit_seqs(b, s + i, j - i, at + 1);
    i = j;
  }
  if (many) gb_puts(b, ")");
}

static bool seq_less(const seq_t *a, const seq_t *b) {
  for (uint32_t k = 0; k < 4; k++) {
    uint32_t x = k < a->n ? (uint32_t)a->lo[k] << 8 | a->hi[k] : 0, y = k < b->n ? (uint32_t)b->lo[k] << 8 | b->hi[k] : 0;
    if (x != y) return x < y;
  }
  return a->n < b->n;
}

static void emit_cps(gr_buf_t *b, cps_t *s) {
  cps_normalize(s);
  if (!s->n) { gb_puts(b, "[^\\x00-\\xff]"); return; }   /* matches nothing */
  gb_puts(b, "(?:");
  bool first = true;
  bool any_ascii = false;
  for (uint32_t i = 0; i < s->n; i++) any_ascii |= s->r[i].lo < 0x80;
  if (any_ascii) {                     /* the one-byte part as one class */
    gb_putn(b, "[", 1);
    for (uint32_t i = 0; i < s->n && s->r[i].lo < 0x80; i++) {
      uint32_t hi = s->r[i].hi < 0x7F ? s->r[i].hi : 0x7F;
      gb_byte(b, (uint8_t)s->r[i].lo);
      if (hi != s->r[i].lo) { gb_putn(b, "-", 1); gb_byte(b, (uint8_t)hi); }
    }
    gb_putn(b, "]", 1);
    first = false;
  }
  static const uint32_t bounds[] = {0x7F, 0x7FF, 0xFFFF, 0x10FFFF};
  seqs_t q = {0};
  for (uint32_t i = 0; i < s->n; i++) {
    uint32_t lo = s->r[i].lo < 0x80 ? 0x80 : s->r[i].lo, hi = s->r[i].hi;
    for (int k = 1; k < 4 && lo <= hi; k++) {
      if (lo > bounds[k]) continue;
      uint32_t h = hi < bounds[k] ? hi : bounds[k];
      utf8_seqs(&q, lo, h);
      lo = h + 1;
    }
  }
  for (uint32_t i = 1; i < q.n; i++)   /* insertion sort: lists are small (a few thousand at most) */
    for (uint32_t j = i; j > 0 && seq_less(&q.s[j], &q.s[j - 1]); j--) { seq_t t = q.s[j]; q.s[j] = q.s[j - 1]; q.s[j - 1] = t; }
  if (q.n) {
    if (!first) gb_puts(b, "|");
    emit_seqs(b, q.s, q.n, 0);
  }
  aici_free(q.s);
  gb_putn(b, ")", 1);
}

void gr_regex_cp_range(gr_buf_t *out, uint32_t lo, uint32_t hi) {
  cps_t s = {0};
  aici_cps_add(&s, lo, hi);
  emit_cps(out, &s);
  aici_free(s.r);
}

void gr_regex_literal(gr_buf_t *out, const uint8_t *s, uint32_t len, bool icase) {
  for (uint32_t i = 0; i < len; i++) {
    uint8_t c = s[i];
    bool letter = (c | 32) >= 'a' && (c | 32) <= 'z';
    if (icase && ((c | 32) == 's' || (c | 32) == 'k')) {   /* the folds outside ASCII too */
      cps_t f = {0};
      aici_cps_add(&f, c, c);
      cps_icase(&f);
      emit_cps(out, &f);
      aici_free(f.r);
    } else if (icase && letter) {
      gb_putn(out, "[", 1); gb_byte(out, c | 32); gb_byte(out, c & ~32); gb_putn(out, "]", 1);
    } else gb_byte(out, c);
  }
}

/* ---- the translator --------------------------------------------------------------------- */
typedef struct {
  const uint8_t *s;
  uint32_t i, n;
  bool icase, dotall;
  const char *err;
} rp_t;

static void rx_alt(rp_t *p, gr_buf_t *o);

static bool peek(rp_t *p, char c) { return p->i < p->n && p->s[p->i] == (uint8_t)c; }

static uint32_t read_cp(rp_t *p) {     /* one UTF-8 character of the pattern */
  uint8_t c = p->s[p->i++];
  if (c < 0x80) return c;
  uint32_t n = c >= 0xF0 ? 3 : c >= 0xE0 ? 2 : 1, v = c & (0x3F >> n);
  while (n-- && p->i < p->n) v = v << 6 | (p->s[p->i++] & 63);
  return v;
}

static int hexv(uint8_t c) {
  if (c >= '0' && c <= '9') return c - '0';
  if ((c | 32) >= 'a' && (c | 32) <= 'f') return (c | 32) - 'a' + 10;
  return -1;
}

static int64_t read_hex(rp_t *p, uint32_t digits) {   /* digits 0: {...} */
  int64_t v = 0;
  if (!digits) {
    if (!peek(p, '{')) { p->err = "bad \\x escape"; return -1; }
    p->i++;
    uint32_t k = 0;
    while (p->i < p->n && p->s[p->i] != '}') {
      int h = hexv(p->s[p->i++]);
      if (h < 0 || ++k > 8) { p->err = "bad \\x{...} escape"; return -1; }
      v = v * 16 + h;
    }
    if (!peek(p, '}')) { p->err = "bad \\x{...} escape"; return -1; }
    p->i++;
    return v;
  }
  for (uint32_t k = 0; k < digits; k++) {
    int h = p->i < p->n ? hexv(p->s[p->i]) : -1;
    if (h < 0) { p->err = "bad hex escape"; return -1; }
    p->i++;
    v = v * 16 + h;
  }
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
  switch (c) {
    case 'd': case 'D': case 'w': case 'W': case 's': case 'S': class_named(cls, (char)c); return -1;
    case 'n': return '\n';
    case 't': return '\t';
    case 'r': return '\r';
    case 'f': return '\f';
    case 'v': return '\v';
    case 'a': return 7;
    case '0': return 0;
    case 'e': return 27;
    case 'x': case 'u': case 'U': {
      int64_t v = read_hex(p, c == 'U' ? 8 : peek(p, '{') ? 0 : c == 'x' ? 2 : 4);
      if (v < 0) return -2;
      if (v > 0x10FFFF) { p->err = "escape out of range (past U+10FFFF)"; return -2; }
      if (v >= 0xD800 && v <= 0xDFFF) { p->err = "surrogate escape (not a Unicode scalar value)"; return -2; }
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

static void rx_class(rp_t *p, gr_buf_t *o) {   /* after '[' */
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
  emit_cps(o, &s);
out:
  aici_free(s.r);
}

static void rx_atom(rp_t *p, gr_buf_t *o) {
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
    gb_puts(o, "(?:");
    rx_alt(p, o);
    if (p->err) return;
    if (!peek(p, ')')) { p->err = "missing )"; return; }
    p->i++;
    gb_puts(o, ")");
    p->icase = icase, p->dotall = dotall;
    return;
  }
  if (c == '[') { p->i++; rx_class(p, o); return; }
  if (c == '.') {
    p->i++;
    cps_t s = {0};
    aici_cps_add(&s, 0, 0x10FFFF);
    if (!p->dotall) { s.n = 0; aici_cps_add(&s, 0, 9); aici_cps_add(&s, 11, 0x10FFFF); }
    emit_cps(o, &s);
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
    if (cp < 128 && !(p->icase && letter)) { gb_byte(o, (uint8_t)cp); aici_free(s.r); return; }
    aici_cps_add(&s, (uint32_t)cp, (uint32_t)cp);
    if (p->icase) cps_icase(&s);
  }
  emit_cps(o, &s);
  aici_free(s.r);
}

static bool read_int(rp_t *p, uint32_t *v) {
  uint32_t s = p->i;
  uint64_t x = 0;
  while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9') {
    x = x * 10 + (p->s[p->i++] - '0');
    if (x > 100000) x = 100000;
  }
  *v = (uint32_t)x;
  return p->i > s;
}

static void rx_repeat(rp_t *p, gr_buf_t *o) {
  gr_buf_t a = {0};
  rx_atom(p, &a);
  while (!p->err && p->i < p->n) {
    uint8_t c = p->s[p->i];
    char q[32];
    uint32_t qn = 0;
    if (c == '*' || c == '+' || c == '?') { q[qn++] = (char)c; p->i++; }
    else if (c == '{') {
      uint32_t save = p->i, lo = 0, hi = 0;
      p->i++;
      bool has_lo = read_int(p, &lo), open = false;
      hi = lo;
      if (peek(p, ',')) { p->i++; if (!read_int(p, &hi)) open = true; }
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
    gr_buf_t w = {0};
    gb_puts(&w, "(?:");
    gb_putn(&w, a.p ? a.p : "", a.n);
    gb_puts(&w, ")");
    gb_putn(&w, q, qn);
    aici_free(a.p);
    a = w;
  }
  gb_putn(o, a.p ? a.p : "", a.n);
  aici_free(a.p);
}

static void rx_cat(rp_t *p, gr_buf_t *o) {
  while (!p->err && p->i < p->n && p->s[p->i] != '|' && p->s[p->i] != ')') rx_repeat(p, o);
}

static void rx_alt(rp_t *p, gr_buf_t *o) {
  gb_puts(o, "(?:");
  rx_cat(p, o);
  while (!p->err && peek(p, '|')) {
    p->i++;
    gb_puts(o, "|");
    rx_cat(p, o);
  }
  gb_puts(o, ")");
}

bool gr_regex_translate(gr_buf_t *out, const char *pat, uint32_t len, bool icase, bool dotall, const char **why) {
  rp_t p = {(const uint8_t *)pat, 0, len, icase, dotall, 0};
  rx_alt(&p, out);
  if (!p.err && p.i < p.n) p.err = "unbalanced )";
  if (p.err) { *why = p.err; return false; }
  return true;
}
