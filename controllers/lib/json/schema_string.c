/* JSON Schema strings (formats, patterns, length bounds, length-counted machines) and numbers
 * (bounds, multipleOf) to regex text: part of the schema compiler (schema_int.h). */
#include "schema_int.h"

/* ---- strings --------------------------------------------------------------------------------- */
/* `one` (a regex) min..max times (unbounded: min or more), in repeats of at most 1000 (the SDK's
 * limit). */
static void emit_repeat(aici_buf_t *b, const aici_buf_t *one, uint64_t min, uint64_t max, bool unbounded) {
  for (; min > 1000; min -= 1000, max -= 1000) aici_buf_putn(b, one->p, one->n), aici_buf_puts(b, "{1000}");
  if (unbounded) {
    aici_buf_putn(b, one->p, one->n), aici_buf_putc(b, '{'), sb_uint(b, min), aici_buf_puts(b, ",}");
  } else {
    uint64_t more = max - min, m = more < 1000 - min ? more : 1000 - min;
    aici_buf_putn(b, one->p, one->n), aici_buf_putc(b, '{'), sb_uint(b, min), aici_buf_putc(b, ','), sb_uint(b, min + m), aici_buf_putc(b, '}');
    for (more -= m; more; more -= m) {
      m = more < 1000 ? more : 1000;
      aici_buf_putn(b, one->p, one->n), aici_buf_puts(b, "{0,"), sb_uint(b, m), aici_buf_putc(b, '}');
    }
  }
}

void sc_emit_chars(aici_buf_t *b, uint64_t min, uint64_t max, bool unbounded) {
  aici_buf_t one = {0};
  emit_strchar(&one);
  emit_repeat(b, &one, min, max, unbounded);
  aici_free(one.p);
}

/* Calendar dates exactly (days per month, February 29 in leap years only, no year 0), as
 * Python's date.fromisoformat; no leap second (:60), which datetime rejects. */
static const char DATE[] =
  "(?:(?:[1-9][0-9]{3}|0[1-9][0-9]{2}|00[1-9][0-9]|000[1-9])\\-(?:(?:0[13578]|1[02])\\-(?:0[1-9]|[12][0-9]|3[01])"
  "|(?:0[469]|11)\\-(?:0[1-9]|[12][0-9]|30)|02\\-(?:0[1-9]|1[0-9]|2[0-8]))"
  "|(?:[0-9]{2}(?:0[48]|[2468][048]|[13579][26])|(?:0[48]|[2468][048]|[13579][26])00)\\-02\\-29)";
static const char TIME[] = "(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\\.[0-9]+)?"
                           "(?:[Zz]|[+\\-](?:[01][0-9]|2[0-3]):[0-5][0-9])";
static const char H4[] = "[0-9a-fA-F]{1,4}";
static const char LABEL[] = "[a-zA-Z0-9](?:[a-zA-Z0-9\\-]{0,61}[a-zA-Z0-9])?";
static const char ATEXT[] = "[a-zA-Z0-9!#$%&'*+/=?\\^_`{|}~\\-]+";
static const char URICH[] = "(?:[a-zA-Z0-9\\-._~:/?#\\[\\]@!$&'()*+,;=]|%[0-9a-fA-F]{2})";

bool sc_emit_format(aici_buf_t *b, const char *f) {
  uint32_t n = 0;
  while (f[n]) n++;
#define IS(s) (n == sizeof(s) - 1 && !__builtin_memcmp(f, s, n))
  if (IS("date")) aici_buf_puts(b, DATE);
  else if (IS("time")) aici_buf_puts(b, TIME);
  else if (IS("date-time")) aici_buf_puts(b, DATE), aici_buf_puts(b, "[Tt]"), aici_buf_puts(b, TIME);
  else if (IS("uuid"))
    aici_buf_puts(b, "[0-9a-fA-F]{8}\\-[0-9a-fA-F]{4}\\-[0-9a-fA-F]{4}\\-[0-9a-fA-F]{4}\\-[0-9a-fA-F]{12}");
  else if (IS("email")) {
    aici_buf_puts(b, ATEXT), aici_buf_puts(b, "(?:\\."), aici_buf_puts(b, ATEXT), aici_buf_puts(b, ")*@");
    aici_buf_puts(b, LABEL), aici_buf_puts(b, "(?:\\."), aici_buf_puts(b, LABEL), aici_buf_puts(b, ")+");
  } else if (IS("hostname")) {
    aici_buf_puts(b, LABEL), aici_buf_puts(b, "(?:\\."), aici_buf_puts(b, LABEL), aici_buf_puts(b, ")*");
  } else if (IS("ipv4")) {
    const char *o = "(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])";
    aici_buf_puts(b, o);
    for (int i = 0; i < 3; i++) aici_buf_puts(b, "\\."), aici_buf_puts(b, o);
  } else if (IS("ipv6")) {
    aici_buf_puts(b, "(?:");
    /* k groups, "::", then up to 7-k groups (k = 0..7), or all eight groups */
    aici_buf_puts(b, "(?:"), aici_buf_puts(b, H4), aici_buf_puts(b, ":){7}"), aici_buf_puts(b, H4);
    for (int k = 0; k <= 7; k++) {
      aici_buf_putc(b, '|');
      if (k) aici_buf_puts(b, "(?:"), aici_buf_puts(b, H4), aici_buf_puts(b, ":){"), sb_uint(b, (uint64_t)k), aici_buf_putc(b, '}');
      else aici_buf_putc(b, ':');
      if (7 - k > 0) aici_buf_puts(b, "(?::"), aici_buf_puts(b, H4), aici_buf_puts(b, "){0,"), sb_uint(b, (uint64_t)(7 - k)), aici_buf_puts(b, "}");
      if (!k) aici_buf_puts(b, "(?::|(?::"), aici_buf_puts(b, H4), aici_buf_puts(b, ")+)"), b->n -= 0;
    }
    aici_buf_putc(b, ')');
  } else if (IS("uri")) {
    aici_buf_puts(b, "[a-zA-Z][a-zA-Z0-9+.\\-]*:"), aici_buf_puts(b, URICH), aici_buf_putc(b, '+');
  } else return false;
  return true;
#undef IS
}

/* format email within maxLength `max`: the same shape with its repeats bounded, so that no
 * match is longer (narrower than the format: the local part, the labels and their count sized to
 * fit, the roomiest shape first). False when even a small address does not fit. */
static bool emit_email_within(aici_buf_t *b, uint64_t max) {
  /* (u, k): local parts of 1 + u atoms (an atom: a character or `.` and one), labels of k */
  static const uint32_t shapes[][2] = {{62, 63}, {31, 63}, {31, 40}, {31, 24}, {20, 24}, {15, 16}, {8, 10}, {4, 6}, {2, 3}};
  const uint32_t n_shapes = sizeof shapes / sizeof shapes[0];
  for (uint32_t i = 0; i < 2 * n_shapes; i++) {   /* at least 2 labels after the first, else 1 */
    uint64_t u = shapes[i % n_shapes][0], k = shapes[i % n_shapes][1], fixed = 2 + 2 * u + k;
    if (max < fixed + k + 1) continue;
    uint64_t d = (max - fixed) / (k + 1);
    if (d < (i < n_shapes ? 2u : 1u)) continue;
    if (d > 127) d = 127;
    const char *atext = "[a-zA-Z0-9!#$%&'*+/=?\\^_`{|}~\\-]";
    aici_buf_puts(b, atext), aici_buf_puts(b, "(?:"), aici_buf_puts(b, atext), aici_buf_puts(b, "|\\."), aici_buf_puts(b, atext);
    aici_buf_puts(b, "){0,"), sb_uint(b, u), aici_buf_puts(b, "}@");
    aici_buf_t label = {0};
    aici_buf_puts(&label, "[a-zA-Z0-9](?:[a-zA-Z0-9\\-]{0,"), sb_uint(&label, k - 2), aici_buf_puts(&label, "}[a-zA-Z0-9])?");
    aici_buf_putn(b, label.p, label.n), aici_buf_puts(b, "(?:\\."), aici_buf_putn(b, label.p, label.n);
    aici_buf_puts(b, "){1,"), sb_uint(b, d), aici_buf_putc(b, '}');
    aici_free(label.p);
    return true;
  }
  return false;
}

bool sc_get_uint(cx_t *c, const jv_t *s, const char *kw, uint64_t *out) {
  const jv_t *v = jv_get(s, kw);
  if (!v) return false;
  if (v->kind != JV_NUM || v->num < 0 || !jv_is_int(v)) { sc_fail(c, "bad schema: ", kw, "not a non-negative integer"); return false; }
  *out = v->num > 1e15 ? (uint64_t)1e15 : (uint64_t)v->num;
  return true;
}

/* A pattern `^ATOM{a,b}$` (or * + ?) with length bounds: the same pattern with the repeat
 * narrowed to the bounds (each repeat of one atom is one character). NULL: not of that form. */
static char *pattern_with_length(const jv_t *pat, uint64_t min, uint64_t max, bool has_max, uint64_t *largest) {
  const char *p = pat->s;
  uint32_t n = pat->n, i = 0;
  if (n < 3 || p[0] != '^' || p[n - 1] != '$' || (n >= 2 && p[n - 2] == '\\')) return 0;
  i = 1;
  uint32_t atom = i;
  if (p[i] == '[') {
    for (i++; i < n - 1 && p[i] != ']'; i++)
      if (p[i] == '\\') i++;
    if (i >= n - 1) return 0;
    i++;
  } else if (p[i] == '\\' && i + 1 < n - 1 && ((p[i + 1] | 0x20) == 'd' || (p[i + 1] | 0x20) == 'w' || (p[i + 1] | 0x20) == 's')) i += 2;
  else if (p[i] == '.') i++;
  else return 0;
  uint32_t atom_end = i;
  uint64_t a = 0, b = 0;
  bool unbounded = false;
  if (p[i] == '*') unbounded = true, i++;
  else if (p[i] == '+') a = 1, unbounded = true, i++;
  else if (p[i] == '?') b = 1, i++;
  else if (p[i] == '{') {
    i++;
    while (p[i] >= '0' && p[i] <= '9') a = a * 10 + (uint64_t)(p[i++] - '0');
    b = a;
    if (p[i] == ',') {
      i++;
      if (p[i] == '}') unbounded = true;
      else { b = 0; while (p[i] >= '0' && p[i] <= '9') b = b * 10 + (uint64_t)(p[i++] - '0'); }
    }
    if (p[i] != '}') return 0;
    i++;
  } else return 0;
  if (i != n - 1) return 0;
  if (min > a) a = min;
  if (has_max && (unbounded || max < b)) b = max, unbounded = false;
  *largest = unbounded || b < a ? a : b;
  aici_buf_t t = {0};
  aici_buf_putc(&t, '^'), aici_buf_putn(&t, p + atom, atom_end - atom);
  aici_buf_putc(&t, '{'), sb_uint(&t, a);
  if (unbounded) aici_buf_putc(&t, ',');
  else if (b != a) aici_buf_putc(&t, ','), sb_uint(&t, b < a ? a : b);
  aici_buf_puts(&t, "}$");
  if (!unbounded && b < a) { aici_free(t.p); aici_buf_t e = {0}; aici_buf_puts(&e, "^[]$"); return e.p; }
  return t.p;
}

/* Shortest and longest match of a regex text, in bytes (max UINT64_MAX: unbounded or too big
 * to tell). Depth-first over the DFA: a state on the current path again is a loop. */
#define LEN_STATES 1024u
typedef struct { aici_regex_t *re; uint64_t *memo; uint8_t *mark; bool failed; } lens_t;

static uint64_t longest(lens_t *l, uint32_t s, uint32_t depth) {
  if (s >= LEN_STATES || depth > 256) { l->failed = true; return 0; }
  if (l->mark[s] == 2) return l->memo[s];
  if (l->mark[s] == 1) { l->failed = true; return 0; }   /* a loop */
  l->mark[s] = 1;
  uint64_t best = 0;
  for (uint32_t byte = 0; byte < 256 && !l->failed; byte++) {
    uint32_t t = aici_regex_step(l->re, s, (uint8_t)byte);
    if (t) {
      uint64_t v = 1 + longest(l, t, depth + 1);
      if (v > best) best = v;
    }
  }
  l->mark[s] = 2, l->memo[s] = best;
  return best;
}

static void length_bounds(const char *text, uint32_t len, uint64_t *min, uint64_t *max) {
  *min = 0, *max = UINT64_MAX;
  aici_regex_t *re = aici_regex_compile(text, len, 0);
  if (!re) return;
  uint32_t q[LEN_STATES], d[LEN_STATES], n = 1;
  uint8_t seen[LEN_STATES] = {0};
  q[0] = aici_regex_start(re), d[0] = 0;
  if (q[0] < LEN_STATES) seen[q[0]] = 1;
  for (uint32_t i = 0; i < n; i++) {       /* breadth first: the shortest match */
    if (aici_regex_accepting(re, q[i])) { *min = d[i]; break; }
    for (uint32_t byte = 0; byte < 256; byte++) {
      uint32_t t = aici_regex_step(re, q[i], (uint8_t)byte);
      if (!t || t >= LEN_STATES || seen[t] || n == LEN_STATES) continue;
      seen[t] = 1, q[n] = t, d[n++] = d[i] + 1;
    }
  }
  lens_t l = {re, aici_calloc(LEN_STATES, 8), aici_calloc(LEN_STATES, 1), false};
  uint64_t v = longest(&l, aici_regex_start(re), 0);
  if (!l.failed) *max = v;
  aici_free(l.memo), aici_free(l.mark);
}


/* A length-counted string machine (machine_src_t.counted): `"`, the content regex, `"`, and
 * lo..hi characters (CHARS_UNBOUNDED: no maximum), one per (key, bounds). The matcher counts
 * beside the DFA state, so nothing here grows with the bounds. */
static void emit_counted(cx_t *c, aici_buf_t *b, const jv_t *key, const aici_buf_t *content, uint64_t lo, uint64_t hi) {
  key_arg = lo << 32 | hi;
  int32_t m = sc_machine_find(c, key, MK_COUNTED);
  aici_buf_t t = {0};
  aici_buf_puts(&t, "\\x22"), aici_buf_putn(&t, content->p, content->n), aici_buf_puts(&t, "\\x22");
  for (uint32_t i = 0; m < 0 && i < c->n_keys; i++)   /* the same machine from another schema node */
    if (c->texts[i].counted && c->texts[i].lo == lo && c->texts[i].hi == hi && c->texts[i].len == t.n &&
        !__builtin_memcmp(c->texts[i].text, t.p, t.n))
      m = (int32_t)i;
  if (m < 0) {
    m = (int32_t)sc_machine_for(c, key, MK_COUNTED, 0, 0);
    if (!c->err) {
      sc_set_text(c, (uint32_t)m, t.p, t.n);
      c->texts[m].counted = true, c->texts[m].lo = (uint32_t)lo, c->texts[m].hi = (uint32_t)hi;
    }
  }
  aici_free(t.p);
  key_arg = 0;
  if (!c->err) sc_emit_call(c, b, (uint32_t)m);
}

/* `pattern` beside `format`: exact where one's language lies inside the other's (the inner one is
 * then the string's language: `^[a-z]+@[a-z]+\.com$` beside `format: email`); else an error. */

/* `pattern` beside `format` (true: both stay, to be intersected, when `intersect`; else an
 * error). */
static bool pattern_beside_format(cx_t *c, const jv_t **pat, const jv_t **fmt, bool intersect) {
  if (!*pat || !*fmt || (*pat)->kind != JV_STR) return false;
  aici_buf_t p = {0}, f = {0};
  const char *why = 0;
  bool ok = emit_pattern_capped(&p, (*pat)->s, (*pat)->n, PAT_NO_CAP, 0, 0, 0, &why) && sc_emit_format(&f, (*fmt)->s);
  if (ok && regex_subset(p.p, p.n, f.p, f.n)) *fmt = 0;
  else if (ok && regex_subset(f.p, f.n, p.p, p.n)) *pat = 0;
  else if (!ok || !intersect) UNSUPPORTED(c, "format", "together with pattern, neither language inside the other's");
  aici_free(p.p), aici_free(f.p);
  return *pat && *fmt && !c->err;
}

/* A string in both the pattern's and the format's language: their product automaton
 * (keylang.c, at most KEYLANG_STATES states), no length bounds beside (a counted machine takes
 * one regex). */
static void emit_pattern_and_format(cx_t *c, aici_buf_t *b, const jv_t *pat, const jv_t *fmt) {
  aici_buf_t pats[2] = {{0}, {0}}, none = {0};
  const char *why = 0;
  if (!emit_pattern_capped(&pats[0], pat->s, pat->n, PAT_NO_CAP, 0, 0, 0, &why) || !sc_emit_format(&pats[1], fmt->s)) {
    UNSUPPORTED(c, "pattern", why ? why : "?");
  } else {
    aici_buf_t content = {0};
    if (!sc_emit_keylang(c, &content, pats, 2, KEYLANG_ALL, &none))
      UNSUPPORTED(c, "format", "together with pattern: their product has over 1024 states");
    else aici_buf_puts(b, "\\x22"), aici_buf_putn(b, content.p, content.n), aici_buf_puts(b, "\\x22");
    aici_free(content.p);
  }
  aici_free(pats[0].p), aici_free(pats[1].p);
}

/* Strings while literals are checked (c->flat_cap: one regex, no machine, so no counting): a
 * `maxLength` a pattern does not imply caps its unbounded repeats and unanchored ends, a
 * `minLength` it does not imply is taken by its unanchored end (narrower: some valid literals
 * dropped, never an invalid one kept). */
static void emit_string_flat(cx_t *c, aici_buf_t *b, const jv_t *s) {
  uint64_t min = 0, max = 0;
  bool has_min = sc_get_uint(c, s, "minLength", &min), has_max = sc_get_uint(c, s, "maxLength", &max);
  const jv_t *pat = jv_get(s, "pattern"), *fmt = jv_get(s, "format");
  if (fmt && fmt->kind == JV_STR && sc_ignored(c, "format")) { sc_relax(c, "format"); fmt = 0; }
  if (fmt && fmt->kind != JV_STR) fmt = 0;
  if (has_max && max < min) { aici_buf_puts(b, "[^\\x00-\\xff]"); return; }
  if (c->flat_cap) {                   /* for literals of fewer characters: the same verdicts */
    if (min > c->flat_cap) min = c->flat_cap;
    if (has_max && max > c->flat_cap) max = c->flat_cap;
  }
  aici_buf_puts(b, "\\x22");
  if (pat || fmt) {
    pattern_beside_format(c, &pat, &fmt, false);
    if (c->err) return;
    if (pat && pat->kind != JV_STR) { sc_fail(c, "bad schema: ", "pattern", "not a string"); return; }
    jv_t narrowed = {0};
    if (pat && ((has_min && min > 0) || has_max)) {
      uint64_t largest;
      char *t = pattern_with_length(pat, has_min ? min : 0, max, has_max, &largest);
      if (t) {
        uint32_t k = 0;
        while (t[k]) k++;
        narrowed.kind = JV_STR, narrowed.s = t, narrowed.n = k;
        pat = &narrowed, has_min = has_max = false;
      }
    }
    uint64_t cap = PAT_NO_CAP, end_min = 0;   /* a pattern's lengths in characters, exactly */
    if (pat && ((has_min && min > 0) || has_max)) {
      aici_buf_t t = {0};
      uint64_t lo = 0, hi = 0;
      const char *why = 0;
      if (emit_pattern_capped(&t, pat->s, pat->n, PAT_NO_CAP, 0, &lo, &hi, &why)) {
        if (has_min && lo < min) {     /* narrower: an unanchored end takes the missing length */
          uint64_t lo2 = 0;
          t.n = 0;
          emit_pattern_capped(&t, pat->s, pat->n, PAT_NO_CAP, min - lo, &lo2, &hi, &why);
          if (lo2 >= min) end_min = min - lo, lo = lo2;
        }
        if (has_min && lo >= min) has_min = false;
        if (has_max && hi <= max) has_max = false;
        for (uint64_t a = 0, z = PAT_CAP_MAX + 1; has_max && a < z;) {
          /* narrower: the unbounded repeats at most `cap` more, the largest cap that fits */
          uint64_t mid = (a + z) / 2;
          t.n = 0;
          emit_pattern_capped(&t, pat->s, pat->n, mid, end_min, &lo, &hi, &why);
          if (hi <= max) cap = mid, a = mid + 1;
          else z = mid;
          if (a >= z && cap != PAT_NO_CAP) has_max = false;
        }
      }
      aici_free(t.p);
    }
    bool email_within = false;         /* a bounded email: its own narrower shape */
    if (fmt && has_max && !pat && jv_str_is(fmt, "email")) {
      aici_buf_t t = {0};
      email_within = emit_email_within(&t, max);
      aici_free(t.p);
      has_max = !email_within;
    }
    if ((has_min && min > 0) || has_max) {
      /* length bounds the pattern or format already implies: characters <= bytes, and a
       * format's text is ASCII (one byte a character) */
      aici_buf_t t = {0};
      const char *why = 0;
      bool ok = pat ? emit_pattern(&t, pat->s, pat->n, &why) : sc_emit_format(&t, fmt->s);
      uint64_t lo, hi;
      if (ok) {
        length_bounds(t.p, t.n, &lo, &hi);
        if (has_max && hi <= max) has_max = false;
        if (has_min && (min <= (pat ? (lo > 0) : lo))) has_min = false;
      }
      aici_free(t.p);
    }
    if ((has_min && min > 0) || has_max) { UNSUPPORTED(c, has_max ? "maxLength" : "minLength", pat ? "together with pattern" : "together with format"); return; }
    if (pat) {
      const char *why = 0;
      uint32_t at = sc_ptr_pushs(c, "pattern");
      if (!emit_pattern_capped(b, pat->s, pat->n, cap, end_min, 0, 0, &why)) UNSUPPORTED(c, "pattern", why);
      sc_ptr_pop(c, at);
    } else if (email_within) {
      emit_email_within(b, max);
    } else if (!sc_emit_format(b, fmt->s)) {
      uint32_t at = sc_ptr_pushs(c, "format");
      UNSUPPORTED(c, "format", fmt->s);
      sc_ptr_pop(c, at);
    }
  } else {
    if (min > STR_MAX || (has_max && max > STR_MAX)) {
      UNSUPPORTED(c, has_max && max > STR_MAX ? "maxLength" : "minLength", "over 134217728");
      return;
    }
    sc_emit_chars(b, min, max, !has_max);
  }
  aici_buf_puts(b, "\\x22");
}

/* Strings: the content's language (a pattern, a format, any characters), and length bounds in
 * characters, exactly. Bounds the language implies cost nothing; `^ATOM{m,n}$` takes small
 * ones into its repeat; any other is a counted machine (emit_counted), whatever its size. */
void sc_emit_string(cx_t *c, aici_buf_t *b, const jv_t *s) {
  if (c->flat_cap) { emit_string_flat(c, b, s); return; }
  uint64_t min = 0, max = 0;
  bool has_min = sc_get_uint(c, s, "minLength", &min), has_max = sc_get_uint(c, s, "maxLength", &max);
  const jv_t *pat = jv_get(s, "pattern"), *fmt = jv_get(s, "format");
  if (fmt && fmt->kind == JV_STR && sc_ignored(c, "format")) { sc_relax(c, "format"); fmt = 0; }
  if (fmt && fmt->kind != JV_STR) fmt = 0;
  if (c->err) return;
  if (has_max && max < min) { aici_buf_puts(b, "[^\\x00-\\xff]"); return; }
  if (has_min && !min) has_min = false;
  aici_buf_puts(b, "\\x22");
  aici_buf_t content = {0};
  jv_t narrowed = {0};
  if (pat || fmt) {
    if (pattern_beside_format(c, &pat, &fmt, true)) {
      if (has_min || has_max) {
        UNSUPPORTED(c, has_max ? "maxLength" : "minLength", "beside both a pattern and a format, neither inside the other");
        return;
      }
      b->n -= 4, b->p[b->n] = 0;       /* (the opening quote: written with the content) */
      emit_pattern_and_format(c, b, pat, fmt);
      return;
    }
    if (c->err) return;
    if (pat && pat->kind != JV_STR) { sc_fail(c, "bad schema: ", "pattern", "not a string"); return; }
    if (pat && (has_min || has_max)) {  /* ^ATOM{m,n}$: the bounds in the repeat, while small */
      uint64_t largest = 0;
      char *t = pattern_with_length(pat, has_min ? min : 0, max, has_max, &largest);
      if (t && largest <= PAT_INLINE_MAX) {
        uint32_t k = 0;
        while (t[k]) k++;
        narrowed.kind = JV_STR, narrowed.s = t, narrowed.n = k;
        pat = &narrowed, has_min = has_max = false;
      } else aici_free(t);
    }
    uint64_t lo = 0, hi = UINT64_MAX;  /* the language's lengths in characters */
    if (pat) {
      const char *why = 0;
      uint32_t at = sc_ptr_pushs(c, "pattern");
      if (!emit_pattern_capped(&content, pat->s, pat->n, PAT_NO_CAP, 0, &lo, &hi, &why)) UNSUPPORTED(c, "pattern", why);
      sc_ptr_pop(c, at);
    } else if (!sc_emit_format(&content, fmt->s)) {
      uint32_t at = sc_ptr_pushs(c, "format");
      UNSUPPORTED(c, "format", fmt->s);
      sc_ptr_pop(c, at);
    } else {
      length_bounds(content.p, content.n, &lo, &hi);   /* a format's text is ASCII: bytes are characters */
      if (hi == UINT64_MAX) lo = 0;    /* (not told exactly: counted) */
    }
    if (narrowed.s) aici_free((char *)narrowed.s);
    if (c->err) { aici_free(content.p); return; }
    if (has_max && lo > max) {         /* no string fits */
      b->n -= 4, b->p[b->n] = 0;
      aici_buf_puts(b, "[^\\x00-\\xff]");
      aici_free(content.p);
      return;
    }
    if (has_min && lo >= min) has_min = false;
    if (has_max && hi <= max) has_max = false;
  } else {
    if ((!has_max || max <= STR_INLINE_MAX) && min <= STR_INLINE_MIN) {
      sc_emit_chars(b, min, max, !has_max);
      aici_buf_puts(b, "\\x22");
      return;
    }
    aici_buf_puts(&content, "(?:");
    emit_strchar(&content);
    aici_buf_puts(&content, ")*");
  }
  if (has_max && max > STR_MAX) max = STR_MAX;   /* narrower: no string of over 2^27 characters */
  if (has_min && min > STR_MAX) {      /* (bounds the language implies are gone) */
    UNSUPPORTED(c, "minLength", "over 134217728");
  } else if (has_min || has_max) {
    b->n -= 4, b->p[b->n] = 0;         /* the opening quote goes in the machine */
    emit_counted(c, b, pat || fmt ? s : &ANY_MARK, &content, has_min ? min : 0, has_max ? max : CHARS_UNBOUNDED);
  } else {
    aici_buf_putn(b, content.p, content.n);
    aici_buf_puts(b, "\\x22");
  }
  aici_free(content.p);
}

/* ---- numbers --------------------------------------------------------------------------------- */
/* An integer multipleOf between bounds: the multiples themselves, when there are at most 512
 * (written as integers: narrower than a number's 12.0). False: not of that kind. */
static bool emit_multiples(aici_buf_t *b, const jv_t *mv, const bounds_t *bd) {
  if (mv->kind != JV_NUM || !jv_is_int(mv) || mv->num < 1 || mv->num > 1e15 || !bd->has_lo || !bd->has_hi) return false;
  if (bd->lo < -1e15 || bd->hi > 1e15) return false;
  int64_t m = (int64_t)mv->num, lo = (int64_t)bd->lo, hi = (int64_t)bd->hi;
  if ((double)lo < bd->lo || (bd->lo_excl && (double)lo == bd->lo)) lo++;
  if ((double)hi > bd->hi || (bd->hi_excl && (double)hi == bd->hi)) hi--;
  int64_t first = lo % m == 0 ? lo : lo > 0 ? lo + (m - lo % m) : lo - lo % m;
  if (first > hi) { aici_buf_puts(b, "[^\\x00-\\xff]"); return true; }
  if ((hi - first) / m >= 512) return false;
  aici_buf_puts(b, "(?:");
  for (int64_t x = first; x <= hi; x += m) {
    if (x != first) aici_buf_putc(b, '|');
    if (x < 0) aici_buf_puts(b, "\\-");
    sb_uint(b, (uint64_t)(x < 0 ? -x : x));
  }
  aici_buf_putc(b, ')');
  return true;
}

void sc_emit_num(cx_t *c, aici_buf_t *b, const jv_t *s, bool is_int) {
  bounds_t bd = {0};
  const jv_t *v;
  const char *lo_kw = 0, *hi_kw = 0;   /* the keyword each bound comes from, for errors */
#define LO(v, kw) (bd.has_lo = true, bd.lo = v->num, bd.lo_text = v->s, bd.lo_len = v->n, lo_kw = kw)
#define HI(v, kw) (bd.has_hi = true, bd.hi = v->num, bd.hi_text = v->s, bd.hi_len = v->n, hi_kw = kw)
  if ((v = jv_get(s, "minimum")) && v->kind == JV_NUM) LO(v, "minimum");
  if ((v = jv_get(s, "maximum")) && v->kind == JV_NUM) HI(v, "maximum");
  if ((v = jv_get(s, "exclusiveMinimum"))) {
    if (v->kind == JV_TRUE) bd.lo_excl = bd.has_lo;
    else if (v->kind == JV_NUM && (!bd.has_lo || v->num >= bd.lo)) LO(v, "exclusiveMinimum"), bd.lo_excl = true;
  }
  if ((v = jv_get(s, "exclusiveMaximum"))) {
    if (v->kind == JV_TRUE) bd.hi_excl = bd.has_hi;
    else if (v->kind == JV_NUM && (!bd.has_hi || v->num <= bd.hi)) HI(v, "exclusiveMaximum"), bd.hi_excl = true;
  }
#undef LO
#undef HI
  const char *why = 0;
  if (bd.has_lo && !number_bound_ok(bd.lo_text, bd.lo_len, &why)) { UNSUPPORTED(c, lo_kw, why); return; }
  if (bd.has_hi && !number_bound_ok(bd.hi_text, bd.hi_len, &why)) { UNSUPPORTED(c, hi_kw, why); return; }
  uint32_t frac = 0;
  if ((v = jv_get(s, "multipleOf"))) {
    double m = v->kind == JV_NUM ? v->num : 0, p = 1;
    uint32_t k = 0;
    while (k < 12 && m * p + 1e-9 < 1) p *= 10, k++;
    bool pow10 = m > 0 && (m * p > 1 - 1e-9 && m * p < 1 + 1e-9);
    if (!pow10 || (k == 0 && m != 1)) {
      if (sc_ignored(c, "multipleOf")) sc_relax(c, "multipleOf");
      else if (!emit_multiples(b, v, &bd)) { UNSUPPORTED(c, "multipleOf", "only 1 and powers of 1/10, or up to 512 integer multiples between bounds"); return; }
      else return;
    } else if (k == 0) is_int = true;
    else if (!is_int) frac = k;
  }
  if (!emit_number(b, is_int, &bd, frac, &why)) UNSUPPORTED(c, bd.has_lo ? lo_kw : hi_kw, why);
}
