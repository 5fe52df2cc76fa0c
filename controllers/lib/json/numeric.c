/* Numbers within bounds as regexes: integer ranges digit by digit, and numbers written without
 * an exponent as integer part + fraction (bounded numbers offer no exponent: a narrower, exact
 * language). A bound is read exactly from its JSON text (0.1 is no binary fraction here): the
 * integer part is compared as a range, the fraction digit by digit. `multipleOf` 10^-k limits
 * the significant fraction digits to k. */
#include "json.h"

static uint32_t digits(uint64_t v, char *out) {
  char t[24];
  uint32_t k = 0;
  do t[k++] = (char)('0' + v % 10), v /= 10; while (v);
  for (uint32_t i = 0; i < k; i++) out[i] = t[k - 1 - i];
  return k;
}

static void digit_class(aici_buf_t *b, char lo, char hi) {
  if (lo == hi) aici_buf_putc(b, lo);
  else aici_buf_putc(b, '['), aici_buf_putc(b, lo), aici_buf_putc(b, '-'), aici_buf_putc(b, hi), aici_buf_putc(b, ']');
}

static void any_digits(aici_buf_t *b, uint32_t n) {
  if (n == 1) aici_buf_puts(b, "[0-9]");
  else if (n) aici_buf_puts(b, "[0-9]{"), sb_uint(b, n), aici_buf_putc(b, '}');
}

/* Same-length digit strings l <= h (n digits): alternatives, each starting with '|' */
static void same_len(aici_buf_t *b, const char *l, const char *h, uint32_t n) {
  if (!n) return;
  if (l[0] == h[0]) {
    aici_buf_putc(b, l[0]);
    if (n > 1) {
      aici_buf_puts(b, "(?:");
      same_len(b, l + 1, h + 1, n - 1);
      aici_buf_putc(b, ')');
    }
    return;
  }
  bool lo_zero = true, hi_nine = true;
  for (uint32_t i = 1; i < n; i++) lo_zero &= l[i] == '0', hi_nine &= h[i] == '9';
  if (lo_zero && hi_nine) { digit_class(b, l[0], h[0]); any_digits(b, n - 1); return; }
  char nines[24], zeros[24];
  for (uint32_t i = 0; i < n; i++) nines[i] = '9', zeros[i] = '0';
  char a = l[0], z = h[0];
  if (!lo_zero) {
    aici_buf_putc(b, l[0]), aici_buf_puts(b, "(?:"), same_len(b, l + 1, nines, n - 1), aici_buf_putc(b, ')');
    a++;
    aici_buf_putc(b, '|');
  }
  if (!hi_nine) z--;
  if (a <= z) { digit_class(b, a, z); any_digits(b, n - 1); }
  else b->n--, b->p[b->n] = 0;         /* drop the '|' just written */
  if (!hi_nine) {
    aici_buf_putc(b, '|');
    aici_buf_putc(b, h[0]), aici_buf_puts(b, "(?:"), same_len(b, zeros, h + 1, n - 1), aici_buf_putc(b, ')');
  }
}

/* Non-negative integers in [lo, hi] (hi_inf: no upper bound), no leading zeros. */
static void uint_range(aici_buf_t *b, uint64_t lo, uint64_t hi, bool hi_inf) {
  char l[24], h[24];
  uint32_t nl = digits(lo, l);
  aici_buf_puts(b, "(?:");
  if (hi_inf) {
    for (uint32_t i = 0; i < nl; i++) h[i] = '9';
    same_len(b, l, h, nl);
    aici_buf_puts(b, "|[1-9][0-9]{"), sb_uint(b, nl), aici_buf_puts(b, ",}");
  } else {
    uint32_t nh = digits(hi, h);
    if (nl == nh) same_len(b, l, h, nl);
    else {
      char t[24];
      for (uint32_t i = 0; i < nl; i++) t[i] = '9';
      same_len(b, l, t, nl);
      for (uint32_t d = nl + 1; d < nh; d++) aici_buf_puts(b, "|[1-9]"), any_digits(b, d - 1);
      t[0] = '1';
      for (uint32_t i = 1; i < nh; i++) t[i] = '0';
      aici_buf_putc(b, '|');
      same_len(b, t, h, nh);
    }
  }
  aici_buf_putc(b, ')');
}

#define IP_MAX (UINT64_MAX - 2)          /* a bound's integer part at most (ip + 1 never wraps) */
#define FRAC_MAX 32u                   /* fraction digits of a bound */

/* A non-negative decimal: integer part and fraction digits (no trailing zeros). */
typedef struct { uint64_t ip; char f[FRAC_MAX]; uint32_t nf; } dec_t;

/* The magnitude of a JSON number's text, exactly; false if too large or too fine. */
static bool dec_parse(const char *s, uint32_t n, dec_t *d) {
  char dig[64];
  uint32_t nd = 0, i = 0, point = 0;
  int64_t exp = 0;
  if (i < n && s[i] == '-') i++;
  for (; i < n && s[i] >= '0' && s[i] <= '9'; i++) {
    if (nd == 64) return false;
    dig[nd++] = s[i];
  }
  point = nd;
  if (i < n && s[i] == '.')
    for (i++; i < n && s[i] >= '0' && s[i] <= '9'; i++) {
      if (nd == 64) return false;
      dig[nd++] = s[i];
    }
  if (i < n && (s[i] | 0x20) == 'e') {
    bool neg = ++i < n && s[i] == '-';
    if (i < n && (s[i] == '-' || s[i] == '+')) i++;
    for (; i < n && s[i] >= '0' && s[i] <= '9'; i++)
      if ((exp = exp * 10 + (s[i] - '0')) > 64) return false;
    if (neg) exp = -exp;
  }
  int64_t p = (int64_t)point + exp;    /* digits before the point */
  d->ip = 0, d->nf = 0;
  for (int64_t k = 0; k < p; k++) {
    uint32_t v = k < nd ? (uint32_t)(dig[k] - '0') : 0;
    if (d->ip > (IP_MAX - v) / 10) return false;
    d->ip = d->ip * 10 + v;
  }
  for (int64_t k = p; k < (int64_t)nd; k++) {   /* before the first digit (p < 0): zeros */
    if (d->nf == FRAC_MAX) return false;
    d->f[d->nf++] = k < 0 ? '0' : dig[k];
  }
  while (d->nf && d->f[d->nf - 1] == '0') d->nf--;
  return true;
}

bool number_bound_ok(const char *text, uint32_t n, const char **why) {
  dec_t d;
  if (dec_parse(text, n, &d)) return true;
  *why = "a bound of 2^64 or more in magnitude, or with over 32 fraction digits";
  return false;
}

/* An integer bound from a number bound, rounded inwards: (neg, mag) is -mag or +mag, never -0. */
typedef struct { bool neg; uint64_t mag; } sint_t;
static sint_t int_lower(const dec_t *d, bool neg, bool excl) {
  bool exact = !d->nf;
  if (!neg) return (sint_t){false, d->ip + (!exact || excl)};
  uint64_t m = d->ip - (exact && excl);           /* ceil(-x), one more when excluded */
  return (sint_t){m != 0, m};
}
static sint_t int_upper(const dec_t *d, bool neg, bool excl) {
  bool exact = !d->nf;
  if (neg) return (sint_t){true, d->ip + (!exact || excl)};
  if (exact && excl) return d->ip ? (sint_t){false, d->ip - 1} : (sint_t){true, 1};
  return (sint_t){false, d->ip};
}

static int dec_cmp(const dec_t *a, const dec_t *b) {
  if (a->ip != b->ip) return a->ip < b->ip ? -1 : 1;
  for (uint32_t i = 0;; i++) {         /* no trailing zeros: an ended fraction is the smaller */
    if (i == a->nf || i == b->nf) return a->nf == b->nf ? 0 : i == a->nf ? -1 : 1;
    if (a->f[i] != b->f[i]) return a->f[i] < b->f[i] ? -1 : 1;
  }
}

/* One side of a fraction constraint: 0.s against 0.d (d: digits left), inclusive or not. */
enum { B_NONE, B_INCL, B_EXCL };
typedef struct { const char *d; uint32_t n; uint8_t mode; } fb_t;
#define UNLIMITED 0xffffffffu

static bool zero_ok(fb_t lo, fb_t hi) {   /* does 0.000... meet both sides */
  bool l = lo.mode == B_NONE || (lo.n == 0 && lo.mode == B_INCL);
  bool h = hi.mode != B_EXCL || hi.n > 0;
  return l && h;
}

/* Digit strings s (empty too if allow_empty) with lo <= 0.s <= hi as the modes say, and at most
 * `budget` significant digits (zeros after them). Alternatives by first digit, grouped. */
static void frac_digits_re(aici_buf_t *b, fb_t lo, fb_t hi, uint32_t budget, bool allow_empty) {
  if (lo.mode == B_INCL && lo.n == 0) lo.mode = B_NONE;   /* >= 0: no constraint */
  bool z = zero_ok(lo, hi);
  if (hi.mode != B_NONE && hi.n == 0) {                   /* <= 0 (or < 0): zeros only */
    if (z) aici_buf_puts(b, allow_empty ? "0*" : "0+");
    else aici_buf_puts(b, "[^\\x00-\\xff]");
    return;
  }
  if (budget == 0) {
    if (z) aici_buf_puts(b, allow_empty ? "0*" : "0+");
    else aici_buf_puts(b, "[^\\x00-\\xff]");
    return;
  }
  if (lo.mode == B_NONE && hi.mode == B_NONE) {
    if (budget == UNLIMITED) aici_buf_puts(b, allow_empty ? "[0-9]*" : "[0-9]+");
    else aici_buf_puts(b, "(?:[0-9]{1,"), sb_uint(b, budget), aici_buf_puts(b, allow_empty ? "}0*)?" : "}0*)");
    return;
  }
  if (lo.mode == B_EXCL && lo.n == 0 && hi.mode == B_NONE && budget == UNLIMITED) {
    aici_buf_puts(b, "0*[1-9][0-9]*");       /* > 0 */
    return;
  }
  /* the residual constraints after each first digit: -1 dead, else (lo, hi) */
  fb_t rl[10], rh[10];
  bool dead[10];
  for (uint32_t dgt = 0; dgt < 10; dgt++) {
    char ch = (char)('0' + dgt);
    dead[dgt] = false;
    rl[dgt] = (fb_t){0, 0, B_NONE}, rh[dgt] = (fb_t){0, 0, B_NONE};
    if (lo.mode != B_NONE) {
      if (lo.n == 0) { if (dgt == 0) rl[dgt] = lo; }      /* > 0: a zero digit settles nothing */
      else if (ch == lo.d[0]) rl[dgt] = (fb_t){lo.d + 1, lo.n - 1, lo.mode};
      else if (ch < lo.d[0]) dead[dgt] = true;
    }
    if (hi.mode != B_NONE) {
      if (ch == hi.d[0]) rh[dgt] = (fb_t){hi.d + 1, hi.n - 1, hi.mode};
      else if (ch > hi.d[0]) dead[dgt] = true;
    }
  }
  aici_buf_puts(b, "(?:");
  bool first = true;
  if (allow_empty && z) first = false;  /* the empty alternative */
  for (uint32_t d0 = 0; d0 < 10;) {
    uint32_t d1 = d0;
    while (d1 + 1 < 10 && dead[d1 + 1] == dead[d0] && rl[d1 + 1].d == rl[d0].d && rl[d1 + 1].mode == rl[d0].mode &&
           rl[d1 + 1].n == rl[d0].n && rh[d1 + 1].d == rh[d0].d && rh[d1 + 1].mode == rh[d0].mode && rh[d1 + 1].n == rh[d0].n)
      d1++;
    if (!dead[d0]) {
      if (!first) aici_buf_putc(b, '|');
      first = false;
      if (d0 == d1) aici_buf_putc(b, (char)('0' + d0));
      else aici_buf_putc(b, '['), aici_buf_putc(b, (char)('0' + d0)), aici_buf_putc(b, '-'), aici_buf_putc(b, (char)('0' + d1)), aici_buf_putc(b, ']');
      frac_digits_re(b, rl[d0], rh[d0], budget == UNLIMITED ? UNLIMITED : budget - 1, true);
    }
    d0 = d1 + 1;
  }
  if (first) aici_buf_puts(b, "[^\\x00-\\xff]");
  aici_buf_putc(b, ')');
}

/* The optional fraction `(\.S)?` of a magnitude with these fraction constraints. */
static void frac_part(aici_buf_t *b, fb_t lo, fb_t hi, uint32_t budget) {
  bool z = zero_ok(lo.mode == B_INCL && lo.n == 0 ? (fb_t){0, 0, B_NONE} : lo, hi);
  aici_buf_puts(b, z ? "(?:\\." : "\\.");
  frac_digits_re(b, lo, hi, budget, false);
  if (z) aici_buf_puts(b, ")?");
}

/* Magnitudes m (after an optional sign) with lo <= m <= hi (modes: inclusive, exclusive; hi
 * B_NONE: unbounded) written as I(.F)?. */
static void magnitude(aici_buf_t *b, bool *first, const char *sign, const dec_t *lo, uint8_t lo_mode, const dec_t *hi,
                      uint8_t hi_mode, uint32_t budget) {
  if (hi_mode != B_NONE) {
    int c = dec_cmp(lo, hi);
    if (c > 0 || (c == 0 && (lo_mode == B_EXCL || hi_mode == B_EXCL))) return;
  }
  fb_t none = {0, 0, B_NONE}, l = {lo->f, lo->nf, lo_mode}, h = {hi ? hi->f : 0, hi ? hi->nf : 0, hi_mode};
#define ALT() (aici_buf_puts(b, *first ? "" : "|"), *first = false, aici_buf_puts(b, sign))
  if (hi_mode != B_NONE && lo->ip == hi->ip) {
    ALT(), uint_range(b, lo->ip, lo->ip, false), frac_part(b, l, h, budget);
    return;
  }
  ALT(), uint_range(b, lo->ip, lo->ip, false), frac_part(b, l, none, budget);
  if (hi_mode == B_NONE) { ALT(), uint_range(b, lo->ip + 1, 0, true), frac_part(b, none, none, budget); return; }
  if (hi->ip > lo->ip + 1) ALT(), uint_range(b, lo->ip + 1, hi->ip - 1, false), frac_part(b, none, none, budget);
  ALT(), uint_range(b, hi->ip, hi->ip, false), frac_part(b, none, h, budget);
#undef ALT
}

static void int_part(aici_buf_t *b, bool *first, const char *sign, uint64_t lo, uint64_t hi, bool hi_inf) {
  if (!hi_inf && hi < lo) return;
  aici_buf_puts(b, *first ? "" : "|"), *first = false, aici_buf_puts(b, sign);
  uint_range(b, lo, hi, hi_inf);
}

bool emit_number(aici_buf_t *b, bool is_int, const bounds_t *bd, uint32_t frac_digits, const char **why) {
  if (!bd->has_lo && !bd->has_hi) {
    if (is_int) aici_buf_puts(b, "-?(?:0|[1-9][0-9]*)");
    else if (frac_digits) {
      aici_buf_puts(b, "-?(?:0|[1-9][0-9]*)(?:\\.[0-9]{1,"), sb_uint(b, frac_digits), aici_buf_puts(b, "}0*)?");
    } else aici_buf_puts(b, "-?(?:0|[1-9][0-9]*)(?:\\.[0-9]+)?(?:[eE][+\\-]?[0-9]+)?");
    return true;
  }
  dec_t dl = {0}, dh = {0}, zero = {0};
  if (bd->has_lo && !number_bound_ok(bd->lo_text, bd->lo_len, why)) return false;
  if (bd->has_hi && !number_bound_ok(bd->hi_text, bd->hi_len, why)) return false;
  if (bd->has_lo) dec_parse(bd->lo_text, bd->lo_len, &dl);
  if (bd->has_hi) dec_parse(bd->hi_text, bd->hi_len, &dh);
  bool lneg = bd->has_lo && bd->lo_text[0] == '-' && (dl.ip || dl.nf);
  bool hneg = bd->has_hi && bd->hi_text[0] == '-' && (dh.ip || dh.nf);
  bool first = true;
  aici_buf_puts(b, "(?:");
  if (is_int) {                        /* integer bounds, exactly from their text: closed, rounded inwards */
    sint_t l = bd->has_lo ? int_lower(&dl, lneg, bd->lo_excl) : (sint_t){true, 0};
    sint_t h = bd->has_hi ? int_upper(&dh, hneg, bd->hi_excl) : (sint_t){false, 0};
    if (!bd->has_hi || !h.neg)         /* x >= 0 */
      int_part(b, &first, "", bd->has_lo && !l.neg ? l.mag : 0, h.mag, !bd->has_hi);
    if (!bd->has_lo || l.neg)          /* x < 0: m = -x >= 1 */
      int_part(b, &first, "\\-", bd->has_hi && h.neg ? h.mag : 1, l.mag, !bd->has_lo);
  } else {
    uint8_t lm = bd->lo_excl ? B_EXCL : B_INCL, hm = bd->hi_excl ? B_EXCL : B_INCL;
    uint32_t budget = frac_digits ? frac_digits : UNLIMITED;
    if (!bd->has_hi || !hneg)          /* x >= 0: m in [max(lo, 0), hi] */
      magnitude(b, &first, "", bd->has_lo && !lneg ? &dl : &zero, bd->has_lo && !lneg ? lm : B_INCL,
                bd->has_hi ? &dh : 0, bd->has_hi ? hm : B_NONE, budget);
    if (!bd->has_lo || lneg)           /* x < 0: m = -x in (max(-hi, 0), -lo] */
      magnitude(b, &first, "\\-", bd->has_hi && hneg ? &dh : &zero, bd->has_hi && hneg ? hm : B_EXCL,
                bd->has_lo ? &dl : 0, bd->has_lo ? lm : B_NONE, budget);
  }
  if (first) aici_buf_puts(b, "[^\\x00-\\xff]");
  aici_buf_putc(b, ')');
  return true;
}
