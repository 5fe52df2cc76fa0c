/* The token trie: fetched once from the host (`token-trie`), checked, and walked to build masks.
 * Format: docs/token-trie.md (nodes in DFS preorder; w0 = byte | token << 8, w1 = pop |
 * subtree_size << 10). The walks keep one recognizer state per trie level on a stack. */
#include "aici.h"
#include "aici_host.h"

#define NO_TOKEN 0xFFFFFFu
#define MAGIC 0x54544941u

static aici_trie_t trie;
static bool trie_tried;
static uint32_t *tok_off, *tok_len;   /* token -> offset into tok_bytes, length (0: no bytes) */
static uint8_t *tok_bytes;

/* The root's children, for walks that skip dead first bytes without visiting their nodes. */
static void list_root_kids(aici_trie_t *t) {
  uint32_t k = 0;
  for (uint32_t c = 1; c < t->n_nodes; c += t->nodes[c].w1 >> 10) k++;
  uint32_t *kids = aici_malloc(k * 4 + 4);
  t->root_kids = kids, t->n_root_kids = kids ? k : 0;
  k = 0;
  for (uint32_t c = 1; c < t->n_nodes && kids; c += t->nodes[c].w1 >> 10) kids[k++] = c << 8 | (t->nodes[c].w0 & 255);
}

static const aici_trie_t *fail(const char *why) {
  aici_logf("aici: bad token trie from host: %s\n", why);
  return 0;
}

const aici_trie_t *aici_trie(void) {
  if (trie_tried) return trie.nodes ? &trie : 0;
  trie_tried = true;
  struct { uint32_t ptr, len; } r;
  aici_h_token_trie((int32_t)(uintptr_t)&r);
  uint32_t *h = (uint32_t *)(uintptr_t)r.ptr;   /* heap block from our cabi_realloc: 8-aligned */
  if (r.len < 16 || h[0] != MAGIC || h[1] != 1) return fail("magic/version");
  uint32_t vocab = h[2], n = h[3];
  if (vocab != aici_vocab_size()) return fail("vocab size differs from vocab-size()");
  if (n < 1 || (uint64_t)r.len < 16 + 8ull * n) return fail("truncated");
  aici_trie_node_t *nodes = (aici_trie_node_t *)(h + 4);
  uint32_t scratch = (vocab + 31) / 32 * 32;
  /* One preorder pass: rewrite "no token" (and any out-of-range id) to the scratch id, and check
   * the sizes and pops so that no later walk can run off the node array or the stack. */
  uint32_t depth = 1, max_depth = 0;
  for (uint32_t p = 1; p < n; p++) {
    uint32_t tok = nodes[p].w0 >> 8, size = nodes[p].w1 >> 10, pop = nodes[p].w1 & 1023;
    if (tok >= vocab) nodes[p].w0 = (nodes[p].w0 & 0xff) | (scratch << 8);
    if (size == 0 || size > n - p) return fail("subtree size");
    if (depth > max_depth) max_depth = depth;
    if (size > 1) {
      if (++depth > 1023) return fail("depth");
    } else if (pop >= depth) return fail("pop");
    else depth -= pop;
  }
  if ((nodes[0].w1 >> 10) != n) return fail("root size");
  trie.nodes = nodes, trie.n_nodes = n, trie.vocab = vocab;
  trie.max_depth = max_depth, trie.scratch_token = scratch;
  list_root_kids(&trie);
  return &trie;
}

const uint8_t *aici_token_bytes(aici_token_t t, uint32_t *len_out) {
  const aici_trie_t *tr = aici_trie();
  if (len_out) *len_out = 0;
  if (!tr || t >= tr->vocab) return 0;
  if (!tok_off) {                      /* first use: replay the preorder, recording each path */
    uint32_t total = 0, depth = 1;
    for (uint32_t p = 1; p < tr->n_nodes; p++) {
      if ((tr->nodes[p].w0 >> 8) < tr->vocab) total += depth;
      uint32_t w1 = tr->nodes[p].w1;
      depth = (w1 >> 10) > 1 ? depth + 1 : depth - (w1 & 1023);
    }
    tok_off = aici_calloc(tr->vocab, 4);
    tok_len = aici_calloc(tr->vocab, 4);
    tok_bytes = aici_malloc(total + 1);
    uint8_t path[1024];
    uint32_t at = 0;
    depth = 1;
    for (uint32_t p = 1; p < tr->n_nodes; p++) {
      uint32_t w0 = tr->nodes[p].w0, w1 = tr->nodes[p].w1, tok = w0 >> 8;
      path[depth - 1] = (uint8_t)w0;
      if (tok < tr->vocab) {
        __builtin_memcpy(tok_bytes + at, path, depth);
        tok_off[tok] = at, tok_len[tok] = depth, at += depth;
      }
      depth = (w1 >> 10) > 1 ? depth + 1 : depth - (w1 & 1023);
    }
  }
  if (!tok_len[t]) return 0;
  if (len_out) *len_out = tok_len[t];
  return tok_bytes + tok_off[t];
}

void aici_trie_walk(const aici_trie_t *tr, aici_byte_step_fn step, void *ctx, uint32_t start,
                    aici_tokset_t *out) {
  uint32_t stack[1025];
  uint32_t sp = 1, p = 1, n = tr->n_nodes;
  const aici_trie_node_t *nodes = tr->nodes;
  uint32_t *mask = out->words;
  stack[0] = start;
  while (p < n) {
    uint32_t w0 = nodes[p].w0, w1 = nodes[p].w1, tok = w0 >> 8;
    uint32_t ns = step(ctx, stack[sp - 1], (uint8_t)w0);
    mask[tok >> 5] |= (uint32_t)(ns != 0) << (tok & 31);
    if (ns && (w1 >> 10) > 1) {
      stack[sp++] = ns;
      p++;
    } else {
      p += w1 >> 10;
      sp -= w1 & 1023;
    }
  }
  out->words[out->n_words] = 0;        /* the spare word: scratch bits, never part of a mask */
}

/* ---- slices ----------------------------------------------------------------------------------
 * llguidance's slicer, reduced to byte sets. For a byte set C, the tokens whose bytes all lie in C
 * (the slice) become a mask, and the other tokens get their own sub-trie (the rest trie). A
 * recognizer that provably keeps every string over C live from its state (inside [^"]* or \w+)
 * takes the mask wholesale and walks only the rest trie: for [^"] over Qwen2 that is ~2k nodes
 * instead of 333k. Built on request, from the trie alone, and kept (up to MAX_SLICES sets of any kind).
 *
 * A node stays in the rest trie iff its subtree holds a node whose path leaves C (every leaf
 * ends a token, so that subtree holds a token outside the slice): with pre[p] = the number of
 * such nodes before p in preorder, node p stays iff pre[p + size] > pre[p]. */
#define MAX_SLICES 24                   /* the standard slices (8) and a regex's or grammar's own */
static struct {
  const aici_trie_t *trie;
  uint32_t bytes[8];                   /* the byte set; a UTF-8 slice's: A (128 bits), then ~0 */
  bool utf8;
  aici_slice_t *slice;                 /* NULL: not worth it */
} slice_cache[MAX_SLICES];
static uint32_t n_slice_cache, slice_nodes_total;
static bool std_building;              /* standard slices: in the snapshot, outside the node budget */

/* The rest trie of the nodes p with pre[p + size] > pre[p] (cnt of them, the root included;
 * tokens of nodes without pre[p + 1] > pre[p] become the scratch token), and the slice's token
 * list from `words`. */
static void fill_slice(aici_slice_t *s, const aici_trie_t *tr, const uint32_t *pre, uint32_t cnt,
                       const uint32_t *words, uint32_t ntok, uint32_t max_len) {
  uint32_t n = tr->n_nodes, nw = (tr->vocab + 31) / 32, d;
  const aici_trie_node_t *nodes = tr->nodes;
  aici_trie_node_t *out = aici_malloc(cnt * sizeof *out);
  uint32_t *od = aici_malloc((cnt + 1) * 4), *stack = aici_malloc(1025 * 4);
  out[0].w0 = tr->scratch_token << 8, od[0] = 0;
  uint32_t k = 1;
  d = 1;
  for (uint32_t p = 1; p < n; p++) {
    uint32_t w0 = nodes[p].w0, w1 = nodes[p].w1;
    if (pre[p + (w1 >> 10)] > pre[p]) {
      uint32_t tok = pre[p + 1] > pre[p] ? w0 >> 8 : tr->scratch_token;  /* slice tokens: masked */
      out[k].w0 = (w0 & 255) | (tok << 8);
      od[k++] = d;
    }
    d = (w1 >> 10) > 1 ? d + 1 : d - (w1 & 1023);
  }
  /* sizes and pops of the filtered preorder (as in toktrie.py's serializer) */
  uint32_t sp = 0;
  for (uint32_t i = 0; i <= cnt; i++) {
    uint32_t di = i < cnt ? od[i] : 1;
    while (sp && od[stack[sp - 1]] >= di) {
      uint32_t j = stack[--sp];
      out[j].w1 = ((i - j) << 10) | (od[j] - di);
    }
    if (i < cnt) stack[sp++] = i;
  }
  out[0].w1 = cnt << 10;
  s->rest.nodes = out, s->rest.n_nodes = cnt, s->rest.vocab = tr->vocab;
  s->rest.max_depth = tr->max_depth, s->rest.scratch_token = tr->scratch_token;
  list_root_kids(&s->rest);
  s->n_tokens = ntok, s->max_len = max_len;
  for (uint32_t i = 0; i < nw; i++) s->n_words += words[i] != 0;
  s->word_idx = aici_malloc(s->n_words * 4 + 4);
  s->word_bits = aici_malloc(s->n_words * 4 + 4);
  for (uint32_t i = 0, j = 0; i < nw; i++)
    if (words[i]) s->word_idx[j] = i, s->word_bits[j++] = words[i];
  aici_free(od), aici_free(stack);
}

static aici_slice_t *build_slice(const aici_trie_t *tr, const uint32_t *bytes) {
  uint32_t n = tr->n_nodes, nw = (tr->vocab + 31) / 32;
  const aici_trie_node_t *nodes = tr->nodes;
  uint8_t in[256], ok[1025];
  for (int b = 0; b < 256; b++) in[b] = (bytes[b >> 5] >> (b & 31)) & 1;
  uint32_t *pre = aici_malloc((n + 1) * 4);
  uint32_t *words = aici_calloc(nw + 1, 4);
  if (!pre || !words) { aici_free(pre), aici_free(words); return 0; }
  /* forward: which nodes leave C (prefix counts), and the slice's tokens */
  uint32_t d = 1, ntok = 0, max_len = 0;
  ok[0] = 1, pre[0] = pre[1] = 0;
  for (uint32_t p = 1; p < n; p++) {
    uint32_t w0 = nodes[p].w0, w1 = nodes[p].w1, tok = w0 >> 8;
    uint8_t o = ok[d] = ok[d - 1] & in[w0 & 255];
    pre[p + 1] = pre[p] + !o;
    if (o && tok < tr->vocab) {
      words[tok >> 5] |= 1u << (tok & 31), ntok++;
      if (d > max_len) max_len = d;
    }
    d = (w1 >> 10) > 1 ? d + 1 : d - (w1 & 1023);
  }
  uint32_t cnt = 1;
  for (uint32_t p = 1; p < n; p++) cnt += pre[p + (nodes[p].w1 >> 10)] > pre[p];
  /* worth it only when it saves a good part of the walk (and the memory stays bounded) */
  if (!ntok || (n - cnt) * 16 < n || (!std_building && slice_nodes_total + cnt > 4 * n + 1024)) {
    aici_free(pre), aici_free(words);
    return 0;
  }
  aici_slice_t *s = aici_calloc(1, sizeof *s);
  fill_slice(s, tr, pre, cnt, words, ntok, max_len);
  __builtin_memcpy(s->bytes, bytes, 32);
  s->dense = s->n_words * 4 > nw ? words : 0;   /* many words: a dense OR vectorizes better */
  if (!s->dense) aici_free(words);
  aici_free(pre);
  if (!std_building) slice_nodes_total += cnt;
  return s;
}

static aici_slice_t *build_utf8_slice(const aici_trie_t *tr, const uint32_t *ascii);

static const aici_slice_t *cached_slice(const aici_trie_t *tr, const uint32_t *bytes, bool utf8) {
  if (!tr) return 0;
  for (uint32_t i = 0; i < n_slice_cache; i++)
    if (slice_cache[i].trie == tr && slice_cache[i].utf8 == utf8 && !__builtin_memcmp(slice_cache[i].bytes, bytes, 32))
      return slice_cache[i].slice;
  if (n_slice_cache == MAX_SLICES) return 0;
  aici_slice_t *s = utf8 ? build_utf8_slice(tr, bytes) : build_slice(tr, bytes);
  slice_cache[n_slice_cache].trie = tr;
  slice_cache[n_slice_cache].utf8 = utf8;
  __builtin_memcpy(slice_cache[n_slice_cache].bytes, bytes, 32);
  slice_cache[n_slice_cache++].slice = s;
  return s;
}

const aici_slice_t *aici_trie_slice(const aici_trie_t *tr, const uint32_t *bytes) {
  return cached_slice(tr, bytes, false);
}

const aici_slice_t *aici_trie_slice_made(const aici_trie_t *tr, const uint32_t *bytes) {
  for (uint32_t i = 0; tr && i < n_slice_cache; i++)
    if (slice_cache[i].trie == tr && !slice_cache[i].utf8 && !__builtin_memcmp(slice_cache[i].bytes, bytes, 32))
      return slice_cache[i].slice;
  return 0;
}

const aici_slice_t *aici_trie_utf8_slice(const aici_trie_t *tr, const uint32_t *ascii) {
  uint32_t key[8] = {ascii[0], ascii[1], ascii[2], ascii[3], ~0u, ~0u, ~0u, ~0u};
  return cached_slice(tr, key, true);
}

/* ---- token slices: a slice chosen per token instead of per byte -------------------------------
 * Same result type as aici_trie_slice (bytes[] zero): the tokens for which in_slice() holds as a
 * mask, every other token in the rest trie. For languages a byte set cannot describe, such as
 * "complete UTF-8 characters other than \" and \\". Built on each call; the caller keeps it. */
static aici_slice_t *token_slice(const aici_trie_t *tr, aici_token_pred_fn in_slice, void *ctx, bool worth) {
  uint32_t n = tr->n_nodes, nw = (tr->vocab + 31) / 32;
  const aici_trie_node_t *nodes = tr->nodes;
  uint32_t *pre = aici_malloc((n + 1) * 4), *words = aici_calloc(nw + 1, 4);
  if (!pre || !words) { aici_free(pre), aici_free(words); return 0; }
  uint32_t ntok = 0, max_len = 0;
  pre[0] = pre[1] = 0;
  for (uint32_t p = 1; p < n; p++) {   /* pre[p + 1] - pre[p]: node p holds a token outside */
    uint32_t tok = nodes[p].w0 >> 8, len = 0;
    bool out = false;
    if (tok < tr->vocab) {
      const uint8_t *b = aici_token_bytes(tok, &len);
      out = !b || !in_slice(ctx, b, len);
      if (!out) {
        words[tok >> 5] |= 1u << (tok & 31), ntok++;
        if (len > max_len) max_len = len;
      }
    }
    pre[p + 1] = pre[p] + out;
  }
  uint32_t cnt = 1;
  for (uint32_t p = 1; p < n; p++) cnt += pre[p + (nodes[p].w1 >> 10)] > pre[p];
  if (worth && (!ntok || (n - cnt) * 16 < n)) {
    aici_free(pre), aici_free(words);
    return 0;
  }
  aici_slice_t *s = aici_calloc(1, sizeof *s);
  fill_slice(s, tr, pre, cnt, words, ntok, max_len);
  s->dense = words;
  aici_free(pre);
  return s;
}

aici_slice_t *aici_trie_token_slice(const aici_trie_t *tr, aici_token_pred_fn in_slice, void *ctx) {
  return token_slice(tr, in_slice, ctx, false);
}

/* ---- UTF-8 slices: characters, the ASCII ones in a set A -------------------------------------
 * What text-mode sets cover: [^"] over text is "any character but \"", which a byte set cannot
 * say (a slice over the bytes of [^"] holds tokens that are not UTF-8, and a DFA over characters
 * dies on them). A token may end inside its last character (a valid prefix of one, as byte-level
 * BPE pieces of CJK characters and byte-fallback <0xE4> tokens do): the cover check steps those
 * prefixes too (aici_utf8_covers), so they are in the slice; only tokens that leave A, start
 * inside a character or are not UTF-8 are walked. */
bool aici_utf8_in(void *ctx, const uint8_t *s, uint32_t n) {
  const uint32_t *ascii = ctx;
  if (!n) return false;
  for (uint32_t i = 0; i < n;) {
    uint8_t c = s[i], lo = 0x80, hi = 0xBF;
    uint32_t k;
    if (c < 0x80) {
      if (!((ascii[c >> 5] >> (c & 31)) & 1)) return false;
      i++;
      continue;
    }
    if (c >= 0xC2 && c <= 0xDF) k = 1;
    else if (c >= 0xE0 && c <= 0xEF) k = 2, lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
    else if (c >= 0xF0 && c <= 0xF4) k = 3, lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
    else return false;
    if (i + 1 < n && (s[i + 1] < lo || s[i + 1] > hi)) return false;
    for (uint32_t j = 2; j <= k && i + j < n; j++)
      if ((s[i + j] & 0xC0) != 0x80) return false;
    i += k + 1;                        /* past n: the token ends inside this character */
  }
  return true;
}

/* Kept when it drops 1/16 of the nodes, outside the byte-set slices' node budget: the grammar
 * library makes three per tokenizer (as it did before they were the SDK's), and a regex's are
 * few (at most 24 slices of any kind) and mostly large, so their rest tries small. */
static aici_slice_t *build_utf8_slice(const aici_trie_t *tr, const uint32_t *key) {
  aici_slice_t *s = token_slice(tr, aici_utf8_in, (void *)key, true);
  if (s) {
    __builtin_memcpy(s->bytes, key, 32);
    s->utf8 = true;
    if (s->n_words * 4 <= (tr->vocab + 31) / 32) {   /* few words: the sparse form */
      aici_free(s->dense);
      s->dense = 0;
    }
  }
  return s;
}

/* ---- standard slices: made once per tokenizer, by an init ------------------------------------
 * The byte sets and UTF-8 sets that regexes and lexemes most often repeat (words, identifiers,
 * text without quotes or brackets, text up to a double quote, any text), as llguidance's slicer
 * keeps a fixed list per tokenizer (" !#-[]-~" is its JSON string's). Made in a controller's
 * init, they are in the init snapshot (docs/snapshots.md): a request's masks use them from its
 * first one, where a slice of its own costs several walks of the whole trie to build (ms: a
 * regex buys its own only once its masks have visited 4 whole tries' worth of nodes). The regex
 * constraint takes them. */
static const char *const STD_BYTES[] = {"a-z", "A-Za-z", "0-9A-Z_a-z"};
static const char *const STD_UTF8[] = {"0-9A-Za-z ", " !#-;=?-Z^-z|~", " !#-[]-~", "\t\n\r !#-~",
                                         "\t\n -~"};
#define N_STD_BYTES (sizeof STD_BYTES / sizeof STD_BYTES[0])
#define N_STD (N_STD_BYTES + sizeof STD_UTF8 / sizeof STD_UTF8[0])
static const aici_trie_t *std_trie;
static const aici_slice_t *std_slices[N_STD];
static uint32_t n_std;

void aici_range_bits(const char *r, uint32_t *bits) {
  while (*r) {
    uint8_t lo = (uint8_t)*r, hi = lo;
    if (r[1] == '-' && r[2]) hi = (uint8_t)r[2], r += 3;
    else r++;
    for (uint32_t b = lo; b <= hi; b++) bits[b >> 5] |= 1u << (b & 31);
  }
}

/* The slices of `tr` over the byte sets `sets` (as range texts) that are worth one, each made by
 * `make` (aici_trie_slice, or aici_trie_utf8_slice over the ASCII sets), into `out` (their count):
 * outside the slices' node budget, as every standard slice. */
static uint32_t std_slices_of(const aici_trie_t *tr, const char *const *sets, uint32_t n_sets,
                              const aici_slice_t *(*make)(const aici_trie_t *, const uint32_t *),
                              const aici_slice_t **out) {
  uint32_t k = 0;
  std_building = true;
  for (uint32_t i = 0; i < n_sets; i++) {
    uint32_t bits[8] = {0};
    aici_range_bits(sets[i], bits);
    const aici_slice_t *s = make(tr, bits);
    if (s) out[k++] = s;
  }
  std_building = false;
  return k;
}

const aici_slice_t *const *aici_trie_std_slices(const aici_trie_t *tr, bool build, uint32_t *n) {
  *n = 0;
  if (!tr) return 0;
  if (std_trie != tr) {
    if (!build) return 0;
    std_trie = tr;
    n_std = std_slices_of(tr, STD_BYTES, N_STD_BYTES, aici_trie_slice, std_slices);
    n_std += std_slices_of(tr, STD_UTF8, N_STD - N_STD_BYTES, aici_trie_utf8_slice, std_slices + n_std);
  }
  *n = n_std;
  return std_slices;
}

/* ---- prefix tries ------------------------------------------------------------------------------
 * The tokens whose bytes are `prefix` then a byte of `first`, as a trie of their bytes after the
 * prefix (the same ids): the nodes of those tokens' paths are copied by fill_slice's filter (a
 * node stays iff its subtree holds one of them), and the trie is the copy seen from the prefix's
 * last node. Its last node's pop runs past its root, as a sub-trie's does: walks stop at its end. */
const aici_trie_t *aici_trie_prefix(const aici_trie_t *tr, const uint8_t *prefix, uint32_t n_prefix,
                                    const uint32_t *first, const aici_slice_t *const **slices, uint32_t *n_slices) {
  static const aici_slice_t *made[N_STD_BYTES];
  *n_slices = 0;
  if (!tr || !n_prefix || n_prefix > 16) return 0;
  const aici_trie_node_t *nodes = tr->nodes;
  uint32_t n = tr->n_nodes, at = 0, nw = (tr->vocab + 31) / 32;
  for (uint32_t i = 0; i < n_prefix; i++) {          /* the prefix's node (of several children with */
    uint32_t end = at + (nodes[at].w1 >> 10), best = 0;   /* its byte, byte fallback's, the largest) */
    for (uint32_t c = at + 1; c < end; c += nodes[c].w1 >> 10)
      if ((nodes[c].w0 & 255) == prefix[i] && (!best || nodes[c].w1 >> 10 > nodes[best].w1 >> 10)) best = c;
    if (!best) return 0;
    at = best;
  }
  uint32_t *pre = aici_malloc((n + 1) * 4), *words = aici_calloc(nw + 1, 4);
  if (!pre || !words) { aici_free(pre), aici_free(words); return 0; }
  __builtin_memset(pre, 0, (at + 2) * 4);
  uint32_t end = at + (nodes[at].w1 >> 10), ntok = 0;
  for (uint32_t p = at + 1; p < end; p += nodes[p].w1 >> 10) {   /* the prefix's children in `first` */
    uint32_t b = nodes[p].w0 & 255, e = p + (nodes[p].w1 >> 10);
    bool in = (first[b >> 5] >> (b & 31)) & 1;
    for (uint32_t q = p; q < e; q++) {
      bool t = in && (nodes[q].w0 >> 8) < tr->vocab;
      pre[q + 1] = pre[q] + t, ntok += t;
    }
  }
  for (uint32_t p = end; p < n; p++) pre[p + 1] = pre[p];
  if (!ntok) { aici_free(pre), aici_free(words); return 0; }
  uint32_t cnt = 1;
  for (uint32_t p = 1; p < n; p++) cnt += pre[p + (nodes[p].w1 >> 10)] > pre[p];
  aici_slice_t tmp = {0};
  fill_slice(&tmp, tr, pre, cnt, words, 0, 0);
  aici_free(tmp.word_idx), aici_free(tmp.word_bits), aici_free(pre), aici_free(words);
  aici_trie_t *v = aici_calloc(1, sizeof *v);
  v->nodes = tmp.rest.nodes + n_prefix, v->n_nodes = tmp.rest.nodes[n_prefix].w1 >> 10;
  v->vocab = tr->vocab, v->max_depth = tr->max_depth, v->scratch_token = tr->scratch_token;
  aici_free((void *)tmp.rest.root_kids);
  list_root_kids(v);
  *n_slices = std_slices_of(v, STD_BYTES, N_STD_BYTES, aici_trie_slice, made);   /* its byte-set slices */
  *slices = made;
  return v;
}

/* The valid UTF-8 encodings of more than one byte (RFC 3629): per byte, the range it may take. */
const aici_u8pat_t AICI_U8_PATS[AICI_N_U8_PATS] = {
  {2, {0xC2, 0x80}, {0xDF, 0xBF}},
  {3, {0xE0, 0xA0, 0x80}, {0xE0, 0xBF, 0xBF}},
  {3, {0xE1, 0x80, 0x80}, {0xEC, 0xBF, 0xBF}},
  {3, {0xED, 0x80, 0x80}, {0xED, 0x9F, 0xBF}},
  {3, {0xEE, 0x80, 0x80}, {0xEF, 0xBF, 0xBF}},
  {4, {0xF0, 0x90, 0x80, 0x80}, {0xF0, 0xBF, 0xBF, 0xBF}},
  {4, {0xF1, 0x80, 0x80, 0x80}, {0xF3, 0xBF, 0xBF, 0xBF}},
  {4, {0xF4, 0x80, 0x80, 0x80}, {0xF4, 0x8F, 0xBF, 0xBF}},
};

bool aici_utf8_whole(const uint8_t *s, uint32_t n, uint32_t *prefix) {
    uint32_t i = 0;
    while (i < n) {
        uint8_t c = s[i];
        int k = c < 0x80 ? 0 : c >= 0xc2 && c < 0xe0 ? 1 : c >= 0xe0 && c < 0xf0 ? 2 : c >= 0xf0 && c < 0xf5 ? 3 : -1;
        if (k < 0 || i + (uint32_t)k >= n) break;
        bool cont = true;
        for (int j = 1; j <= k; j++) cont &= (s[i + j] & 0xc0) == 0x80;
        if (!cont) break;
        i += (uint32_t)k + 1;
    }
    *prefix = i;
    return i == n;
}

/* ---- the cover check of a UTF-8 slice ------------------------------------------------------
 * Breadth first over the states at character boundaries, each with the least depth (in bytes) it
 * is reached at (a state reached again sooner is checked again: fewer bytes used leave more
 * strings to check). Per state at depth d: each ASCII byte of A and each multi-byte encoding
 * (one byte per class at each of its positions), up to max_len - d of its bytes (a token may end
 * inside a character), must keep every byte live. */
#define U8_COVER_STATES 64u
#define U8_COVER_STEPS 8192u
typedef struct {
  aici_byte_step_fn step;
  void *ctx;
  const uint8_t *cls;
  uint32_t st[U8_COVER_STATES], dep[U8_COVER_STATES], n, steps;
  uint32_t queue[U8_COVER_STEPS], qh, qt;
} u8cover_t;

static bool u8_reach(u8cover_t *C, uint32_t st, uint32_t d) {
  uint32_t k = 0;
  while (k < C->n && C->st[k] != st) k++;
  if (k == C->n) {
    if (C->n == U8_COVER_STATES) return false;
    C->st[C->n++] = st;
  } else if (C->dep[k] <= d) return true;
  C->dep[k] = d;
  if (C->qt == U8_COVER_STEPS) return false;
  C->queue[C->qt++] = k;
  return true;
}

/* The bytes of encoding p from state st, `left` bytes of room: each must keep the state live (a
 * token may end after any of them); the states after the whole character are reached at depth d.
 * Position by position over the distinct states there (one byte per class of each), not one
 * path per combination of classes: a grammar whose terminals split the continuation bytes into
 * many classes (a Unicode \d beside [^"]) has thousands of 4-byte paths to few states. */
#define U8_FRONT 64u
static bool u8_tail(u8cover_t *C, uint32_t st, const aici_u8pat_t *p, uint32_t left, uint32_t d) {
  uint32_t front[2][U8_FRONT], n = 1;
  front[0][0] = st;
  for (uint32_t i = 0; i < p->n; i++) {
    if (i == left) return true;        /* no token of the slice gets past here */
    const uint32_t *cur = front[i & 1];
    uint32_t *nxt = front[(i + 1) & 1], nn = 0;
    for (uint32_t k = 0; k < n; k++) {
      uint32_t seen[8] = {0};
      for (uint32_t b = p->lo[i]; b <= p->hi[i]; b++) {
        uint32_t c = C->cls[b];
        if ((seen[c >> 5] >> (c & 31)) & 1) continue;
        seen[c >> 5] |= 1u << (c & 31);
        if (++C->steps > U8_COVER_STEPS) return false;
        uint32_t ns = C->step(C->ctx, cur[k], (uint8_t)b), j = 0;
        if (!ns) return false;
        while (j < nn && nxt[j] != ns) j++;
        if (j == nn) {
          if (nn == U8_FRONT) return false;
          nxt[nn++] = ns;
        }
      }
    }
    n = nn;
  }
  for (uint32_t k = 0; k < n; k++)
    if (!u8_reach(C, front[p->n & 1][k], d)) return false;
  return true;
}

/* A few characters no word, digit or space class holds (and one letter): a state that covers
 * every character keeps each of them (or its first max_len bytes) alive, so one that dies on
 * one is refused in a few steps, before the search makes the states of every UTF-8 tail (a
 * Unicode \w lexeme's: most characters, not all). */
static const uint8_t U8_PROBES[][5] = {
  {2, 0xC3, 0x97}, {2, 0xC3, 0xA9}, {3, 0xE2, 0x80, 0x94}, {4, 0xF0, 0x9F, 0x98, 0x80},
};

bool aici_utf8_covers(aici_byte_step_fn step, void *ctx, const uint8_t *cls, uint32_t start,
                      const uint32_t *ascii, uint32_t max_len) {
  for (uint32_t k = 0; k < sizeof U8_PROBES / sizeof U8_PROBES[0]; k++) {
    uint32_t st = start;
    for (uint32_t i = 0; i < U8_PROBES[k][0] && i < max_len && st; i++) st = step(ctx, st, U8_PROBES[k][1 + i]);
    if (!st) return false;
  }
  u8cover_t *C = aici_malloc(sizeof *C);
  uint8_t reps[128];
  uint32_t nr = 0, seen[8] = {0};
  for (uint32_t b = 0; b < 128; b++) {
    uint32_t c = cls[b];
    if (!((ascii[b >> 5] >> (b & 31)) & 1) || ((seen[c >> 5] >> (c & 31)) & 1)) continue;
    seen[c >> 5] |= 1u << (c & 31);
    reps[nr++] = (uint8_t)b;
  }
  C->step = step, C->ctx = ctx, C->cls = cls, C->n = 0, C->steps = 0, C->qh = C->qt = 0;
  bool ok = u8_reach(C, start, 0);
  while (ok && C->qh < C->qt) {
    uint32_t k = C->queue[C->qh++], st = C->st[k], d = C->dep[k], left = max_len > d ? max_len - d : 0;
    for (uint32_t r = 0; r < nr && ok && left; r++) {
      uint32_t ns = step(ctx, st, reps[r]);
      ok = ns && ++C->steps <= U8_COVER_STEPS && u8_reach(C, ns, d + 1);
    }
    for (uint32_t p = 0; p < AICI_N_U8_PATS && ok && left; p++)
      ok = u8_tail(C, st, &AICI_U8_PATS[p], left, d + AICI_U8_PATS[p].n);
  }
  aici_free(C);
  return ok;
}
