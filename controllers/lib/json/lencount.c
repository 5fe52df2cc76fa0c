/* Length-counted string machines: a string's content in a pattern's (or format's) language AND
 * lo..hi characters long, exactly, with memory that does not grow with hi.
 *
 * A configuration of such a machine is the DFA state of `"content"` beside n = count << 4 |
 * tracker: the tracker follows the JSON text's characters (raw UTF-8, escapes; each counts as
 * one, as minLength/maxLength count them), the count is the characters written so far. Over the
 * product of DFA states and tracker states (explored once, at most LC_MAX_Q), two tables decide
 * whether a configuration can still end as a valid string:
 *   sh(q)      the fewest characters from q to the closing quote (0-1 BFS backwards);
 *   D_a(q)     min { l - a : l >= a, a closing quote l characters from q }, for a <= lo: what a
 *              minLength still owed needs. D_0 = sh, and D_a follows from D_(a-1) alone, so the
 *              sequence of layers is ultimately periodic: it is stored until a layer repeats one
 *              of the previous 64 (or until lo), and read modulo the period past that.
 * (q, count) is live iff count + a + D_a(q) <= hi with a = max(0, lo - count): some continuation
 * completes a valid string. Masks are exact, and the tables cost the product's size times the
 * layers kept (usually a handful), whatever hi is. */
#include "json.h"

#define LC_MAX_Q 8192u                 /* product states (an error past it) */
#define LC_MAX_LAYER_BYTES (4u << 20)  /* the D layers kept */
#define LC_MAX_PERIOD 64u
#define LC_INF 0xffffu

struct lencount {
  uint32_t lo, hi;
  uint32_t n_s;                        /* DFA states the index covers */
  uint32_t *q;                         /* q[s << 4 | t]: product id + 1 (0: never reached) */
  uint32_t n_q;
  uint16_t *d;                         /* layer k at d + k * n_q (layer 0: sh) */
  uint32_t layers, period;             /* period 0: the layers reach lo */
  uint32_t hmax;                       /* the largest finite sh */
};

typedef struct { uint32_t from, to; uint8_t w; } lc_edge_t;

static uint8_t tracker_class(uint32_t b) {
  if (b == '"') return 0;
  if (b == '\\') return 1;
  if (b == 'u') return 2;
  if ((b >= '0' && b <= '9') || ((b | 0x20) >= 'a' && (b | 0x20) <= 'f')) return 3;
  if (b < 0x80) return 4;
  if (b < 0xc0) return 5;
  if (b < 0xe0) return 6;
  if (b < 0xf0) return 7;
  return b < 0xf8 ? 8 : 9;
}

static uint32_t slot(lencount_t *L, uint32_t s, uint32_t t) {
  if (s >= L->n_s) {
    uint32_t n = L->n_s ? L->n_s : 64;
    while (n <= s) n *= 2;
    L->q = aici_realloc(L->q, (size_t)n * 16 * 4);
    __builtin_memset(L->q + (size_t)L->n_s * 16, 0, (size_t)(n - L->n_s) * 16 * 4);
    L->n_s = n;
  }
  return s << 4 | t;
}

static void fail_msg(char **err, const char *what) {
  aici_buf_t m = {0};
  aici_buf_puts(&m, what);
  *err = m.p;
}

lencount_t *lencount_new(aici_regex_t *re, uint32_t lo, uint32_t hi, char **err) {
  lencount_t *L = aici_calloc(1, sizeof *L);
  L->lo = lo, L->hi = hi;
  /* one byte per (regex class, tracker class): bytes alike in both lead everywhere alike */
  const uint8_t *cls = aici_regex_classes(re, 0);
  uint8_t reps[256];
  uint32_t n_reps = 0;
  uint8_t seen[256 * 10 / 8 + 1] = {0};
  for (uint32_t b = 0; b < 256; b++) {
    if (b == CALL_BYTE) continue;
    uint32_t k = (uint32_t)cls[b] * 10 + tracker_class(b);
    if (seen[k >> 3] >> (k & 7) & 1) continue;
    seen[k >> 3] |= (uint8_t)(1u << (k & 7));
    reps[n_reps++] = (uint8_t)b;
  }
  uint32_t *qs = 0, *qt = 0, cap_q = 0;
  lc_edge_t *e = 0;
  uint32_t n_e = 0, cap_e = 0;
  uint32_t start = aici_regex_start(re);
#define NEWQ(S, T) do { \
    uint32_t _k = slot(L, (S), (T)); \
    if (!L->q[_k]) { \
      if (L->n_q == LC_MAX_Q) goto too_big; \
      if (L->n_q == cap_q) cap_q = cap_q ? 2 * cap_q : 64, qs = aici_realloc(qs, cap_q * 4), qt = aici_realloc(qt, cap_q * 4); \
      qs[L->n_q] = (S), qt[L->n_q] = (T), L->q[_k] = ++L->n_q; \
    } \
  } while (0)
  NEWQ(start, LC_PRE);
  for (uint32_t i = 0; i < L->n_q; i++) {
    for (uint32_t r = 0; r < n_reps; r++) {
      uint32_t s2 = aici_regex_step(re, qs[i], reps[r]);
      if (!s2) continue;
      uint32_t inc, t2 = lc_track(qt[i], reps[r], &inc);
      if (t2 == LC_DEAD) continue;
      NEWQ(s2, t2);
      if (n_e == cap_e) cap_e = cap_e ? 2 * cap_e : 256, e = aici_realloc(e, cap_e * sizeof *e);
      e[n_e++] = (lc_edge_t){i, L->q[slot(L, s2, t2)] - 1, (uint8_t)inc};
    }
  }
#undef NEWQ
  uint32_t n = L->n_q;
  /* sh: a 0-1 BFS from the closed states along reversed edges */
  uint32_t *in_off = aici_calloc(n + 1, 4), *in_e = aici_malloc((n_e + 1) * 4);
  for (uint32_t i = 0; i < n_e; i++) in_off[e[i].to + 1]++;
  for (uint32_t i = 0; i < n; i++) in_off[i + 1] += in_off[i];
  uint32_t *fill = aici_malloc((n + 1) * 4);
  for (uint32_t i = 0; i <= n; i++) fill[i] = in_off[i];
  for (uint32_t i = 0; i < n_e; i++) in_e[fill[e[i].to]++] = i;
  aici_free(fill);
  /* level by level: a node enters level d's list when its distance drops to d (at most once a
   * level, twice in all: by a 1-edge into the next level, then perhaps by a 0-edge into this one) */
  uint32_t *dist = aici_malloc(n * 4), *cur_l = aici_malloc(n * 4), *next_l = aici_malloc(n * 4), n_cur = 0, n_next = 0;
  for (uint32_t i = 0; i < n; i++) {
    dist[i] = qt[i] == LC_END ? 0 : 0xffffffffu;
    if (!dist[i]) cur_l[n_cur++] = i;
  }
  for (uint32_t d = 0; n_cur; d++) {
    while (n_cur) {
      uint32_t v = cur_l[--n_cur];
      if (dist[v] != d) continue;
      for (uint32_t j = in_off[v]; j < in_off[v + 1]; j++) {
        const lc_edge_t *x = &e[in_e[j]];
        uint32_t nd = d + x->w;
        if (nd >= dist[x->from]) continue;
        dist[x->from] = nd;
        if (x->w) next_l[n_next++] = x->from;
        else cur_l[n_cur++] = x->from;
      }
    }
    uint32_t *t = cur_l; cur_l = next_l, next_l = t, n_cur = n_next, n_next = 0;
  }
  aici_free(cur_l), aici_free(next_l);
  aici_free(in_off), aici_free(in_e);
  /* the layers: layer 0 is sh, layer k from layer k-1 (1-edges) and itself (0-edges: they only
   * finish a character, so they form no cycle and a few passes settle them) */
  uint32_t max_layers = lo + 1;
  if ((uint64_t)max_layers * n * 2 > LC_MAX_LAYER_BYTES) max_layers = LC_MAX_LAYER_BYTES / 2 / n;
  uint32_t cap_l = 1;
  L->d = aici_malloc((size_t)n * 2);
  for (uint32_t i = 0; i < n; i++) {
    L->d[i] = dist[i] < LC_INF ? (uint16_t)dist[i] : LC_INF;
    if (dist[i] < LC_INF && dist[i] > L->hmax) L->hmax = dist[i];
  }
  aici_free(dist);
  L->layers = 1;
  while (L->layers <= lo) {
    if (L->layers == max_layers) {
      fail_msg(err, "unsupported: minLength at # (its length table beside the pattern is over 4 MiB)");
      goto fail;
    }
    if (L->layers == cap_l) cap_l *= 2, L->d = aici_realloc(L->d, (size_t)cap_l * n * 2);
    uint16_t *prev = L->d + (size_t)(L->layers - 1) * n, *cur = L->d + (size_t)L->layers * n;
    for (uint32_t i = 0; i < n; i++) cur[i] = LC_INF;
    for (uint32_t i = 0; i < n_e; i++)
      if (e[i].w && prev[e[i].to] < cur[e[i].from]) cur[e[i].from] = prev[e[i].to];
    for (bool changed = true; changed;) {
      changed = false;
      for (uint32_t i = 0; i < n_e; i++)
        if (!e[i].w && cur[e[i].to] < cur[e[i].from]) cur[e[i].from] = cur[e[i].to], changed = true;
    }
    uint32_t k = L->layers;
    for (uint32_t p = 1; p <= k && p <= LC_MAX_PERIOD; p++)
      if (!__builtin_memcmp(cur, L->d + (size_t)(k - p) * n, (size_t)n * 2)) { L->period = p; break; }
    if (L->period) break;              /* layer k repeats layer k - p: not kept */
    L->layers++;
  }
  aici_free(qs), aici_free(qt), aici_free(e);
  return L;
too_big:
  fail_msg(err, "unsupported: maxLength at # (a string's length bounds beside its pattern need over 8192 states)");
fail:
  aici_free(qs), aici_free(qt), aici_free(e);
  lencount_free(L);
  return 0;
}

void lencount_free(lencount_t *L) {
  if (!L) return;
  aici_free(L->q), aici_free(L->d), aici_free(L);
}

bool lencount_live(const lencount_t *L, uint32_t s, uint32_t n) {
  uint32_t t = n & 15, cnt = n >> 4;
  if (s >= L->n_s || !L->q[s << 4 | t]) return false;
  if (cnt > L->hi) return false;
  uint32_t q = L->q[s << 4 | t] - 1, a = L->lo > cnt ? L->lo - cnt : 0, k = a;
  if (k >= L->layers) {                /* past the layers kept: periodic */
    uint32_t first = L->layers - L->period;
    k = first + (k - first) % L->period;
  }
  uint32_t d = L->d[(size_t)k * L->n_q + q];
  if (d == LC_INF) return false;
  return L->hi == CHARS_UNBOUNDED || (uint64_t)cnt + a + d <= L->hi;
}

bool lencount_next(const lencount_t *L, uint32_t s2, uint32_t n, uint8_t b, uint32_t *n2) {
  uint32_t inc, t = lc_track(n & 15, b, &inc), cnt = (n >> 4) + inc;
  if (t == LC_DEAD) return false;
  if (L->hi == CHARS_UNBOUNDED && cnt > L->lo) cnt = L->lo;   /* past lo, counts are all alike */
  *n2 = cnt << 4 | t;
  return lencount_live(L, s2, *n2);
}

uint32_t lencount_room(const lencount_t *L, uint32_t s, uint32_t n, uint32_t kmax) {
  uint32_t a = 0, z = kmax;            /* live at a; the largest live k is in [a, z] */
  while (a < z) {
    uint32_t mid = a + (z - a + 1) / 2;
    if (lencount_live(L, s, n + (mid << 4))) a = mid;
    else z = mid - 1;
  }
  return a;
}

bool lencount_settled(const lencount_t *L, uint32_t n, uint32_t longest_token) {
  uint32_t cnt = n >> 4;
  if (cnt < L->lo) return false;
  return L->hi == CHARS_UNBOUNDED || (uint64_t)cnt + longest_token + L->hmax <= L->hi;
}
