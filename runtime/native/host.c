/* Host imports of WIT interface `host` as native callbacks (compiled with step.c).
 *
 * The imports a controller may call on every step (abi.NATIVE_IMPORTS: vocab-size, eos-token,
 * self-seq-id, capabilities, arg, var-get, var-set, var-append, log) run here, on the worker
 * thread, without the GIL: a few hundred ns instead of tens of µs through wasmtime-py. The others
 * (tokenize, detokenize, token-trie, the WASI shim) go through one trampoline into Python
 * (`aicirt_py_import`, a cffi extern "Python" that takes the GIL).
 *
 * The Store's data pointer is the sequence's slot. A guest that passes something invalid gets a
 * trap whose message is also kept in its own slot (`fault`): never in a process-global place.
 * Variables live in one `aicirt_vars` per request (shared by its forks, guarded by a mutex);
 * every change is also recorded for the embedder to stream, in order.
 */
#include <stdarg.h>
#include <stdio.h>

static int aicirt_py_import(int32_t index, aicirt_slot *s, void *ctx, wt_val_raw_t *args);

/* ---- Faults ------------------------------------------------------------------------------------ */
static void *fault(aicirt_slot *s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(s->fault, sizeof s->fault, fmt, ap);
    va_end(ap);
    s->fault_len = n < 0 ? 0 : (n >= (int)sizeof s->fault ? (int)sizeof s->fault - 1 : n);
    return p_trap_new(s->fault, (size_t)s->fault_len);
}

/* The trap a failed guest_alloc left: the guest's own trap, or a fault naming what went wrong. */
static void *alloc_failure(aicirt_slot *s, const char *name) {
    if (s->status == AICIRT_BAD_ALLOC)
        return fault(s, "host import `%s`: cabi_realloc returned [%u, %llu): misaligned or outside linear memory", name,
                     s->detail[0], (unsigned long long)s->detail[0] + s->detail[1]);
    void *trap = s->trap;
    s->trap = 0;
    if (s->error) {   /* a wasmtime error rather than a trap: report it as a fault */
        p_error_delete(s->error);
        s->error = 0;
    }
    return trap ? trap : fault(s, "host import `%s`: cabi_realloc failed", name);
}

/* Bounds-checked view of guest bytes [ptr, ptr + n); NULL with *trap set when out of range. */
static const uint8_t *guest_bytes(aicirt_slot *s, void *ctx, const char *name, uint32_t ptr, uint32_t n, void **trap) {
    if (n > s->host_arg_cap) {   /* host work runs outside the epoch clock's reach: bound it */
        *trap = fault(s, "host import `%s`: an argument of %u bytes is over the limit of %u (Limits.host_arg_bytes)",
                      name, n, s->host_arg_cap);
        return 0;
    }
    size_t size = p_mem_size(ctx, &s->mem);
    if ((uint64_t)ptr + n > size) {
        *trap = fault(s, "host import `%s`: range [%u, %llu) is outside linear memory (%zu bytes)", name, ptr,
                      (unsigned long long)ptr + n, size);
        return 0;
    }
    return p_mem_data(ctx, &s->mem) + ptr;
}

static int valid_utf8(const uint8_t *p, uint32_t n) {
    uint32_t i = 0;
    while (i < n) {
        uint8_t c = p[i];
        uint32_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        if (!len || i + len > n) return 0;
        uint32_t cp = len == 1 ? c : len == 2 ? c & 0x1F : len == 3 ? c & 0x0F : c & 0x07;
        for (uint32_t k = 1; k < len; k++) {
            if ((p[i + k] & 0xC0) != 0x80) return 0;
            cp = (cp << 6) | (p[i + k] & 0x3F);
        }
        if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && (cp < 0x10000 || cp > 0x10FFFF)) ||
            (cp >= 0xD800 && cp <= 0xDFFF))
            return 0;
        i += len;
    }
    return 1;
}

static const uint8_t *guest_str(aicirt_slot *s, void *ctx, const char *name, uint32_t ptr, uint32_t n, void **trap) {
    const uint8_t *p = guest_bytes(s, ctx, name, ptr, n, trap);
    if (p && !valid_utf8(p, n)) {
        *trap = fault(s, "host import `%s`: string is not valid UTF-8", name);
        return 0;
    }
    return p;
}

static int guest_write(aicirt_slot *s, void *ctx, const char *name, uint32_t ptr, const void *src, uint32_t n,
                       void **trap) {
    size_t size = p_mem_size(ctx, &s->mem);
    if ((uint64_t)ptr + n > size) {
        *trap = fault(s, "host import `%s`: range [%u, %llu) is outside linear memory (%zu bytes)", name, ptr,
                      (unsigned long long)ptr + n, size);
        return 0;
    }
    memcpy(p_mem_data(ctx, &s->mem) + ptr, src, n);
    return 1;
}

/* Copy `data` into memory the guest allocates; the guest pointer goes to *out (0 for no data). */
static void *guest_copy_in(aicirt_slot *s, void *ctx, const char *name, const uint8_t *data, uint32_t n, uint32_t *out) {
    *out = 0;
    if (!n) return 0;
    int64_t ptr = guest_alloc(s, ctx, 1, n);
    if (ptr < 0) return alloc_failure(s, name);
    memcpy(p_mem_data(ctx, &s->mem) + ptr, data, n);
    *out = (uint32_t)ptr;
    return 0;
}

/* ---- The per-sequence log ---------------------------------------------------------------------- */
void aicirt_log_append(aicirt_slot *s, const uint8_t *data, uint32_t n) {
    if (!n || !s->log_cap) return;
    if (!s->log && !(s->log = malloc(s->log_cap))) return;   /* no memory: the log line is dropped */
    if (n >= s->log_cap) {
        memcpy(s->log, data + (n - s->log_cap), s->log_cap);
        s->log_len = s->log_cap;
    } else {
        if (s->log_len + n > s->log_cap) {   /* oldest dropped */
            uint32_t drop = s->log_len + n - s->log_cap;
            memmove(s->log, s->log + drop, s->log_len - drop);
            s->log_len -= drop;
        }
        memcpy(s->log + s->log_len, data, n);
        s->log_len += n;
    }
    s->call_log_len = s->call_log_len + n > s->log_len ? s->log_len : s->call_log_len + n;
}

void aicirt_slot_release(aicirt_slot *s) {
    free(s->log);
    s->log = 0;
    s->log_len = s->call_log_len = 0;
}

/* ---- Variables --------------------------------------------------------------------------------- */
/* Each variable and each change record counts this much beside its name and value, so that a
 * flood of empty appends is bounded by Limits.variable_bytes too. */
#define VAR_OVERHEAD 32

typedef struct { uint8_t *name; uint8_t *value; uint32_t name_len, len, hash, used; } var_entry;
typedef struct { uint32_t seq_id, append, name_len, len; uint8_t *name, *value; } aicirt_var_change;

struct aicirt_vars {
    pthread_mutex_t mu;
    var_entry *tab;
    uint32_t cap, n;                 /* open addressing; cap a power of two; no deletion */
    aicirt_var_change *changes;
    size_t n_changes, changes_cap;
    uint64_t held, pending, limit;
};

static uint32_t fnv1a(const uint8_t *p, uint32_t n) {
    uint32_t h = 2166136261u;
    for (uint32_t i = 0; i < n; i++) h = (h ^ p[i]) * 16777619u;
    return h;
}

aicirt_vars *aicirt_vars_new(uint64_t limit) {
    aicirt_vars *v = calloc(1, sizeof *v);
    if (!v) return 0;
    pthread_mutex_init(&v->mu, 0);
    v->limit = limit;
    return v;
}

static void free_changes(aicirt_var_change *c, size_t n) {
    for (size_t i = 0; i < n; i++) { free(c[i].name); free(c[i].value); }
    free(c);
}

void aicirt_vars_free_changes(aicirt_var_change *c, size_t n) { free_changes(c, n); }

void aicirt_vars_free(aicirt_vars *v) {
    if (!v) return;
    for (uint32_t i = 0; i < v->cap; i++)
        if (v->tab[i].used) { free(v->tab[i].name); free(v->tab[i].value); }
    free(v->tab);
    free_changes(v->changes, v->n_changes);
    pthread_mutex_destroy(&v->mu);
    free(v);
}

static var_entry *find(aicirt_vars *v, const uint8_t *name, uint32_t n, uint32_t h) {
    if (!v->cap) return 0;
    for (uint32_t i = h & (v->cap - 1);; i = (i + 1) & (v->cap - 1)) {
        var_entry *e = &v->tab[i];
        if (!e->used) return e;
        if (e->hash == h && e->name_len == n && !memcmp(e->name, name, n)) return e;
    }
}

static int grow_table(aicirt_vars *v) {
    uint32_t cap = v->cap ? v->cap * 2 : 16;
    var_entry *tab = calloc(cap, sizeof *tab);
    if (!tab) return 0;
    for (uint32_t i = 0; i < v->cap; i++) {
        if (!v->tab[i].used) continue;
        uint32_t j = v->tab[i].hash & (cap - 1);
        while (tab[j].used) j = (j + 1) & (cap - 1);
        tab[j] = v->tab[i];
    }
    free(v->tab);
    v->tab = tab;
    v->cap = cap;
    return 1;
}

static uint8_t *bytes_dup(const uint8_t *p, uint32_t n) {
    uint8_t *q = malloc(n ? n : 1);
    if (q && n) memcpy(q, p, n);
    return q;
}

/* Set or append. Returns 0, 1 when over the limit (*would: the bytes it would take), -1 when out
 * of memory. Nothing changes unless it returns 0. */
int aicirt_vars_set(aicirt_vars *v, uint32_t seq_id, const uint8_t *name, uint32_t nlen, const uint8_t *val,
                    uint32_t vlen, int append, uint64_t *would) {
    uint32_t h = fnv1a(name, nlen);
    int rc = -1;
    pthread_mutex_lock(&v->mu);
    if ((v->n + 1) * 4 > v->cap * 3 && !grow_table(v)) goto out;
    var_entry *e = find(v, name, nlen, h);
    uint64_t old = e->used ? (uint64_t)VAR_OVERHEAD + nlen + e->len : 0;
    uint64_t new_len = (append && e->used ? e->len : 0) + (uint64_t)vlen;
    uint64_t held = v->held - old + VAR_OVERHEAD + nlen + new_len;
    uint64_t pending = v->pending + VAR_OVERHEAD + nlen + vlen;
    if (held > v->limit || pending > v->limit) {
        *would = held > pending ? held : pending;
        rc = 1;
        goto out;
    }
    if (new_len > UINT32_MAX) goto out;
    if (v->n_changes == v->changes_cap) {
        size_t cap = v->changes_cap ? v->changes_cap * 2 : 16;
        aicirt_var_change *c = realloc(v->changes, cap * sizeof *c);
        if (!c) goto out;
        v->changes = c;
        v->changes_cap = cap;
    }
    uint8_t *cname = bytes_dup(name, nlen), *cval = bytes_dup(val, vlen);
    uint8_t *value = malloc(new_len ? new_len : 1);
    uint8_t *ename = e->used ? e->name : bytes_dup(name, nlen);
    if (!cname || !cval || !value || !ename) {
        free(cname); free(cval); free(value);
        if (!e->used) free(ename);
        goto out;
    }
    if (append && e->used) memcpy(value, e->value, e->len);
    memcpy(value + (new_len - vlen), val, vlen);
    if (e->used) free(e->value);
    else { e->used = 1; e->hash = h; e->name = ename; e->name_len = nlen; v->n++; }
    e->value = value;
    e->len = (uint32_t)new_len;
    v->changes[v->n_changes++] = (aicirt_var_change){seq_id, (uint32_t)append, nlen, vlen, cname, cval};
    v->held = held;
    v->pending = pending;
    rc = 0;
out:
    pthread_mutex_unlock(&v->mu);
    return rc;
}

/* 1 and a malloc'd copy of the value (free with aicirt_free) if set, 0 if not, -1 out of memory. */
int aicirt_vars_get(aicirt_vars *v, const uint8_t *name, uint32_t nlen, uint8_t **copy, uint32_t *len) {
    uint32_t h = fnv1a(name, nlen);
    int rc = 0;
    pthread_mutex_lock(&v->mu);
    var_entry *e = find(v, name, nlen, h);
    if (e && e->used) {
        *copy = bytes_dup(e->value, e->len);
        *len = e->len;
        rc = *copy ? 1 : -1;
    }
    pthread_mutex_unlock(&v->mu);
    return rc;
}

/* The changes since the last take, in order (free with aicirt_vars_free_changes). */
size_t aicirt_vars_take(aicirt_vars *v, aicirt_var_change **out) {
    pthread_mutex_lock(&v->mu);
    size_t n = v->n_changes;
    *out = v->changes;
    v->changes = 0;
    v->n_changes = v->changes_cap = 0;
    v->pending = 0;
    pthread_mutex_unlock(&v->mu);
    return n;
}

/* Every variable as a change record (seq_id 0), for a snapshot; -1 when out of memory. */
int64_t aicirt_vars_snapshot(aicirt_vars *v, aicirt_var_change **out) {
    int64_t n = 0;
    pthread_mutex_lock(&v->mu);
    aicirt_var_change *c = calloc(v->n ? v->n : 1, sizeof *c);
    if (!c) { n = -1; goto out; }
    for (uint32_t i = 0; i < v->cap; i++) {
        var_entry *e = &v->tab[i];
        if (!e->used) continue;
        c[n] = (aicirt_var_change){0, 0, e->name_len, e->len, bytes_dup(e->name, e->name_len), bytes_dup(e->value, e->len)};
        if (!c[n].name || !c[n].value) { free_changes(c, (size_t)n + 1); n = -1; goto out; }
        n++;
    }
    *out = c;
out:
    pthread_mutex_unlock(&v->mu);
    return n;
}

void aicirt_free(void *p) { free(p); }

/* ---- The imports ------------------------------------------------------------------------------- */
#define SLOT(caller, ctx) void *ctx = p_caller_context(caller); aicirt_slot *s = (aicirt_slot *)p_get_data(ctx)

/* The scalar imports: one slot field each. */
#define SCALAR_IMPORT(fn, field)                                                  \
    static void *fn(void *env, void *caller, wt_val_raw_t *a, size_t n) {       \
        SLOT(caller, ctx); (void)ctx;                                           \
        a[0].i32 = (int32_t)s->field;                                           \
        return 0;                                                               \
    }
SCALAR_IMPORT(h_vocab_size, vocab_size)
SCALAR_IMPORT(h_eos_token, eos_token)
SCALAR_IMPORT(h_self_seq_id, seq_id)
SCALAR_IMPORT(h_capabilities, capabilities)

static void *return_list(aicirt_slot *s, void *ctx, const char *name, uint32_t retptr, const uint8_t *data,
                         uint32_t len) {
    uint32_t ptr, rec[2];
    void *trap = guest_copy_in(s, ctx, name, data, len, &ptr);
    if (trap) return trap;
    rec[0] = ptr; rec[1] = len;
    guest_write(s, ctx, name, retptr, rec, sizeof rec, &trap);
    return trap;
}

static void *h_arg(void *env, void *caller, wt_val_raw_t *a, size_t n) {
    SLOT(caller, ctx);
    return return_list(s, ctx, "arg", (uint32_t)a[0].i32, s->arg, s->arg_len);
}

static void *h_log(void *env, void *caller, wt_val_raw_t *a, size_t n) {
    SLOT(caller, ctx);
    void *trap = 0;
    uint32_t len = (uint32_t)a[1].i32;
    const uint8_t *p = guest_bytes(s, ctx, "log", (uint32_t)a[0].i32, len, &trap);
    if (p) aicirt_log_append(s, p, len);
    return trap;
}

static void *h_var_get(void *env, void *caller, wt_val_raw_t *a, size_t n) {
    SLOT(caller, ctx);
    void *trap = 0;
    uint32_t nlen = (uint32_t)a[1].i32, retptr = (uint32_t)a[2].i32;
    const uint8_t *name = guest_str(s, ctx, "var-get", (uint32_t)a[0].i32, nlen, &trap);
    if (!name) return trap;
    uint8_t *copy = 0;
    uint32_t len = 0, rec[3] = {0, 0, 0};
    /* copied out under the lock, written after it: the guest's realloc may itself set variables */
    int found = aicirt_vars_get(s->vars, name, nlen, &copy, &len);
    if (found < 0) return fault(s, "host import `var-get`: out of host memory");
    if (found) {
        trap = guest_copy_in(s, ctx, "var-get", copy, len, &rec[1]);
        free(copy);
        if (trap) return trap;
        rec[0] = 1; rec[2] = len;
    }
    guest_write(s, ctx, "var-get", retptr, rec, sizeof rec, &trap);
    return trap;
}

static void *var_set(void *caller, wt_val_raw_t *a, int append) {
    SLOT(caller, ctx);
    const char *what = append ? "var-append" : "var-set";
    void *trap = 0;
    uint32_t nlen = (uint32_t)a[1].i32, vlen = (uint32_t)a[3].i32;
    const uint8_t *name = guest_str(s, ctx, what, (uint32_t)a[0].i32, nlen, &trap);
    if (!name) return trap;
    const uint8_t *val = guest_bytes(s, ctx, what, (uint32_t)a[2].i32, vlen, &trap);
    if (!val) return trap;
    uint64_t would = 0;
    int rc = aicirt_vars_set(s->vars, s->seq_id, name, nlen, val, vlen, append, &would);
    if (rc > 0)
        return fault(s, "host import `%s`: variables would take %llu bytes, over the limit of %llu "
                        "(Limits.variable_bytes)", what, (unsigned long long)would, (unsigned long long)s->vars->limit);
    if (rc < 0) return fault(s, "host import `%s`: out of host memory", what);
    return 0;
}

static void *h_var_set(void *env, void *caller, wt_val_raw_t *a, size_t n) { return var_set(caller, a, 0); }
static void *h_var_append(void *env, void *caller, wt_val_raw_t *a, size_t n) { return var_set(caller, a, 1); }

/* Everything else: into Python (takes the GIL). env is the handler's index. */
static void *h_python(void *env, void *caller, wt_val_raw_t *a, size_t n) {
    SLOT(caller, ctx);
    if (!aicirt_py_import((int32_t)(intptr_t)env, s, ctx, a)) return 0;
    void *trap = s->host_trap;   /* a failed allocation's own trap, else the fault Python wrote */
    s->host_trap = 0;
    return trap ? trap : p_trap_new(s->fault, (size_t)s->fault_len);
}

typedef void *(*host_fn)(void *env, void *caller, wt_val_raw_t *args, size_t n);

/* The callback for host import `index` (abi.HOST_IMPORTS order), or the Python trampoline. */
void *aicirt_host_callback(int index) {
    switch (index) {
    case HOST_VOCAB_SIZE: return (void *)h_vocab_size;
    case HOST_EOS_TOKEN: return (void *)h_eos_token;
    case HOST_SELF_SEQ_ID: return (void *)h_self_seq_id;
    case HOST_CAPABILITIES: return (void *)h_capabilities;
    case HOST_ARG: return (void *)h_arg;
    case HOST_LOG: return (void *)h_log;
    case HOST_VAR_GET: return (void *)h_var_get;
    case HOST_VAR_SET: return (void *)h_var_set;
    case HOST_VAR_APPEND: return (void *)h_var_append;
    default: return (void *)h_python;
    }
}

/* For the Python side of an import: the guest memory and an allocation in it. */
uint8_t *aicirt_ctx_memory(aicirt_slot *s, void *ctx, size_t *size) {
    *size = p_mem_size(ctx, &s->mem);
    return p_mem_data(ctx, &s->mem);
}

/* Allocate in the guest from inside a Python host import; on failure -1, and the trap to raise
 * is kept in s->host_trap for h_python (the Python side then returns non-zero). */
int64_t aicirt_ctx_alloc(aicirt_slot *s, void *ctx, uint32_t align, uint32_t bytes, const char *name) {
    int64_t ptr = guest_alloc(s, ctx, align, bytes);
    if (ptr < 0) s->host_trap = alloc_failure(s, name);
    return ptr;
}
