/* aici_buf.c - a growable byte buffer, always NUL-terminated (so its text can go to a logf
 * %s or a compiler that wants C strings), for the regex and message text controllers build. */
#include "aici.h"

void aici_buf_putn(aici_buf_t *b, const void *s, uint32_t n) {
  if (b->n + n + 1 > b->cap) {
    uint32_t c = b->cap ? b->cap : 256;
    while (c < b->n + n + 1) c *= 2;
    b->p = aici_realloc(b->p, c);
    b->cap = c;
  }
  __builtin_memcpy(b->p + b->n, s, n);
  b->n += n;
  b->p[b->n] = 0;
}

void aici_buf_puts(aici_buf_t *b, const char *s) { aici_buf_putn(b, s, (uint32_t)__builtin_strlen(s)); }

void aici_buf_putc(aici_buf_t *b, char c) { aici_buf_putn(b, &c, 1); }

void aici_buf_rx_byte(aici_buf_t *b, uint8_t c) {
  static const char hex[] = "0123456789abcdef";
  char t[4] = {'\\', 'x', hex[c >> 4], hex[c & 15]};
  aici_buf_putn(b, t, 4);
}
