/* aici_utf8.c - one code point to UTF-8 and back, the hex escapes (\xHH, \uHHHH,
 * \UHHHHHHHH, \x{H..}) that grammar, regex and schema texts spell code points with, and the
 * decimal counts of their {m,n} repeats. */
#include "aici.h"

uint32_t aici_utf8_encode(uint32_t c, uint8_t *o) {
  if (c < 0x80) { o[0] = (uint8_t)c; return 1; }
  if (c < 0x800) { o[0] = (uint8_t)(0xC0 | c >> 6), o[1] = (uint8_t)(0x80 | (c & 63)); return 2; }
  if (c < 0x10000) {
    o[0] = (uint8_t)(0xE0 | c >> 12), o[1] = (uint8_t)(0x80 | (c >> 6 & 63)), o[2] = (uint8_t)(0x80 | (c & 63));
    return 3;
  }
  o[0] = (uint8_t)(0xF0 | c >> 18), o[1] = (uint8_t)(0x80 | (c >> 12 & 63));
  o[2] = (uint8_t)(0x80 | (c >> 6 & 63)), o[3] = (uint8_t)(0x80 | (c & 63));
  return 4;
}

uint32_t aici_utf8_decode(const uint8_t *s, uint32_t n, uint32_t *cp) {
  if (!n) { *cp = 0; return 0; }
  uint8_t c = s[0];
  uint32_t k = c < 0xC0 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
  uint32_t v = k == 1 ? c : c & (0x7Fu >> k), i = 1;
  for (; i < k && i < n; i++) v = v << 6 | (s[i] & 63);
  *cp = v;
  return i;
}

bool aici_read_uint(const uint8_t *s, uint32_t n, uint32_t *i, uint32_t cap, uint32_t *v) {
  uint32_t at = *i;
  uint64_t x = 0;
  /* every digit, saturating: stopping early would leave digits before a '}' (so `a{1000000}`
   * would read as literal text while `a{999999}` is a too-large repeat) */
  while (at < n && s[at] >= '0' && s[at] <= '9') {
    x = x * 10 + (s[at++] - '0');
    if (x > cap) x = cap;
  }
  *v = (uint32_t)x;
  bool any = at > *i;
  *i = at;
  return any;
}

int aici_escape_char(uint32_t c) {
  switch (c) {
    case 'n': return '\n';
    case 't': return '\t';
    case 'r': return '\r';
    case 'f': return '\f';
    case 'v': return '\v';
    case '0': return 0;
  }
  return -1;
}

int aici_hex_digit(uint32_t c) {
  if (c >= '0' && c <= '9') return (int)(c - '0');
  if ((c | 32) >= 'a' && (c | 32) <= 'f') return (int)((c | 32) - 'a' + 10);
  return -1;
}

int64_t aici_escape_hex(const uint8_t *s, uint32_t n, uint32_t *i, uint32_t digits) {
  int64_t v = 0;
  uint32_t at = *i;
  if (!digits) {                       /* {H..H}: 1 to 8 digits */
    if (at >= n || s[at] != '{') return AICI_ESC_BAD_DIGITS;
    uint32_t k = 0;
    for (at++; at < n && s[at] != '}'; at++) {
      int h = aici_hex_digit(s[at]);
      if (h < 0 || ++k > 8) return AICI_ESC_BAD_DIGITS;
      v = v * 16 + h;
    }
    if (at >= n || !k) return AICI_ESC_BAD_DIGITS;
    at++;
  } else {
    for (uint32_t k = 0; k < digits; k++, at++) {
      int h = at < n ? aici_hex_digit(s[at]) : -1;
      if (h < 0) return AICI_ESC_BAD_DIGITS;
      v = v * 16 + h;
    }
  }
  if (v > 0x10FFFF) return AICI_ESC_OUT_OF_RANGE;
  if (v >= 0xD800 && v <= 0xDFFF) return AICI_ESC_SURROGATE;
  *i = at;
  return v;
}

const char *aici_escape_error(int64_t code) {
  switch (code) {
    case AICI_ESC_BAD_DIGITS: return "bad hex escape";
    case AICI_ESC_OUT_OF_RANGE: return "escape out of range (past U+10FFFF)";
    case AICI_ESC_SURROGATE: return "surrogate escape (not a Unicode scalar value)";
  }
  return "not an escape error";
}
