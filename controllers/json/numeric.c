/* Numbers within bounds as regexes: integer ranges digit by digit, and numbers written without
 * an exponent as integer part + fraction (bounded numbers offer no exponent: a narrower, exact
 * language). Bounds of a `number` must be integers; `multipleOf` 10^-k limits fraction digits. */
#include "json.h"

static uint32_t digits(uint64_t v, char *out) {
  char t[24];
  uint32_t k = 0;
  do t[k++] = (char)('0' + v % 10), v /= 10; while (v);
  for (uint32_t i = 0; i < k; i++) out[i] = t[k - 1 - i];
  return k;
}

static void digit_class(sb_t *b, char lo, char hi) {
  if (lo == hi) sb_putc(b, lo);
  else sb_putc(b, '['), sb_putc(b, lo), sb_putc(b, '-'), sb_putc(b, hi), sb_putc(b, ']');
}

static void any_digits(sb_t *b, uint32_t n) {
  if (n == 1) sb_puts(b, "[0-9]");
  else if (n) sb_puts(b, "[0-9]{"), sb_uint(b, n), sb_putc(b, '}');
}

/* Same-length digit strings l <= h (n digits): alternatives, each starting with '|' */
static void same_len(sb_t *b, const char *l, const char *h, uint32_t n) {
  if (!n) return;
  if (l[0] == h[0]) {
    sb_putc(b, l[0]);
    if (n > 1) {
      sb_puts(b, "(?:");
      same_len(b, l + 1, h + 1, n - 1);
      sb_putc(b, ')');
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
    sb_putc(b, l[0]), sb_puts(b, "(?:"), same_len(b, l + 1, nines, n - 1), sb_putc(b, ')');
    a++;
    sb_putc(b, '|');
  }
  if (!hi_nine) z--;
  if (a <= z) { digit_class(b, a, z); any_digits(b, n - 1); }
  else b->n--, b->p[b->n] = 0;         /* drop the '|' just written */
  if (!hi_nine) {
    sb_putc(b, '|');
    sb_putc(b, h[0]), sb_puts(b, "(?:"), same_len(b, zeros, h + 1, n - 1), sb_putc(b, ')');
  }
}

/* Non-negative integers in [lo, hi] (hi_inf: no upper bound), no leading zeros. */
static void uint_range(sb_t *b, uint64_t lo, uint64_t hi, bool hi_inf) {
  char l[24], h[24];
  uint32_t nl = digits(lo, l);
  sb_puts(b, "(?:");
  if (hi_inf) {
    for (uint32_t i = 0; i < nl; i++) h[i] = '9';
    same_len(b, l, h, nl);
    sb_puts(b, "|[1-9][0-9]{"), sb_uint(b, nl), sb_puts(b, ",}");
  } else {
    uint32_t nh = digits(hi, h);
    if (nl == nh) same_len(b, l, h, nl);
    else {
      char t[24];
      for (uint32_t i = 0; i < nl; i++) t[i] = '9';
      same_len(b, l, t, nl);
      for (uint32_t d = nl + 1; d < nh; d++) sb_puts(b, "|[1-9]"), any_digits(b, d - 1);
      t[0] = '1';
      for (uint32_t i = 1; i < nh; i++) t[i] = '0';
      sb_putc(b, '|');
      same_len(b, t, h, nh);
    }
  }
  sb_putc(b, ')');
}

#define BIG 9.0e18

static bool to_u64(double v, uint64_t *out) {
  if (v < 0 || v >= BIG) return false;
  *out = (uint64_t)v;
  return true;
}

/* Magnitudes m (the part after an optional '-') in [lo, hi] written as I(.F)? */
typedef struct { const char *any, *zero, *nonzero; } frac_t;

static bool magnitude(sb_t *b, bool *first, const char *sign, uint64_t lo, bool lo_open, uint64_t hi,
                      bool hi_open, bool hi_inf, const frac_t *f) {
#define ALT() (sb_puts(b, *first ? "" : "|"), *first = false, sb_puts(b, sign))
  if (!hi_inf && (hi < lo || (hi == lo && (lo_open || hi_open)))) return true;
  if (f->any[0] == 0 && !lo_open && !hi_open) {    /* integers: one range */
    ALT();
    uint_range(b, lo, hi, hi_inf);
    return true;
  }
  if (!hi_inf && hi == lo) { ALT(); uint_range(b, lo, lo, false); sb_puts(b, f->zero); return true; }
  ALT(); uint_range(b, lo, lo, false); sb_puts(b, lo_open ? f->nonzero : f->any);
  if (hi_inf) { ALT(); uint_range(b, lo + 1, 0, true); sb_puts(b, f->any); return true; }
  if (hi > lo + 1) { ALT(); uint_range(b, lo + 1, hi - 1, false); sb_puts(b, f->any); }
  if (!hi_open) { ALT(); uint_range(b, hi, hi, false); sb_puts(b, f->zero); }
  return true;
#undef ALT
}

static bool is_integral(double v) { return v == (double)(int64_t)v; }

bool emit_number(sb_t *b, bool is_int, const bounds_t *bd, uint32_t frac_digits, const char **why) {
  if (!bd->has_lo && !bd->has_hi) {
    if (is_int) sb_puts(b, "-?(?:0|[1-9][0-9]*)");
    else if (frac_digits) {
      sb_puts(b, "-?(?:0|[1-9][0-9]*)(?:\\.[0-9]{1,"), sb_uint(b, frac_digits), sb_puts(b, "}0*)?");
    } else sb_puts(b, "-?(?:0|[1-9][0-9]*)(?:\\.[0-9]+)?(?:[eE][+\\-]?[0-9]+)?");
    return true;
  }
  double lo = bd->lo, hi = bd->hi;
  bool lo_open = bd->lo_excl, hi_open = bd->hi_excl;
  if ((bd->has_lo && (lo <= -BIG || lo >= BIG)) || (bd->has_hi && (hi <= -BIG || hi >= BIG))) {
    *why = "a bound beyond 9e18";
    return false;
  }
  if (is_int) {                        /* integer bounds: closed, rounded inwards */
    if (bd->has_lo) {
      double c = (double)(int64_t)lo;
      if (c < lo) c += 1;
      if (lo_open && c == lo) c += 1;
      lo = c, lo_open = false;
    }
    if (bd->has_hi) {
      double c = (double)(int64_t)hi;
      if (c > hi) c -= 1;
      if (hi_open && c == hi) c -= 1;
      hi = c, hi_open = false;
    }
  } else if ((bd->has_lo && !is_integral(lo)) || (bd->has_hi && !is_integral(hi))) {
    *why = "a non-integer bound on a number";
    return false;
  }
  frac_t f = {0};
  sb_t a = {0}, z = {0};
  if (is_int) f.any = f.zero = "", f.nonzero = "[^\\x00-\\xff]";
  else if (frac_digits) {
    f.zero = "(?:\\.0+)?";
    sb_puts(&a, "(?:\\.[0-9]{1,"), sb_uint(&a, frac_digits), sb_puts(&a, "}0*)?");
    sb_puts(&z, "\\.[0-9]{0,"), sb_uint(&z, frac_digits - 1), sb_puts(&z, "}[1-9]0*");
    f.any = a.p, f.nonzero = z.p;
  } else f.any = "(?:\\.[0-9]+)?", f.zero = "(?:\\.0+)?", f.nonzero = "\\.[0-9]*[1-9][0-9]*";
  bool first = true;
  sb_puts(b, "(?:");
  /* x >= 0 */
  if (!bd->has_hi || hi > 0 || (hi == 0 && !hi_open)) {
    uint64_t l = 0, h = 0;
    bool lopen = false;
    if (bd->has_lo && lo >= 0) to_u64(lo, &l), lopen = lo_open;
    if (bd->has_hi) to_u64(hi, &h);
    magnitude(b, &first, "", l, lopen, h, hi_open, !bd->has_hi, &f);
  }
  /* x < 0: m = -x > 0 */
  if (!bd->has_lo || lo < 0) {
    uint64_t l = 0, h = 0;
    bool lopen = true;
    if (bd->has_hi && hi < 0) to_u64(-hi, &l), lopen = hi_open;
    if (bd->has_lo) to_u64(-lo, &h);
    if (is_int && l == 0) l = 1, lopen = false;
    magnitude(b, &first, "\\-", l, lopen, h, lo_open, !bd->has_lo, &f);
  }
  if (first) sb_puts(b, "[^\\x00-\\xff]");
  sb_putc(b, ')');
  aici_free(a.p), aici_free(z.p);
  return true;
}
