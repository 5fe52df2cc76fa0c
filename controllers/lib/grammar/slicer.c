/* slicer.c - the lexer-only parts of masks (see matcher_impl.h): the parts cache, the slices a
 * lexer state covers (llguidance's slicer, by byte sets), the plain trie walk, and the walks
 * that build a part's tokens and emission edges. */
#include "matcher_impl.h"

/* ---- masks ------------------------------------------------------------------------------
 * A mask is built from *parts*. The part of (lexer state L, trie subtree T) is what the lexer
 * alone decides about T's tokens from L: the tokens that stay inside the current lexeme, and the
 * *emission edges*, nodes of T whose byte the lexeme cannot take where the lexer state before it
 * accepts (a lexeme ends there). Parts depend on no parser state, so they are cached: the root
 * part per lexer state (with the SDK's slices), and below each edge the part of the subtree
 * that the next lexeme starts (per lexer state after the edge's byte and node), so that a
 * token crossing a boundary costs a parser step per distinct (lexer state, byte) group, not a
 * walk of its subtree. Applying a part: its tokens, then per edge group one parser gm_step (most
 * groups die at once: the byte starts no lexeme the parser allows), and for each live edge the
 * part below it, recursively. */
static uint32_t part_hash(uint32_t lex, uint32_t node, const aici_trie_t *base) {
  uint32_t h = lex * 0x9E3779B1u ^ node * 0x85EBCA77u ^ (uint32_t)(uintptr_t)base * 0xC2B2AE3Du;
  return h ^ (h >> 15);
}

static part_t *part_find(parts_t *P, uint32_t lex, uint32_t node, const aici_trie_t *base) {
  if (!P->cap) return 0;
  for (uint32_t i = part_hash(lex, node, base) & (P->cap - 1);; i = (i + 1) & (P->cap - 1)) {
    part_t *c = P->tab[i];
    if (!c) return 0;
    if (c->lex == lex && c->node == node && c->base == base) return c;
  }
}

static void part_insert(parts_t *P, part_t *c) {
  if ((P->n + 1) * 2 > P->cap) {
    uint32_t cap = P->cap ? P->cap * 2 : 256;
    part_t **t = aici_calloc(cap, sizeof(part_t *));
    for (uint32_t k = 0; k < P->cap; k++)
      if (P->tab[k]) {
        uint32_t i = part_hash(P->tab[k]->lex, P->tab[k]->node, P->tab[k]->base) & (cap - 1);
        while (t[i]) i = (i + 1) & (cap - 1);
        t[i] = P->tab[k];
      }
    aici_free(P->tab);
    P->tab = t, P->cap = cap;
    P->bytes += cap * (uint32_t)sizeof(part_t *) / 2;
  }
  uint32_t i = part_hash(c->lex, c->node, c->base) & (P->cap - 1);
  while (P->tab[i]) i = (i + 1) & (P->cap - 1);
  P->tab[i] = c;
  P->n++;
}

#define COVER_STATES 64u               /* lexer states a slice check follows before giving up */

/* The largest byte set C such that every string over C keeps `lex` alive (false: none worth a
 * slice, or too many states to check). Then the tokens whose bytes lie in C are inside the
 * lexeme wholesale (the SDK's slice), and only the other tokens (its rest trie) are walked. */
static bool lex_cover(gr_matcher_t *m, uint32_t lex, uint32_t *cover) {
  /* over byte classes: the bytes of a class lead every lexer state to the same state */
  uint32_t list[COVER_STATES], n = 1, nc = m->n_cls;
  uint8_t in[256];
  list[0] = lex;
  __builtin_memset(in, 1, nc);
  for (uint32_t i = 0; i < n; i++) {
    uint32_t st = list[i];
    for (uint32_t c = 0; c < nc; c++) {
      if (!in[c]) continue;
      uint32_t ns = gm_lex_next(m, st, m->cls_bytes[m->cls_off[c]]);
      if (!ns) { in[c] = 0; continue; }
      bool seen = false;
      for (uint32_t k = 0; k < n && !seen; k++) seen = list[k] == ns;
      if (!seen) {
        if (n == COVER_STATES) return false;
        list[n++] = ns;
      }
    }
  }
  uint32_t count = 0;
  for (int w = 0; w < 8; w++) cover[w] = 0;
  for (uint32_t c = 0; c < nc; c++)
    if (in[c])
      for (uint32_t k = m->cls_off[c], e = m->cls_off[c + 1]; k < e; k++, count++)
        cover[m->cls_bytes[k] >> 5] |= 1u << (m->cls_bytes[k] & 31);
  return count >= 8;
}

#define ROOT_RENT 4u                   /* whole tries of root walks before a cover slice is built */

/* Slices made once per tokenizer (gr_prepare_tokenizer, in the init: every request starts with
 * them from the snapshot): the SDK's standard slices (aici_trie_std_slices), byte sets for the
 * identifiers' bytes and UTF-8 slices, the tokens made of valid UTF-8 characters, each ASCII one
 * in a set A and any non-ASCII one, the last possibly cut short. No byte set describes the latter,
 * and they are what text lexemes cover ([^<>]+, a string's body, (.|\n)* before a stop string):
 * such a lexeme's root part walks only the rest trie. A slice of any C' within a lexer state's
 * cover is exact too (every string over C' is one over C): the largest ready one is taken, and a
 * slice for the exact cover is built (per instance, a pass over the trie) only when none fits. */
static const aici_slice_t *const *std_slices;
static uint32_t n_std;
static const aici_trie_t *std_trie;

/* The space trie: the tokens " " + [0-9A-Z_a-z]..., as a trie of their bytes after the space
 * (aici_trie_prefix), with its byte-set slices. After `%ignore`d whitespace the next lexeme starts
 * at the letter of every " word" token: a run of edges at the space node's word children is the
 * next lexeme's root part over this trie (gm_space_run), slice and all, not a walk of each word
 * child's subtree (the space subtree is 40-60 % of a byte-level BPE trie). Per trie a part may
 * walk (the base trie, and the standard slices' rest tries whose space node keeps every word
 * child whole: a slice without the space byte), sp_kid[b] is the node of the space node's child
 * b (0: none, or b not a word byte): the same subtrees in each, so one space trie serves them all. */
#define SP_TRIES 12u
static const aici_trie_t *sp_trie;
static const aici_slice_t *const *sp_slices;
static uint32_t n_sp, n_sp_kids, n_sp_tab;
static struct { const aici_trie_t *t; uint32_t kid[256]; } sp_tab[SP_TRIES];

/* Whether node a of trie s and node b of trie t root the same subtree: bytes, tokens, shapes. */
static bool same_subtree(const aici_trie_t *s, uint32_t a, const aici_trie_t *t, uint32_t b) {
  uint32_t n = s->nodes[a].w1 >> 10;
  if (!b || n != t->nodes[b].w1 >> 10) return false;
  for (uint32_t k = 0; k < n; k++)
    if (s->nodes[a + k].w0 != t->nodes[b + k].w0 || s->nodes[a + k].w1 >> 10 != t->nodes[b + k].w1 >> 10) return false;
  return true;
}

/* The space node's word children of trie t into kid[] (by byte); their count, or 0 when one is not
 * as in `like` (a rest trie that lost tokens there), or a byte comes twice. */
static uint32_t space_kids(const aici_trie_t *t, const uint32_t *word, uint32_t *kid, const aici_trie_t *like,
                           const uint32_t *like_kid) {
  const aici_trie_node_t *nodes = t->nodes;
  uint32_t sp = 0, n = 0;
  for (uint32_t c = 1; c < t->n_nodes; c += nodes[c].w1 >> 10)   /* (the largest: a byte-fallback <0x20> is a leaf) */
    if ((nodes[c].w0 & 255) == ' ' && (!sp || nodes[c].w1 >> 10 > nodes[sp].w1 >> 10)) sp = c;
  __builtin_memset(kid, 0, 256 * 4);
  if (!sp) return 0;
  for (uint32_t c = sp + 1, end = sp + (nodes[sp].w1 >> 10); c < end; c += nodes[c].w1 >> 10) {
    uint32_t b = nodes[c].w0 & 255;
    if (!((word[b >> 5] >> (b & 31)) & 1)) continue;
    if (kid[b] || (like && !same_subtree(t, c, like, like_kid[b]))) return 0;
    kid[b] = c, n++;
  }
  return n;
}

void gr_prepare_tokenizer(const aici_trie_t *trie) {
  if (!trie || std_trie == trie) return;
  std_trie = trie;
  std_slices = aici_trie_std_slices(trie, true, &n_std);
  uint32_t word[8] = {0};
  aici_range_bits("0-9A-Z_a-z", word);
  sp_trie = 0, n_sp_tab = 0;
  n_sp_kids = space_kids(trie, word, sp_tab[0].kid, 0, 0);
  if (!n_sp_kids) return;
  sp_trie = aici_trie_prefix(trie, (const uint8_t *)" ", 1, word, &sp_slices, &n_sp);
  if (!sp_trie || sp_trie->n_root_kids != n_sp_kids) { sp_trie = 0; return; }
  sp_tab[n_sp_tab++].t = trie;
  for (uint32_t k = 0; k < n_std && n_sp_tab < SP_TRIES; k++)
    if (space_kids(&std_slices[k]->rest, word, sp_tab[n_sp_tab].kid, trie, sp_tab[0].kid) == n_sp_kids)
      sp_tab[n_sp_tab++].t = &std_slices[k]->rest;
}

/* Which sp_tab entry describes trie t (-1: none). */
static int sp_find(const aici_trie_t *t) {
  for (uint32_t k = 0; k < n_sp_tab; k++)
    if (sp_tab[k].t == t) return (int)k;
  return -1;
}

bool gm_space_edge(const part_t *c, const edge_t *e) {
  int k = sp_find(c->walked);
  return k >= 0 && e->child && sp_tab[k].kid[e->key & 255] == e->child;
}

uint32_t gm_space_kids(void) { return n_sp_kids; }
const aici_trie_t *gm_space_trie(void) { return sp_trie; }

/* Whether every string over byte set `bytes` keeps `lex` alive (false also past COVER_STATES). */
static bool lex_covers(gr_matcher_t *m, uint32_t lex, const uint32_t *bytes) {
  uint32_t list[COVER_STATES], n = 1, nc = 0;
  uint8_t reps[256];                   /* one byte per class that meets `bytes` */
  for (uint32_t c = 0; c < m->n_cls; c++)
    for (uint32_t k = m->cls_off[c], e = m->cls_off[c + 1]; k < e; k++)
      if ((bytes[m->cls_bytes[k] >> 5] >> (m->cls_bytes[k] & 31)) & 1) { reps[nc++] = m->cls_bytes[k]; break; }
  list[0] = lex;
  for (uint32_t i = 0; i < n; i++)
    for (uint32_t c = 0; c < nc; c++) {
      uint32_t ns = gm_lex_next(m, list[i], reps[c]);
      if (!ns) return false;
      bool seen = false;
      for (uint32_t k = 0; k < n && !seen; k++) seen = list[k] == ns;
      if (!seen) {
        if (n == COVER_STATES) return false;
        list[n++] = ns;
      }
    }
  return true;
}

static uint32_t lex_step(void *m, uint32_t lex, uint8_t b) { return gm_lex_next(m, lex, b); }

/* Whether every string of characters, ASCII ones in `ascii` (128 bits) and any non-ASCII one,
 * up to the slice's longest token (which may end inside a character), keeps `lex` alive: the
 * SDK's check over the lexer's byte classes. */
static bool lex_covers_utf8(gr_matcher_t *m, uint32_t lex, const uint32_t *ascii, uint32_t max_len) {
  return aici_utf8_covers(lex_step, m, m->bcls, lex, ascii, max_len);
}

/* The largest ready slice whose byte set keeps `lex` alive (NULL: none). lex_cover's greedy set
 * can miss it (a state where only digits live, NUMBER's, shrinks it to [0-9] though [a-z] keeps
 * NAME's alive), so each ready set is checked on its own first. */
static const aici_slice_t *std_slice(gr_matcher_t *m, const aici_trie_t *trie, uint32_t lex) {
  const aici_slice_t *best = 0;
  const aici_slice_t *const *list = trie == std_trie ? std_slices : trie == sp_trie ? sp_slices : 0;
  uint32_t n = trie == std_trie ? n_std : trie == sp_trie ? n_sp : 0;
  if (!list) return 0;
  for (uint32_t k = 0; k < n; k++) {
    const aici_slice_t *sl = list[k];
    if ((!best || sl->n_tokens > best->n_tokens)
        && (sl->utf8 ? lex_covers_utf8(m, lex, sl->bytes, sl->max_len) : lex_covers(m, lex, sl->bytes)))
      best = sl;
  }
  return best;
}

/* The largest standard byte-set slice within the cover, else the cover's own slice: one made
 * already, or (`build`) made now, a few ms (per instance: a pass over the trie). */
static const aici_slice_t *cover_slice(const aici_trie_t *trie, const uint32_t *cover, bool build) {
  const aici_slice_t *best = 0;
  if (std_trie == trie)
    for (uint32_t k = 0; k < n_std; k++) {
      const aici_slice_t *sl = std_slices[k];
      bool sub = !sl->utf8;            /* byte sets: every string over one within the cover */
      for (int w = 0; w < 8 && sub; w++) sub = !(sl->bytes[w] & ~cover[w]);
      if (sub && (!best || sl->n_tokens > best->n_tokens)) best = sl;
    }
  return best ? best : build ? aici_trie_slice(trie, cover) : aici_trie_slice_made(trie, cover);
}

/* The general walk over nodes [p, end) of the trie, the parent's position being `top`; with
 * `rec`, each token it allows is also recorded (rec_push). */
void gm_walk(gr_matcher_t *m, const aici_trie_t *trie, uint32_t p, uint32_t end, pos_t top, uint32_t *mask,
                 uint32_t vocab, pos_t *stack, parts_t *rec) {
  const aici_trie_node_t *nodes = trie->nodes;
  bool top_level = p == 1;             /* the whole trie: its root's children start tokens */
  uint32_t sp = 1;
  stack[0] = top;
  while (p < end) {
    uint32_t w0 = nodes[p].w0, w1 = nodes[p].w1, tok = w0 >> 8;
    pos_t q = stack[sp - 1];
    ST(walk_nodes);
    const int32_t *row = m->ls[q.lex].row;
    int32_t ns = row ? row[w0 & 255] : -1;
    bool live;
    if (ns > 0) {                      /* the lexeme goes on: no parser work */
      q.lex = (uint32_t)ns, q.at_start = false;
      live = true;
    } else {
      ST(walk_steps);
      m->tok_start = top_level && sp == 1;
      live = gm_step(m, &q, (uint8_t)(w0 & 255)) && !m->overflow;
      m->overflow = m->tok_start = false;
    }
    if (live && tok < vocab) {
      mask[tok >> 5] |= 1u << (tok & 31);
      if (rec) gm_rec_push(rec, tok);
    }
    if (live && (w1 >> 10) > 1) {
      stack[sp++] = q;
      p++;
    } else {
      p += w1 >> 10;
      sp -= w1 & 1023;
    }
  }
}

static void sort_edges(edge_t *e, uint32_t n) {   /* shellsort by key (stable enough: keys only) */
  static const uint32_t gaps[] = {701, 301, 132, 57, 23, 10, 4, 1};
  for (uint32_t g = 0; g < 8; g++)
    for (uint32_t i = gaps[g]; i < n; i++) {
      edge_t t = e[i];
      uint32_t j = i;
      for (; j >= gaps[g] && e[j - gaps[g]].key > t.key; j -= gaps[g]) e[j] = e[j - gaps[g]];
      e[j] = t;
    }
}

/* The lexer-only walk of nodes [p, end) of `t` from lexer state `lex`: tokens inside the lexeme
 * into the list P->tmp (count *n_toks), or, once they outnumber a set's words, into the new set
 * *grown (else NULL); edges into P->etmp (*n_edges). */
static void lex_walk(gr_matcher_t *m, const aici_trie_t *t, uint32_t p, uint32_t end, uint32_t lex, bool top,
                     aici_tokset_t **grown, uint32_t vocab, uint32_t *n_toks, uint32_t *n_edges) {
  /* top: a root part of a token trie, its root's children start tokens (EDGE_TOP); the space
   * trie's root children follow the space */
  parts_t *P = m->parts;
  uint32_t *mask = 0, nw = (vocab + 31) / 32;
  *grown = 0;
  const aici_trie_node_t *nodes = t->nodes;
  if (P->cap_lstack < t->max_depth + 2) {
    P->cap_lstack = t->max_depth + 2;
    P->lstack = aici_realloc(P->lstack, P->cap_lstack * 4);
  }
  /* the list holds at most nw tokens (then a set): room for them all, no check per token */
  if (P->cap_tmp < nw + 1) P->cap_tmp = nw + 1, P->tmp = aici_realloc(P->tmp, P->cap_tmp * 4);
  /* the top's state, its row and whether it accepts stay in locals: they change on a push or a
   * pop only, not between siblings */
  uint32_t *stack = P->lstack, *tmp = P->tmp, sp = 1, nt = 0, ne = 0, from = lex;
#ifdef GR_STATS
  uint32_t lp0 = st.lp_nodes, p0 = p - 1;
#endif
  const int32_t *row = gm_lex_row(m, from);
  bool acc = m->ls[from].n_acc != 0;
  stack[0] = lex;
  while (p < end) {
    uint32_t w0 = nodes[p].w0, w1 = nodes[p].w1, tok = w0 >> 8;
    ST(lp_nodes);
    int32_t r = row[w0 & 255];
    uint32_t ns = r >= 0 ? (uint32_t)r : gm_lex_next(m, from, (uint8_t)(w0 & 255));
    if (ns) {
      if (tok < vocab) {
        if (mask) mask[tok >> 5] |= 1u << (tok & 31);
        else if (nt == nw) {           /* a set is smaller than the list from here on */
          *grown = aici_tokset_new();
          mask = (*grown)->words;
          for (uint32_t k = 0; k < nt; k++) mask[tmp[k] >> 5] |= 1u << (tmp[k] & 31);
          mask[tok >> 5] |= 1u << (tok & 31);
        } else tmp[nt++] = tok;
      }
      if ((w1 >> 10) > 1) {
        stack[sp++] = from = ns;
        const lstate_t *s = &m->ls[ns];  /* (ls may have moved: read it after gm_lex_next) */
        row = s->row ? s->row : gm_lex_row(m, ns);
        acc = s->n_acc != 0;
        p++;
        continue;
      }
    } else if (acc) {
      if (ne == P->cap_etmp) P->cap_etmp = P->cap_etmp ? 2 * P->cap_etmp : 256, P->etmp = aici_realloc(P->etmp, P->cap_etmp * sizeof(edge_t));
      P->etmp[ne++] = (edge_t){(uint32_t)(sp == 1 && top) << 31 | from << 8 | (w0 & 255), p};
    }
    p += w1 >> 10;
    if (w1 & 1023) {
      sp -= w1 & 1023;
      if (p >= end) break;             /* the subtree's last node pops past its root */
      from = stack[sp - 1];
      const lstate_t *s = &m->ls[from];
      row = s->row;
      acc = s->n_acc != 0;
    }
  }
  *n_toks = nt, *n_edges = ne;
#ifdef GR_STATS
  if (st.lp_nodes - lp0 >= 4096)      /* the big walks: which trie, from which node and state */
    aici_logf("WALK %s node=%u lex=%u nodes=%u edges=%u toks=%u\n", t == std_trie ? "base" : t == sp_trie ? "space"
              : "rest", p0, lex, st.lp_nodes - lp0, ne, nt);
#endif
}

/* Within each run of one lexer state, the edges at the space node's word children last (in
 * byte order), so that gm_space_run finds them as the run's tail. */
static void space_last(const part_t *c, edge_t *e, uint32_t n) {
  edge_t tmp[256];
  for (uint32_t i = 0, run; i < n; i = run) {
    uint32_t ns = 0, w = i;
    for (run = i; run < n && e[run].key >> 8 == e[i].key >> 8; run++)
      if (gm_space_edge(c, &e[run])) tmp[ns++] = e[run];   /* one node per byte: ns <= 64 */
      else e[w++] = e[run];
    __builtin_memcpy(e + w, tmp, ns * sizeof(edge_t));
  }
}

static part_t *part_new(gr_matcher_t *m, uint32_t lex, uint32_t node, const aici_trie_t *base, const aici_trie_t *walked,
                        uint32_t n_edges) {
  parts_t *P = m->parts;
  part_t *c = aici_calloc(1, sizeof(part_t));
  c->lex = lex, c->node = node, c->base = base, c->walked = walked;
  sort_edges(P->etmp, n_edges);
  if (sp_find(walked) >= 0) space_last(c, P->etmp, n_edges);
  c->n_edges = n_edges;
  if (n_edges) {
    c->edges = aici_malloc(n_edges * sizeof(edge_t));
    __builtin_memcpy(c->edges, P->etmp, n_edges * sizeof(edge_t));
  }
  P->bytes += (uint32_t)sizeof(part_t) + n_edges * (uint32_t)sizeof(edge_t);
  part_insert(P, c);
  return c;
}

/* Keeps lex_walk's tokens in part c: its set, or its list P->tmp[0..nt). */
static void part_keep_toks(parts_t *P, part_t *c, uint32_t nt, aici_tokset_t *grown) {
  if (grown) {
    c->own.dense = grown;
    P->bytes += grown->n_words * 4;
  } else if (nt) {
    c->own.toks = aici_malloc(nt * 4);
    __builtin_memcpy(c->own.toks, P->tmp, nt * 4);
    c->own.n_toks = nt;
    P->bytes += nt * 4;
  }
}

/* Tokens t into mask (ORed). */
void gm_toks_or(const toks_t *t, uint32_t *mask) {
  if (t->dense) ST(dense_or);
  STN(list_toks, t->n_toks);
  if (t->dense) {                      /* restrict: the compiler vectorizes it (a mask is ~5k words) */
    uint32_t *restrict d = mask;
    const uint32_t *restrict src = t->dense->words;
    for (uint32_t w = 0, n = t->dense->n_words; w < n; w++) d[w] |= src[w];
  }
  for (uint32_t k = 0; k < t->n_toks; k++) mask[t->toks[k] >> 5] |= 1u << (t->toks[k] & 31);
}

/* The root part of lexer state `lex` (NULL: too many cached). It refers to its slice (the SDK
 * keeps it) and holds only the other tokens, mostly a short list: a first visit costs no
 * vocabulary-sized copy or allocation. */
part_t *gm_root_part(gr_matcher_t *m, const aici_trie_t *trie, uint32_t lex) {
  parts_t *P = m->parts;
  part_t *c = part_find(P, lex, 0, trie);
  if (c || P->n_roots >= PART_ROOTS_MAX || P->bytes >= PART_BYTES_MAX) return c;
  ST(lp);
  /* every token starts the next lexeme: no walk, no edges (one trie per matcher has them: the
   * unions they share assume it) */
  if ((!P->top_trie || P->top_trie == trie) && gm_lex_eager(m, lex)) {
    if (!P->top_trie) {
      /* more than 256 when a byte string has several ids (byte fallback: <0x41> and "A"), the
       * extra ids being leaf siblings with the same byte: counted first */
      uint32_t n = 0;
      for (uint32_t p = 1; p < trie->n_nodes; p += trie->nodes[p].w1 >> 10) n++;
      P->top = aici_malloc((n ? n : 1) * sizeof(edge_t));
      for (uint32_t p = 1; p < trie->n_nodes; p += trie->nodes[p].w1 >> 10)
        P->top[P->n_top++] = (edge_t){EDGE_TOP | (trie->nodes[p].w0 & 255), p};
      P->top_trie = trie;
    }
    c = part_new(m, lex, 0, trie, trie, 0);
    c->ends = true;
    P->n_roots++;
    return c;
  }
  uint32_t cover[8], nt, ne;
  const aici_trie_t *walked = trie;
  const aici_slice_t *sl = std_slice(m, trie, lex);
  /* A root part is walked once per lexer state, so the cover's own slice saves one walk (and
   * those of later states with the same cover) for a build that costs several: ski rental, as
   * the regex constraint's: built once root walks it would have cut short visited 4 tries. */
  if (!sl && lex_cover(m, lex, cover)) {
    sl = cover_slice(trie, cover, P->rent >= ROOT_RENT * (uint64_t)trie->n_nodes);
    if (!sl) P->rent += trie->n_nodes;
  }
  if (sl) {                            /* the slice's tokens wholesale, then walk its rest trie */
    ST(slices);
    walked = &sl->rest;
  }
  aici_tokset_t *grown;
  lex_walk(m, walked, 1, walked->n_nodes, lex, trie != sp_trie, &grown, trie->vocab, &nt, &ne);
#ifdef GR_STATS
  if (walked->n_nodes >= 4096)
    aici_logf("WALK root of lex=%u over %s: slice %s%u %u %u %u (%u tokens), %u std slices\n", lex,
              trie == sp_trie ? "space" : "base", !sl ? "none " : sl->utf8 ? "utf8 " : "bytes ", sl ? sl->bytes[0] : 0,
              sl ? sl->bytes[1] : 0, sl ? sl->bytes[2] : 0, sl ? sl->bytes[3] : 0, sl ? sl->n_tokens : 0,
              trie == sp_trie ? n_sp : n_std);
#endif
  c = part_new(m, lex, 0, trie, walked, ne);
  c->slice = sl;
  part_keep_toks(P, c, nt, grown);
  P->n_roots++;
  return c;
}

/* The root part of lexer state `lex` if it takes a slice whose rest trie has at most max_rest
 * nodes (NULL: none, or none made yet and no such standard slice covers it: no walk is made to
 * find out). */
part_t *gm_root_part_sliced(gr_matcher_t *m, const aici_trie_t *trie, uint32_t lex, uint32_t max_rest) {
  part_t *c = part_find(m->parts, lex, 0, trie);
  if (!c) {
    const aici_slice_t *sl = gm_lex_eager(m, lex) ? 0 : std_slice(m, trie, lex);
    if (!sl || sl->rest.n_nodes > max_rest) return 0;
    c = gm_root_part(m, trie, lex);
  }
  return c && c->slice && c->slice->rest.n_nodes <= max_rest ? c : 0;
}

/* The part below edge node `ch` of trie `t`, the next lexeme in lexer state `lex` (NULL: the
 * memory budget is spent; the caller walks). */
part_t *gm_sub_part(gr_matcher_t *m, const aici_trie_t *t, uint32_t ch, uint32_t lex, uint32_t vocab) {
  parts_t *P = m->parts;
  part_t *c = part_find(P, lex, ch, t);
  if (c || P->bytes >= PART_BYTES_MAX) return c;
  uint32_t nt, ne, size = t->nodes[ch].w1 >> 10;
  aici_tokset_t *grown;
  lex_walk(m, t, ch + 1, ch + size, lex, false, &grown, vocab, &nt, &ne);
  c = part_new(m, lex, ch, t, t, ne);
  part_keep_toks(P, c, nt, grown);
  return c;
}
