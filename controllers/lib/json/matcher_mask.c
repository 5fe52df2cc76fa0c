/* The matcher's masks (see matcher.h): free strings by token slices, the trie walk over a
 * configuration set, length-counted strings, and the per-sequence mask cache. */
#include "matcher_int.h"

/* ---- free strings ---------------------------------------------------------------------------
 * Inside a string without length or pattern, every character leads back to the same state: the
 * tokens made of whole such characters (~145k of Qwen2's 151k) are then allowed wholesale and
 * only the others (quotes, escapes, partial characters: ~6k) are walked. */
static bool in_string_slice(void *ctx, const uint8_t *b, uint32_t n) {
  (void)ctx;
  for (uint32_t i = 0; i < n;) {
    uint8_t c = b[i];
    if (c < 0x80) {
      if (c < 0x20 || c == '"' || c == '\\') return false;
      i++;
      continue;
    }
    uint32_t k = c >= 0xc2 && c < 0xe0 ? 1 : c >= 0xe0 && c < 0xf0 ? 2 : c >= 0xf0 && c < 0xf5 ? 3 : 0;
    if (!k || i + k >= n) return false;   /* a partial character */
    uint8_t c1 = b[i + 1];
    uint8_t lo = c == 0xe0 ? 0xa0 : c == 0xf0 ? 0x90 : 0x80, hi = c == 0xed ? 0x9f : c == 0xf4 ? 0x8f : 0xbf;
    if (c1 < lo || c1 > hi) return false;
    for (uint32_t j = 2; j <= k; j++)
      if ((b[i + j] & 0xc0) != 0x80) return false;
    i += k + 1;
  }
  return true;
}

/* UTF-8 lead byte ranges: lead bytes, second byte range, continuation bytes in all. */
static const uint8_t LEADS[8][5] = {
  {0xc2, 0xdf, 0x80, 0xbf, 1}, {0xe0, 0xe0, 0xa0, 0xbf, 2}, {0xe1, 0xec, 0x80, 0xbf, 2}, {0xed, 0xed, 0x80, 0x9f, 2},
  {0xee, 0xef, 0x80, 0xbf, 2}, {0xf0, 0xf0, 0x90, 0xbf, 3}, {0xf1, 0xf3, 0x80, 0xbf, 3}, {0xf4, 0xf4, 0x80, 0x8f, 3}};

/* One byte per byte class of the machine's regex within [lo, hi] (`str`: not " or \): the probes
 * below step on these only (bytes of one class lead every state to the same state). */
static void fill_reps(const uint8_t *cls, uint32_t lo, uint32_t hi, bool str, reps_t *out) {
  uint32_t seen[8] = {0};
  out->n = 0;
  for (uint32_t b = lo; b <= hi; b++) {
    if (str && (b == '"' || b == '\\')) continue;
    uint8_t c = cls[b];
    if ((seen[c >> 5] >> (c & 31)) & 1) continue;
    seen[c >> 5] |= 1u << (c & 31);
    out->b[out->n++] = (uint8_t)b;
  }
}

static const char_reps_t *reps_of(matcher_t *M, uint32_t m) {
  if (M->reps[m]) return M->reps[m];
  char_reps_t *R = aici_malloc(sizeof *R);
  const uint8_t *cls = aici_regex_classes(M->re[m], 0);
  fill_reps(cls, 0x20, 0x7f, true, &R->ascii);
  fill_reps(cls, 0x80, 0xbf, false, &R->cont);
  for (uint32_t r = 0; r < 8; r++) {
    fill_reps(cls, LEADS[r][0], LEADS[r][1], false, &R->lead[r]);
    fill_reps(cls, LEADS[r][2], LEADS[r][3], false, &R->second[r]);
  }
  return M->reps[m] = R;
}

/* All k continuation bytes from t lead to s (memo: the states already checked per level). */
static bool conts_to(aici_regex_t *re, const char_reps_t *R, uint32_t t, uint32_t k, uint32_t s, uint32_t memo[3][8],
                     uint32_t *nm) {
  if (!t) return false;
  if (!k) return t == s;
  for (uint32_t i = 0; i < nm[k - 1]; i++)
    if (memo[k - 1][i] == t) return true;
  for (uint32_t i = 0; i < R->cont.n; i++)
    if (!conts_to(re, R, aici_regex_step(re, t, R->cont.b[i]), k - 1, s, memo, nm)) return false;
  if (nm[k - 1] == 8) return false;
  memo[k - 1][nm[k - 1]++] = t;
  return true;
}

static bool string_loop(matcher_t *M, uint32_t m, uint32_t s) {
  uint16_t f = mt_state_info(M, m, s);
  if (f & ST_LOOP_KNOWN) return f & ST_LOOP;
  aici_regex_t *re = M->re[m];
  const char_reps_t *R = reps_of(M, m);
  bool loop = true;
  for (uint32_t i = 0; i < R->ascii.n && loop; i++) loop = aici_regex_step(re, s, R->ascii.b[i]) == s;
  uint32_t memo[3][8], nm[3] = {0, 0, 0};
  for (uint32_t r = 0; r < 8 && loop; r++) {
    for (uint32_t i = 0; i < R->lead[r].n && loop; i++) {
      uint32_t t = aici_regex_step(re, s, R->lead[r].b[i]);
      for (uint32_t j = 0; j < R->second[r].n && loop; j++)
        loop = t && conts_to(re, R, aici_regex_step(re, t, R->second[r].b[j]), LEADS[r][4] - 1u, s, memo, nm);
    }
  }
  M->info[m][s] = (uint16_t)(f | ST_LOOP_KNOWN | (loop ? ST_LOOP : 0));
  return loop;
}

static bool in_short_slice(void *ctx, const uint8_t *b, uint32_t n) {
  uint32_t chars = 0;
  for (uint32_t i = 0; i < n; i++) chars += (b[i] & 0xc0) != 0x80;
  return chars <= SHORT_CHARS && in_string_slice(ctx, b, n);
}

/* The states after one string character from each of `in` (all must be live), deduplicated;
 * false if some character dies or the set outgrows `cap`. Reads rows directly: a row is copied
 * out before another is fetched (fetching may build one and move the table). */
#define PUT(set, n, v) do { uint32_t _v = (v) & ~AICI_REGEX_FINAL, _j = 0; if (!_v) return false; \
    while (_j < (n) && (set)[_j] != _v) _j++; if (_j == (n)) { if ((n) == cap) return false; (set)[(n)++] = _v; } } while (0)

/* Whether none of set[0..n) is a call or a match state (see room_of). */
static bool clean_set(matcher_t *M, uint32_t m, const uint32_t *set, uint32_t n) {
  for (uint32_t i = 0; i < n; i++)
    if (mt_state_info(M, m, set[i]) & (ST_CALLS | ST_ACCEPT)) return false;
  return true;
}

/* The states after the lead range r's continuation bytes from each of set[]. */
static bool conts(matcher_t *M, uint32_t m, const char_reps_t *R, uint32_t *set, uint32_t *n, uint32_t r, uint32_t cap,
                  bool *clean) {
  aici_regex_t *re = M->re[m];
  for (uint32_t level = 0; level < LEADS[r][4]; level++) {
    uint32_t next[PROBE_CAP], nn = 0;
    const reps_t *bytes = level ? &R->cont : &R->second[r];
    for (uint32_t i = 0; i < *n; i++) {
      const uint32_t *row = aici_regex_row(re, set[i]);
      for (uint32_t x = 0; x < bytes->n; x++) PUT(next, nn, row[bytes->b[x]]);
    }
    for (uint32_t i = 0; i < nn; i++) set[i] = next[i];
    *n = nn;
    if (level + 1 < LEADS[r][4]) *clean &= clean_set(M, m, set, nn);
  }
  return true;
}

/* The states after one string character from each of in[] (all live, else false); *clean: and
 * every state met, the results included, is neither a call nor a match. */
static bool char_step(matcher_t *M, uint32_t m, const char_reps_t *R, const uint32_t *in, uint32_t n_in, uint32_t *out,
                      uint32_t *n_out, uint32_t cap, bool *clean) {
  *n_out = 0;
  for (uint32_t i = 0; i < n_in; i++) {
    uint32_t row[256];
    __builtin_memcpy(row, aici_regex_row(M->re[m], in[i]), sizeof row);
    for (uint32_t x = 0; x < R->ascii.n; x++) PUT(out, *n_out, row[R->ascii.b[x]]);
    for (uint32_t r = 0; r < 8; r++) {
      uint32_t a[PROBE_CAP], na = 0;
      for (uint32_t x = 0; x < R->lead[r].n; x++) PUT(a, na, row[R->lead[r].b[x]]);
      *clean &= clean_set(M, m, a, na);
      if (!conts(M, m, R, a, &na, r, PROBE_CAP, clean)) return false;
      for (uint32_t k = 0; k < na; k++) PUT(out, *n_out, a[k]);
    }
  }
  *clean &= clean_set(M, m, out, *n_out);
  return true;
}
#undef PUT

/* Whether some whole string character from t (after the lead byte of range r: k continuation
 * bytes still to come) ends in a live state that is no call and no match. `clean`: every state
 * on the way was neither (else false, said through *clean). */
static bool char_lives(matcher_t *M, uint32_t m, const char_reps_t *R, uint32_t t, uint32_t k, uint32_t r, bool *clean) {
  if (!t) return false;
  if (mt_state_info(M, m, t) & (ST_CALLS | ST_ACCEPT)) *clean = false;
  if (!k) return true;
  const reps_t *bytes = k == LEADS[r][4] ? &R->second[r] : &R->cont;
  for (uint32_t i = 0; i < bytes->n; i++)
    if (char_lives(M, m, R, aici_regex_step(M->re[m], t, bytes->b[i]), k - 1, r, clean)) return true;
  return false;
}

/* Whether no whole string character is live from any of a[], every state met being clean. */
static bool no_char(matcher_t *M, uint32_t m, const char_reps_t *R, const uint32_t *a, uint32_t na) {
  aici_regex_t *re = M->re[m];
  for (uint32_t i = 0; i < na; i++) {
    bool clean = true;
    for (uint32_t x = 0; x < R->ascii.n; x++)
      if (aici_regex_step(re, a[i], R->ascii.b[x])) return false;
    for (uint32_t r = 0; r < 8; r++)
      for (uint32_t x = 0; x < R->lead[r].n; x++)
        if (char_lives(M, m, R, aici_regex_step(re, a[i], R->lead[r].b[x]), LEADS[r][4], r, &clean)) return false;
    if (!clean) return false;
  }
  return true;
}

/* Inside a bounded string, the room left, in characters (cached per state):
 *   ROOM_SHORT  any SHORT_CHARS string characters keep the DFA live (the short-token slice);
 *   0..15       exactly: any string of up to that many characters keeps it live, none longer
 *               does, and no call or match is met on the way (a token of whole string
 *               characters is then allowed iff it has at most that many);
 *   ROOM_NONE   neither. */
static uint32_t room_of(matcher_t *M, uint32_t m, uint32_t s) {
  uint16_t f = mt_state_info(M, m, s);
  if (f & ST_ROOM_KNOWN) return (f >> ROOM_SHIFT) & ROOM_MASK;
  const char_reps_t *R = reps_of(M, m);
  uint32_t a[PROBE_CAP] = {s}, na = 1, b[PROBE_CAP], nb, room = ROOM_SHORT;
  bool clean = true;
  for (uint32_t d = 0; d < SHORT_CHARS; d++) {
    if (!char_step(M, m, R, a, na, b, &nb, PROBE_CAP, &clean)) {
      room = clean && no_char(M, m, R, a, na) ? d : ROOM_NONE;
      break;
    }
    for (uint32_t k = 0; k < nb; k++) a[k] = b[k];
    na = nb;
  }
  M->info[m][s] = (uint16_t)(mt_state_info(M, m, s) | ST_ROOM_KNOWN | room << ROOM_SHIFT);
  return room;
}

/* Whether every string of whole string characters, of any length, keeps the DFA live from s:
 * the states such strings reach from s are at most ANY_CAP, and every string character is live
 * from each of them (a key before its closing quote where any other key may follow, a pattern
 * of "anything but" characters ...). Then every token of the free-string slice is allowed
 * whatever its length (the short-token slice stops at SHORT_CHARS), and the same holds from each
 * of those states: all of them are marked (cached per state, ST_ANY). */
static bool any_string(matcher_t *M, uint32_t m, uint32_t s) {
  uint16_t f = mt_state_info(M, m, s);
  if (f & ST_ANY_KNOWN) return f & ST_ANY;
  const char_reps_t *R = reps_of(M, m);
  uint32_t set[ANY_CAP], n = 1, out[ANY_CAP], n_out;
  bool ok = true, clean = true;
  set[0] = s;
  for (uint32_t i = 0; i < n && ok; i++) {
    ok = char_step(M, m, R, &set[i], 1, out, &n_out, ANY_CAP, &clean);
    for (uint32_t k = 0; k < n_out && ok; k++) {
      uint32_t j = 0;
      while (j < n && set[j] != out[k]) j++;
      if (j < n) continue;
      if (n == ANY_CAP) ok = false;
      else set[n++] = out[k];
    }
  }
  for (uint32_t i = 0; i < (ok ? n : 1); i++) {
    uint16_t g = mt_state_info(M, m, set[i]);
    M->info[m][set[i]] = (uint16_t)(g | ST_ANY_KNOWN | (ok ? ST_ANY : 0));
  }
  return ok;
}

/* What masks share across schemas, per tokenizer: built by json_init (once per tokenizer, in
 * the init snapshot) or, without a snapshot, by the first matcher_prepare. */
static struct {
  aici_slice_t *str_slice, *short_slice;
  uint8_t *nchars;
  uint32_t max_chars;
} tok_tables;

void matcher_prepare_tokenizer(const aici_trie_t *t) {
  if (!tok_tables.str_slice) tok_tables.str_slice = aici_trie_token_slice(t, in_string_slice, 0);
  if (!tok_tables.short_slice) tok_tables.short_slice = aici_trie_token_slice(t, in_short_slice, 0);
  if (!tok_tables.nchars) {
    uint32_t padded = (t->vocab + 31) / 32 * 32;
    uint8_t *nchars = aici_calloc(padded + 16, 1);
    for (uint32_t tok = 0; tok < t->vocab; tok++) {
      uint32_t len, n = 0;
      const uint8_t *b = aici_token_bytes(tok, &len);
      if (!b || !in_string_slice(0, b, len)) continue;
      for (uint32_t i = 0; i < len; i++) n += (b[i] & 0xc0) != 0x80;
      nchars[tok] = (uint8_t)(n < 255 ? n : 255);
      if (n > tok_tables.max_chars) tok_tables.max_chars = n;
    }
    tok_tables.nchars = nchars;
  }
}

void matcher_prepare(matcher_t *M, const aici_trie_t *t) {
  matcher_prepare_tokenizer(t);
  M->str_slice = tok_tables.str_slice, M->short_slice = tok_tables.short_slice, M->nchars = tok_tables.nchars;
  M->max_chars = tok_tables.max_chars, M->longest_token = t->max_depth;
  if (!M->out) {
    M->out = aici_tokset_new();
    M->out_idx = aici_malloc(M->out->n_words * 4 + 4);
    M->out_base = BASE_ZERO, M->out_n = 0, M->out_ent = NO_LIST;
  }
  if (!M->walk) M->walk = aici_malloc((t->max_depth + 2) * sizeof(cset_t));
}

/* ---- masks ---------------------------------------------------------------------------------
 * Two walks of the token trie. The generic one steps a configuration set per node. The mono one
 * follows a single configuration through its machine's DFA rows (one load per node, as the
 * SDK's regex walk) and hands a subtree to the generic walk only where a call or a return may
 * start: most masks (inside strings, keys, numbers) never leave the mono walk. */
static inline bool boundary(matcher_t *M, uint32_t m, uint32_t s, uint32_t parent, bool *fresh) {
  *fresh = !(s < M->info_cap[m] && M->info[m][s]);
  uint16_t f = mt_state_info(M, m, s);
  return (f & ST_CALLS) || ((f & ST_ACCEPT) && parent);
}

static void walk_mono_from(matcher_t *M, const aici_trie_node_t *nodes, const cfg_t *c, uint32_t p, uint32_t end,
                           uint32_t sp0, uint32_t *mask);

/* The generic walk hands a subtree back to the mono walk where its set is one configuration that
 * the mono walk can follow (no length count, no call or return at its state): after a key's
 * closing quote, after a call's first byte, most of what a token spells is then one DFA row per
 * node instead of a set step. Not in the reference mode (its walks stay plain). */
static void walk_generic(matcher_t *M, const aici_trie_node_t *nodes, uint32_t p, uint32_t end, uint32_t sp,
                         uint32_t *mask) {
  cset_t *st = M->walk;
  while (p < end) {
    uint32_t w0 = nodes[p].w0, w1 = nodes[p].w1, tok = w0 >> 8, size = w1 >> 10;
    bool live = matcher_step(M, &st[sp - 1], (uint8_t)w0, &st[sp]), fresh;
    mask[tok >> 5] |= (uint32_t)live << (tok & 31);
    if (live && size > 1) {
      const cfg_t *c = &st[sp].c[0];
      if (st[sp].n == 1 && !M->reference && !M->lc[c->m] && !boundary(M, c->m, c->s, c->parent, &fresh)) {
        cfg_t one = *c;
        walk_mono_from(M, nodes, &one, p + 1, p + size, sp + 1, mask);
      } else {
        sp++, p++;
        continue;
      }
    }
    p += size;
    sp -= w1 & 1023;
  }
}

/* Rows are addressed from the table's base (state 0's row): building a row may move the table,
 * so the base is re-read after anything that can build one. Walks nodes [p, end) (whole
 * subtrees) from depth sp0 (1: the root's children's level; deeper: a subtree the generic walk
 * handed over, whose sets M->walk[0..sp0) stay as they are). */
static void walk_mono_from(matcher_t *M, const aici_trie_node_t *nodes, const cfg_t *c, uint32_t p, uint32_t end,
                           uint32_t sp0, uint32_t *mask) {
  aici_regex_t *re = M->re[c->m];
  uint32_t m = c->m, parent = c->parent, states[1025], sp = sp0;
  states[sp0 - 1] = c->s;
  aici_regex_row(re, c->s);
  const uint32_t *base = aici_regex_row(re, 0), *row = base + (size_t)c->s * 256;
  while (p < end) {
    uint32_t w0 = nodes[p].w0, w1 = nodes[p].w1, tok = w0 >> 8, size = w1 >> 10;
    uint32_t e = row[w0 & 255], ns = e & ~AICI_REGEX_FINAL;
    if ((uint8_t)w0 == CALL_BYTE) ns = 0;
    if (ns) {
      mask[tok >> 5] |= 1u << (tok & 31);
      if (size > 1) {
        uint16_t f = ns < M->info_cap[m] ? M->info[m][ns] : 0;
        if (!f) {
          f = mt_state_info(M, m, ns);
          base = aici_regex_row(re, 0);
        }
        if ((f & ST_CALLS) || ((f & ST_ACCEPT) && parent)) {
          M->walk[sp] = (cset_t){.n = 1, .c = {{m, ns, parent, 0}}};
          walk_generic(M, nodes, p + 1, p + size, sp + 1, mask);
          base = aici_regex_row(re, 0);
        } else if (!(e & AICI_REGEX_FINAL)) {
          states[sp++] = ns;
          row = aici_regex_row(re, ns);      /* builds it if new */
          base = row - (size_t)ns * 256;
          p++;
          continue;
        }
      }
    }
    p += size;
    sp -= w1 & 1023;
    if (p >= end) break;               /* (the last node's pop may leave the subtree's levels) */
    row = base + (size_t)states[sp - 1] * 256;
  }
}

/* The root's children by the SDK's list (t->root_kids): a dead first byte is skipped without
 * reading its node, so a first mask that allows a few first bytes (`{`, `[`, `"`) touches only
 * their subtrees' pages, not one page per root child of a trie in fresh snapshot memory. */
static void walk_mono(matcher_t *M, const aici_trie_t *t, const cfg_t *c, uint32_t *mask) {
  if (!t->root_kids) {
    walk_mono_from(M, t->nodes, c, 1, t->n_nodes, 1, mask);
    return;
  }
  aici_regex_t *re = M->re[c->m];
  for (uint32_t k = 0, nk = t->n_root_kids; k < nk; k++) {
    uint32_t e = t->root_kids[k], b = e & 255, p = e >> 8;
    if (b == CALL_BYTE || !(aici_regex_row(re, c->s)[b] & ~AICI_REGEX_FINAL)) continue;
    walk_mono_from(M, t->nodes, c, p, p + (t->nodes[p].w1 >> 10), 1, mask);
  }
}

/* The generic walk from the root, skipping dead first bytes as walk_mono does. */
static void walk_generic_root(matcher_t *M, const aici_trie_t *t, uint32_t *mask) {
  if (!t->root_kids) {
    walk_generic(M, t->nodes, 1, t->n_nodes, 1, mask);
    return;
  }
  cset_t *st = M->walk;
  for (uint32_t k = 0, nk = t->n_root_kids; k < nk; k++) {
    uint32_t e = t->root_kids[k], p = e >> 8;
    if (!matcher_step(M, &st[0], (uint8_t)e, &st[1])) continue;
    uint32_t tok = t->nodes[p].w0 >> 8, size = t->nodes[p].w1 >> 10;
    mask[tok >> 5] |= 1u << (tok & 31);
    if (size > 1) walk_generic(M, t->nodes, p + 1, p + size, 2, mask);
  }
}

/* The mono walk of a length-counted machine: the count and the tracker ride along the trie path,
 * and a node lives iff its configuration can still end as a valid string (lencount_live), so a
 * subtree dies as soon as no continuation fits. After the closing quote, the generic walk takes
 * the subtree (the caller resumes). */
static void walk_counted(matcher_t *M, const aici_trie_t *t, const cfg_t *c, uint32_t *mask) {
  aici_regex_t *re = M->re[c->m];
  const lencount_t *L = M->lc[c->m];
  uint32_t m = c->m, parent = c->parent, states[1025], counts[1025], sp = 1, p = 1, n = t->n_nodes;
  const aici_trie_node_t *nodes = t->nodes;
  states[0] = c->s, counts[0] = c->n;
  while (p < n) {
    uint32_t w0 = nodes[p].w0, w1 = nodes[p].w1, tok = w0 >> 8, size = w1 >> 10, n2;
    uint8_t b = (uint8_t)w0;
    uint32_t ns = b == CALL_BYTE ? 0 : aici_regex_step(re, states[sp - 1], b);
    if (ns && lencount_next(L, ns, counts[sp - 1], b, &n2)) {
      mask[tok >> 5] |= 1u << (tok & 31);
      if (size > 1) {
        if ((n2 & 15) != LC_END) {
          states[sp] = ns, counts[sp++] = n2;
          p++;
          continue;
        }
        if (parent) {
          M->walk[sp] = (cset_t){.n = 1, .c = {{m, ns, parent, n2}}};
          walk_generic(M, nodes, p + 1, p + size, sp + 1, mask);
        }
      }
    }
    p += size;
    sp -= w1 & 1023;
  }
}

static void walk(matcher_t *M, const aici_trie_t *t, const cset_t *start, uint32_t *mask) {
  if (!M->walk) M->walk = aici_malloc((t->max_depth + 2) * sizeof(cset_t));
  bool fresh;
  if (start->n == 1 && !boundary(M, start->c[0].m, start->c[0].s, start->c[0].parent, &fresh)) {
    if (M->reference) walk_mono_from(M, t->nodes, &start->c[0], 1, t->n_nodes, 1, mask);   /* every node */
    else walk_mono(M, t, &start->c[0], mask);
    return;
  }
  M->walk[0] = *start;
  if (M->reference) walk_generic(M, t->nodes, 1, t->n_nodes, 1, mask);
  else walk_generic_root(M, t, mask);
}

static void sort_set(cset_t *s) {
  for (uint32_t i = 1; i < s->n; i++)
    for (uint32_t j = i; j; j--) {
      cfg_t a = s->c[j - 1], b = s->c[j];
      bool gt = a.m != b.m ? a.m > b.m : a.s != b.s ? a.s > b.s : a.parent != b.parent ? a.parent > b.parent : a.n > b.n;
      if (!gt) break;
      s->c[j - 1] = b, s->c[j] = a;
    }
}

static bool same_set(const cset_t *a, const cset_t *b) {
  if (a->n != b->n) return false;
  for (uint32_t i = 0; i < a->n; i++)
    if (a->c[i].m != b->c[i].m || a->c[i].s != b->c[i].s || a->c[i].parent != b->c[i].parent || a->c[i].n != b->c[i].n)
      return false;
  return true;
}

typedef uint32_t v128u __attribute__((vector_size(16), aligned(4)));
typedef signed char i8x16 __attribute__((vector_size(16)));

/* Vector loops: wasmtime's memory.copy / memory.fill are libcalls that cost more at mask sizes. */
static void copy_words(uint32_t *restrict d, const uint32_t *restrict s, uint32_t n) {
  uint32_t i = 0;
  for (; i + 4 <= n; i += 4) *(v128u *)(d + i) = *(const v128u *)(s + i);
  for (; i < n; i++) d[i] = s[i];
}

static void zero_words(uint32_t *d, uint32_t n) {
  uint32_t i = 0;
  v128u z = {0, 0, 0, 0};
  for (; i + 4 <= n; i += 4) *(v128u *)(d + i) = z;
  for (; i < n; i++) d[i] = 0;
}

static const uint32_t *base_words(const matcher_t *M, uint32_t base) {
  return base == BASE_STR ? M->str_slice->dense : base == BASE_SHORT ? M->short_slice->dense : 0;
}

/* Sets the out buffer to `base`: only the words changed since, when they are known. */
static void out_reset(matcher_t *M, uint32_t base) {
  uint32_t *w = M->out->words, nw = M->out->n_words;
  const uint32_t *b = base_words(M, base);
  if (M->out_n != NO_LIST && M->out_base == base) {
    for (uint32_t i = 0; i < M->out_n; i++) w[M->out_idx[i]] = b ? b[M->out_idx[i]] : 0;
  } else if (b) {
    copy_words(w, b, nw);
  } else {
    zero_words(w, nw);
  }
  M->out_base = base, M->out_n = 0, M->out_ent = NO_LIST;
  w[nw] = 0;
}

/* The words of the out buffer that differ from its base, into out_idx (NO_LIST past `limit`). */
static void out_diff(matcher_t *M, uint32_t limit) {
  const uint32_t *w = M->out->words, *b = base_words(M, M->out_base);
  uint32_t nw = M->out->n_words, n = 0, i = 0;
  v128u z = {0, 0, 0, 0};
  for (; i + 4 <= nw; i += 4) {
    v128u d = *(const v128u *)(w + i) ^ (b ? *(const v128u *)(b + i) : z);
    if (!__builtin_wasm_any_true_v128((i8x16)d)) continue;   /* one v128.any_true: lanes ORed cost 4 extracts */
    if (n + 4 > limit) { M->out_n = NO_LIST; return; }
    for (uint32_t k = 0; k < 4; k++)
      if (d[k]) M->out_idx[n++] = i + k;
  }
  for (; i < nw; i++)
    if (w[i] != (b ? b[i] : 0)) {
      if (n + 1 > limit) { M->out_n = NO_LIST; return; }
      M->out_idx[n++] = i;
    }
  M->out_n = n;
}

/* The configuration set's mask, into the out buffer. */
typedef uint8_t u8x16 __attribute__((vector_size(16), aligned(1)));

/* The tokens of whole string characters, at most `room` of them: from the per-token counts. */
static void count_mask(const uint8_t *nchars, uint32_t room, uint32_t *w, uint32_t nw) {
  u8x16 lim = (u8x16){0} + (uint8_t)room;
  for (uint32_t i = 0; i < nw; i++) {   /* count 0 (not such a token) wraps to 255: never below */
    u8x16 a = *(const u8x16 *)(nchars + 32 * i) - 1, b = *(const u8x16 *)(nchars + 32 * i + 16) - 1;
    w[i] = (uint32_t)__builtin_wasm_bitmask_i8x16((i8x16)(a < lim)) |
           (uint32_t)__builtin_wasm_bitmask_i8x16((i8x16)(b < lim)) << 16;
  }
}

/* A single configuration in a length-counted machine, into the out buffer. Where every string
 * character leads back to its DFA state, the tokens of whole such characters are decided by
 * their character counts (the room the bounds leave, lencount_room) and only the rest of the
 * trie is walked; where every short string keeps the DFA live and the bounds are far, the
 * short-token slice is taken wholesale; elsewhere the whole trie is walked with the count. */
static void compute_counted(matcher_t *M, const aici_trie_t *t, const cfg_t *c) {
  uint32_t room = 0xffffffffu, *w = M->out->words;
  const aici_trie_t *rest = t;
  if (M->reference) {
    out_reset(M, BASE_ZERO);
    M->walk[0] = (cset_t){.n = 1, .c = {*c}};
    walk_generic(M, t->nodes, 1, t->n_nodes, 1, w);
    return;
  }
  if (M->str_slice && (c->n & 15) == LC_IN && string_loop(M, c->m, c->s))
    room = lencount_room(M->lc[c->m], c->s, c->n, M->max_chars);
  if (room >= M->max_chars && room != 0xffffffffu) {
    out_reset(M, BASE_STR);
    rest = &M->str_slice->rest;
  } else if (room < 255) {
    count_mask(M->nchars, room, w, M->out->n_words);
    M->out_base = BASE_ZERO, M->out_n = NO_LIST, M->out_ent = NO_LIST;
    rest = &M->str_slice->rest;
  } else if (room == 0xffffffffu && M->short_slice && (c->n & 15) == LC_IN &&
             lencount_settled(M->lc[c->m], c->n, SHORT_CHARS) && room_of(M, c->m, c->s) == ROOM_SHORT) {
    /* every string of up to SHORT_CHARS characters keeps the DFA live, and the bounds are far
     * enough that none of them can meet one: the short-token slice wholesale */
    out_reset(M, BASE_SHORT);
    rest = &M->short_slice->rest;
  } else {
    out_reset(M, BASE_ZERO);
  }
  walk_counted(M, rest, c, w);
}

/* The configuration set's mask, into the out buffer. */
static void compute(matcher_t *M, const aici_trie_t *t, const cset_t *set) {
  if (set->n == 1 && M->lc[set->c[0].m] && (set->c[0].n & 15) != LC_END) {   /* (closed: the caller's turn) */
    compute_counted(M, t, &set->c[0]);
    M->out->words[M->out->n_words] = 0;
    return;
  }
  const aici_slice_t *sl = 0;
  uint32_t room = ROOM_NONE;
  bool fresh;
  if (set->n == 1 && M->str_slice && !M->reference && !boundary(M, set->c[0].m, set->c[0].s, set->c[0].parent, &fresh)) {
    uint32_t m = set->c[0].m, s = set->c[0].s;
    if (string_loop(M, m, s)) sl = M->str_slice;
    else if (aici_regex_step(M->re[m], s, 'a')) {   /* 'a': a cheap first test */
      room = room_of(M, m, s);
      sl = room == ROOM_SHORT ? (any_string(M, m, s) ? M->str_slice : M->short_slice)
                              : room != ROOM_NONE ? M->str_slice : 0;
    }
  }
  if (room < ROOM_SHORT) {   /* the counts decide the whole-character tokens; the others are walked */
    count_mask(M->nchars, room, M->out->words, M->out->n_words);
    M->out_base = BASE_ZERO, M->out_n = NO_LIST, M->out_ent = NO_LIST;
  } else {
    out_reset(M, sl == M->str_slice ? BASE_STR : sl ? BASE_SHORT : BASE_ZERO);
  }
  walk(M, sl ? &sl->rest : t, set, M->out->words);
  M->out->words[M->out->n_words] = 0;
}

static uint32_t set_hash(const cset_t *s) {
  uint32_t h = s->n;
  for (uint32_t i = 0; i < s->n; i++) h = mt_hash3(h ^ s->c[i].m, s->c[i].s ^ s->c[i].n * 0x9e3779b9u, s->c[i].parent);
  return h;
}

/* Keeps the out buffer's mask as cache entry `e`: its changed words, or a whole copy. */
static void cache_store(matcher_t *M, cache_ent_t *e) {
  uint32_t nw = M->out->n_words;
  out_diff(M, nw / 2);
  e->base = M->out_base;
  if (M->out_n == NO_LIST) {
    e->n = nw, e->idx = 0;
    e->val = aici_malloc(nw * 4);
    copy_words(e->val, M->out->words, nw);
  } else {
    e->n = M->out_n;
    e->idx = aici_malloc(e->n * 4 + 4);
    e->val = aici_malloc(e->n * 4 + 4);
    for (uint32_t i = 0; i < e->n; i++) e->idx[i] = M->out_idx[i], e->val[i] = M->out->words[M->out_idx[i]];
  }
  M->cache_bytes += e->idx ? 8 * e->n : 4 * e->n;
}

static void cache_load(matcher_t *M, const cache_ent_t *e) {
  uint32_t *w = M->out->words;
  if (!e->idx) {
    copy_words(w, e->val, e->n);
    M->out_n = NO_LIST;
    return;
  }
  out_reset(M, e->base);
  for (uint32_t i = 0; i < e->n; i++) w[e->idx[i]] = e->val[i], M->out_idx[i] = e->idx[i];
  M->out_n = e->n;
}

const aici_tokset_t *matcher_mask(matcher_t *M, const aici_trie_t *t, const cset_t *set, aici_token_t eos) {
  if (!M->out) matcher_prepare(M, t);
  cset_t key = *set;
  /* A counted configuration far enough from its bounds has the mask of every count there, and
   * after its closing quote the count no longer matters; any other count is met once (unless
   * the sequence backtracks): not cached, so that a long string does not fill the cache. */
  bool cacheable = true;
  for (uint32_t i = 0; i < key.n; i++) {
    const lencount_t *L = M->lc[key.c[i].m];
    if (!L) continue;
    if ((key.c[i].n & 15) == LC_END) key.c[i].n = LC_END;
    else if (lencount_settled(L, key.c[i].n, M->longest_token)) key.c[i].n = SETTLED | (key.c[i].n & 15);
    else cacheable = false;
  }
  sort_set(&key);
  uint32_t h = set_hash(&key);
  for (uint32_t i = 0; i < M->cache_n; i++) {
    cache_ent_t *e = &M->cache[i];
    if (e->hash != h || !same_set(&e->key, &key)) continue;
    if (M->out_ent != i) cache_load(M, e);
    M->out_ent = i;
    return M->out;
  }
  compute(M, t, set);
  if (matcher_accepting(M, set)) aici_tokset_allow(M->out, eos);   /* a function of the set too */
  M->out_n = NO_LIST;
  if (!M->reference && cacheable && M->cache_n < CACHE_MAX && M->cache_bytes < CACHE_BYTES) {
    if (M->cache_n == M->cache_cap)    /* grown as masks come: a first call touches no 73 KB table */
      M->cache = aici_realloc(M->cache, (M->cache_cap = M->cache_cap ? 2 * M->cache_cap : 8) * sizeof(cache_ent_t));
    cache_ent_t *e = &M->cache[M->cache_n];
    e->key = key, e->hash = h;
    cache_store(M, e);
    M->out_ent = M->cache_n++;
  }
  return M->out;
}
