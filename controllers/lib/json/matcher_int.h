/* matcher_int.h: what the matcher's two parts share (internal): the matcher's state, its
 * limits and flags. matcher.c: machines, frames, stepping; matcher_mask.c: free strings and masks. */
#ifndef MATCHER_INT_H
#define MATCHER_INT_H
#include "matcher.h"

#define ST_KNOWN 1
#define ST_CALLS 2
#define ST_ACCEPT 4
#define ST_FINAL 8                     /* accepting, and no byte continues */
#define ST_LOOP_KNOWN 16
#define ST_LOOP 32                     /* inside a free string: every character comes back here */
#define ST_ROOM_KNOWN 64
#define ST_ANY_KNOWN 128
#define ROOM_SHIFT 8                   /* room: see room_of (5 bits) */
#define ROOM_MASK 31u
#define ST_ANY (1u << 13)              /* any string of string characters keeps it live: any_string */
#define SHORT_CHARS 16u
#define PROBE_CAP 32u                  /* DFA states a string probe follows at once */
#define ANY_CAP 256u                   /* DFA states any_string follows at most */
#define ROOM_SHORT SHORT_CHARS
#define ROOM_NONE (SHORT_CHARS + 1)
#define CACHE_MAX 256u                 /* masks cached per sequence */
#define CACHE_BYTES (4u << 20)         /* and their stored words at most */
#define NO_LIST 0xffffffffu
#define SETTLED 0xfffffff0u              /* a cache key's count: lencount_settled */
#define BASE_ZERO 0u
#define BASE_STR 1u
#define BASE_SHORT 2u

typedef struct { uint32_t m, s, parent, depth; } frame_t;
typedef struct { uint8_t n, b[96]; } reps_t;
typedef struct { reps_t ascii, cont, lead[8], second[8]; } char_reps_t;   /* see fill_reps */
typedef struct { uint32_t callee, ret; } call_t;
typedef struct { uint32_t key_m, key_s, off, n; } calls_ent_t;
/* A cached mask, stored as the words where it differs from its base (all zero, or a slice's
 * dense mask), or whole (idx NULL, n = n_words) when that is no smaller. */
typedef struct { cset_t key; uint32_t hash, base, n, *idx, *val; } cache_ent_t;

struct matcher {
  uint32_t n, cap;                     /* machine ids in use (compiled, dynamic, reserved); room */
  uint32_t n_dyn;                      /* dynamic machines compiled (DYN_MAX at most) */
  dyn_t *dyn;                          /* writes the dynamic machines' regexes (NULL: none) */
  bool (*dyn_write)(dyn_t *, uint32_t, dyn_reserve_fn, void *, aici_buf_t *);
  aici_regex_t **re;                   /* NULL: a dynamic machine not made yet */
  lencount_t **lc;                     /* per machine: its length tables (NULL: not counted) */
  uint16_t **info;                     /* per machine, per DFA state: ST_*, room << ROOM_SHIFT */
  char_reps_t **reps;                  /* per machine, made on first use */
  uint32_t *info_cap;
  frame_t *fr;
  uint32_t n_fr, cap_fr, *fr_ht, fr_ht_cap;
  calls_ent_t *calls_ht;               /* (machine, state) -> calls in call_pool */
  uint32_t calls_ht_cap, calls_n;
  call_t *call_pool;
  uint32_t call_pool_n, call_pool_cap;
  cache_ent_t *cache;
  uint32_t cache_n, cache_cap, cache_bytes;   /* cache_cap: entries allocated (grown on demand) */
  /* The mask handed out: one buffer, allocated before any fork (its pages are then resident in
   * every child) and rewritten in place. Its content is base `out_base` with the words
   * out_idx[0..out_n) changed (out_n == NO_LIST: unknown, rewrite it whole). */
  aici_tokset_t *out;
  uint32_t out_base, out_n, *out_idx, out_ent;
  cset_t *walk;                        /* one set per trie depth */
  aici_slice_t *str_slice;             /* tokens of whole characters other than " \ and controls */
  aici_slice_t *short_slice;           /* those of them of at most SHORT_CHARS characters */
  bool reference;                      /* matcher_reference */
  uint8_t *nchars;                     /* per token: its characters if a str_slice token (<= 255), else 0 */
  uint32_t max_chars;                  /* the most characters of a str_slice token */
  uint32_t longest_token;              /* the most bytes of any token */
  uint8_t *dead;                       /* per compiled machine (< n_static): it admits no value */
  uint32_t n_static;
};


uint32_t mt_hash3(uint32_t a, uint32_t b, uint32_t c);
uint16_t mt_state_info(matcher_t *M, uint32_t m, uint32_t s);

#endif
