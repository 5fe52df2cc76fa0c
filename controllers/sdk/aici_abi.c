/* Canonical-ABI glue for world `controller` (wit/aici.wit), written by hand: the exports
 * (`mid-process`, `cabi_realloc`, `cabi_post_mid-process`, `_initialize`), the host imports
 * lowered to core Wasm, the per-call arena and the result builders.
 *
 * Memory ownership (why two allocators): the host allocates every list it hands the guest
 * (mid-process arguments, host-call results) with `cabi_realloc`. Those go on the heap, because
 * a controller may keep a host result (the token trie, a tokenized option) for its whole life,
 * and because the arguments are written *before* mid-process runs, so an arena reset at the
 * start of mid-process would hand their memory out again while they are read. The result the
 * host reads back (branches, splices, copied token lists, tmp token sets) is built in the arena,
 * which is reset at the start of the next mid-process, after the host has read it.
 */
#include "aici.h"

#include "aici_host.h"

#define I32(p) ((int32_t)(uintptr_t)(p))
#define PTR(x) ((void *)(uintptr_t)(uint32_t)(x))

/* ---- arena ---------------------------------------------------------------------------------- */
typedef struct chunk {
  struct chunk *next;
  size_t size, used;
} chunk_t;
static chunk_t *arena_first, *arena_cur;

static void arena_reset(void) {
  for (chunk_t *c = arena_first; c; c = c->next) c->used = 0;
  arena_cur = arena_first;
}

void *aici_tmp_alloc(size_t n) {
  n = (n + 7) & ~(size_t)7;
  for (;;) {
    chunk_t *c = arena_cur;
    if (c && c->size - c->used >= n) {
      void *p = (char *)(c + 1) + c->used;
      c->used += n;
      __builtin_memset(p, 0, n);
      return p;
    }
    if (c && c->next) { arena_cur = c->next; continue; }
    size_t sz = 1 << 16;
    while (sz < n) sz <<= 1;
    chunk_t *nc = aici_malloc(sizeof(chunk_t) + sz);
    nc->next = 0, nc->size = sz, nc->used = 0;
    if (c) c->next = nc; else arena_first = nc;
    arena_cur = nc;
  }
}

/* ---- result layout (canonical ABI, docs/protocol.md#wit) ------------------------------------------------ */
typedef struct {
  uint32_t when_ptr, when_len, backtrack, ff_ptr, ff_len;
} splice_abi_t;
struct aici_branch {
  uint8_t mask_tag; uint8_t pad0[3]; uint32_t mask_ptr, mask_len;
  uint8_t temp_tag; uint8_t pad1[3]; float temp;
  uint32_t splices_ptr, splices_len;
};
_Static_assert(sizeof(splice_abi_t) == 20, "splice is 20 bytes");
_Static_assert(sizeof(struct aici_branch) == 28, "branch is 28 bytes");

/* Branches live in one fixed arena block so that the pointers aici_branch() returns stay valid. */
#define MAX_BRANCHES 256
struct aici_result {
  struct aici_branch *branches;
  uint32_t n;
};
static struct { uint32_t ptr, len; } ret_area;

aici_branch_t *aici_branch(aici_result_t *res) {
  if (res->n == MAX_BRANCHES) { aici_logs("aici: too many branches\n"); return 0; }
  if (!res->branches) res->branches = aici_tmp_alloc(MAX_BRANCHES * sizeof(struct aici_branch));
  return &res->branches[res->n++];     /* arena memory is zeroed: none, none, [] */
}

uint32_t aici_result_branches(const aici_result_t *res) { return res->n; }

void aici_branch_mask(aici_branch_t *b, const aici_tokset_t *mask) {
  if (!b) return;
  b->mask_tag = 1, b->mask_ptr = I32(mask->words), b->mask_len = mask->n_words;
}

void aici_branch_temperature(aici_branch_t *b, float t) {
  if (b) b->temp_tag = 1, b->temp = t;
}

static uint32_t copy_tokens(const aici_token_t *t, uint32_t n) {
  if (!n) return 4;                    /* any aligned pointer will do for an empty list */
  aici_token_t *d = aici_tmp_alloc(n * 4);
  __builtin_memcpy(d, t, n * 4);
  return I32(d);
}

void aici_branch_splice(aici_branch_t *b, const aici_token_t *when, uint32_t n_when,
                        uint32_t backtrack, const aici_token_t *ff, uint32_t n_ff) {
  if (!b) return;
  splice_abi_t *old = PTR(b->splices_ptr);
  uint32_t n = b->splices_len;
  if ((n & (n - 1)) == 0) {            /* capacity is the next power of two: grow at 0,1,2,4.. */
    splice_abi_t *s = aici_tmp_alloc((n ? 2 * n : 1) * sizeof(splice_abi_t));
    if (n) __builtin_memcpy(s, old, n * sizeof(splice_abi_t));
    b->splices_ptr = I32(s);
  }
  splice_abi_t *s = (splice_abi_t *)PTR(b->splices_ptr) + n;
  s->when_ptr = copy_tokens(when, n_when), s->when_len = n_when;
  s->backtrack = backtrack;
  s->ff_ptr = copy_tokens(ff, n_ff), s->ff_len = n_ff;
  b->splices_len = n + 1;
}

aici_branch_t *aici_sample(aici_result_t *res, const aici_tokset_t *mask) {
  aici_branch_t *b = aici_branch(res);
  aici_branch_mask(b, mask);
  return b;
}

aici_branch_t *aici_ff(aici_result_t *res, uint32_t backtrack, const aici_token_t *ff, uint32_t n_ff) {
  aici_branch_t *b = aici_branch(res);
  aici_branch_splice(b, 0, 0, backtrack, ff, n_ff);
  return b;
}

aici_branch_t *aici_noop(aici_result_t *res) { return aici_ff(res, 0, 0, 0); }

/* ---- exports ------------------------------------------------------------------------------ */
static aici_token_t *hist;            /* the sequence as this controller has seen it */
static uint32_t hist_len, hist_cap, calls;

__attribute__((export_name("cabi_realloc")))
int32_t aici_cabi_realloc(int32_t old, int32_t old_size, int32_t align, int32_t new_size) {
  (void)old_size, (void)align;         /* the heap aligns to 8, the most any WIT type needs */
  if (new_size == 0) return 8;         /* empty list: never dereferenced */
  return I32(aici_realloc(PTR(old), (uint32_t)new_size));
}

__attribute__((export_name("mid-process")))
int32_t aici_mid_process(int32_t backtrack, int32_t tokens_ptr, int32_t tokens_len,
                         int32_t sampled_is_some, int32_t sampled, int32_t group_ptr,
                         int32_t group_len) {
  arena_reset();
  uint32_t bt = (uint32_t)backtrack, nt = (uint32_t)tokens_len;
  hist_len = bt > hist_len ? 0 : hist_len - bt;
  if (hist_len + nt > hist_cap) {
    uint32_t cap = hist_cap ? hist_cap : 256;
    while (cap < hist_len + nt) cap *= 2;
    hist = aici_realloc(hist, cap * 4);
    hist_cap = cap;
  }
  if (nt) __builtin_memcpy(hist + hist_len, PTR(tokens_ptr), nt * 4);
  hist_len += nt;

  aici_arg_t arg = {
    .backtrack = bt, .tokens = PTR(tokens_ptr), .n_tokens = nt,
    .has_sampled = (sampled_is_some & 0xff) != 0, .sampled = (uint32_t)sampled,
    .fork_group = PTR(group_ptr), .n_fork_group = (uint32_t)group_len,
    .all_tokens = hist, .n_all_tokens = hist_len, .call_index = calls++,
  };
  aici_result_t res;
  res.branches = 0, res.n = 0;
  aici_step(&arg, &res);
  aici_free(PTR(tokens_ptr));          /* the host's argument lists: ours to free */
  aici_free(PTR(group_ptr));
  ret_area.ptr = res.n ? I32(res.branches) : 4;
  ret_area.len = res.n;
  return I32(&ret_area);
}

/* Called after the host has read the result. Nothing to do: the arena is reset at the start of
 * the next call, which also covers hosts that skip post-return. */
__attribute__((export_name("cabi_post_mid-process")))
void aici_post_mid_process(int32_t ret) { (void)ret; }

extern void __wasm_call_ctors(void);
__attribute__((export_name("_initialize")))
void aici_initialize(void) { __wasm_call_ctors(); }

/* ---- host wrappers ------------------------------------------------------------------------ */
static struct { uint32_t a, b, c; } host_ret;   /* return area for host calls (12 bytes) */
static uint32_t vocab_cache, eos_cache;
static bool vocab_known, eos_known;

uint32_t aici_vocab_size(void) {
  if (!vocab_known) vocab_cache = (uint32_t)aici_h_vocab_size(), vocab_known = true;
  return vocab_cache;
}
aici_token_t aici_eos_token(void) {
  if (!eos_known) eos_cache = (uint32_t)aici_h_eos_token(), eos_known = true;
  return eos_cache;
}
uint32_t aici_self_seq_id(void) { return (uint32_t)aici_h_self_seq_id(); }
uint32_t aici_capabilities(void) { return (uint32_t)aici_h_capabilities(); }

/* The host's list as a heap block we own; a NULL-free empty list becomes a fresh 1-byte block so
 * callers can always aici_free() the result. `extra` bytes are added and zeroed (NUL end). */
static void *take_list(uint32_t ptr, uint32_t len, uint32_t elem, uint32_t extra) {
  void *p = PTR(ptr);
  if (!extra && len) return p;
  void *q = aici_realloc(len ? p : 0, len * elem + extra);
  if (q) __builtin_memset((char *)q + len * elem, 0, extra);
  return q;
}

aici_token_t *aici_tokenize(const char *text, size_t len, uint32_t *n_out) {
  aici_h_tokenize(I32(text), (int32_t)len, I32(&host_ret));
  if (n_out) *n_out = host_ret.b;
  return take_list(host_ret.a, host_ret.b, 4, host_ret.b ? 0 : 4);
}

aici_token_t *aici_tokenize_str(const char *text, uint32_t *n_out) {
  return aici_tokenize(text, __builtin_strlen(text), n_out);
}

uint8_t *aici_detokenize(const aici_token_t *toks, uint32_t n, uint32_t *len_out) {
  aici_h_detokenize(I32(toks), (int32_t)n, I32(&host_ret));
  if (len_out) *len_out = host_ret.b;
  return take_list(host_ret.a, host_ret.b, 1, 1);
}

uint8_t *aici_arg(uint32_t *len_out) {
  aici_h_arg(I32(&host_ret));
  if (len_out) *len_out = host_ret.b;
  return take_list(host_ret.a, host_ret.b, 1, 1);
}

uint8_t *aici_var_get(const char *name, uint32_t *len_out) {
  aici_h_var_get(I32(name), (int32_t)__builtin_strlen(name), I32(&host_ret));
  if (!(host_ret.a & 0xff)) {          /* option tag u8 @0: none */
    if (len_out) *len_out = 0;
    return 0;
  }
  if (len_out) *len_out = host_ret.c;
  return take_list(host_ret.b, host_ret.c, 1, 1);
}

void aici_var_set(const char *name, const void *value, size_t len) {
  aici_h_var_set(I32(name), (int32_t)__builtin_strlen(name), I32(value), (int32_t)len);
}
void aici_var_append(const char *name, const void *value, size_t len) {
  aici_h_var_append(I32(name), (int32_t)__builtin_strlen(name), I32(value), (int32_t)len);
}
static aici_buf_t *log_held;          /* aici_log_hold: where log lines go instead of the host */
void aici_log_hold(aici_buf_t *into) { log_held = into; }
void aici_log(const char *msg, size_t len) {
  if (log_held) aici_buf_putn(log_held, msg, (uint32_t)len);
  else aici_h_log(I32(msg), (int32_t)len);
}
void aici_logs(const char *msg) { aici_log(msg, __builtin_strlen(msg)); }

void aici_prepare_run(aici_prepared_t *p, bool (*work)(void)) {
  aici_log_hold(&p->log);
  p->ok = work();
  aici_log_hold(0);
  p->done = true;
}

bool aici_prepared(aici_prepared_t *p, bool (*work)(void)) {
  if (!p->done) aici_prepare_run(p, work);   /* a host that did not call aicirt_prepare */
  if (p->log.n) aici_log(p->log.p, p->log.n);
  return p->ok;
}

/* ---- aici_logf: a small printf into a stack buffer, flushed when full ---------------------- */
typedef struct { char buf[256]; uint32_t n; } out_t;
static void put(out_t *o, char c) {
  if (o->n == sizeof o->buf) aici_log(o->buf, o->n), o->n = 0;
  o->buf[o->n++] = c;
}
static void put_uint(out_t *o, unsigned long long v, unsigned base) {
  char tmp[24]; int i = 0;
  do tmp[i++] = "0123456789abcdef"[v % base], v /= base; while (v);
  while (i) put(o, tmp[--i]);
}

static void vlogf(const char *fmt, __builtin_va_list ap) {
  out_t o; o.n = 0;
  for (const char *f = fmt; *f; f++) {
    if (*f != '%') { put(&o, *f); continue; }
    f++;
    int prec = -1;
    if (f[0] == '.' && f[1] == '*') prec = __builtin_va_arg(ap, int), f += 2;
    int longs = 0;
    while (*f == 'l' || *f == 'z') longs++, f++;   /* size_t and long are 32-bit here */
    switch (*f) {
      case 'd': case 'i': {
        long long v = longs >= 2 ? __builtin_va_arg(ap, long long)
                    : longs ? __builtin_va_arg(ap, long) : __builtin_va_arg(ap, int);
        if (v < 0) put(&o, '-'), v = -v;
        put_uint(&o, (unsigned long long)v, 10);
        break;
      }
      case 'u': case 'x': {
        unsigned long long v = longs >= 2 ? __builtin_va_arg(ap, unsigned long long)
                             : longs ? __builtin_va_arg(ap, unsigned long) : __builtin_va_arg(ap, unsigned);
        put_uint(&o, v, *f == 'x' ? 16 : 10);
        break;
      }
      case 'c': put(&o, (char)__builtin_va_arg(ap, int)); break;
      case 's': {
        const char *s = __builtin_va_arg(ap, const char *);
        if (!s) s = "(null)";
        for (int i = 0; s[i] && (prec < 0 || i < prec); i++) put(&o, s[i]);
        break;
      }
      case '%': put(&o, '%'); break;
      case 0: f--; break;
      default: put(&o, '%'), put(&o, *f);
    }
  }
  if (o.n) aici_log(o.buf, o.n);
}

void aici_logf(const char *fmt, ...) {
  __builtin_va_list ap;
  __builtin_va_start(ap, fmt);
  vlogf(fmt, ap);
  __builtin_va_end(ap);
}

void aici_fail(const char *fmt, ...) {
  __builtin_va_list ap;
  __builtin_va_start(ap, fmt);
  vlogf(fmt, ap);
  __builtin_va_end(ap);
  aici_log("\n", 1);
  if (log_held) {                      /* held lines (aici_log_hold) go out with the error */
    aici_h_log(I32(log_held->p), (int32_t)log_held->n);
    log_held = 0;
  }
  __builtin_trap();
}
