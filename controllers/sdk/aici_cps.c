/* aici_cps.c - code-point sets: ranges [lo, hi] of Unicode code points, as character classes
 * are before they become byte regexes (the json controller's `pattern`s, the grammar
 * controller's terminals). */
#include "aici.h"

void aici_cps_add(aici_cp_set_t *s, uint32_t lo, uint32_t hi) {
  if (lo > hi) return;
  if (s->n == s->cap) {
    s->cap = s->cap ? 2 * s->cap : 8;
    s->r = aici_realloc(s->r, s->cap * sizeof(aici_cp_range_t));
  }
  s->r[s->n].lo = lo, s->r[s->n++].hi = hi;
}

void aici_cps_normalize(aici_cp_set_t *s) {
  for (uint32_t i = 1; i < s->n; i++)        /* insertion sort: sets are small */
    for (uint32_t j = i; j && s->r[j - 1].lo > s->r[j].lo; j--) {
      aici_cp_range_t t = s->r[j]; s->r[j] = s->r[j - 1]; s->r[j - 1] = t;
    }
  uint32_t k = 0;
  for (uint32_t i = 0; i < s->n; i++) {
    if (k && s->r[i].lo <= s->r[k - 1].hi + 1) {
      if (s->r[i].hi > s->r[k - 1].hi) s->r[k - 1].hi = s->r[i].hi;
    } else s->r[k++] = s->r[i];
  }
  s->n = k;
}

void aici_cps_negate(aici_cp_set_t *s) {
  aici_cps_normalize(s);
  aici_cp_set_t o = {0};
  uint32_t next = 0;
  for (uint32_t i = 0; i < s->n; i++) {
    if (s->r[i].lo > next) aici_cps_add(&o, next, s->r[i].lo - 1);
    next = s->r[i].hi + 1;
  }
  if (next <= 0x10FFFF) aici_cps_add(&o, next, 0x10FFFF);
  aici_free(s->r);
  *s = o;
}
