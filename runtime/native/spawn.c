/* A sequence's instance in one call: the Store, its limits and epoch callback, the instance from the
 * controller's InstancePre (copy-on-write from its image), the exports the hot path calls; and a
 * fork's copy of one instance into another (memory, mutable globals, the tokens seen, the per-call
 * record). Compiled after step.c, host.c, wasi.c and pages.c (one translation unit: build.py).
 *
 * The Store is owned by the slot (`store`): aicirt_store_delete frees it. Both functions run on the
 * engine's thread between calls (nothing of the instance runs while they do). Failures leave a
 * wasmtime error or trap in the slot (`error` / `trap`, which Native.error_text formats and frees)
 * or, for a failure of this file's own, a fault text (`fault`). instance.py holds the Python side
 * (the plan). */

/* CDEF SPAWN BEGIN */
typedef struct {
    void *engine, *pre;             /* wasm_engine_t *, wasmtime_instance_pre_t * */
    int64_t memory_bytes;           /* the Store's linear-memory limit */
    int32_t has_post, has_init;
    const char *names[7];           /* cabi_realloc, mid-process, post-return (or NULL), _initialize (or NULL), memory,
                                     * aicirt_prepare (or NULL), aicirt_prepare_template (or NULL) */
    size_t lens[7];
    int32_t n_globals;              /* the mutable globals the loader exported, copied by a fork */
    const char **global_names;
    const size_t *global_lens;
} aicirt_spawn_plan;

/* Where a first call copies its instance once aicirt_prepare has returned (on its worker, before
 * mid-process): `dst` (an aicirt_slot *), a fresh instance of the same plan that nothing else uses
 * meanwhile, becomes the prepared template (core/prepared.py). `written`: -2 until it ran, then the
 * pages written, or -1 (the copy failed: the reason in dst; the call itself goes on). */
typedef struct {
    const aicirt_spawn_plan *pl;
    void *dst;
    size_t img_lo, img_hi;
    int64_t written;
    uint64_t ns;                    /* out: the copy's wall time (CLOCK_MONOTONIC) */
    double prepare_us;              /* out: aicirt_prepare's time with aicirt_prepare_template's (µs, the call's
                                     * clock): what a copy saves */
} aicirt_capture;
/* CDEF SPAWN END */

typedef void *(*store_new_fn)(void *engine, void *data, void *finalizer);
typedef void *(*store_context_fn)(void *store);
typedef void (*store_limiter_fn)(void *store, int64_t memory_size, int64_t table_elements, int64_t instances,
                                 int64_t tables, int64_t memories);
typedef void (*store_delete_fn)(void *store);
typedef void (*set_data_fn)(void *ctx, void *data);
typedef void (*epoch_callback_fn)(void *store, void *cb, void *data, void *finalizer);
typedef void *(*pre_instantiate_fn)(void *pre, void *ctx, wt_instance_t *out, void **trap);
typedef int (*export_get_fn)(void *ctx, const wt_instance_t *inst, const char *name, size_t len, wt_extern_t *item);
typedef void *(*memory_grow_fn)(void *ctx, const wt_memory_t *m, uint64_t delta, uint64_t *prev);
typedef void (*global_get_fn)(void *ctx, const void *g, void *val);
typedef void *(*global_set_fn)(void *ctx, const void *g, const void *val);

static store_new_fn p_store_new;
static store_context_fn p_store_context;
static store_limiter_fn p_store_limiter;
static store_delete_fn p_store_delete;
static set_data_fn p_set_data;
static epoch_callback_fn p_epoch_callback;
static pre_instantiate_fn p_pre_instantiate;
static export_get_fn p_export_get;
static memory_grow_fn p_memory_grow;
static global_get_fn p_global_get;
static global_set_fn p_global_set;

#define EXTERN_FUNC 0     /* WASMTIME_EXTERN_FUNC */
#define EXTERN_GLOBAL 1   /* WASMTIME_EXTERN_GLOBAL */
#define EXTERN_MEMORY 3   /* WASMTIME_EXTERN_MEMORY */
#define WASM_PAGE_BYTES 65536u

/* Debug counters for timing spawn's and fork's phases (bench/step_overhead.py --phases): while
 * enabled by aicirt_spawn_timing(1, ...), each phase adds its wall ns (CLOCK_MONOTONIC) and 1 to its
 * count; while disabled (the default) no clock is read. Not thread-safe: one engine thread. */
enum { PH_STORE, PH_INSTANTIATE, PH_EXPORTS, PH_GROW, PH_COPY, PH_GLOBALS, PH_RECORD, PH_N };
static int phase_on;
static uint64_t phase_ns[PH_N], phase_count[PH_N];

static uint64_t phase_clock(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* End phase `ph`, begun at *t (when enabled); the next phase begins now. */
static inline void phase_end(int ph, uint64_t *t) {
    if (!phase_on) return;
    uint64_t now = phase_clock();
    phase_ns[ph] += now - *t;
    phase_count[ph]++;
    *t = now;
}

/* Enable (on != 0) or disable the counters; `out` (2 * PH_N entries, or NULL) gets the ns then the
 * counts summed so far, which are then reset. */
void aicirt_spawn_timing(int on, uint64_t *out) {
    if (out) {
        memcpy(out, phase_ns, sizeof phase_ns);
        memcpy(out + PH_N, phase_count, sizeof phase_count);
    }
    memset(phase_ns, 0, sizeof phase_ns);
    memset(phase_count, 0, sizeof phase_count);
    phase_on = on;
}

/* libwasmtime's entry points, from the copy wasmtime-py loaded (the order of compiled.py's list). */
void aicirt_bind_spawn(void **fns) {
    p_store_new = (store_new_fn)fns[0];
    p_store_context = (store_context_fn)fns[1];
    p_store_limiter = (store_limiter_fn)fns[2];
    p_store_delete = (store_delete_fn)fns[3];
    p_set_data = (set_data_fn)fns[4];
    p_epoch_callback = (epoch_callback_fn)fns[5];
    p_pre_instantiate = (pre_instantiate_fn)fns[6];
    p_export_get = (export_get_fn)fns[7];
    p_memory_grow = (memory_grow_fn)fns[8];
    p_global_get = (global_get_fn)fns[9];
    p_global_set = (global_set_fn)fns[10];
}

static int spawn_fault(aicirt_slot *s, const char *fmt, const char *name, size_t len) {
    int n = snprintf(s->fault, sizeof s->fault, fmt, (int)len, name);
    s->fault_len = n < 0 ? 0 : (n >= (int)sizeof s->fault ? (int)sizeof s->fault - 1 : n);
    return 1;
}

/* Copy export `name` of kind `kind` out of `inst`'s instance into `out` (`n` bytes of its handle,
 * at most 24); 0, or 1 with a fault in `report`. */
static int export_copy(const aicirt_slot *inst, aicirt_slot *report, const char *name, size_t len, uint8_t kind,
                       void *out, size_t n) {
    wt_extern_t item;
    if (!p_export_get(inst->ctx, &inst->inst, name, len, &item))
        return spawn_fault(report, "export '%.*s' is missing", name, len);
    if (item.kind != kind)
        return spawn_fault(report, "export '%.*s' is of another kind", name, len);
    memcpy(out, item.of, n);
    return 0;
}

/* A fresh instance for slot `s` (its limits already written): a Store limited to the plan's memory,
 * whose data is `s` (host.c finds its sequence through it) and whose epoch-deadline callback holds
 * calls to their CPU limits (step.c), the clock started on this thread; the instance, and the
 * exports the hot path calls copied into `s` (no start function runs: admission refuses one).
 * Returns 0, or 1 with the reason in `s` (error / trap / fault). Either way s->store is the Store
 * (NULL only if none could be made), for the caller to free with aicirt_store_delete. */
int aicirt_spawn(const aicirt_spawn_plan *pl, aicirt_slot *s) {
    uint64_t t = phase_on ? phase_clock() : 0;
    void *store = p_store_new(pl->engine, NULL, NULL);
    s->store = store;
    if (!store) return spawn_fault(s, "%.*s", "no Store could be made", 22);
    p_store_limiter(store, pl->memory_bytes, -1, -1, -1, -1);
    s->ctx = p_store_context(store);
    p_set_data(s->ctx, s);
    p_epoch_callback(store, (void *)aicirt_epoch_cb, s, NULL);
    s->budget_us = (double)s->first_call_ticks * s->tick_us;
    aicirt_clock_start(s, s->budget_us);
    phase_end(PH_STORE, &t);
    void *trap = 0;
    void *err = p_pre_instantiate(pl->pre, s->ctx, &s->inst, &trap);
    phase_end(PH_INSTANTIATE, &t);
    if (err || trap) {
        s->error = err;
        s->trap = trap;
        return 1;
    }
    if (export_copy(s, s, pl->names[0], pl->lens[0], EXTERN_FUNC, &s->f_realloc, sizeof s->f_realloc)
        || export_copy(s, s, pl->names[1], pl->lens[1], EXTERN_FUNC, &s->f_mid, sizeof s->f_mid)
        || (pl->has_post && export_copy(s, s, pl->names[2], pl->lens[2], EXTERN_FUNC, &s->f_post, sizeof s->f_post))
        || (pl->has_init && export_copy(s, s, pl->names[3], pl->lens[3], EXTERN_FUNC, &s->f_init, sizeof s->f_init))
        || export_copy(s, s, pl->names[4], pl->lens[4], EXTERN_MEMORY, &s->mem, sizeof s->mem)
        || (pl->names[5] && export_copy(s, s, pl->names[5], pl->lens[5], EXTERN_FUNC, &s->f_prepare,
                                        sizeof s->f_prepare))
        || (pl->names[6] && export_copy(s, s, pl->names[6], pl->lens[6], EXTERN_FUNC, &s->f_prepare_template,
                                        sizeof s->f_prepare_template)))
        return 1;
    wt_extern_t notice;   /* the optional time notice (clock.c): an i32 global, the address of a u32 */
    uint64_t val[8];      /* wasmtime_val_t: kind (0: i32) at 0, the value at 8 */
    s->notice_addr = 0;
    if (p_export_get(s->ctx, &s->inst, "aicirt_time_notice", 18, &notice) && notice.kind == EXTERN_GLOBAL) {
        p_global_get(s->ctx, notice.of, val);
        if ((uint8_t)val[0] == 0) s->notice_addr = (uint32_t)val[1];
    }
    phase_end(PH_EXPORTS, &t);
    s->has_post = pl->has_post;
    s->needs_init = pl->has_init;   /* _initialize runs on the worker, first */
    s->needs_prepare = pl->names[5] != NULL;   /* then aicirt_prepare (step.c) */
    s->has_prepare_template = pl->names[6] != NULL;
    return 0;
}

/* Free the slot's Store (and with it its instance and memory slot); idempotent. */
void aicirt_store_delete(aicirt_slot *s) {
    void *store = s->store;
    s->store = 0;
    s->ctx = 0;
    if (store) p_store_delete(store);
}

/* Make `dst`, a fresh instance of the plan's controller that has not run, hold `src`'s instance
 * state: linear memory (grown to src's size; only the pages that can differ from a fresh instance
 * are written: pages.c, given the fresh image's nonzero extent [img_lo, img_hi)) and every mutable
 * global. Returns the pages written (>= 0), or -1 with the reason in `dst`. `t`: the phase clock
 * (NULL: off the engine's thread, no phase timing). */
static int64_t copy_instance(const aicirt_spawn_plan *pl, aicirt_slot *src, aicirt_slot *dst, size_t img_lo,
                             size_t img_hi, uint64_t *t) {
    uint64_t none = 0;
    if (!t) t = &none;
    int timed = t != &none;
    size_t src_size = p_mem_size(src->ctx, &src->mem), dst_size = p_mem_size(dst->ctx, &dst->mem);
    if (src_size > dst_size) {
        uint64_t prev = 0;
        void *err = p_memory_grow(dst->ctx, &dst->mem, (src_size - dst_size) / WASM_PAGE_BYTES, &prev);
        if (err) { dst->error = err; return -1; }
    }
    if (timed) phase_end(PH_GROW, t);
    size_t written = aicirt_copy_changed(p_mem_data(dst->ctx, &dst->mem), p_mem_data(src->ctx, &src->mem),
                                         src_size, img_lo, img_hi, (size_t)src->resident_bytes,
                                         (size_t)dst->resident_bytes);
    if (timed) phase_end(PH_COPY, t);
    for (int32_t k = 0; k < pl->n_globals; k++) {
        uint64_t gs[3], gd[3], val[8];   /* wasmtime_global_t (<= 24 bytes), wasmtime_val_t (<= 64: compiled.py checks) */
        const char *name = pl->global_names[k];
        size_t len = pl->global_lens[k];
        if (export_copy(src, dst, name, len, EXTERN_GLOBAL, gs, sizeof gs)
            || export_copy(dst, dst, name, len, EXTERN_GLOBAL, gd, sizeof gd))
            return -1;
        p_global_get(src->ctx, gs, val);
        void *err = p_global_set(dst->ctx, gd, val);
        if (err) { dst->error = err; return -1; }
    }
    if (timed) phase_end(PH_GLOBALS, t);
    return (int64_t)written;
}

/* A fork: make `dst`, a fresh instance of the plan's controller that has not run, a copy of `src`
 * (an idle instance of it): its instance state (copy_instance), the tokens the controller saw, and
 * the per-call record that goes with the state (a pending post-return, whether _initialize and
 * aicirt_prepare have run, the calls made and the caller-runs rule's history of them; WASI
 * random_get's stream split between the two). Returns the pages written (>= 0), or -1 with the
 * reason in `dst`. */
int64_t aicirt_fork_copy(const aicirt_spawn_plan *pl, aicirt_slot *src, aicirt_slot *dst, size_t img_lo, size_t img_hi) {
    uint64_t t = phase_on ? phase_clock() : 0;
    int64_t written = copy_instance(pl, src, dst, img_lo, img_hi, &t);
    if (written < 0) return -1;
    if (aicirt_seen_copy(src, dst)) {
        spawn_fault(dst, "%.*s", "out of memory for the tokens seen", 33);
        return -1;
    }
    dst->post_pending = src->post_pending;
    dst->post_ptr = src->post_ptr;
    dst->post_left_us = src->post_left_us;
    dst->needs_init = src->needs_init;
    dst->needs_prepare = src->needs_prepare > 0;
    dst->calls = src->calls;
    /* the caller-runs rule's history: the child's calls continue the parent's state (step.c) */
    dst->hist_calls = src->hist_calls;
    dst->hist_max_us = src->hist_max_us;
    dst->steal_barred = src->steal_barred;
    /* WASI random_get: the child gets its own stream, the same on a replay (wasi_rng.py: split) */
    if (!src->wasi_rng) src->wasi_rng = wasi_seed(src->arg, src->arg_len);
    uint64_t r = wasi_mix(&src->wasi_rng);
    dst->wasi_rng = r ? r : 1;
    phase_end(PH_RECORD, &t);
    return written;
}

/* On the worker of a first call, right after aicirt_prepare returned (step.c): copy the instance
 * into the capture's template (copy_instance), with the WASI random stream as prepare left it and
 * nothing left to run before mid-process. The call's own instance is only read. */
void aicirt_capture_run(void *capture, aicirt_slot *src) {
    aicirt_capture *c = (aicirt_capture *)capture;
    aicirt_slot *dst = (aicirt_slot *)c->dst;
    c->prepare_us = cpu_used_us(src);   /* the call's clock started with prepare (step.c), its template part included */
    uint64_t t0 = phase_clock();
    int64_t written = copy_instance(c->pl, src, dst, c->img_lo, c->img_hi, NULL);
    c->ns = phase_clock() - t0;
    if (written >= 0) {
        dst->wasi_rng = src->wasi_rng;
        dst->needs_init = dst->needs_prepare = 0;
    }
    __atomic_store_n(&c->written, written, __ATOMIC_RELEASE);
}

/* A new request's first instance from a prepared template (core/prepared.py), on the engine's
 * thread: `dst`, a fresh instance of the plan that has not run, takes the template's instance
 * state and WASI stream; _initialize and aicirt_prepare are then not run again, and its calls
 * count from 0 (its first call is a first call: the prompt, the first-call limit). Returns the
 * pages written, or -1 with the reason in `dst`. */
int64_t aicirt_template_fork(const aicirt_spawn_plan *pl, aicirt_slot *tpl, aicirt_slot *dst, size_t img_lo,
                             size_t img_hi) {
    uint64_t t = phase_on ? phase_clock() : 0;
    int64_t written = copy_instance(pl, tpl, dst, img_lo, img_hi, &t);
    if (written < 0) return -1;
    dst->needs_init = dst->needs_prepare = 0;
    dst->wasi_rng = tpl->wasi_rng;
    return written;
}
