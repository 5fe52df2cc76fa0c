/* The pushdown matcher: machines (one SDK regex DFA each) that call each other through the
 * CALL_BYTE marker, run as a set of configurations (top machine, DFA state, stack) so that
 * anyOf branches and "this value may end here" stay open until the bytes decide. */
#ifndef JSON_MATCHER_H
#define JSON_MATCHER_H
#include "json.h"

#define MAX_CFGS 16u                   /* configurations alive at once (more: the extra die) */
#define MAX_STACK 128u                 /* nesting depth of calls */

/* parent: frame id, 0 = empty stack; n: in a length-counted machine (machine_src_t.counted), its
 * characters so far << 4 | where in a character it is (lc_track), else 0 */
typedef struct { uint32_t m, s, parent, n; } cfg_t;
typedef struct { cfg_t c[MAX_CFGS]; uint32_t n; } cset_t;

typedef struct matcher matcher_t;

/* Compiles every machine; NULL with *err (heap) when a regex fails (e.g. too large). */
matcher_t *matcher_new(const compiled_t *src, char **err);
void matcher_start(matcher_t *m, cset_t *out);
/* The configurations after `byte`; false when none is left. */
bool matcher_step(matcher_t *m, const cset_t *in, uint8_t byte, cset_t *out);
bool matcher_advance(matcher_t *m, cset_t *set, const uint8_t *bytes, uint32_t n);
bool matcher_accepting(matcher_t *m, const cset_t *set);
/* The one byte every continuation starts with (-1: none or several; also -1 when accepting). */
int matcher_forced_byte(matcher_t *m, const cset_t *set);
/* Tokens whose bytes keep some configuration alive, and `eos` when the set accepts; cached per
 * set. The result is owned by the matcher: do not change it; valid until the next call. */
const aici_tokset_t *matcher_mask(matcher_t *m, const aici_trie_t *trie, const cset_t *set, aici_token_t eos);
uint32_t matcher_machines(const matcher_t *m);
uint32_t matcher_dfa_states(const matcher_t *m);   /* built so far, over every machine (1 KiB of rows each) */
/* Builds what masks share across schemas (the free-string and short-token slices, per-token
 * character counts: passes over the trie), once per tokenizer: in the init (json_init), so that
 * every request starts with them from the snapshot. Idempotent. */
void matcher_prepare_tokenizer(const aici_trie_t *trie);
/* The matcher's share of those tables (built now if the init did not) and its mask buffer,
 * before any fork: children then find them in memory they already hold. */
void matcher_prepare(matcher_t *m, const aici_trie_t *trie);
/* on: masks by plain walks of the whole trie (no slices, character counts or string probes):
 * the reference the fast paths must agree with, bit for bit (tests compare the two). */
void matcher_reference(matcher_t *m, bool on);

#endif
