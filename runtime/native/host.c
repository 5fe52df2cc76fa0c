/* Host imports of WIT interface `host` as native callbacks (built with slot.c and the rest).
 *
 * The imports a controller may call on every step (abi.NATIVE_IMPORTS: vocab-size, eos-token,
 * self-seq-id, capabilities, arg, var-get, var-set, var-append, log) run here, on the worker
 * thread, without the GIL: a few hundred ns instead of tens of µs through wasmtime-py. The others
 * (tokenize, detokenize, token-trie, the WASI shim) go through one trampoline into Python
 * (`p_py_import`, a cffi callback that takes the GIL, set by aicirt_bind_py_import).
 *
 * The Store's data pointer is the sequence's slot. A guest that passes something invalid gets a
 * trap whose message is also kept in its own slot (`fault`): never in a process-global place.
 * Variables live in one `aicirt_vars` per request (shared by its forks, guarded by a mutex);
 * the changes not yet taken are marks on them, coalesced per name, for the embedder to stream.
 */
#include <stdarg.h>
#include <stdio.h>

typedef int (*py_import_fn)(int32_t index, aicirt_slot *s, void *ctx, wt_val_raw_t *args);
static py_import_fn p_py_import;

/* The Python trampoline (a cffi callback; Python keeps it alive for the process). */
void aicirt_bind_py_import(void *fn) { p_py_import = (py_import_fn)fn; }

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
/* Accounting (Limits.variable_bytes) counts what the variables really take in native memory: the
 * entry array, the hash slots and the pending-change order (their allocated capacity), and each
 * name and value as the malloc chunk that holds it (glibc on 64-bit: 8 bytes of header, 16-byte
 * granules, 32 at least; a chunk past the mmap threshold rounds to pages).
 *
 * Changes are coalesced per name between two takes, so the changes not yet taken cost nothing but
 * a mark on the variable: a `set` after anything replaces the pending change (its value is then the
 * variable's whole value), appends after appends concatenate (their value is the variable's tail).
 * A take therefore writes at most one record per variable, in the order each was first changed
 * since the last take, with the last writer's seq-id; it is one buffer (aicirt_vars_take). */
#define PENDING_NONE 0
#define PENDING_APPEND 1
#define PENDING_SET 2

typedef struct {
    uint8_t *name, *value;
    uint32_t name_len, len, cap, hash;
    uint32_t pending, pending_len, writer;   /* the change not yet taken */
} var_entry;

struct aicirt_vars {
    pthread_mutex_t mu;
    var_entry *ents;                 /* insertion order; indices are stable (no deletion) */
    uint32_t *order;                 /* entries changed since the last take, first change first */
    uint32_t *slots;                 /* open addressing over ents: index + 1, 0 empty; cap a power of two */
    uint32_t n, ents_cap, slots_cap, n_order;
    uint64_t held, limit;
};

#define ENT_COST (sizeof(var_entry) + sizeof(uint32_t))   /* an entry and its place in `order` */

static uint64_t chunk(uint64_t n) {
    if (!n) return 0;                                      /* nothing allocated */
    if (n >= (128u << 10)) return (n + 16 + 4095) & ~(uint64_t)4095;
    uint64_t c = (n + 8 + 15) & ~(uint64_t)15;
    return c < 32 ? 32 : c;
}

static uint64_t tables_bytes(uint32_t ents_cap, uint32_t slots_cap) {
    return (uint64_t)ents_cap * ENT_COST + (uint64_t)slots_cap * sizeof(uint32_t);
}

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

void aicirt_vars_free(aicirt_vars *v) {
    if (!v) return;
    for (uint32_t i = 0; i < v->n; i++) { free(v->ents[i].name); free(v->ents[i].value); }
    free(v->ents);
    free(v->order);
    free(v->slots);
    pthread_mutex_destroy(&v->mu);
    free(v);
}

uint64_t aicirt_vars_held(aicirt_vars *v) {
    pthread_mutex_lock(&v->mu);
    uint64_t held = v->held;
    pthread_mutex_unlock(&v->mu);
    return held;
}

/* The slot for `name`: holding its entry's index + 1, or empty (0) where it would go. */
static uint32_t *find(aicirt_vars *v, const uint8_t *name, uint32_t n, uint32_t h) {
    for (uint32_t i = h & (v->slots_cap - 1);; i = (i + 1) & (v->slots_cap - 1)) {
        uint32_t k = v->slots[i];
        if (!k) return &v->slots[i];
        var_entry *e = &v->ents[k - 1];
        if (e->hash == h && e->name_len == n && !memcmp(e->name, name, n)) return &v->slots[i];
    }
}

/* Room for one more entry (held already counts the new capacities); 0 when out of memory. */
static int grow(aicirt_vars *v, uint32_t ents_cap, uint32_t slots_cap) {
    if (ents_cap != v->ents_cap) {
        var_entry *e = realloc(v->ents, ents_cap * sizeof *e);
        if (!e) return 0;
        v->ents = e;
        uint32_t *o = realloc(v->order, ents_cap * sizeof *o);
        if (!o) return 0;
        v->order = o;
        v->ents_cap = ents_cap;
    }
    if (slots_cap != v->slots_cap) {
        uint32_t *slots = calloc(slots_cap, sizeof *slots);
        if (!slots) return 0;
        for (uint32_t i = 0; i < v->n; i++) {
            uint32_t j = v->ents[i].hash & (slots_cap - 1);
            while (slots[j]) j = (j + 1) & (slots_cap - 1);
            slots[j] = i + 1;
        }
        free(v->slots);
        v->slots = slots;
        v->slots_cap = slots_cap;
    }
    return 1;
}

/* Set or append. Returns 0, 1 when over the limit (*would: the bytes it would take), -1 when out
 * of memory. Nothing changes unless it returns 0. Appends grow the value geometrically (amortised
 * O(1) a byte), never past what the limit leaves. */
int aicirt_vars_set(aicirt_vars *v, uint32_t seq_id, const uint8_t *name, uint32_t nlen, const uint8_t *val,
                    uint32_t vlen, int append, uint64_t *would) {
    uint32_t h = fnv1a(name, nlen);
    int rc = -1;
    pthread_mutex_lock(&v->mu);
    uint32_t *slot = v->slots_cap ? find(v, name, nlen, h) : 0;
    var_entry *e = slot && *slot ? &v->ents[*slot - 1] : 0;
    uint64_t held = v->held, new_len = (append && e ? e->len : 0) + (uint64_t)vlen;
    uint32_t ents_cap = v->ents_cap, slots_cap = v->slots_cap;
    if (!e) {
        if (v->n == ents_cap) ents_cap = ents_cap ? ents_cap * 2 : 16;
        if ((uint64_t)(v->n + 1) * 4 > (uint64_t)slots_cap * 3) slots_cap = slots_cap ? slots_cap * 2 : 16;
        held += tables_bytes(ents_cap, slots_cap) - tables_bytes(v->ents_cap, v->slots_cap) + chunk(nlen);
    } else {
        held -= chunk(e->cap);
    }
    uint64_t cap = new_len;
    if (append && e && new_len > e->cap) {   /* geometric, within the limit */
        uint64_t want = (uint64_t)e->cap * 2, room = v->limit > held + chunk(new_len) ? v->limit - held : 0;
        if (want > new_len && chunk(want) <= room) cap = want;
    } else if (e && new_len <= e->cap && (append || new_len * 2 > e->cap)) {
        cap = e->cap;                     /* fits: keep the buffer */
    }
    held += chunk(cap);
    if (held > v->limit) {
        *would = held;
        rc = 1;
        goto out;
    }
    if (new_len > UINT32_MAX || cap > UINT32_MAX) goto out;
    if (!e) {   /* whatever is allocated here is counted at once, even if a later step fails */
        uint64_t before = tables_bytes(v->ents_cap, v->slots_cap);
        int grown = grow(v, ents_cap, slots_cap);
        v->held += tables_bytes(v->ents_cap, v->slots_cap) - before;
        uint8_t *ename = grown && nlen ? malloc(nlen) : 0;
        if (!grown || (nlen && !ename)) goto out;
        if (nlen) memcpy(ename, name, nlen);
        slot = find(v, name, nlen, h);
        e = &v->ents[v->n];
        *e = (var_entry){ename, 0, nlen, 0, 0, h, PENDING_NONE, 0, 0};
        *slot = ++v->n;
        v->held += chunk(nlen);   /* a new entry stays (empty) if its value cannot be allocated */
    }
    if (cap != e->cap) {   /* a set copies nothing old: a fresh block, exactly the size counted */
        uint8_t *value = !cap ? 0 : append ? realloc(e->value, cap) : malloc(cap);
        if (cap && !value) goto out;
        if (!append || !cap) free(e->value);
        e->value = value;
        e->cap = (uint32_t)cap;
    }
    if (vlen) memcpy(e->value + (new_len - vlen), val, vlen);
    e->len = (uint32_t)new_len;
    if (e->pending == PENDING_NONE) {
        v->order[v->n_order++] = (uint32_t)(e - v->ents);
        e->pending_len = 0;
    }
    if (!append) e->pending = PENDING_SET;
    else if (e->pending != PENDING_SET) { e->pending = PENDING_APPEND; e->pending_len += vlen; }
    e->writer = seq_id;
    v->held = held;
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
    uint32_t *slot = v->slots_cap ? find(v, name, nlen, h) : 0;
    if (slot && *slot) {
        var_entry *e = &v->ents[*slot - 1];
        *copy = malloc(e->len ? e->len : 1);
        if (*copy && e->len) memcpy(*copy, e->value, e->len);
        *len = e->len;
        rc = *copy ? 1 : -1;
    }
    pthread_mutex_unlock(&v->mu);
    return rc;
}

/* Records of (uint32 seq_id, uint32 append, uint32 name_len, uint32 value_len, name, value), one
 * after another in one malloc'd buffer (free with aicirt_free); *out NULL when there are none. */
#define REC_HEAD 16

static int64_t write_records(var_entry **es, uint32_t n, int changes, uint8_t **out, uint64_t *bytes) {
    uint64_t total = 0;
    for (uint32_t i = 0; i < n; i++)
        total += REC_HEAD + es[i]->name_len + (changes && es[i]->pending == PENDING_APPEND ? es[i]->pending_len : es[i]->len);
    *out = 0;
    *bytes = total;
    if (!n) return 0;
    uint8_t *buf = malloc(total), *p = buf;
    if (!buf) return -1;
    for (uint32_t i = 0; i < n; i++) {
        var_entry *e = es[i];
        int app = changes && e->pending == PENDING_APPEND;
        uint32_t vlen = app ? e->pending_len : e->len, head[4] = {changes ? e->writer : 0, (uint32_t)app, e->name_len, vlen};
        memcpy(p, head, REC_HEAD);
        if (e->name_len) memcpy(p + REC_HEAD, e->name, e->name_len);
        if (vlen) memcpy(p + REC_HEAD + e->name_len, e->value + (e->len - vlen), vlen);
        p += REC_HEAD + e->name_len + vlen;
    }
    *out = buf;
    return n;
}

/* The changes since the last take (coalesced per name, see above) as records; -1 when out of
 * memory (nothing is taken then). */
int64_t aicirt_vars_take(aicirt_vars *v, uint8_t **out, uint64_t *bytes) {
    pthread_mutex_lock(&v->mu);
    int64_t n = -1;
    var_entry **es = malloc((v->n_order ? v->n_order : 1) * sizeof *es);
    if (es) {
        for (uint32_t i = 0; i < v->n_order; i++) es[i] = &v->ents[v->order[i]];
        n = write_records(es, v->n_order, 1, out, bytes);
        if (n >= 0) {
            for (uint32_t i = 0; i < v->n_order; i++) es[i]->pending = PENDING_NONE;
            v->n_order = 0;
        }
        free(es);
    }
    pthread_mutex_unlock(&v->mu);
    return n;
}

/* Every variable as a record (seq_id 0, set), for a snapshot; -1 when out of memory. */
int64_t aicirt_vars_snapshot(aicirt_vars *v, uint8_t **out, uint64_t *bytes) {
    pthread_mutex_lock(&v->mu);
    int64_t n = -1;
    var_entry **es = malloc((v->n ? v->n : 1) * sizeof *es);
    if (es) {
        for (uint32_t i = 0; i < v->n; i++) es[i] = &v->ents[i];
        n = write_records(es, v->n, 0, out, bytes);
        free(es);
    }
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
SCALAR_IMPORT(h_capabilities, capabilities)

/* aicirt_prepare's state is shared by every request with the same controller, argument and
 * capabilities (core/prepared.py): what is this sequence's or this request's own is refused there. */
static void *prepare_refuses(aicirt_slot *s, const char *name) {
    if (s->stage != AICIRT_STAGE_PREPARE) return 0;
    return fault(s, "host import `%s`: `aicirt_prepare` may not call it (its state is shared by every request with "
                    "this argument: no sequence or variables yet); call it from mid-process", name);
}

static void *h_self_seq_id(void *env, void *caller, wt_val_raw_t *a, size_t n) {
    SLOT(caller, ctx); (void)ctx;
    void *trap = prepare_refuses(s, "self-seq-id");
    if (!trap) a[0].i32 = (int32_t)s->seq_id;
    return trap;
}

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
    void *trap = prepare_refuses(s, "var-get");
    if (trap) return trap;
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
    void *trap = prepare_refuses(s, what);
    if (trap) return trap;
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
    if (!p_py_import((int32_t)(intptr_t)env, s, ctx, a)) return 0;
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
