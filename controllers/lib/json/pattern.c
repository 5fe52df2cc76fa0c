/* Strings at the byte level: code-point sets as regexes over their JSON encoding, and ECMA-262
 * `pattern`s translated to the SDK's byte regex over the string's JSON text.
 *
 * Why translate instead of matching decoded text: the DFA steps on the bytes the model writes,
 * which are JSON-escaped. A character the pattern allows is emitted as its raw UTF-8 bytes, and
 * the characters JSON must escape (", \, controls) as their escapes; other escape spellings of
 * ordinary characters (\u0041 for A) are not offered, which only narrows what the model may write.
 */
#include "json.h"

static void alt(aici_buf_t *b, bool *first, const char *text) {
  if (!*first) aici_buf_putc(b, '|');
  *first = false;
  aici_buf_puts(b, text);
}

/* The escapes JSON needs (and allows) for the characters it cannot write raw. */
static void escaped(aici_buf_t *b, uint32_t c, bool *first) {
  static const char hx[] = "0123456789abcdef";
  if (c == '"') { alt(b, first, "\\\\\\x22"); return; }
  if (c == '\\') { alt(b, first, "\\\\\\\\"); return; }
  const char *short_form = c == '\n' ? "\\\\n" : c == '\r' ? "\\\\r" : c == '\t' ? "\\\\t" : c == '\b' ? "\\\\b"
                         : c == '\f' ? "\\\\f" : 0;
  if (short_form) alt(b, first, short_form);
  alt(b, first, "\\\\u00");
  aici_buf_putc(b, hx[c >> 4]);
  char lo = hx[c & 15];
  if (lo >= 'a') { aici_buf_putc(b, '['); aici_buf_putc(b, lo); aici_buf_putc(b, (char)(lo - 32)); aici_buf_putc(b, ']'); }
  else aici_buf_putc(b, lo);
}

bool emit_cp_set(aici_buf_t *b, cp_set_t *s) {
  aici_cps_normalize(s);
  bool first = true;
  aici_buf_puts(b, "(?:");
  bool all_escaped = s->n && s->r[0].lo == 0 && s->r[0].hi >= '\\';
  if (all_escaped) alt(b, &first, "\\\\(?:[\\x22\\x5c/bfnrt]|u[0-9a-fA-F]{4})");
  /* every control character: their escapes (below, one by one) as one piece, the same language */
  bool all_controls = !all_escaped && s->n && s->r[0].lo == 0 && s->r[0].hi >= 0x1f;
  if (all_controls) alt(b, &first, "\\\\[bfnrt]|\\\\u00[01][0-9a-fA-F]");
  /* the one-byte characters as one class: the SDK takes a repeated class as a slice candidate */
  aici_buf_t ascii = {0};
  cp_set_t wide = {0};                 /* U+0080 and up */
  for (uint32_t i = 0; i < s->n; i++) {
    uint32_t lo = s->r[i].lo, hi = s->r[i].hi;
    for (uint32_t c = lo; c <= hi && c < 0x60; c++)
      if ((c < 0x20 ? !all_controls : c == '"' || c == '\\') && !all_escaped) escaped(b, c, &first);
    for (uint32_t c = lo < 0x20 ? 0x20 : lo; c <= hi && c < 0x80; c++) {
      if (c == '"' || c == '\\') continue;
      uint32_t e = c;
      while (e + 1 <= hi && e + 1 < 0x80 && e + 1 != '"' && e + 1 != '\\') e++;
      sb_byte(&ascii, (uint8_t)c);
      if (e > c) aici_buf_putc(&ascii, '-'), sb_byte(&ascii, (uint8_t)e);
      c = e;
    }
    if (hi >= 0x80) aici_cps_add(&wide, lo < 0x80 ? 0x80 : lo, hi);
  }
  if (wide.n) {                        /* the rest as raw UTF-8 (the SDK's byte-range split) */
    if (!first) aici_buf_putc(b, '|');
    first = false;
    aici_cps_scalars(&wide);
    /* every character from U+0080 on (what most strings allow): the SDK's \M, the same language
     * as the split written out (~270 bytes of text each time: most of a schema's regex text) */
    if (wide.n == 2 && wide.r[0].lo == 0x80 && wide.r[0].hi == 0xD7FF && wide.r[1].lo == 0xE000 && wide.r[1].hi == 0x10FFFF)
      aici_buf_puts(b, "\\M");
    else aici_cps_regex(b, &wide);
    aici_free(wide.r);
  }
  if (ascii.n) {
    if (!first) aici_buf_putc(b, '|');
    first = false;
    aici_buf_putc(b, '['), aici_buf_putn(b, ascii.p, ascii.n), aici_buf_putc(b, ']');
    aici_free(ascii.p);
  }
  if (first) { aici_buf_puts(b, "[^\\x00-\\xff])"); return false; }
  aici_buf_putc(b, ')');
  return true;
}

/* ---- ECMA-262 patterns ---------------------------------------------------------------------- */
typedef struct {
  const uint8_t *s;
  uint32_t n, i;
  const char *why;
  aici_buf_t *out;
  uint64_t cap;                        /* unbounded repeats: at most cap more (PAT_NO_CAP: none) */
  uint64_t end_min;                    /* an unanchored end: at least this many characters */
  uint64_t lo, hi;                     /* length in characters of what was just parsed */
} pat_t;

#define LEN_INF (UINT64_MAX / 4)
static uint64_t len_add(uint64_t a, uint64_t b) { return a >= LEN_INF || b >= LEN_INF ? LEN_INF : a + b; }
static uint64_t len_mul(uint64_t a, uint64_t k) {
  if (!a || !k) return 0;
  return a >= LEN_INF || k >= LEN_INF || a > LEN_INF / k ? LEN_INF : a * k;
}

static uint32_t next_cp(pat_t *p) {
  uint8_t c = p->s[p->i++];
  if (c < 0x80 || p->i >= p->n + 1) return c;
  uint32_t n = c >= 0xf0 ? 3 : c >= 0xe0 ? 2 : 1, cp = c & (0x3f >> n);
  for (uint32_t k = 0; k < n && p->i < p->n; k++) cp = cp << 6 | (p->s[p->i++] & 63);
  return cp;
}

static void class_escape(cp_set_t *s, char c) {   /* \d \w \s and negations */
  cp_set_t t = {0};
  switch (c | 0x20) {
    case 'd': aici_cps_add(&t, '0', '9'); break;
    case 'w': aici_cps_add(&t, '0', '9'), aici_cps_add(&t, 'A', 'Z'), aici_cps_add(&t, 'a', 'z'), aici_cps_add(&t, '_', '_'); break;
    default:
      aici_cps_add(&t, 9, 13), aici_cps_add(&t, ' ', ' '), aici_cps_add(&t, 0xa0, 0xa0), aici_cps_add(&t, 0x1680, 0x1680);
      aici_cps_add(&t, 0x2000, 0x200a), aici_cps_add(&t, 0x2028, 0x2029), aici_cps_add(&t, 0x202f, 0x202f);
      aici_cps_add(&t, 0x205f, 0x205f), aici_cps_add(&t, 0x3000, 0x3000), aici_cps_add(&t, 0xfeff, 0xfeff);
  }
  if (c >= 'A' && c <= 'Z') aici_cps_negate(&t);
  for (uint32_t i = 0; i < t.n; i++) aici_cps_add(s, t.r[i].lo, t.r[i].hi);
  aici_free(t.r);
}

static int64_t hexn(pat_t *p, uint32_t n) {
  int64_t v = 0;
  for (uint32_t k = 0; k < n; k++) {
    int d = p->i < p->n ? aici_hex_digit(p->s[p->i]) : -1;
    if (d < 0) return -1;
    v = v * 16 + d, p->i++;
  }
  return v;
}

/* After a backslash: a code point (>= 0), a class added to `cls` (-1), or an error (-2). */
static int64_t escape(pat_t *p, cp_set_t *cls, bool in_class) {
  if (p->i >= p->n) { p->why = "trailing backslash"; return -2; }
  uint8_t c = p->s[p->i++];
  int e = aici_escape_char(c);         /* n t r f v 0 */
  if (e >= 0) return e;
  switch (c) {
    case 'd': case 'D': case 'w': case 'W': case 's': case 'S': class_escape(cls, (char)c); return -1;
    case 'b': if (in_class) return '\b'; p->why = "\\b (word boundary)"; return -2;
    case 'x': {
      int64_t v = aici_escape_hex(p->s, p->n, &p->i, 2);
      if (v < 0) p->why = "bad \\x escape";
      return v < 0 ? -2 : v;
    }
    case 'u': {
      if (p->i < p->n && p->s[p->i] == '{') {   /* \u{H..H}: a scalar value, 1 to 8 digits */
        int64_t v = aici_escape_hex(p->s, p->n, &p->i, 0);
        if (v < 0) { p->why = v == AICI_ESC_BAD_DIGITS ? "bad \\u{...} escape" : aici_escape_error(v); return -2; }
        return v;
      }
      int64_t v = hexn(p, 4);
      if (v < 0) { p->why = "bad \\u escape"; return -2; }
      if (v >= 0xd800 && v < 0xdc00 && p->i + 6 <= p->n && p->s[p->i] == '\\' && p->s[p->i + 1] == 'u') {
        uint32_t save = p->i;
        p->i += 2;
        int64_t lo = hexn(p, 4);
        if (lo >= 0xdc00 && lo < 0xe000) return 0x10000 + ((v - 0xd800) << 10) + (lo - 0xdc00);
        p->i = save;
      }
      return v;
    }
    case 'c':
      if (p->i < p->n && ((p->s[p->i] | 0x20) >= 'a' && (p->s[p->i] | 0x20) <= 'z')) return p->s[p->i++] & 31;
      p->why = "bad \\c escape";
      return -2;
  }
  if ((c >= '1' && c <= '9') || c == 'k') { p->why = "backreferences"; return -2; }
  if (c == 'p' || c == 'P') { p->why = "Unicode property escapes"; return -2; }
  if (c == 'B') { p->why = "\\B"; return -2; }
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) { p->why = "unknown escape"; return -2; }
  p->i--;
  return next_cp(p);
}

static bool emit_set_atom(pat_t *p, cp_set_t *s) {
  p->lo = p->hi = 1;                   /* one character */
  emit_cp_set(p->out, s);
  aici_free(s->r);
  return true;
}

static bool parse_class(pat_t *p) {
  cp_set_t s = {0};
  bool neg = p->i < p->n && p->s[p->i] == '^';
  if (neg) p->i++;
  for (;;) {
    if (p->i >= p->n) { p->why = "unterminated [ ]"; return false; }
    if (p->s[p->i] == ']') { p->i++; break; }   /* ECMA: [] is empty, [^] is anything */
    int64_t lo;
    if (p->s[p->i] == '\\') { p->i++; lo = escape(p, &s, true); }
    else lo = next_cp(p);
    if (lo == -2) return false;
    if (lo == -1) continue;
    if (p->i + 1 < p->n && p->s[p->i] == '-' && p->s[p->i + 1] != ']') {
      p->i++;
      int64_t hi;
      if (p->s[p->i] == '\\') { p->i++; hi = escape(p, &s, true); }
      else hi = next_cp(p);
      if (hi == -2) return false;
      if (hi == -1) { aici_cps_add(&s, (uint32_t)lo, (uint32_t)lo), aici_cps_add(&s, '-', '-'); continue; }
      if (hi < lo) { p->why = "bad range in [ ]"; return false; }
      aici_cps_add(&s, (uint32_t)lo, (uint32_t)hi);
    } else aici_cps_add(&s, (uint32_t)lo, (uint32_t)lo);
  }
  if (neg) aici_cps_negate(&s);
  return emit_set_atom(p, &s);
}

static bool parse_alt(pat_t *p, uint32_t depth);

static bool parse_atom(pat_t *p, uint32_t depth) {
  uint32_t c = next_cp(p);
  cp_set_t s = {0};
  switch (c) {
    case '(': {
      if (p->i < p->n && p->s[p->i] == '?') {
        if (p->i + 1 < p->n && p->s[p->i + 1] == ':') p->i += 2;
        else if (p->i + 2 < p->n && p->s[p->i + 1] == '<' && p->s[p->i + 2] != '=' && p->s[p->i + 2] != '!') {
          while (p->i < p->n && p->s[p->i] != '>') p->i++;
          p->i++;
        } else { p->why = "lookaround assertions"; return false; }
      }
      aici_buf_puts(p->out, "(?:");
      if (!parse_alt(p, depth + 1)) return false;   /* sets p->lo, p->hi */
      if (p->i >= p->n || p->s[p->i] != ')') { p->why = "missing )"; return false; }
      p->i++;
      aici_buf_putc(p->out, ')');
      return true;
    }
    case '[': return parse_class(p);
    case '.':
      aici_cps_add(&s, '\n', '\n'), aici_cps_add(&s, '\r', '\r'), aici_cps_add(&s, 0x2028, 0x2029);
      aici_cps_negate(&s);
      return emit_set_atom(p, &s);
    case '\\': {
      int64_t v = escape(p, &s, false);
      if (v == -2) return false;
      if (v >= 0) aici_cps_add(&s, (uint32_t)v, (uint32_t)v);
      return emit_set_atom(p, &s);
    }
    case '^': case '$': p->why = "^ or $ inside the pattern"; return false;
    case '*': case '+': case '?': p->why = "nothing to repeat"; return false;
    case ')': p->why = "unbalanced )"; return false;
  }
  aici_cps_add(&s, c, c);
  return emit_set_atom(p, &s);
}

static bool parse_uint(pat_t *p, uint32_t *v) {
  uint32_t s = p->i;
  uint64_t x = 0;
  while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9' && x < 1000000) x = x * 10 + (p->s[p->i++] - '0');
  *v = (uint32_t)x;
  return p->i > s;
}

/* Repeats wider than the SDK's 1000 are written as consecutive pieces of the same atom. */
static void repeat(aici_buf_t *b, uint32_t atom_at, uint32_t min, uint32_t max, bool unbounded) {
  uint32_t n = b->n - atom_at;
  char *atom = aici_malloc(n + 1);
  __builtin_memcpy(atom, b->p + atom_at, n);
  b->n = atom_at;
  for (; min > 1000; min -= 1000) aici_buf_putn(b, atom, n), aici_buf_puts(b, "{1000}");
  aici_buf_putn(b, atom, n), aici_buf_putc(b, '{'), sb_uint(b, min);
  if (unbounded) {
    aici_buf_puts(b, ",}");
  } else {
    uint32_t more = max - min, m = more < 1000 - min ? more : 1000 - min;
    aici_buf_putc(b, ','), sb_uint(b, min + m), aici_buf_putc(b, '}');
    for (more -= m; more; more -= m) {
      m = more < 1000 ? more : 1000;
      aici_buf_putn(b, atom, n), aici_buf_puts(b, "{0,"), sb_uint(b, m), aici_buf_putc(b, '}');
    }
  }
  aici_free(atom);
}

static bool parse_seq(pat_t *p, uint32_t depth) {
  uint64_t lo = 0, hi = 0;
  while (p->i < p->n && p->s[p->i] != '|' && p->s[p->i] != ')') {
    if (depth == 0 && p->s[p->i] == '$' && (p->i + 1 == p->n || p->s[p->i + 1] == '|')) break;
    uint32_t at = p->out->n;
    aici_buf_puts(p->out, "(?:");
    if (!parse_atom(p, depth)) return false;
    aici_buf_putc(p->out, ')');
    uint64_t alo = p->lo, ahi = p->hi;
    uint32_t min = 1, max = 1;
    bool unbounded = false;
    uint8_t q = p->i < p->n ? p->s[p->i] : 0;
    if (q == '*') min = 0, unbounded = true, p->i++;
    else if (q == '+') min = 1, unbounded = true, p->i++;
    else if (q == '?') min = 0, max = 1, p->i++;
    else if (q == '{') {
      uint32_t save = p->i++;
      bool ok = parse_uint(p, &min);
      max = min;
      if (ok && p->i < p->n && p->s[p->i] == ',') {
        p->i++;
        if (!parse_uint(p, &max)) unbounded = true;
      }
      if (!ok || p->i >= p->n || p->s[p->i] != '}') { p->i = save; lo = len_add(lo, alo), hi = len_add(hi, ahi); continue; }   /* a literal { */
      p->i++;
      if (!unbounded && max < min) { p->why = "bad {m,n}"; return false; }
      if (min > 100000 || max > 100000) { p->why = "repeat count over 100000"; return false; }
    } else {
      lo = len_add(lo, alo), hi = len_add(hi, ahi);
      continue;
    }
    if (p->i < p->n && p->s[p->i] == '?') p->i++;   /* lazy: same language */
    if (unbounded && p->cap != PAT_NO_CAP) max = min + (uint32_t)p->cap, unbounded = false;
    lo = len_add(lo, len_mul(alo, min)), hi = len_add(hi, unbounded ? (ahi ? LEN_INF : 0) : len_mul(ahi, max));
    repeat(p->out, at, min, max, unbounded);
    if (p->i < p->n && (p->s[p->i] == '*' || p->s[p->i] == '+' || p->s[p->i] == '?' || p->s[p->i] == '{')) {
      p->why = "multiple repeat";
      return false;
    }
  }
  p->lo = lo, p->hi = hi;
  return true;
}

static uint64_t any_chars(pat_t *p, uint64_t min) {   /* an unanchored end; its longest */
  uint32_t at = p->out->n;
  emit_strchar(p->out);
  bool unbounded = p->cap == PAT_NO_CAP;
  repeat(p->out, at, (uint32_t)min, unbounded ? 0 : (uint32_t)(min + p->cap), unbounded);
  return unbounded ? LEN_INF : min + p->cap;
}

static bool parse_alt(pat_t *p, uint32_t depth) {
  uint64_t lo = LEN_INF, hi = 0;
  for (;;) {
    uint64_t ends = 0, end_min = 0;    /* the unanchored ends' longest, and shortest */
    if (depth == 0) {                  /* search semantics: unanchored ends match anything */
      bool anchored = p->i < p->n && p->s[p->i] == '^';
      if (anchored) p->i++;
      aici_buf_puts(p->out, "(?:");
      if (!anchored) ends = len_add(ends, any_chars(p, 0));
    }
    if (!parse_seq(p, depth)) return false;
    uint64_t slo = p->lo, shi = p->hi;
    if (depth == 0) {
      bool anchored = p->i < p->n && p->s[p->i] == '$';
      if (anchored) p->i++;
      else ends = len_add(ends, any_chars(p, p->end_min)), end_min = p->end_min;
      aici_buf_putc(p->out, ')');
    }
    shi = len_add(shi, ends), slo = len_add(slo, end_min);
    if (slo < lo) lo = slo;
    if (shi > hi) hi = shi;
    if (p->i < p->n && p->s[p->i] == '|') { p->i++; aici_buf_putc(p->out, '|'); continue; }
    p->lo = lo, p->hi = hi;
    return true;
  }
}

bool emit_pattern_capped(aici_buf_t *b, const char *pat, uint32_t len, uint64_t cap, uint64_t end_min, uint64_t *lo,
                         uint64_t *hi, const char **why) {
  pat_t p = {.s = (const uint8_t *)pat, .n = len, .out = b, .cap = cap, .end_min = end_min};
  aici_buf_puts(b, "(?:");
  bool ok = parse_alt(&p, 0);
  if (ok && p.i < p.n) p.why = "unbalanced )", ok = false;
  aici_buf_putc(b, ')');
  *why = p.why;
  if (lo) *lo = p.lo;
  if (hi) *hi = p.hi >= LEN_INF ? UINT64_MAX : p.hi;
  return ok;
}

bool emit_pattern(aici_buf_t *b, const char *pat, uint32_t len, const char **why) {
  return emit_pattern_capped(b, pat, len, PAT_NO_CAP, 0, 0, 0, why);
}

void emit_strchar(aici_buf_t *b) {
  cp_set_t s = {0};
  aici_cps_add(&s, 0, 0x10ffff);
  emit_cp_set(b, &s);
  aici_free(s.r);
}
