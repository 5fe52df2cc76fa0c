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
 * The vocabulary split by byte set (the idea of llguidance's slicer, reduced to byte sets):
 * each token goes to the first slice whose byte set holds all its bytes, and each slice gets its
 * own sub-trie and token list. A recognizer that provably accepts every string over a slice's
 * byte set from its current state (e.g. inside [^"]* or \w+) adds the slice's tokens wholesale
 * instead of walking them. Built once, from the trie alone. */
static aici_slice_t slices[AICI_N_SLICES];
static bool slices_built;

static void slice_bytes(uint32_t q, uint32_t *set) {
  __builtin_memset(set, 0, 32);
#define ADD(lo, hi) for (unsigned b = (lo); b <= (hi); b++) set[b >> 5] |= 1u << (b & 31)
  switch (q) {
    case 0: ADD('0', '9'); break;
    case 1: ADD('a', 'z'); break;
    case 2: ADD('a', 'z'); ADD('A', 'Z'); ADD('0', '9'); ADD('_', '_'); break;
    case 3: ADD('a', 'z'); ADD(' ', ' '); break;
    case 4: ADD('a', 'z'); ADD('A', 'Z'); ADD('0', '9'); ADD('_', '_'); ADD(' ', ' '); break;
    case 5: ADD(0x20, 0x7e); break;
    case 6: ADD(0x20, 0xff); break;
    default: ADD(0, 255);
  }
#undef ADD
  if (q == 5 || q == 6) set['"' >> 5] &= ~(1u << ('"' & 31)), set['\\' >> 5] &= ~(1u << ('\\' & 31));
}

const aici_slice_t *aici_trie_slices(const aici_trie_t *tr) {
  if (slices_built) return slices;
  uint32_t n = tr->n_nodes;
  uint8_t member[256] = {0};
  for (uint32_t q = 0; q < AICI_N_SLICES; q++) {
    slice_bytes(q, slices[q].bytes);
    for (int b = 0; b < 256; b++)
      if ((slices[q].bytes[b >> 5] >> (b & 31)) & 1) member[b] |= (uint8_t)(1u << q);
  }
  /* forward: each node's depth and its token's slice (own: one bit, 0 for no token) */
  uint8_t *own = aici_calloc(n, 1), *sub = aici_calloc(n, 1);
  uint16_t *depth = aici_malloc(n * 2);
  uint8_t ok[1025];
  ok[0] = 0xff;
  depth[0] = 0;
  uint32_t d = 1;
  for (uint32_t p = 1; p < n; p++) {
    uint32_t w0 = tr->nodes[p].w0, w1 = tr->nodes[p].w1;
    depth[p] = (uint16_t)d;
    ok[d] = ok[d - 1] & member[w0 & 255];
    if ((w0 >> 8) < tr->vocab) own[p] = (uint8_t)(ok[d] & -ok[d]);
    d = (w1 >> 10) > 1 ? d + 1 : d - (w1 & 1023);
  }
  /* backward: which slices occur in each subtree */
  for (uint32_t p = n - 1; p >= 1; p--) {
    uint8_t m = own[p];
    uint32_t end = p + (tr->nodes[p].w1 >> 10);
    for (uint32_t c = p + 1; c < end; c += tr->nodes[c].w1 >> 10) m |= sub[c];
    sub[p] = m;
  }
  uint32_t *stack = aici_malloc(1025 * 4);
  for (uint32_t q = 0; q < AICI_N_SLICES; q++) {
    aici_slice_t *s = &slices[q];
    uint8_t bit = (uint8_t)(1u << q);
    uint32_t cnt = 1, ntok = 0;
    for (uint32_t p = 1; p < n; p++) cnt += (sub[p] & bit) != 0, ntok += own[p] == bit;
    aici_trie_node_t *out = aici_malloc(cnt * sizeof *out);
    uint32_t *od = aici_malloc(cnt * 4);
    out[0].w0 = tr->scratch_token << 8, od[0] = 0;
    uint32_t k = 1;
    for (uint32_t p = 1; p < n; p++) {
      if (!(sub[p] & bit)) continue;
      uint32_t tok = own[p] == bit ? tr->nodes[p].w0 >> 8 : tr->scratch_token;
      out[k].w0 = (tr->nodes[p].w0 & 255) | (tok << 8);
      od[k++] = depth[p];
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
    s->nodes = out, s->n_nodes = cnt;
    /* the slice's tokens as sparse mask words */
    s->n_words = 0;
    uint32_t nw = (tr->vocab + 31) / 32;
    uint32_t *words = aici_calloc(nw, 4);
    for (uint32_t p = 1; p < n; p++)
      if (own[p] == bit) {
        uint32_t t = tr->nodes[p].w0 >> 8;
        words[t >> 5] |= 1u << (t & 31);
      }
    for (uint32_t i = 0; i < nw; i++) s->n_words += words[i] != 0;
    s->word_idx = aici_malloc(s->n_words * 4 + 4);
    s->word_bits = aici_malloc(s->n_words * 4 + 4);
    for (uint32_t i = 0, j = 0; i < nw; i++)
      if (words[i]) s->word_idx[j] = i, s->word_bits[j++] = words[i];
    s->n_tokens = ntok;
    s->dense = s->n_words * 4 > nw ? words : 0;   /* many words: a dense OR vectorizes better */
    if (!s->dense) aici_free(words);
    aici_free(od);
  }
  aici_free(stack), aici_free(own), aici_free(sub), aici_free(depth);
  slices_built = true;
  return slices;
}
