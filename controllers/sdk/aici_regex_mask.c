/* The regex's masks: the trie walk over DFA rows, slices, the per-state mask cache and masks
 * shared between states no token tells apart (see aici_regex_int.h). */
#include "aici_regex_int.h"

/* The hot loop, over nodes [p, end) (stack: the rows of the states above p). Per node: one row
 * load, one unconditional mask OR (tokenless nodes hit the spare word), one branch: descend into
 * the subtree, or skip it and climb `pop` levels. Row entries carry END_BIT for FINAL targets,
 * which makes them negative: such a node's token counts, its subtree is skipped unvisited.
 * `checked`: rows may be unbuilt (built on entry); unchecked walks start from a CLOSED state. */
static inline __attribute__((always_inline)) uint32_t walk_range(aici_regex_t *re, const aici_trie_node_t *nodes,
                                                                 uint32_t p, uint32_t end, const uint32_t **stack,
                                                                 uint32_t sp, uint32_t *mask, bool checked) {
  const uint32_t *trans = re->trans, *row = stack[sp - 1];
  uint32_t visits = 0;
  while (p < end) {
    visits++;
    uint32_t w0 = nodes[p].w0, w1 = nodes[p].w1, tok = w0 >> 8;
    uint32_t ns = row[w0 & 255];
    mask[tok >> 5] |= (uint32_t)(ns != 0) << (tok & 31);
    if ((int32_t)ns > 0 && w1 >= (2u << 10)) {   /* live, not FINAL, and has children */
      if (checked && __builtin_expect(!(re->flags[ns] & BUILT), 0)) {
        const uint32_t *old = re->trans;
        rx_build_row(re, ns);             /* may move the table: rebase the stack */
        trans = re->trans;
        if (trans != old)
          for (uint32_t i = 0; i < sp; i++) stack[i] = trans + (stack[i] - old);
      }
      row = trans + (size_t)ns * 256;
      stack[sp++] = row;
      p++;
    } else {
      p += w1 >> 10;
      sp -= w1 & 1023;
      row = stack[sp - 1];
    }
  }
  return visits;
}

/* Returns the nodes it visited (the root's children included). */
static inline __attribute__((always_inline)) uint32_t walk_impl(aici_regex_t *re, const aici_trie_t *t,
                                                                uint32_t state, uint32_t *mask, bool checked) {
  const uint32_t *stack[1025];
  const aici_trie_node_t *nodes = t->nodes;
  stack[0] = re->trans + (size_t)state * 256;
  if (!t->root_kids) return walk_range(re, nodes, 1, t->n_nodes, stack, 1, mask, checked);
  uint32_t visits = t->n_root_kids;
  /* first level from the list: dead first bytes cost one row lookup, no node visit */
  for (uint32_t k = 0, nk = t->n_root_kids; k < nk; k++) {
    uint32_t e = t->root_kids[k], ns = stack[0][e & 255];
    if (!ns) continue;
    uint32_t c = e >> 8, w0 = nodes[c].w0, size = nodes[c].w1 >> 10, tok = w0 >> 8;
    mask[tok >> 5] |= 1u << (tok & 31);
    if (size < 2 || (int32_t)ns < 0) continue;
    if (checked && !(re->flags[ns] & BUILT)) {
      rx_build_row(re, ns);
      stack[0] = re->trans + (size_t)state * 256;
    }
    stack[1] = re->trans + (size_t)ns * 256;
    visits += walk_range(re, nodes, c + 1, c + size, stack, 2, mask, checked);
  }
  return visits;
}

static uint32_t walk_checked(aici_regex_t *re, const aici_trie_t *t, uint32_t state, uint32_t *mask) {
  return walk_impl(re, t, state, mask, true);
}
static uint32_t walk_closed(aici_regex_t *re, const aici_trie_t *t, uint32_t state, uint32_t *mask) {
  return walk_impl(re, t, state, mask, false);
}

/* Build every row reachable from `state` (up to CLOSE_ROWS new ones) and mark those states
 * CLOSED: walks from them need no per-node row check. */
static bool close_state(aici_regex_t *re, uint32_t state) {
  if (re->flags[state] & CLOSED) return true;
  if (re->close_failed) return false;
  uint32_t gen = ++re->stamp_gen, n = 0, cap = 64, built = 0;
  uint32_t *list = aici_malloc(cap * 4);
  list[n++] = state;
  re->stamp[state] = gen;
  for (uint32_t i = 0; i < n; i++) {
    uint32_t d = list[i];
    if (re->flags[d] & CLOSED) continue;
    if (!(re->flags[d] & BUILT)) {
      if (++built > CLOSE_ROWS) { re->close_failed = true; aici_free(list); return false; }
      rx_build_row(re, d);
    }
    for (uint32_t c = 0; c < re->n_cls; c++) {
      uint32_t t = re->trans[(size_t)d * 256 + re->rep[c]] & ~END_BIT;
      if (!t || re->stamp[t] == gen) continue;
      re->stamp[t] = gen;
      if (n == cap) list = aici_realloc(list, (cap *= 2) * 4);
      list[n++] = t;
    }
  }
  for (uint32_t i = 0; i < n; i++) re->flags[list[i]] |= CLOSED;
  aici_free(list);
  return true;
}

static uint32_t walk(aici_regex_t *re, const aici_trie_t *t, uint32_t state, uint32_t *mask) {
  return close_state(re, state) ? walk_closed(re, t, state, mask) : walk_checked(re, t, state, mask);
}

/* Whether this mask may build the pattern's own slices: building one costs several walks of the
 * whole trie (a pass over it, and its rest trie's memory), more than a request that computes a
 * mask or two saves. Ski rental: the masks' walks are the rent, counted in the nodes they
 * visited; the pattern's own slices are bought once that comes to slices_after whole tries (with
 * the standard slices covering a state, its masks visit a few thousand nodes and pay little). */
static bool slices_now(const aici_regex_t *re, const aici_trie_t *tr) {
  return re->use_slices && re->walked >= (uint64_t)re->slices_after * tr->n_nodes;
}

/* Whether the slice's bytes lie in one of the pattern's repeated sets (byte sets, or in text mode
 * an ASCII set beside any character): only then can a state of the pattern keep all its strings live. */
static bool within_cands(const aici_regex_t *re, const aici_slice_t *s) {
  for (uint32_t k = 0; k < re->n_cand; k++) {
    bool sub = true;
    for (int w = 0; w < 8 && sub; w++) sub = !(s->bytes[w] & ~re->cand[k][w]);
    if (sub) return true;
  }
  bool ascii = !(s->bytes[4] | s->bytes[5] | s->bytes[6] | s->bytes[7]);
  for (uint32_t k = 0; k < re->n_cand_u8; k++) {
    bool sub = ascii || s->utf8;       /* a UTF-8 candidate takes any non-ASCII character */
    for (int w = 0; w < 4 && sub; w++) sub = !(s->bytes[w] & ~re->cand_u8[k][w]);
    if (sub) return true;
  }
  return false;
}

static void add_sl(aici_regex_t *re, const aici_slice_t *s) {
  for (uint32_t k = 0; k < re->n_sl; k++)
    if (re->sl[k] == s) return;
  uint32_t i = re->n_sl++;
  for (; i && re->sl[i - 1]->rest.n_nodes > s->rest.n_nodes; i--) re->sl[i] = re->sl[i - 1];
  re->sl[i] = s;
}

/* The slices this regex may use, fewest rest nodes first, each with one representative byte per
 * regex byte class it touches: the SDK's standard slices that lie within the pattern's repeated
 * sets (made by the init: free, used from the first mask), and once slices_now() the pattern's
 * own candidates (built here, a few ms each). Resolving again forgets each state's pick. */
static void resolve_slices(aici_regex_t *re, const aici_trie_t *tr) {
  re->slice_trie = tr;
  re->n_sl = 0;
  __builtin_memset(re->pick, 0, re->cap_states);
  uint32_t n_std;
  const aici_slice_t *const *std = aici_trie_std_slices(tr, false, &n_std);
  for (uint32_t k = 0; k < n_std; k++)
    if (within_cands(re, std[k])) add_sl(re, std[k]);
  re->own_slices = slices_now(re, tr);
  for (uint32_t k = 0; re->own_slices && k < re->n_cand + re->n_cand_u8; k++) {
    const aici_slice_t *s = k < re->n_cand ? aici_trie_slice(tr, re->cand[k])
                                           : aici_trie_utf8_slice(tr, re->cand_u8[k - re->n_cand]);
    if (s) add_sl(re, s);
  }
  for (uint32_t k = 0; k < re->n_sl; k++) {
    uint32_t seen[8] = {0}, n = 0;
    for (int b = 0; b < 256; b++) {
      uint8_t c = re->cls[b];
      if ((re->sl[k]->bytes[b >> 5] >> (b & 31)) & 1 && !((seen[c >> 5] >> (c & 31)) & 1))
        seen[c >> 5] |= 1u << (c & 31), re->sl_reps[k][n++] = (uint8_t)b;
    }
    re->sl_n_reps[k] = n;
  }
}

/* Does every string over slice k's bytes, up to its longest token, keep the DFA live from
 * `state`? Breadth-first over the states those bytes reach (one byte per regex byte class
 * suffices), with their least depths: a state first reached at depth d < max_len must have a
 * live transition on every such byte. Gives up (no) past COVER_STATES states. */
static uint32_t cover_step(void *ctx, uint32_t state, uint8_t byte) {
  aici_regex_t *re = ctx;
  rx_build_row(re, state);
  return re->trans[(size_t)state * 256 + byte] & ~END_BIT;
}

static bool covers(aici_regex_t *re, uint32_t state, uint32_t k) {
  if (re->sl[k]->utf8)                 /* whole characters: the SDK's check, over the regex's classes */
    return aici_utf8_covers(cover_step, re, re->cls, state, re->sl[k]->bytes, re->sl[k]->max_len);
  const uint8_t *reps = re->sl_reps[k];
  uint32_t n_reps = re->sl_n_reps[k], max_len = re->sl[k]->max_len;
  uint32_t seen[COVER_STATES], depth[COVER_STATES], n = 1;
  seen[0] = state, depth[0] = 0;
  for (uint32_t i = 0; i < n; i++) {
    if (depth[i] >= max_len) continue;
    rx_build_row(re, seen[i]);
    const uint32_t *row = re->trans + (size_t)seen[i] * 256;
    for (uint32_t r = 0; r < n_reps; r++) {
      uint32_t t = row[reps[r]] & ~END_BIT, j = 0;
      if (!t) return false;
      while (j < n && seen[j] != t) j++;
      if (j == n) {
        if (n == COVER_STATES) return false;
        seen[n] = t, depth[n++] = depth[i] + 1;
      }
    }
  }
  return true;
}

/* The slice to use from `state` (NULL: walk the whole trie), decided once per DFA state. */
static const aici_slice_t *pick_slice(aici_regex_t *re, const aici_trie_t *tr, uint32_t state) {
  if (re->slice_trie != tr || (!re->own_slices && slices_now(re, tr))) resolve_slices(re, tr);
  if (!re->n_sl) return 0;
  uint8_t c = re->pick[state];
  if (!c) {
    c = 1;
    for (uint32_t k = 0; k < re->n_sl && c == 1; k++)
      if (covers(re, state, k)) c = (uint8_t)(2 + k);
    re->pick[state] = c;               /* after covers(): it may have grown the arrays */
  }
  return c > 1 ? re->sl[c - 2] : 0;
}

typedef uint32_t v128u __attribute__((vector_size(16), aligned(4)));

/* A vector loop: wasmtime's memory.copy (a libcall) costs more than this at mask sizes. */
static void copy_words(uint32_t *restrict d, const uint32_t *restrict s, uint32_t n) {
  uint32_t i = 0;
  for (; i + 4 <= n; i += 4) *(v128u *)(d + i) = *(const v128u *)(s + i);
  for (; i < n; i++) d[i] = s[i];
}

static void or_words(uint32_t *restrict d, const uint32_t *restrict s, uint32_t n) {
  uint32_t i = 0;
  for (; i + 4 <= n; i += 4) *(v128u *)(d + i) |= *(const v128u *)(s + i);
  for (; i < n; i++) d[i] |= s[i];
}


/* `write`: out's old contents do not count, so a slice's dense mask is copied (memory.copy,
 * a native memcpy) instead of ORed word by word. */
static void mask_impl(aici_regex_t *re, const aici_trie_t *tr, uint32_t state, aici_tokset_t *out, bool write) {
  uint32_t *w = out->words, nw = out->n_words;
  const aici_slice_t *s = 0;
  if (state && tr) {
    rx_build_row(re, state);
    if (re->use_slices) s = pick_slice(re, tr, state);
  }
  if (s && s->dense) {
    if (write) copy_words(w, s->dense, nw);
    else or_words(w, s->dense, nw);
  } else {
    if (write) __builtin_memset(w, 0, nw * 4);
    if (s) {
      const uint32_t *idx = s->word_idx, *bits = s->word_bits;
      for (uint32_t i = 0, n = s->n_words; i < n; i++) w[idx[i]] |= bits[i];
    }
  }
  if (state && tr) re->walked += walk(re, s ? &s->rest : tr, state, w);
  w[nw] = 0;
}

void aici_regex_mask(aici_regex_t *re, const aici_trie_t *tr, uint32_t state, aici_tokset_t *out) {
  mask_impl(re, tr, state, out, false);
}

void aici_regex_mask_write(aici_regex_t *re, const aici_trie_t *tr, uint32_t state, aici_tokset_t *out) {
  mask_impl(re, tr, state, out, true);
}

void aici_regex_use_slices(aici_regex_t *re, bool on) { re->use_slices = on; }
void aici_regex_slices_after(aici_regex_t *re, uint32_t masks) { re->slices_after = masks; }

const aici_slice_t *aici_regex_slice(aici_regex_t *re, const aici_trie_t *tr, uint32_t state) {
  if (!state || !tr || !re->use_slices) return 0;
  rx_build_row(re, state);
  return pick_slice(re, tr, state);
}

/* ---- masks shared between states no token tells apart --------------------------------------
 * A state's mask is the set of tokens whose bytes keep the DFA live from it. Two states whose
 * every string of up to `len` bytes (the trie's longest token) leaves both live or both dead have
 * the same mask: inside `( [a-z]+){100}` word 7 and word 8 do, until the end comes within a
 * token's reach. A state about to compute its mask first looks for such a state among the last
 * EQ_RECENT whose masks were computed (same accepting flag, same live byte classes), and takes
 * that mask instead of a walk of the trie. */

/* The state's accepting flag and which byte classes keep it live, hashed: states that differ here
 * cannot share a mask (callers add EOS to a cached mask of an accepting state). */
static uint32_t live_sig(aici_regex_t *re, uint32_t state) {
  rx_build_row(re, state);
  const uint32_t *row = re->trans + (size_t)state * 256;
  uint32_t h = 2166136261u ^ (re->flags[state] & ACCEPT);
  for (uint32_t c = 0; c < re->n_cls; c++) h = (h ^ (row[re->rep[c]] != 0)) * 16777619u;
  return h;
}

/* Whether every string of up to `len` bytes keeps a and b both live or both dead: breadth first
 * over the pairs of states those strings reach (one byte per byte class), each at its least depth.
 * Gives up (false) past EQ_PAIRS pairs. */
static bool same_masks(aici_regex_t *re, uint32_t a, uint32_t b, uint32_t len) {
  const uint32_t cap = 2 * EQ_PAIRS;   /* seen: a power of two, at most half full */
  if (!re->eq_seen) {
    re->eq_seen = aici_malloc(cap * sizeof *re->eq_seen);
    re->eq_q = aici_malloc(EQ_PAIRS * 3 * sizeof *re->eq_q);
  }
  uint64_t *seen = re->eq_seen;
  uint32_t *q = re->eq_q, n = 1;
  __builtin_memset(seen, 0, cap * sizeof *seen);
  q[0] = a, q[1] = b, q[2] = 0;
  for (uint32_t i = 0; i < n; i++) {
    uint32_t x = q[3 * i], y = q[3 * i + 1], d = q[3 * i + 2];
    if (d >= len) continue;
    rx_build_row(re, x);
    rx_build_row(re, y);                  /* may move the table: rows read after both */
    const uint32_t *rx = re->trans + (size_t)x * 256, *ry = re->trans + (size_t)y * 256;
    for (uint32_t c = 0; c < re->n_cls; c++) {
      uint32_t tx = rx[re->rep[c]] & ~END_BIT, ty = ry[re->rep[c]] & ~END_BIT;
      if ((tx != 0) != (ty != 0)) return false;
      if (tx == ty) continue;          /* both dead, or one state: the same from here on */
      uint64_t key = (uint64_t)tx << 32 | ty;
      uint32_t k = (uint32_t)((key * 0x9E3779B97F4A7C15ull) >> 40) & (cap - 1);
      while (seen[k] && seen[k] != key) k = (k + 1) & (cap - 1);
      if (seen[k]) continue;
      if (n == EQ_PAIRS) return false;
      seen[k] = key;
      q[3 * n] = tx, q[3 * n + 1] = ty, q[3 * n + 2] = d + 1, n++;
    }
  }
  return true;
}

/* A state among the recent ones whose mask is `state`'s (0: none). */
static uint32_t shared_mask_state(aici_regex_t *re, const aici_trie_t *tr, uint32_t state, uint32_t sig) {
  for (uint32_t k = 0; k < re->eq_n; k++) {
    uint32_t i = (re->eq_next + EQ_RECENT - 1 - k) % EQ_RECENT;   /* the latest first */
    uint32_t r = re->eq_recent[i];
    if (re->eq_sig[i] == sig && (re->flags[r] & ACCEPT) == (re->flags[state] & ACCEPT)
        && same_masks(re, state, r, tr->max_depth))
      return r;
  }
  return 0;
}

/* cache[state] of a state whose mask aici_regex_mask_now computed once and did not keep */
#define VISITED_ONCE ((aici_tokset_t *)1)

const aici_tokset_t *aici_regex_mask_cached(aici_regex_t *re, const aici_trie_t *tr, uint32_t state) {
  aici_tokset_t *hit = state < re->cap_states ? re->cache[state] : 0;
  if (hit > VISITED_ONCE) return hit;
  uint32_t sig = 0;
  if (state && tr && re->cache_limit) {
    sig = live_sig(re, state);
    uint32_t r = shared_mask_state(re, tr, state, sig);
    if (r && re->cache[r] > VISITED_ONCE) return re->cache[state] = re->cache[r];
  }
  aici_tokset_t *s;
  bool keep = state && re->cache_n < re->cache_limit;
  if (keep) {
    s = aici_tokset_new();
    re->cache[state] = s, re->cache_n++;
    re->eq_recent[re->eq_next] = state, re->eq_sig[re->eq_next] = sig;
    re->eq_next = (re->eq_next + 1) % EQ_RECENT;
    if (re->eq_n < EQ_RECENT) re->eq_n++;
  } else {
    if (!re->spare) re->spare = aici_tokset_new();
    s = re->spare;
  }
  aici_regex_mask_write(re, tr, state, s);
  return s;
}

const aici_tokset_t *aici_regex_mask_now(aici_regex_t *re, const aici_trie_t *tr, uint32_t state) {
  aici_tokset_t *hit = state && state < re->cap_states ? re->cache[state] : 0;
  if (hit > VISITED_ONCE) return hit;
  if (!hit && state && re->cache_limit) {
    /* A state's first mask is not kept: most states of a walk along a text are met once (each
     * position of `[0-9]{4}-[0-9]{2}`), and keeping a mask costs a fresh 19 KiB of linear memory
     * (its pages' first touch), several times the walk itself. Its second visit keeps it (a
     * loop's state: `[0-9]+`, an identifier's tail). */
    re->cache[state] = VISITED_ONCE;
    if (!re->spare) re->spare = aici_tokset_new();
    aici_regex_mask_write(re, tr, state, re->spare);
    return re->spare;
  }
  return aici_regex_mask_cached(re, tr, state);
}

void aici_regex_cache_limit(aici_regex_t *re, uint32_t limit) { re->cache_limit = limit; }

/* ---- raw rows, for walkers that drive several DFAs at once (controllers/json) ---------------- */
const uint32_t *aici_regex_row(aici_regex_t *re, uint32_t state) {
  rx_build_row(re, state);
  return re->trans + (size_t)state * 256;
}

const uint8_t *aici_regex_classes(const aici_regex_t *re, uint32_t *n_classes) {
  if (n_classes) *n_classes = re->n_cls;
  return re->cls;
}
