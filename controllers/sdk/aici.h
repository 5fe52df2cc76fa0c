/* aici.h - the C SDK for aicirt controllers (world `controller` of wit/aici.wit).
 *
 * A controller defines one function, aici_step(), called once per decoding step:
 *
 *     #include "aici.h"
 *     void aici_step(const aici_arg_t *arg, aici_result_t *res) {
 *         if (arg->call_index == 3) return;              // no branch = stop
 *         aici_tokset_t *m = aici_tokset_tmp();         // empty set, valid for this step
 *         aici_tokset_allow_range(m, '0', '9' + 1);
 *         aici_sample(res, m);                          // sample under the mask
 *     }
 *
 * The SDK is libc-free (no WASI imports): it brings its own allocator, memcpy & co. and the
 * canonical-ABI glue. Memory rules, in short:
 *   - everything aici_tmp_*() returns, and everything attached to the result, lives in a per-call
 *     arena that is reset at the start of the next mid-process call;
 *   - everything a host call returns (aici_tokenize, aici_arg, aici_var_get, ...) is heap memory
 *     owned by the caller: keep it, or aici_free() it;
 *   - arg->tokens and arg->fork_group are valid during the call only; arg->all_tokens until the
 *     next call.
 * State kept across steps goes in globals (or heap memory pointed to by globals): a fork copies
 * the whole linear memory, so children start with the parent's state.
 */
#ifndef AICI_H
#define AICI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef uint32_t aici_token_t;

/* ---- memory ------------------------------------------------------------------------------ */
/* Never NULL: out of guest memory (docs/protocol.md#limits: 64 MiB by default) logs and traps, which ends the
 * sequence with finish reason "error". */
void *aici_malloc(size_t n);
void *aici_calloc(size_t n, size_t size);
void *aici_realloc(void *p, size_t n);
void aici_free(void *p);              /* ignores NULL and pointers it did not hand out */
void *aici_tmp_alloc(size_t n);       /* arena, 8-aligned, zeroed; valid until the next call */

/* ---- one step ---------------------------------------------------------------------------- */
typedef struct {
  uint32_t backtrack;                 /* tokens removed from the end since the previous call */
  const aici_token_t *tokens;         /* tokens appended since the previous call */
  uint32_t n_tokens;                  /*   (first call: the whole prompt) */
  bool has_sampled;                   /* the token sampled in the previous step, before splices */
  aici_token_t sampled;
  const uint32_t *fork_group;         /* first call after a fork: all its sequences, parent first */
  uint32_t n_fork_group;
  /* Maintained by the SDK: */
  const aici_token_t *all_tokens;     /* the sequence as this controller sees it (prompt included) */
  uint32_t n_all_tokens;
  uint32_t call_index;                /* 0 on the first call; children inherit the parent's count */
} aici_arg_t;

typedef struct aici_result aici_result_t;
typedef struct aici_branch aici_branch_t;
typedef struct aici_tokset aici_tokset_t;

/* Defined by the controller. Leaving `res` without branches stops the sequence. */
void aici_step(const aici_arg_t *arg, aici_result_t *res);

/* Append a branch (no mask, no temperature, no splices yet). Two or more branches fork. */
aici_branch_t *aici_branch(aici_result_t *res);
/* Sample under `mask`. The set is referenced, not copied: keep it unchanged until the next call
 * (arena sets and sets you own both qualify). Its length is the vocabulary's. */
void aici_branch_mask(aici_branch_t *b, const aici_tokset_t *mask);
void aici_branch_temperature(aici_branch_t *b, float t);
/* Add a splice (lists are copied). n_when == 0: unconditional. First match wins. */
void aici_branch_splice(aici_branch_t *b, const aici_token_t *when, uint32_t n_when,
                        uint32_t backtrack, const aici_token_t *ff, uint32_t n_ff);
/* Shorthands for a single-branch result (each appends one branch). */
aici_branch_t *aici_sample(aici_result_t *res, const aici_tokset_t *mask);
aici_branch_t *aici_ff(aici_result_t *res, uint32_t backtrack, const aici_token_t *ff, uint32_t n_ff);
aici_branch_t *aici_noop(aici_result_t *res);   /* no mask, splice (0, []): wait this step */
uint32_t aici_result_branches(const aici_result_t *res);

/* ---- per-tokenizer init (optional; docs/snapshots.md) ------------------------------------ */
/* Put in front of a `void f(void)` to export it as `aicirt_init`: a Runtime runs it once per
 * (controller, tokenizer) at load, after the constructors, and starts every request from a
 * snapshot of the memory and globals it leaves (so its work is not repeated per request):
 *
 *     static const aici_trie_t *trie;
 *     AICI_EXPORT_INIT void my_init(void) { trie = aici_trie(); aici_token_bytes(0, 0); }
 *
 * It may call aici_vocab_size, aici_eos_token, aici_trie, aici_token_bytes, aici_trie_slice,
 * aici_tokenize, aici_detokenize and log; not aici_arg, aici_self_seq_id, aici_capabilities or
 * the variables (no request, no sequence yet: the load fails, naming the call). A trap in it
 * fails the load. Hosts without snapshots never call it: code must not rely on it having run. */
#define AICI_EXPORT_INIT __attribute__((export_name("aicirt_init")))

/* ---- per-argument prepare (optional; docs/protocol.md#binary) ----------------------------- */
/* Put in front of a `void f(void)` to export it as `aicirt_prepare`: the host runs it before the
 * first mid-process call of a request, after the constructors and the init, under the first-call
 * limit, and may start later requests with the same argument (and capabilities) from a copy of the
 * memory and globals it leaves, without running it again. Do the argument's work here (parse,
 * compile) and keep the result in statics:
 *
 *     static prog_t *P;
 *     AICI_EXPORT_PREPARE void my_prepare(void) { uint32_t n; P = compile(aici_arg(&n), n); }
 *
 * It may call what mid-process may, except aici_self_seq_id and the variables (its state is
 * shared by every request with this argument: the call traps, naming it). Its log lines are the
 * first request's only: keep what every request must report and log it from mid-process. A trap
 * in it is the first call's error. Hosts that do not call it call mid-process at once: code must
 * not rely on it having run (do its work on the first call when it has not). */
#define AICI_EXPORT_PREPARE __attribute__((export_name("aicirt_prepare")))
/* Put in front of a `void f(void)` to export it as `aicirt_prepare_template`: run after
 * aicirt_prepare on the request whose state the host keeps as the template later requests start
 * from, and on no other (docs/protocol.md#binary): work that pays only when shared, such as caches
 * built ahead. It must not change what mid-process returns. */
#define AICI_EXPORT_PREPARE_TEMPLATE __attribute__((export_name("aicirt_prepare_template")))

/* ---- host ------------------------------------------------------------------------------- */
#define AICI_CAP_FORK 1u
#define AICI_CAP_BACKTRACK 2u
#define AICI_CAP_FF_TOKENS 4u
#define AICI_CAP_CONDITIONAL_FF 8u

uint32_t aici_vocab_size(void);       /* cached after the first call */
aici_token_t aici_eos_token(void);    /* cached */
uint32_t aici_self_seq_id(void);
uint32_t aici_capabilities(void);
/* Heap results; *n_out gets the element count. */
aici_token_t *aici_tokenize(const char *text, size_t len, uint32_t *n_out);
aici_token_t *aici_tokenize_str(const char *text, uint32_t *n_out);
uint8_t *aici_detokenize(const aici_token_t *toks, uint32_t n, uint32_t *len_out);
uint8_t *aici_arg(uint32_t *len_out); /* NUL-terminated for convenience (not counted in len) */
/* Returns NULL when the variable is unset; else heap bytes, NUL-terminated (not counted). */
uint8_t *aici_var_get(const char *name, uint32_t *len_out);
void aici_var_set(const char *name, const void *value, size_t len);
void aici_var_append(const char *name, const void *value, size_t len);
void aici_log(const char *msg, size_t len);
void aici_logs(const char *msg);      /* NUL-terminated */
/* printf subset: %d %i %u %x %c %s %.*s %% and the l/z length modifiers. Appends no newline. */
void aici_logf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* End this sequence in error: log the message (a newline is added), then trap. The host reports
 * finish reason "error"; `aicirt run` shows the message and exits non-zero. For a rejected
 * argument or an impossible state; a normal end is a result with no branches (stop). */
__attribute__((noreturn)) void aici_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* ---- token sets (bit t%32 of word t/32, ceil(vocab/32) words) ---------------------------- */
struct aici_tokset {
  uint32_t *words;
  uint32_t n_words;                   /* ceil(vocab / 32) */
  uint32_t vocab;
};
aici_tokset_t *aici_tokset_new(void); /* heap, empty */
aici_tokset_t *aici_tokset_tmp(void); /* arena, empty, valid until the next call */
void aici_tokset_free(aici_tokset_t *s);
void aici_tokset_clear(aici_tokset_t *s);
void aici_tokset_fill(aici_tokset_t *s);          /* allow every token */
void aici_tokset_allow(aici_tokset_t *s, aici_token_t t);
void aici_tokset_deny(aici_tokset_t *s, aici_token_t t);
bool aici_tokset_has(const aici_tokset_t *s, aici_token_t t);
void aici_tokset_allow_range(aici_tokset_t *s, aici_token_t lo, aici_token_t hi);  /* [lo, hi) */
void aici_tokset_deny_range(aici_tokset_t *s, aici_token_t lo, aici_token_t hi);
void aici_tokset_copy(aici_tokset_t *dst, const aici_tokset_t *src);
void aici_tokset_and(aici_tokset_t *dst, const aici_tokset_t *src);
void aici_tokset_or(aici_tokset_t *dst, const aici_tokset_t *src);
void aici_tokset_sub(aici_tokset_t *dst, const aici_tokset_t *src);               /* dst &= ~src */
uint32_t aici_tokset_count(const aici_tokset_t *s);
bool aici_tokset_empty(const aici_tokset_t *s);                                  /* no token allowed */

/* ---- token trie (docs/token-trie.md) ---------------------------------------------------- */
typedef struct {
  uint32_t w0;                        /* byte | token << 8 (token: see aici_trie_t.scratch_token) */
  uint32_t w1;                        /* pop | subtree_size << 10 */
} aici_trie_node_t;

typedef struct {
  const aici_trie_node_t *nodes;      /* nodes[0] is the root */
  uint32_t n_nodes;
  uint32_t vocab;
  uint32_t max_depth;
  /* Nodes without a token carry this id (vocab rounded up to 32): a token set's hidden spare
   * word absorbs its bit, so walks set mask bits without a branch. */
  aici_token_t scratch_token;
  /* Filled by the SDK: the root's children, `node index << 8 | byte`, in byte order (NULL: none
   * listed). A walk reads the first byte's row entry for each and skips dead ones unvisited. */
  const uint32_t *root_kids;
  uint32_t n_root_kids;
} aici_trie_t;

/* Fetches (host `token-trie`) and checks the trie on first use; NULL (and a log line) if bad. */
const aici_trie_t *aici_trie(void);
/* A token's bytes, from the trie (the table is built on first use). NULL for tokens without
 * bytes (special tokens). The pointer stays valid. */
const uint8_t *aici_token_bytes(aici_token_t t, uint32_t *len_out);
/* Whether s[0..n) is whole UTF-8 characters; *prefix gets the length of the longest such prefix
 * (a character cut at the end, or a malformed byte, ends it). */
bool aici_utf8_whole(const uint8_t *s, uint32_t n, uint32_t *prefix);
/* Token healing (aici_heal.c): text = the bytes of *last (when last is not NULL and they are
 * whole UTF-8 of at most 256 bytes: joined, plen of them) then forced[0..n) (n <= 256),
 * tokenized into toks (heap, nt of them; false when the tokenizer failed). token_at: whether
 * token t's bytes (*bytes, *len) are text[*pos..len)'s next ones; *pos moves past them. */
typedef struct { uint8_t text[512]; uint32_t plen, len, nt; bool joined; aici_token_t *toks; } aici_heal_t;
bool aici_heal_tokenize(aici_heal_t *h, const aici_token_t *last, const uint8_t *forced, uint32_t n);
bool aici_heal_token_at(const aici_heal_t *h, aici_token_t t, uint32_t *pos, const uint8_t **bytes, uint32_t *len);

/* Code-point sets (aici_cps.c): ranges [lo, hi] of code points, each set owning its array
 * (aici_free(s.r) when done; {0} is the empty set). */
typedef struct { uint32_t lo, hi; } aici_cp_range_t;
typedef struct { aici_cp_range_t *r; uint32_t n, cap; } aici_cp_set_t;
void aici_cps_add(aici_cp_set_t *s, uint32_t lo, uint32_t hi);   /* append [lo, hi]; nothing if lo > hi */
void aici_cps_normalize(aici_cp_set_t *s);                       /* sort; merge overlapping and adjacent ranges */
void aici_cps_negate(aici_cp_set_t *s);                          /* the complement within [0, 0x10FFFF] */

/* ---- text helpers: a growable buffer, UTF-8, escapes, classes as regex text --------------- */
/* A growable buffer (aici_buf.c), always NUL-terminated; {0} is empty; aici_free(b.p) when done. */
typedef struct { char *p; uint32_t n, cap; } aici_buf_t;
void aici_buf_putn(aici_buf_t *b, const void *s, uint32_t n);
void aici_buf_puts(aici_buf_t *b, const char *s);
void aici_buf_putc(aici_buf_t *b, char c);
void aici_buf_rx_byte(aici_buf_t *b, uint8_t c);                 /* one byte as regex text: \xHH */
/* Until aici_log_hold(NULL), log lines (aici_log, aici_logs, aici_logf) go into *into instead of
 * to the host: aicirt_prepare keeps what each request must report, and mid-process logs it. */
void aici_log_hold(aici_buf_t *into);   /* aici_fail sends what is held, then traps */

/* The usual aicirt_prepare: `work` does the argument's work (false: the sequence stops, the reason
 * logged); aici_prepare_run runs it with its log held, aici_prepared (on the first call) runs it
 * if no host did, logs what it held and returns its verdict, so that every request logs the same
 * whether it prepared or started from a prepared copy:
 *
 *     static aici_prepared_t prep;
 *     AICI_EXPORT_PREPARE void my_prepare(void) { aici_prepare_run(&prep, compile_arg); }
 *     ... on the first call: if (!aici_prepared(&prep, compile_arg)) return;  */
typedef struct { bool done, ok; aici_buf_t log; } aici_prepared_t;
void aici_prepare_run(aici_prepared_t *p, bool (*work)(void));
bool aici_prepared(aici_prepared_t *p, bool (*work)(void));

/* UTF-8 and hex escapes (aici_utf8.c). encode: writes 1-4 bytes to o, returns the count (no
 * check: pass a scalar value). decode: one character of s[0..n) (lenient: a cut or malformed
 * one reads what is there), its length in bytes (0 when n == 0). */
uint32_t aici_utf8_encode(uint32_t cp, uint8_t *o);
uint32_t aici_utf8_decode(const uint8_t *s, uint32_t n, uint32_t *cp);
int aici_hex_digit(uint32_t c);                                  /* 0-15, or -1 */
/* Decimal digits at s[*i..n) (a repeat count): their value, saturating at cap; *i moves past
 * them. false (and *v = 0) when there is none. */
bool aici_read_uint(const uint8_t *s, uint32_t n, uint32_t *i, uint32_t cap, uint32_t *v);
int aici_escape_char(uint32_t c);    /* after a backslash: n t r f v 0 -> their byte; else -1 */
/* The digits of a hex escape at s[*i..n): exactly `digits` of them, or with digits == 0 a braced
 * {H..H} of 1 to 8. Returns the code point and moves *i past the digits, or (i unchanged) one of
 * the AICI_ESC_* codes when the digits are bad or the value is not a Unicode scalar value. */
#define AICI_ESC_BAD_DIGITS (-1)
#define AICI_ESC_OUT_OF_RANGE (-2)
#define AICI_ESC_SURROGATE (-3)
int64_t aici_escape_hex(const uint8_t *s, uint32_t n, uint32_t *i, uint32_t digits);
const char *aici_escape_error(int64_t code);                      /* a static message for a code */

/* A code-point set as SDK regex text over UTF-8 (aici_cps_regex.c): "(?:...)" matching one
 * encoded character of the set. Normalizes s first (aici_cps_scalars). false (and a class that
 * matches nothing) when the set is empty. */
bool aici_cps_regex(aici_buf_t *out, aici_cp_set_t *s);
void aici_cps_scalars(aici_cp_set_t *s);   /* normalize, then drop surrogates and all past U+10FFFF */

/* ---- token history (aici_history.c) ----------------------------------------------------- */
/* A controller's state after each generated token (fixed-size states; the prompt is what the
 * first call saw). update() drops the tokens the host took back and feeds the new ones through
 * `step`, which gets a copy of the previous state to advance in place (false: the token leaves
 * the constraint). update() returns false when a token failed (the history then ends before it)
 * or the sequence was backtracked into the prompt; aici_history_state() is the newest state. */
typedef bool (*aici_history_step_fn)(void *ctx, void *state, aici_token_t t);
typedef struct { void *states; uint32_t size, cap, n_seen, prompt_len; } aici_history_t;
void aici_history_init(aici_history_t *h, const aici_arg_t *arg, uint32_t state_size, const void *start);
bool aici_history_update(aici_history_t *h, const aici_arg_t *arg, aici_history_step_fn step, void *ctx);
void *aici_history_state(const aici_history_t *h);

/* A slice (llguidance's slicer, reduced to byte sets): for a byte set C, the tokens whose bytes
 * all lie in C, as a mask, and a sub-trie (same format) of all the other tokens, the rest trie.
 * A recognizer that keeps every string over C (up to max_len bytes) live from its state may add
 * the slice's tokens wholesale and walk only the rest trie: the walk inside [^"]* over Qwen2
 * visits ~2k nodes instead of ~333k. */
typedef struct {
  uint32_t bytes[8];                  /* C, 256 bits */
  aici_trie_t rest;                   /* sub-trie of the tokens NOT in the slice */
  uint32_t n_tokens;                  /* tokens whose bytes all lie in C */
  uint32_t max_len;                   /* the longest of them, in bytes */
  uint32_t n_words;                   /* the tokens: mask words word_idx[i] |= word_bits[i] */
  uint32_t *word_idx, *word_bits;
  uint32_t *dense;                    /* the same as a full mask when over 1/4 of words are used */
  bool utf8;                          /* a UTF-8 slice (aici_trie_utf8_slice) */
} aici_slice_t;
/* The slice for byte set `bytes` (256 bits), built on first request and kept (a few ms at 150k
 * tokens). NULL when it would save under 1/16 of the trie's nodes (e.g. [0-9] over a BPE
 * vocabulary), or once the SDK's budget (24 slices of any kind, rest tries totalling 4x the trie
 * beside the standard slices') is spent. */
const aici_slice_t *aici_trie_slice(const aici_trie_t *trie, const uint32_t *bytes);
/* The same slice if a call made it already, never built here (NULL: not made, or not worth it). */
const aici_slice_t *aici_trie_slice_made(const aici_trie_t *trie, const uint32_t *bytes);

/* A slice chosen per token: the tokens for which in_slice(ctx, bytes, len) holds as the mask,
 * every other token (and those without bytes) in the rest trie; bytes[] is zero. For languages
 * a byte set cannot describe (e.g. whole UTF-8 characters only). Built on each call (one pass
 * over the trie); the caller keeps it. */
typedef bool (*aici_token_pred_fn)(void *ctx, const uint8_t *bytes, uint32_t len);
aici_slice_t *aici_trie_token_slice(const aici_trie_t *trie, aici_token_pred_fn in_slice, void *ctx);

/* A UTF-8 slice: the tokens made of valid UTF-8 characters (no overlong form, surrogate or code
 * point past U+10FFFF), each ASCII one in the set `ascii` (128 bits), any non-ASCII one, the last
 * one possibly cut short (a valid prefix of a character). What text-mode sets ([^"], . over
 * text) cover. bytes[] is A then all ones, utf8 is set. Cached and budgeted as aici_trie_slice. */
const aici_slice_t *aici_trie_utf8_slice(const aici_trie_t *trie, const uint32_t *ascii);
/* The standard slices of trie `trie` (*n of them; their bytes[] and utf8 say which): byte sets
 * a-z, A-Za-z, 0-9A-Z_a-z and UTF-8 slices over the ASCII sets "0-9A-Za-z ", " !#-;=?-Z^-z|~"
 * (printable but quotes, brackets, backslash), " !#-[]-~" (a JSON string's: printable but " and
 * backslash), "\t\n\r !#-~" (text but ") and "\t\n -~", those worth it. build: make them if not
 * made yet (tens of ms: call it from the init, so that they are in the snapshot); false: only
 * those made (none if no call built them). */
const aici_slice_t *const *aici_trie_std_slices(const aici_trie_t *trie, bool build, uint32_t *n);
/* The tokens whose bytes are prefix[0..n) followed by a byte of the set `first` (256 bits), as a
 * trie of their bytes after the prefix (token ids kept; NULL: none, or no memory), with its
 * byte-set standard slices (a-z, A-Za-z, 0-9A-Z_a-z: *n_slices of them, those worth it) made
 * outside the slice budget. Built on each call (a pass over the trie): call it from the init.
 * E.g. " " and [0-9A-Z_a-z]: the " word" tokens that follow whitespace, as a trie of words. */
const aici_trie_t *aici_trie_prefix(const aici_trie_t *trie, const uint8_t *prefix, uint32_t n_prefix,
                                    const uint32_t *first, const aici_slice_t *const **slices, uint32_t *n_slices);
/* Ranges as text ("a-z_", bytes or ASCII) -> the bits of those bytes, ORed into bits. */
void aici_range_bits(const char *ranges, uint32_t *bits);
/* Its predicate (ctx: the 128-bit set A). */
bool aici_utf8_in(void *ctx, const uint8_t *bytes, uint32_t len);
/* The multi-byte UTF-8 encodings: per position, the byte range. */
typedef struct { uint8_t n, lo[4], hi[4]; } aici_u8pat_t;
#define AICI_N_U8_PATS 8
extern const aici_u8pat_t AICI_U8_PATS[AICI_N_U8_PATS];
typedef uint32_t (*aici_byte_step_fn)(void *ctx, uint32_t state, uint8_t byte);
/* Whether every string of characters (ASCII ones in `ascii`, any non-ASCII one, the last possibly
 * cut short) of up to max_len bytes keeps a recognizer live from `start` (step: the state after
 * a byte, 0 = dead; cls: byte classes, bytes of one class lead every state alike, so one byte
 * per class is stepped). What makes a UTF-8 slice's tokens wholesale allowed. False also past
 * 64 states or 8192 steps. */
bool aici_utf8_covers(aici_byte_step_fn step, void *ctx, const uint8_t *cls, uint32_t start,
                      const uint32_t *ascii, uint32_t max_len);

/* Generic walk: `step(ctx, state, byte)` returns the recognizer's state after `byte`, 0 = dead.
 * Adds (ORs) to `out` every token whose bytes lead from `start` to a live state. */
void aici_trie_walk(const aici_trie_t *trie, aici_byte_step_fn step, void *ctx, uint32_t start,
                    aici_tokset_t *out);

/* ---- regex constraint ------------------------------------------------------------------- */
/* Byte-oriented, implicitly anchored at both ends (a whole-string match, like re.fullmatch):
 * literals, . (any byte but \n), [..] [^..] with ranges and \d \w \s inside, ( ) (?: ),
 * |, ? * + {m} {m,} {m,n} (lazy ? suffix accepted and ignored), escapes \d \D \w \W \s \S
 * \n \r \t \f \v \0 \xHH and \<punct>; \M (not in [..]) is one well-formed multi-byte UTF-8
 * character (U+0080..U+10FFFF, no surrogates: what `.` adds to ASCII in text mode), parsed once
 * per pattern and shared, so a long pattern that spells "any character" often stays short and
 * cheap to compile. ^ at the start and $ at the end are accepted. Compiled to
 * an NFA, then a DFA built lazily (one state per reached NFA-state set). State 0 is dead. */
typedef struct aici_regex aici_regex_t;

/* NULL on error; *err (if non-NULL) then gets a heap message naming the offset. */
aici_regex_t *aici_regex_compile(const char *pattern, size_t len, char **err);
/* The same syntax over text: a set that holds every byte >= 0x80 (`.`, `[^...]`, \D \W \S)
 * matches its ASCII bytes or one whole well-formed UTF-8 character, so that the output stays
 * UTF-8 (as llguidance's regexes); explicit bytes (\xHH, [\x80-\xbf]) keep byte semantics. */
aici_regex_t *aici_regex_compile_text(const char *pattern, size_t len, char **err);
uint32_t aici_regex_start(aici_regex_t *re);
uint32_t aici_regex_step(aici_regex_t *re, uint32_t state, uint8_t byte);
uint32_t aici_regex_advance(aici_regex_t *re, uint32_t state, const uint8_t *bytes, size_t n);
bool aici_regex_accepting(aici_regex_t *re, uint32_t state);
bool aici_regex_can_continue(aici_regex_t *re, uint32_t state);  /* some byte keeps it live */
uint32_t aici_regex_num_states(const aici_regex_t *re);
/* Whether some string of the language matches when every `marker` byte in it must be followed by
 * two bytes hi, lo that ok(ctx, hi << 8 | lo) approves (other markers: dead): is a machine that
 * calls others through such triples non-empty, given which callees are. Decided exactly on the
 * NFA, in time linear in its size (no DFA rows built). */
bool aici_regex_productive(const aici_regex_t *re, uint8_t marker, bool (*ok)(void *ctx, uint32_t id), void *ctx);
/* Add to `out` every token whose bytes keep the text a prefix of a match from `state`.
 * (Tokens only: EOS has no bytes; add it yourself when aici_regex_accepting().) */
void aici_regex_mask(aici_regex_t *re, const aici_trie_t *trie, uint32_t state, aici_tokset_t *out);
/* Same, but overwrites `out` (no need to clear it; faster on slices: a copy instead of an OR). */
void aici_regex_mask_write(aici_regex_t *re, const aici_trie_t *trie, uint32_t state, aici_tokset_t *out);
/* Same, cached per DFA state (up to `limit` masks, see aici_regex_cache_limit; default 1024):
 * the returned set is owned by the regex; do not modify it. */
const aici_tokset_t *aici_regex_mask_cached(aici_regex_t *re, const aici_trie_t *trie, uint32_t state);
void aici_regex_cache_limit(aici_regex_t *re, uint32_t limit);   /* 0 disables caching */
/* Same as aici_regex_mask_cached for a walk along one text: a state's mask is kept from its second
 * visit on; the first one is computed into a set the regex reuses, valid until the next call of
 * this function or aici_regex_mask_cached on `re` (use it before asking for another). Most states
 * of a walk are met once, and keeping a mask costs more than computing it. */
const aici_tokset_t *aici_regex_mask_now(aici_regex_t *re, const aici_trie_t *trie, uint32_t state);
/* Masks use slices (default on; same result): the byte classes the pattern repeats (the sets
 * under * + {m,n} with n >= 8, and the union of an alternation of sets so repeated) become
 * candidate slices; a DFA state that keeps every string over one of them live (checked once per
 * state, on the DFA) gets that slice's tokens wholesale plus a walk of its rest trie. The SDK's
 * standard slices (aici_trie_std_slices, if an init made them) that lie within those sets serve
 * from the first mask. Off: one walk over the whole trie. */
void aici_regex_use_slices(aici_regex_t *re, bool on);
/* The pattern's own slices only once its masks have visited `masks` whole tries' worth of nodes
 * (default 4; 0: from the first mask). Building one costs several walks of the whole trie, more
 * than a request that computes a mask or two saves. */
void aici_regex_slices_after(aici_regex_t *re, uint32_t masks);
/* The slice that the next mask from `state` uses (NULL: it walks the whole trie). */
const aici_slice_t *aici_regex_slice(aici_regex_t *re, const aici_trie_t *trie, uint32_t state);

/* The state's transition row (256 entries, built on demand): entry b is the state after byte b,
 * 0 = dead, with AICI_REGEX_FINAL set when that state is a match nothing extends. For walkers
 * that step several regexes together; the pointer is valid until a call builds another row. */
#define AICI_REGEX_FINAL 0x80000000u
const uint32_t *aici_regex_row(aici_regex_t *re, uint32_t state);
/* The pattern's byte classes: bytes in one class lead every state to the same state, so a walker
 * that probes a range of bytes may probe one byte per class. Returns the byte -> class table (256
 * entries, fixed at compile time); *n_classes (if non-NULL) gets the number of classes. */
const uint8_t *aici_regex_classes(const aici_regex_t *re, uint32_t *n_classes);

#ifdef __cplusplus
}
#endif
#endif /* AICI_H */
