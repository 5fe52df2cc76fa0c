/* Key languages that regexes cannot write: "keys in pattern i's language but none of the listed
 * keys", "keys that match no pattern and are none of the listed keys" (patternProperties beside
 * properties / required / additionalProperties). Set difference and complement have no regex
 * text of linear size, so the language is built as the product DFA of its parts:
 *   S   any JSON string content (canonical: raw UTF-8, escapes only where JSON needs them),
 *   K   the listed keys (their canonical content), when there are any,
 *   P_j each pattern's regex over string content (search semantics),
 * accepting where S accepts, K does not, and P_target does (target >= 0; the patterns are
 * disjoint, the caller checks), no P_j does (target -1), or every P_j does (KEYLANG_ALL: a
 * string's `pattern` beside its `format`). States that cannot reach a match are
 * dropped (else a mask would offer a dead end). Each remaining state becomes a machine whose
 * regex steps one byte class and tail-calls the next state's machine, so the stack does not
 * grow; a state where every part but S is absorbing (dead, or matched for good) and S is at a
 * character boundary is the plain `STRCHAR*` and is written inline instead of as a machine. */
#include "json.h"

#define MAX_COMP 66u                   /* S, K and up to 64 patterns */

struct keylang {
  uint32_t n_comp, n_states, cap, n_cls;
  int32_t target;
  bool has_k;
  aici_regex_t *re[MAX_COMP];
  uint8_t cls_rep[256], cls_of[256];   /* joint byte classes: a representative, and byte -> class */
  uint32_t *st;                        /* n_states * n_comp component states */
  uint32_t *next;                      /* n_states * n_cls: target product state + 1, 0 = dead */
  uint8_t *accept, *live, *free_, *tail;   /* tail: every part but S absorbing (see keylang_new) */
  uint32_t *ht, ht_cap;
  uint32_t *id;                        /* per product state: its machine's index among the kept ones */
  uint32_t n_kept;
};

static uint32_t tuple_hash(const uint32_t *s, uint32_t n) {
  uint32_t h = 2166136261u;
  for (uint32_t i = 0; i < n; i++) h = (h ^ s[i]) * 16777619u;
  return h ^ (h >> 13);
}

static bool accepts(const keylang_t *L, const uint32_t *s) {
  if (!aici_regex_accepting(L->re[0], s[0])) return false;
  if (L->has_k && aici_regex_accepting(L->re[1], s[1])) return false;
  uint32_t p0 = L->has_k ? 2 : 1;
  if (L->target == KEYLANG_ALL) {      /* in every pattern's language */
    for (uint32_t j = p0; j < L->n_comp; j++)
      if (!aici_regex_accepting(L->re[j], s[j])) return false;
    return true;
  }
  if (L->target >= 0) return aici_regex_accepting(L->re[p0 + (uint32_t)L->target], s[p0 + (uint32_t)L->target]);
  for (uint32_t j = p0; j < L->n_comp; j++)
    if (aici_regex_accepting(L->re[j], s[j])) return false;
  return true;
}

/* The product state for s (added when new); UINT32_MAX when over `limit` states. */
static uint32_t intern(keylang_t *L, const uint32_t *s, uint32_t limit) {
  uint32_t n = L->n_comp, h = tuple_hash(s, n);
  for (uint32_t k = h & (L->ht_cap - 1);; k = (k + 1) & (L->ht_cap - 1)) {
    uint32_t v = L->ht[k];
    if (!v) {
      if (L->n_states == limit) return UINT32_MAX;
      if (L->n_states == L->cap) {
        L->cap *= 2;
        L->st = aici_realloc(L->st, (size_t)L->cap * n * 4);
      }
      uint32_t i = L->n_states++;
      __builtin_memcpy(L->st + (size_t)i * n, s, n * 4);
      L->ht[k] = i + 1;
      return i;
    }
    if (!__builtin_memcmp(L->st + (size_t)(v - 1) * n, s, n * 4)) return v - 1;
  }
}

/* Whether component c's state s stays s on every byte class (dead states do: 0 -> 0). */
static bool absorbing(const keylang_t *L, uint32_t c, uint32_t s) {
  if (!s) return true;
  for (uint32_t x = 0; x < L->n_cls; x++)
    if (aici_regex_step(L->re[c], s, L->cls_rep[x]) != s) return false;
  return true;
}

keylang_t *keylang_new(const char *const *pats, const uint32_t *pat_lens, uint32_t n_pats, int32_t target,
                       const char *keys, uint32_t keys_len, uint32_t limit) {
  if (n_pats + 2 > MAX_COMP) return 0;
  keylang_t *L = aici_calloc(1, sizeof *L);
  L->target = target, L->has_k = keys_len > 0;
  aici_buf_t any = {0};
  aici_buf_puts(&any, "(?:"), emit_strchar(&any), aici_buf_puts(&any, ")*");
  L->re[L->n_comp++] = aici_regex_compile(any.p, any.n, 0);
  aici_free(any.p);
  if (L->has_k) L->re[L->n_comp++] = aici_regex_compile(keys, keys_len, 0);
  for (uint32_t j = 0; j < n_pats; j++) L->re[L->n_comp++] = aici_regex_compile(pats[j], pat_lens[j], 0);
  for (uint32_t c = 0; c < L->n_comp; c++)
    if (!L->re[c]) { keylang_free(L); return 0; }
  /* joint classes: bytes that every component puts in one class */
  for (uint32_t b = 0; b < 256; b++) {
    uint32_t x = 0;
    for (; x < L->n_cls; x++) {
      bool same = true;
      for (uint32_t c = 0; c < L->n_comp && same; c++) {
        const uint8_t *cls = aici_regex_classes(L->re[c], 0);
        same = cls[b] == cls[L->cls_rep[x]];
      }
      if (same) break;
    }
    if (x == L->n_cls) L->cls_rep[L->n_cls++] = (uint8_t)b;
    L->cls_of[b] = (uint8_t)x;
  }
  uint32_t n = L->n_comp;
  L->cap = 64, L->ht_cap = 1;
  while (L->ht_cap < 2 * limit + 2) L->ht_cap *= 2;
  L->st = aici_malloc((size_t)L->cap * n * 4);
  L->ht = aici_calloc(L->ht_cap, 4);
  uint32_t s[MAX_COMP];
  for (uint32_t c = 0; c < n; c++) s[c] = aici_regex_start(L->re[c]);
  intern(L, s, limit);
  uint32_t next_cap = 0;
  for (uint32_t i = 0; i < L->n_states; i++) {   /* breadth first over the reachable product */
    if (L->n_states * L->n_cls > next_cap) {
      uint32_t old = next_cap;
      next_cap = 2 * (L->n_states + L->cap) * L->n_cls;
      L->next = aici_realloc(L->next, (size_t)next_cap * 4);
      __builtin_memset(L->next + old, 0, (size_t)(next_cap - old) * 4);
    }
    for (uint32_t x = 0; x < L->n_cls; x++) {
      uint32_t t[MAX_COMP];
      const uint32_t *from = L->st + (size_t)i * n;
      t[0] = aici_regex_step(L->re[0], from[0], L->cls_rep[x]);
      if (!t[0]) continue;             /* no string content: dead for every part */
      for (uint32_t c = 1; c < n; c++) t[c] = aici_regex_step(L->re[c], from[c], L->cls_rep[x]);
      uint32_t j = intern(L, t, limit);
      if (j == UINT32_MAX) { keylang_free(L); return 0; }
      if (L->n_states * L->n_cls > next_cap) {
        uint32_t old = next_cap;
        next_cap = 2 * L->n_states * L->n_cls;
        L->next = aici_realloc(L->next, (size_t)next_cap * 4);
        __builtin_memset(L->next + old, 0, (size_t)(next_cap - old) * 4);
      }
      L->next[(size_t)i * L->n_cls + x] = j + 1;
    }
  }
  uint32_t N = L->n_states;
  L->accept = aici_calloc(N, 1), L->live = aici_calloc(N, 1), L->free_ = aici_calloc(N, 1), L->tail = aici_calloc(N, 1);
  L->id = aici_calloc(N, 4);
  for (uint32_t i = 0; i < N; i++) L->live[i] = L->accept[i] = accepts(L, L->st + (size_t)i * n);
  for (bool changed = true; changed;) {   /* live: some match is reachable */
    changed = false;
    for (uint32_t i = 0; i < N; i++) {
      if (L->live[i]) continue;
      for (uint32_t x = 0; x < L->n_cls && !L->live[i]; x++) {
        uint32_t j = L->next[(size_t)i * L->n_cls + x];
        if (j && L->live[j - 1]) L->live[i] = 1, changed = true;
      }
    }
  }
  uint32_t s_start = aici_regex_start(L->re[0]);
  for (uint32_t i = 0; i < N; i++) {
    const uint32_t *q = L->st + (size_t)i * n;
    /* tail: the other parts are settled, so what is left is S's own language from here (the
     * rest of a character, then STRCHAR*): written inline, a few bytes deep, never a machine */
    bool tail = L->live[i];
    for (uint32_t c = 1; c < n && tail; c++) tail = absorbing(L, c, q[c]);
    L->tail[i] = tail;
    L->free_[i] = tail && L->accept[i] && q[0] == s_start;
    L->id[i] = L->live[i] && !tail ? L->n_kept++ : UINT32_MAX;
  }
  return L;
}

bool keylang_empty(const keylang_t *L) { return !L->live[0]; }
uint32_t keylang_machines(const keylang_t *L) { return L->n_kept; }
bool keylang_start_is_free(const keylang_t *L) { return L->tail[0]; }

static void hex(aici_buf_t *b, uint32_t v);
static void call(aici_buf_t *b, uint32_t m) {
  aici_buf_puts(b, "(?:");
  sb_byte(b, CALL_BYTE), sb_byte(b, (uint8_t)(m >> 8)), sb_byte(b, (uint8_t)m);
  aici_buf_putc(b, ')');
}

static void hex(aici_buf_t *b, uint32_t v) {
  static const char H[] = "0123456789abcdef";
  aici_buf_puts(b, "\\x"), aici_buf_putc(b, H[v >> 4]), aici_buf_putc(b, H[v & 15]);
}

/* State i's language: STRCHAR* when free, else one byte class and what follows it, inline for
 * tail states, a call to their machine for the others (`top`: state i's own machine text). */
static void state_text(const keylang_t *L, uint32_t i, uint32_t base, bool top, uint32_t depth, aici_buf_t *out) {
  if (L->free_[i]) {
    aici_buf_puts(out, "(?:"), emit_strchar(out), aici_buf_puts(out, ")*");
    return;
  }
  if (depth > 8) {                     /* never: a tail is S alone, back at a character's start within 4 */
    aici_buf_puts(out, "[^\\x00-\\xff]");
    return;
  }
  if (!top && !L->tail[i]) { call(out, base + L->id[i]); return; }
  aici_buf_puts(out, "(?:");
  bool first = true;
  uint8_t done[256] = {0};
  for (uint32_t x = 0; x < L->n_cls; x++) {
    uint32_t j = L->next[(size_t)i * L->n_cls + x];
    if (!j || !L->live[j - 1] || done[x]) continue;
    if (!first) aici_buf_putc(out, '|');
    first = false;
    bool in[256] = {0};                /* every byte whose class leads to j */
    for (uint32_t y = x; y < L->n_cls; y++)
      if (L->next[(size_t)i * L->n_cls + y] == j) done[y] = 1;
    for (uint32_t b = 0; b < 256; b++) in[b] = L->next[(size_t)i * L->n_cls + L->cls_of[b]] == j;
    aici_buf_putc(out, '[');
    for (uint32_t b = 0; b < 256;) {
      if (!in[b]) { b++; continue; }
      uint32_t e = b;
      while (e + 1 < 256 && in[e + 1]) e++;
      hex(out, b);
      if (e > b) aici_buf_putc(out, '-'), hex(out, e);
      b = e + 1;
    }
    aici_buf_putc(out, ']');
    state_text(L, j - 1, base, false, depth + 1, out);
  }
  if (L->accept[i]) aici_buf_puts(out, first ? "" : "|");
  else if (first) aici_buf_puts(out, "[^\\x00-\\xff]");
  aici_buf_putc(out, ')');
}

void keylang_text(const keylang_t *L, uint32_t state_machine, uint32_t base, aici_buf_t *out) {
  uint32_t i = 0;                      /* the product state whose machine index is state_machine */
  while (L->id[i] != state_machine) i++;
  state_text(L, i, base, true, 0, out);
}

void keylang_start_text(const keylang_t *L, uint32_t base, aici_buf_t *out) { state_text(L, 0, base, L->tail[0], 0, out); }

void keylang_free(keylang_t *L) {
  if (!L) return;
  /* the SDK has no regex free: its regexes live as long as the module (as key_matches' do) */
  aici_free(L->st), aici_free(L->next), aici_free(L->ht);
  aici_free(L->accept), aici_free(L->live), aici_free(L->free_), aici_free(L->id);
  aici_free(L);
}
