/* The per-sequence step of the hot path, in C (compiled on first use with cffi's API mode).
 *
 * aicirt_step runs `mid-process` for one sequence on a worker thread of the pool below, with the
 * GIL released: allocate and write the arguments through the guest's cabi_realloc, call
 * mid-process, lift the common result (one branch, a mask, no splices) straight into the batch's
 * mask row, then call cabi_post_mid-process. Anything rarer (stop, forks, splices, no mask) is left to Python
 * (status AICIRT_LIFT), which reads the same linear memory through a numpy view; that result's
 * post-return runs here too, first thing in the sequence's next call.
 *
 * libwasmtime is not linked: the function pointers come from the library wasmtime-py already
 * loaded (aicirt_bind), so there is exactly one copy of wasmtime in the process.
 * The struct layouts below mirror wasmtime 50's C API (wasmtime/extern.h, val.h); the text between
 * the CDEF markers is also cffi's declaration of them (ffi_decl.py reads it from here).
 * Host imports are in host.c, compiled with this file.
 */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <sched.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ABI_* layouts, AICIRT_* statuses and HOST_* import indices are #defined above this file,
 * generated from runtime/abi.py (abi.c_header()). */

/* CDEF BEGIN */
typedef struct { uint64_t store_id; void *priv; } wt_func_t;                      /* 16 bytes */
typedef struct { struct { uint64_t store_id; uint32_t p1; } a; uint32_t p2; } wt_memory_t; /* 24 */
typedef union { int32_t i32; int64_t i64; float f32; double f64; uint8_t v128[16]; void *ref; } wt_val_raw_t;
typedef struct { uint64_t store_id; size_t index; } wt_instance_t;                 /* 16 */
typedef struct { uint8_t kind; uint64_t of[3]; } wt_extern_t;                       /* 32: kind, then the handle */
typedef struct aicirt_vars aicirt_vars;

typedef struct {
    void *ctx;
    wt_func_t f_realloc, f_mid, f_post, f_init;
    wt_memory_t mem;
    int32_t has_post, needs_init;   /* needs_init: run _initialize before this (first) call */
    int32_t post_pending;           /* a lifted result's post-return, run first thing in the next call */
    uint32_t post_ptr;
    double post_left_us;            /* what its call left of its time limit */
    uint64_t first_call_ticks;      /* a start function's limit, in epoch ticks (instantiation) */
    double budget_us, tick_us;      /* this call's time limit; the epoch tick */
    /* in */
    uint32_t backtrack, n_tokens, sampled_is_some, sampled, n_group;
    const uint32_t *tokens, *group;
    uint32_t *mask_row;   /* branch 0's mask lands here */
    uint32_t mask_words, vocab_size;
    /* out */
    volatile int32_t started;       /* a worker has begun the call (it is not just queued) */
    int32_t stage;                  /* what ran when it failed: abi.Stage */
    double started_us;
    int32_t status;
    uint32_t result_ptr;
    uint32_t n_branches, branches_ptr;
    int32_t temp_is_some;
    float temp;
    uint32_t detail[2];   /* what was wrong, for the message (see abi.Status) */
    void *error, *trap;
    double elapsed_us;
    volatile int32_t done;
    /* host state, read by host.c's imports on the worker thread */
    uint32_t seq_id, eos_token, capabilities, host_arg_cap;
    const uint8_t *arg;
    uint32_t arg_len;
    aicirt_vars *vars;
    uint8_t *log;                   /* the last log_cap bytes logged, oldest dropped */
    uint32_t log_len, log_cap, call_log_len;
    void *host_trap;                /* a trap a Python host import is about to raise */
    int32_t fault_len;              /* a host import's fault: why the guest trapped */
    char fault[256];
    /* the rows API (aicirt_rows_start / aicirt_rows_collect), on the engine's thread between calls */
    uint32_t *seen;                 /* the tokens as the controller last saw them (malloc'd) */
    uint32_t n_seen, seen_cap;
    int32_t call_out;               /* 0: none; 1: in a batch not yet waited for; 2: late, from an earlier step */
    int32_t stopped;                /* finished, closing or closed: no more calls */
    uint32_t calls;                 /* calls started so far */
    uint64_t stamp;                 /* the last batch that took it (a duplicate in one batch is refused) */
    double first_budget_us, call_budget_us;
    /* the call's clocks, read by the epoch-deadline callback (docs/protocol.md#limits: the hard limits count CPU time) */
    int32_t cpu_clock;              /* the CPU clock (clockid_t) of the thread running the call */
    int64_t cpu_start_ns;           /* that clock at the part's first epoch tick (-1: no tick yet, not read) */
    double cpu_pre_us;              /* what the part is charged for its time before that tick (<= one tick) */
    double cpu_budget_us;           /* the CPU time that part may use */
    double wall_start_us;           /* when that part began, for the wall-clock backstop */
    double wall_factor;             /* the backstop: this times the call's limit (Limits.wall_backstop_factor; 0: none) */
    double cpu_us;                  /* out: the CPU time the call used */
    double turn_wait_us;            /* what the call waited for its turns as a stalled call, so far */
    double turn_wait_since_us;      /* when its current wait for a turn began; 0: not waiting */
    uint64_t wasi_rng;              /* WASI random_get's stream (wasi.c); 0: not seeded yet */
    /* the instance (spawn.c): the Store this slot owns, and the instance in it */
    void *store;
    wt_instance_t inst;
    uint64_t resident_bytes;        /* linear memory's first bytes the pooled slot kept resident at spawn (a hint: pages.c) */
    /* the caller-runs rule (see the pool): a queued call may run on the caller's thread at wait() */
    int32_t claimed;                /* a worker or a waiting caller has taken the queued call (under the pool's mu) */
    uint64_t qpos;                  /* where the queued call sits in the pool's ring (under mu): a caller
                                     * that takes it clears that entry, so no worker meets the slot again */
    int32_t steal_barred;           /* a call run on a caller outlasted that wait's deadline: never on a caller again */
    uint32_t hist_calls;            /* calls after the first that have ended */
    double hist_max_us;             /* the most CPU time one of them used */
} aicirt_slot;
/* CDEF END */

typedef void *(*call_unchecked_fn)(void *ctx, const wt_func_t *f, wt_val_raw_t *args, size_t n, void **trap);
typedef uint8_t *(*memory_data_fn)(void *ctx, const wt_memory_t *m);
typedef size_t (*memory_size_fn)(void *ctx, const wt_memory_t *m);
typedef void (*set_deadline_fn)(void *ctx, uint64_t ticks);
typedef void *(*caller_context_fn)(void *caller);
typedef void *(*context_get_data_fn)(void *ctx);
typedef void *(*trap_new_fn)(const char *msg, size_t len);
typedef void (*error_delete_fn)(void *err);
typedef void *(*error_new_fn)(const char *msg);
typedef void (*increment_epoch_fn)(void *engine);

static call_unchecked_fn p_call;
static memory_data_fn p_mem_data;
static memory_size_fn p_mem_size;
static set_deadline_fn p_deadline;
static caller_context_fn p_caller_context;
static context_get_data_fn p_get_data;
static trap_new_fn p_trap_new;
static error_delete_fn p_error_delete;
static error_new_fn p_error_new;
static increment_epoch_fn p_increment_epoch;

int aicirt_bind(void *call, void *mem_data, void *mem_size, void *deadline, void *caller_context,
                void *get_data, void *trap_new, void *error_delete) {
    p_call = (call_unchecked_fn)call;
    p_mem_data = (memory_data_fn)mem_data;
    p_mem_size = (memory_size_fn)mem_size;
    p_deadline = (set_deadline_fn)deadline;
    p_caller_context = (caller_context_fn)caller_context;
    p_get_data = (context_get_data_fn)get_data;
    p_trap_new = (trap_new_fn)trap_new;
    p_error_delete = (error_delete_fn)error_delete;
    return (int)sizeof(aicirt_slot);
}

static double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec * 1e-3;
}

static int call(aicirt_slot *s, void *ctx, const wt_func_t *f, wt_val_raw_t *args, size_t n) {
    void *trap = 0;
    void *err = p_call(ctx, f, args, n, &trap);
    if (err || trap) {
        s->error = err;
        s->trap = trap;
        return 0;
    }
    return 1;
}

/* ---- The hard time limits, in CPU time (docs/protocol.md#limits) ---------------------------------------------
 * Every store has aicirt_epoch_cb as its epoch-deadline callback (data: its slot), and a call
 * runs with a deadline of one tick, so the callback runs at each epoch tick the call is in Wasm,
 * ON the thread running it. It compares the CPU time of that thread since the call began
 * (CLOCK_THREAD_CPUTIME_ID) with the call's limit: a busy machine slows a call down but never
 * spends its budget. A generous wall-clock backstop (Limits.wall_backstop_factor times the call's
 * limit, not counting time it waited for its turn in the pool) still ends a call that is starved
 * of CPU for that long. On a worker, a call past the pool's stall threshold runs only in its
 * turn, and waits for it here (see the pool). */
static int64_t cpu_now_ns(clockid_t clock) {
    struct timespec ts;
    if (clock_gettime(clock, &ts) != 0) return -1;
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* The thread's CPU clock is read lazily. Reading it is a system call (about 1 µs on a VM: more than
 * a whole common call), so a call starts with a wall-clock stamp only (vDSO, cheap), and the CPU
 * clock is first read at the call's first epoch tick; the time before that tick is charged as CPU
 * at its wall-clock length, capped at one tick (a call cannot run longer than that before the tick
 * reaches it, unless the epoch clock itself is late). A call that ends before a tick never reads it. */
static double cpu_used_us(aicirt_slot *s) {   /* on the call's own thread */
    int64_t start = s->cpu_start_ns;
    if (start < 0) return now_us() - s->wall_start_us;   /* no tick yet: its wall time bounds its CPU */
    return s->cpu_pre_us + (double)(cpu_now_ns(CLOCK_THREAD_CPUTIME_ID) - start) / 1e3;
}

/* The part's first epoch tick: read the CPU clock from here on (on the call's own thread). */
static void cpu_base(aicirt_slot *s, double now) {
    if (s->cpu_start_ns >= 0) return;
    double pre = now - s->wall_start_us;
    s->cpu_pre_us = pre < s->tick_us ? pre : s->tick_us;
    __atomic_store_n(&s->cpu_start_ns, cpu_now_ns(CLOCK_THREAD_CPUTIME_ID), __ATOMIC_RELEASE);
}

static __thread clockid_t tl_clock;
static __thread int tl_clock_known;

/* Start (or restart) the running call's clocks on the calling thread: `budget_us` of CPU from
 * now, the wall-clock backstop from the call's own limit. */
void aicirt_clock_start(aicirt_slot *s, double budget_us) {
    if (!tl_clock_known) {   /* the thread's CPU clock id, once per thread */
        if (pthread_getcpuclockid(pthread_self(), &tl_clock) != 0) tl_clock = CLOCK_THREAD_CPUTIME_ID;
        tl_clock_known = 1;
    }
    s->cpu_clock = (int32_t)tl_clock;
    s->cpu_pre_us = 0;
    __atomic_store_n(&s->cpu_start_ns, -1, __ATOMIC_RELEASE);
    s->cpu_budget_us = budget_us;
    s->wall_start_us = now_us();
    p_deadline(s->ctx, 1);
}

/* The CPU time (µs) the slot's call has used: read from another thread while it runs (the
 * lateness rule, docs/protocol.md#limits), what it used once it is done, 0 before it starts. */
double aicirt_call_cpu_us(aicirt_slot *s) {
    if (!__atomic_load_n(&s->started, __ATOMIC_ACQUIRE)) return 0;
    if (__atomic_load_n(&s->done, __ATOMIC_ACQUIRE)) return s->cpu_us;
    int64_t start = __atomic_load_n(&s->cpu_start_ns, __ATOMIC_ACQUIRE);
    if (start < 0) return 0;   /* no epoch tick has reached it yet: it has not run a tick's worth */
    int64_t now = cpu_now_ns((clockid_t)s->cpu_clock);
    if (now < 0 || __atomic_load_n(&s->done, __ATOMIC_ACQUIRE)) return s->cpu_us;   /* it just ended */
    return s->cpu_pre_us + (now > start ? (double)(now - start) / 1e3 : 0);
}

static double stalled_turn(aicirt_slot *s, double now, double cpu_us);

/* The call's own time (µs): the CPU it used plus what it waited for its turns as a stalled call
 * (waiting for a turn is a stuck call's share of the cores, not the machine's doing). Read by the
 * engine thread for the lateness rule (docs/protocol.md#limits); 0 before the call starts. */
double aicirt_call_own_us(aicirt_slot *s) {
    if (!__atomic_load_n(&s->started, __ATOMIC_ACQUIRE)) return 0;
    double since = s->turn_wait_since_us;
    return aicirt_call_cpu_us(s) + s->turn_wait_us + (since > 0 ? now_us() - since : 0);
}

/* Why the limit ended the call, in the slot's fault (the message the sequence gets), and the
 * error that makes wasmtime unwind the call. */
static void *limit_error(aicirt_slot *s, double cpu_us, double wall_us) {
    int first = s->calls <= 1;   /* counted when the call was queued */
    const char *which = first ? "its first call" : "one call";
    const char *limit = first ? "Limits.first_call_timeout_s" : "Limits.call_timeout_s";
    int n = cpu_us >= s->cpu_budget_us
        ? snprintf(s->fault, sizeof s->fault,
                   "trap: interrupted: controller used %.2f s of CPU in %s, over its time limit of %g s (%s)",
                   cpu_us / 1e6, which, s->cpu_budget_us / 1e6, limit)
        : snprintf(s->fault, sizeof s->fault,
                   "trap: interrupted: %s ran %.1f s of wall-clock time with %.2f s of CPU (the machine is "
                   "too busy): the time limit's backstop (Limits.wall_backstop_factor x %s)",
                   which, wall_us / 1e6, cpu_us / 1e6, limit);
    s->fault_len = n < 0 ? 0 : n < (int)sizeof s->fault ? n : (int)sizeof s->fault - 1;
    return p_error_new(s->fault);
}

/* wasmtime's epoch-deadline callback (wasmtime_store_epoch_deadline_callback): continue for one
 * more tick, or end the call with an error naming the limit. */
void *aicirt_epoch_cb(void *ctx, void *data, uint64_t *delta, uint8_t *kind) {
    (void)ctx;
    aicirt_slot *s = data;
    double now = now_us();
    cpu_base(s, now);
    double cpu = cpu_used_us(s), wall = now - s->wall_start_us;
    double limit = s->budget_us > s->cpu_budget_us ? s->budget_us : s->cpu_budget_us;
    *delta = 1;
    *kind = 0;   /* WASMTIME_UPDATE_DEADLINE_CONTINUE */
    if (cpu >= s->cpu_budget_us || (s->wall_factor > 0 && wall >= s->wall_factor * limit))
        return limit_error(s, cpu, wall);
    s->wall_start_us += stalled_turn(s, now, cpu);   /* waiting for its turn is the pool's doing, not the machine's */
    return 0;
}

void aicirt_bind_clock(void *error_new, void *increment_epoch) {
    p_error_new = (error_new_fn)error_new;
    p_increment_epoch = (increment_epoch_fn)increment_epoch;
}

/* Allocate `bytes` in the guest (cabi_realloc) with `align`; returns the guest pointer, or -1 with
 * s->status set (the call trapped, or the memory it returned is not inside linear memory). */
static int64_t guest_alloc(aicirt_slot *s, void *ctx, uint32_t align, uint32_t bytes) {
    wt_val_raw_t a[4];
    a[0].i32 = 0; a[1].i32 = 0; a[2].i32 = (int32_t)align; a[3].i32 = (int32_t)bytes;
    if (!call(s, ctx, &s->f_realloc, a, 4)) { s->status = AICIRT_TRAP; return -1; }
    uint32_t ptr = (uint32_t)a[0].i32;
    if ((uint64_t)ptr + bytes > p_mem_size(ctx, &s->mem) || (align && ptr % align)) {
        s->status = AICIRT_BAD_ALLOC;
        s->detail[0] = ptr; s->detail[1] = bytes;
        return -1;
    }
    return ptr;
}

/* Copy `n` u32s into guest memory it allocates; returns the guest pointer or -1. */
static int64_t write_list(aicirt_slot *s, const uint32_t *src, uint32_t n) {
    if (n == 0) return 0;
    int64_t ptr = guest_alloc(s, s->ctx, 4, n * 4);
    if (ptr >= 0) memcpy(p_mem_data(s->ctx, &s->mem) + ptr, src, (size_t)n * 4);
    return ptr;
}

static inline uint32_t rd32(const uint8_t *m, uint64_t off) {
    uint32_t v;
    memcpy(&v, m + off, 4);
    return v;
}

/* Post-return runs on what is left of its call's time limit, never on a fresh one: within the
 * call under the call's clock, or (deferred) under clock_start(s, what the call left). */
static int run_post(aicirt_slot *s, uint32_t result_ptr) {
    s->stage = AICIRT_STAGE_POST;
    wt_val_raw_t a[1];
    a[0].i32 = (int32_t)result_ptr;
    if (call(s, s->ctx, &s->f_post, a, 1)) return 1;
    s->status = AICIRT_TRAP;
    return 0;
}

/* The mask rule (docs/protocol.md#wit/#semantics), the one C copy of it: `words` must be ceil(V/32), the list inside
 * memory, no bit at or past V, some bit set. Copies the mask into `row`; returns a Status with
 * detail[] saying what was wrong. */
int aicirt_check_mask(const uint8_t *m, size_t size, uint32_t ptr, uint32_t words, uint32_t vocab_size,
                      uint32_t *row, uint32_t *detail) {
    uint32_t want = (vocab_size + 31) / 32;
    if (words != want) { detail[0] = words; detail[1] = ptr; return AICIRT_BAD_MASK_LEN; }
    if ((uint64_t)ptr + (uint64_t)words * 4 > size) { detail[0] = ptr; detail[1] = words; return AICIRT_BAD_MASK_RANGE; }
    memcpy(row, m + ptr, (size_t)words * 4);
    uint32_t tail = vocab_size % 32;
    uint32_t extra = tail ? row[words - 1] >> tail : 0;
    if (extra) {
        detail[0] = (words - 1) * 32 + tail + (uint32_t)__builtin_ctz(extra);
        return AICIRT_BAD_MASK_BITS;
    }
    uint32_t first = 0;  /* most masks allow a token early on: stop at the first non-zero word */
    while (first < words && !row[first]) first++;
    return first == words ? AICIRT_EMPTY_MASK : AICIRT_OK;
}

static void lift(aicirt_slot *s) {
    size_t size = p_mem_size(s->ctx, &s->mem);
    const uint8_t *m = p_mem_data(s->ctx, &s->mem);
    if ((uint64_t)s->result_ptr + ABI_RESULT_SIZE > size) { s->status = AICIRT_BAD_RESULT; return; }
    s->branches_ptr = rd32(m, s->result_ptr);
    s->n_branches = rd32(m, s->result_ptr + 4);
    if ((uint64_t)s->branches_ptr + (uint64_t)s->n_branches * ABI_BRANCH_SIZE > size) {
        s->status = AICIRT_BAD_RESULT;
        return;
    }
    if (s->n_branches != 1) { s->status = AICIRT_LIFT; return; }
    const uint8_t *b = m + s->branches_ptr;
    if (b[ABI_BRANCH_MASK_TAG] == 0 || rd32(b, ABI_BRANCH_SPLICES_LEN) != 0) { s->status = AICIRT_LIFT; return; }
    s->temp_is_some = b[ABI_BRANCH_TEMP_TAG] != 0;
    memcpy(&s->temp, b + ABI_BRANCH_TEMP_VALUE, 4);
    s->status = aicirt_check_mask(m, size, rd32(b, ABI_BRANCH_MASK_PTR), rd32(b, ABI_BRANCH_MASK_LEN),
                                  s->vocab_size, s->mask_row, s->detail);
    if (s->status == AICIRT_OK && s->has_post) run_post(s, s->result_ptr);
}

void aicirt_step(aicirt_slot *s) {
    double t0 = s->started_us = now_us();
    s->cpu_us = 0;
    s->turn_wait_us = s->turn_wait_since_us = 0;
    aicirt_clock_start(s, s->budget_us);   /* before `started`: the engine thread reads the clock then */
    __atomic_store_n(&s->started, 1, __ATOMIC_RELEASE);
    s->error = s->trap = 0;
    s->n_branches = 0;
    s->fault_len = 0;
    if (s->needs_init) {   /* the instance's _initialize runs here, on the worker, under its own limit */
        s->needs_init = 0;
        s->stage = AICIRT_STAGE_INITIALIZE;
        wt_val_raw_t none[1];
        if (!call(s, s->ctx, &s->f_init, none, 0)) {
            s->status = AICIRT_TRAP;
            goto out;
        }
        t0 = s->started_us = now_us();
        aicirt_clock_start(s, s->budget_us);
    }
    /* A result Python lifted (status AICIRT_LIFT) is post-returned here, on the worker, before
     * the next call: a looping post-return then delays only its own sequence. */
    if (s->post_pending) {
        s->post_pending = 0;
        aicirt_clock_start(s, s->post_left_us > 0 ? s->post_left_us : 0);
        if (!run_post(s, s->post_ptr)) goto out;
        s->started_us = now_us();
        aicirt_clock_start(s, s->budget_us);
    }
    /* one budget for the step's realloc + mid-process + post */
    s->stage = AICIRT_STAGE_ARGUMENTS;
    int64_t tokens = write_list(s, s->tokens, s->n_tokens);
    int64_t group = tokens < 0 ? -1 : write_list(s, s->group, s->n_group);
    uint32_t n_group = s->n_group;
    s->n_group = 0;   /* a fork group is reported on one call only */
    if (group >= 0) {
        wt_val_raw_t a[7];
        a[0].i32 = (int32_t)s->backtrack;
        a[1].i32 = (int32_t)tokens; a[2].i32 = (int32_t)s->n_tokens;
        a[3].i32 = (int32_t)s->sampled_is_some; a[4].i32 = (int32_t)s->sampled;
        a[5].i32 = (int32_t)group; a[6].i32 = (int32_t)n_group;
        s->stage = AICIRT_STAGE_MID_PROCESS;
        if (call(s, s->ctx, &s->f_mid, a, 7)) {
            s->result_ptr = (uint32_t)a[0].i32;
            lift(s);
        } else {
            s->status = AICIRT_TRAP;
        }
    }
out:
    s->elapsed_us = now_us() - t0;
    s->cpu_us = cpu_used_us(s);
    if (s->calls > 1) {   /* the history the caller-runs rule predicts from (first calls left out) */
        s->hist_calls++;
        if (s->cpu_us > s->hist_max_us) s->hist_max_us = s->cpu_us;
    }
    __atomic_store_n(&s->done, 1, __ATOMIC_RELEASE);
}

uint8_t *aicirt_memory(aicirt_slot *s, size_t *size) {
    *size = p_mem_size(s->ctx, &s->mem);
    return p_mem_data(s->ctx, &s->mem);
}

/* ---- Worker pool -------------------------------------------------------------------------------
 * Plain pthreads, not Python threads: a submit wakes a worker in a few µs and a wait returns as
 * soon as the last `done` flag flips, with the GIL released throughout. Slots queue FIFO.
 *
 * Isolation without oversubscribing the cores: a worker whose call has run past `stall_us` (the
 * soft deadline) is stalled. The engine thread starts a fresh worker in its place (up to
 * `max_threads` in all), so `base_threads` workers are always free for healthy calls, and the
 * stalled one leaves once its call ends. Stalled calls take turns to run: at most `run_stalled_max`
 * (half the cores, at least one) at once, each for a slice of STALL_SLICE_US while others wait,
 * in FIFO order; the others wait inside the epoch callback, on their own thread, where they are
 * not runnable and their CPU clocks (their time limits) stand still. So the runnable workers are
 * at most `base_threads` plus that bounded few however many calls are stuck, and sixteen
 * loopers cost a legal call beside them wall-clock time, never CPU budget. When stalled calls
 * hold every extra worker the pool is saturated (aicirt_pool_stats): a further stuck call holds
 * up the queue. Host imports in Python take the GIL themselves.
 *
 * The caller runs what no worker has taken (aicirt_pool_wait): a caller that reaches wait() while a
 * call of its own is still queued runs it on its own thread (it is idle until its rows are done
 * anyway), which removes the hand-off to a worker and the wake-ups when the forward pass was short,
 * and costs nothing when it was long (the workers had taken everything). A call running on the
 * caller cannot be left behind at the wait's deadline, so only a call predicted short is taken:
 * not a first call, from a sequence with at least one ended call after its first and none that
 * used more than a STEAL_HEADROOM-th of the time left to the deadline (CPU time), and not barred. A taken call that
 * still ends past the deadline (a controller cheap so far, then not) bars its sequence from the
 * caller for good and pauses taking calls in this pool for STEAL_PAUSE times the overrun, so
 * however requests behave, overruns cost the caller at most about 1 / STEAL_PAUSE of its time.
 * A taken call runs under the same limits as on a worker (its CPU clock, the epoch callback, the
 * wall-clock backstop; it counts as busy, so the epoch clock ticks); it never takes turns (no
 * other call waits for the caller's thread).
 *
 * The wake-up a caller would pay for nothing is left out: when its last wait followed its submit
 * within DEFER_GAP_US (no forward pass in between: a decode loop of one sequence, a grammar
 * check), and every call it queues now would be taken by the caller-runs rule, and there is one
 * call or the calls are predicted to take under DEFER_WORK_US together (a worker could not share
 * them sooner than a wake-up takes), the submit wakes no worker (a futex system call on the
 * engine's thread, tens of µs on a VM, and a worker that wakes to find its call taken, then
 * spins). The wait runs them; whatever it leaves queued (the rule refused it then) it wakes a
 * worker for, and the epoch clock wakes one for calls queued a whole tick with workers asleep
 * (a batch never waited for).
 *
 * The epoch clock behind the hard time limits is a thread of the pool too (`ticker`): it calls
 * wasmtime_engine_increment_epoch every `tick_us` while any call is running or queued, or while the
 * caller runs guest code outside the pool (aicirt_pool_guests), and sleeps (no wake-up at all)
 * once there has been none for IDLE_TICKS ticks. Waking it is a futex system call on the submitting
 * thread, so an engine that steps more often than every IDLE_TICKS ticks never pays it, and no
 * Python thread wakes per step (a Python clock took the GIL from the engine's thread at each
 * submit). An extra tick while idle is harmless: every call sets its deadline from the epoch it
 * starts at. It ticks on while the pool is being freed, until the last call has ended. */
#define SPIN_US 50.0
#define IDLE_TICKS 16
#define DEFER_GAP_US 20.0
#define DEFER_WORK_US 20.0
#define STEAL_HEADROOM 10.0
#define STEAL_PAUSE 100.0
#define MAX_THREADS 64
#define STALL_SLICE_US 10000.0

typedef struct aicirt_pool aicirt_pool;
typedef struct { aicirt_pool *p; int index; } worker_arg;

struct aicirt_pool {
    pthread_mutex_t mu;
    pthread_cond_t work, done;
    aicirt_slot **queue;
    size_t head, tail, cap;   /* ring buffer of pending slots */
    int stop, waiting;
    int sleepers;             /* workers in pthread_cond_wait(&work) (under mu) */
    int spinners;             /* workers spinning for work before they sleep (atomic) */
    int base_threads, max_threads, live, busy, stalled;
    int stalls_total;         /* calls ever demoted to stalled (a counter for /metrics) */
    double stall_us;
    pthread_t threads[MAX_THREADS];
    int started[MAX_THREADS], alive[MAX_THREADS], demoted[MAX_THREADS];
    worker_arg args[MAX_THREADS];
    /* stalled calls' turns: at most run_stalled_max hold one; the rest wait in FIFO order */
    pthread_cond_t turn;
    int run_stalled_max, run_stalled;
    int holds[MAX_THREADS];
    double turn_since[MAX_THREADS];
    int waiting_turn[MAX_THREADS];    /* FIFO ring of worker indices */
    int turn_head, turn_len;
    /* the caller-runs rule */
    int steal;                  /* 0: every call goes to a worker */
    double steal_paused_until;  /* now_us() before which no caller takes a call (under mu) */
    int steals_total;           /* calls run on a waiting caller (a counter; under mu) */
    int callers;                /* threads inside aicirt_pool_wait (under mu): the free waits for them */
    double submit_end_us;       /* when the last submit queued its calls (under mu) */
    double last_gap_us;         /* from that submit to the wait that followed it (under mu) */
    /* the epoch clock (under mu) */
    void *engine;               /* wasm_engine_t *: outlives the pool (the Python side keeps it) */
    double tick_us;
    pthread_t ticker;
    pthread_cond_t tick;        /* CLOCK_MONOTONIC: wakes the ticker early (new work while it sleeps, or the end) */
    int ticker_asleep;          /* idle past IDLE_TICKS: waits for a submit's (or a guest's) wake-up */
    int ticker_stop;            /* set by aicirt_pool_free once every call has ended */
    int guests;                 /* blocks running guest code outside the pool (aicirt_pool_guests) */
};

static __thread worker_arg *tl_worker;   /* the pool worker this thread is, if any */

static void *worker(void *arg);

/* Start a worker in a free entry (joining one that has left); under p->mu. */
static int spawn_worker(aicirt_pool *p) {
    for (int i = 0; i < MAX_THREADS; i++) {
        if (p->alive[i]) continue;
        if (p->started[i]) { pthread_join(p->threads[i], 0); p->started[i] = 0; }
        p->args[i] = (worker_arg){p, i};
        p->alive[i] = 1;
        p->demoted[i] = 0;
        if (pthread_create(&p->threads[i], 0, worker, &p->args[i]) != 0) { p->alive[i] = 0; return 0; }
        p->started[i] = 1;
        p->live++;
        return 1;
    }
    return 0;
}

/* Keep `base_threads` workers free of stalled calls: replace stalled ones (under p->mu). */
static void replace_stalled(aicirt_pool *p) {
    while (!p->stop && p->live - p->stalled < p->base_threads && p->live < p->max_threads)
        if (!spawn_worker(p)) break;
}

/* Give turns to waiting stalled calls while there is room (under p->mu). */
static void grant_turns(aicirt_pool *p) {
    int granted = 0;
    while (p->turn_len && p->run_stalled < p->run_stalled_max) {
        int j = p->waiting_turn[p->turn_head];
        p->turn_head = (p->turn_head + 1) % MAX_THREADS;
        p->turn_len--;
        p->holds[j] = 1;
        p->turn_since[j] = now_us();
        p->run_stalled++;
        granted = 1;
    }
    if (granted) pthread_cond_broadcast(&p->turn);
}

static void release_turn(aicirt_pool *p, int i) {
    if (!p->holds[i]) return;
    p->holds[i] = 0;
    p->run_stalled--;
    grant_turns(p);
}

/* Queue for a turn and wait for it (under p->mu); returns the µs spent waiting (also added to the
 * call's turn_wait_us). */
static double take_turn(aicirt_pool *p, int i, aicirt_slot *s) {
    double t0 = s->turn_wait_since_us = now_us();
    p->waiting_turn[(p->turn_head + p->turn_len) % MAX_THREADS] = i;
    p->turn_len++;
    grant_turns(p);
    while (!p->holds[i] && !p->stop) pthread_cond_wait(&p->turn, &p->mu);
    if (!p->holds[i]) {   /* stopping: run on, out of turn (the call ends at its limit) */
        for (int k = 0; k < p->turn_len; k++)
            if (p->waiting_turn[(p->turn_head + k) % MAX_THREADS] == i) {
                for (int m = k; m + 1 < p->turn_len; m++)
                    p->waiting_turn[(p->turn_head + m) % MAX_THREADS] = p->waiting_turn[(p->turn_head + m + 1) % MAX_THREADS];
                p->turn_len--;
                break;
            }
    }
    double waited = now_us() - t0;
    s->turn_wait_us += waited;
    s->turn_wait_since_us = 0;
    return waited;
}

/* From the epoch callback, on the thread running the call: a pool worker whose call has used
 * `cpu_us` of CPU past the stall threshold becomes stalled (it is replaced, and leaves after this
 * call) and from then on runs only in its turn. CPU, not wall-clock time: on a busy machine a
 * healthy call preempted for longer than the threshold must not be demoted and made to wait for
 * turns behind stuck calls (that wait counts as its own lateness). Returns the µs it waited,
 * which the wall-clock backstop leaves out. */
static double stalled_turn(aicirt_slot *s, double now, double cpu_us) {
    worker_arg *w = tl_worker;
    if (!w) return 0;   /* not a pool worker (a start function on the engine's thread) */
    aicirt_pool *p = w->p;
    int i = w->index;
    if (!p->demoted[i] && cpu_us < p->stall_us) return 0;
    double waited = 0;
    pthread_mutex_lock(&p->mu);
    if (p->stop) {   /* closing: no turns, the call runs on to its limit */
        pthread_mutex_unlock(&p->mu);
        return 0;
    }
    if (!p->demoted[i]) {
        p->demoted[i] = 1;
        p->stalled++;
        p->stalls_total++;
    }
    if (!p->holds[i]) {
        waited = take_turn(p, i, s);
    } else if (p->turn_len && now - p->turn_since[i] >= STALL_SLICE_US) {   /* others wait: let one run */
        release_turn(p, i);
        waited = take_turn(p, i, s);
    }
    pthread_mutex_unlock(&p->mu);
    return waited;
}

static void *worker(void *arg) {
    worker_arg *w = tl_worker = arg;
    aicirt_pool *p = w->p;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        if (p->head == p->tail && !p->stop) {
            /* Spin a little before sleeping: the engine's next submit often follows within
             * microseconds, and a futex wake-up costs tens of µs on a VM. */
            __atomic_add_fetch(&p->spinners, 1, __ATOMIC_ACQ_REL);
            pthread_mutex_unlock(&p->mu);
            double until = now_us() + SPIN_US;
            while (__atomic_load_n(&p->tail, __ATOMIC_ACQUIRE) == __atomic_load_n(&p->head, __ATOMIC_ACQUIRE)
                   && !__atomic_load_n(&p->stop, __ATOMIC_ACQUIRE) && now_us() < until)
                sched_yield();
            pthread_mutex_lock(&p->mu);
            __atomic_sub_fetch(&p->spinners, 1, __ATOMIC_ACQ_REL);
        }
        while (p->head == p->tail && !p->stop) {
            p->sleepers++;
            pthread_cond_wait(&p->work, &p->mu);
            p->sleepers--;
        }
        if (p->head == p->tail) break;   /* stop, and nothing left to run */
        aicirt_slot *s = p->queue[p->head % p->cap];
        __atomic_store_n(&p->head, p->head + 1, __ATOMIC_RELEASE);
        if (!s || s->claimed) continue;   /* a waiting caller ran it */
        s->claimed = 1;
        p->busy++;
        pthread_mutex_unlock(&p->mu);
        aicirt_step(s);
        pthread_mutex_lock(&p->mu);
        p->busy--;
        if (p->waiting) pthread_cond_broadcast(&p->done);
        release_turn(p, w->index);
        if (p->demoted[w->index]) break;   /* stalled: leave; the worker that replaced it stays */
    }
    if (p->demoted[w->index]) p->stalled--;
    p->alive[w->index] = 0;
    p->live--;
    pthread_mutex_unlock(&p->mu);
    return 0;
}

/* Wake the ticker if it sleeps (under p->mu): there is work to tick for. */
static void wake_ticker(aicirt_pool *p) {
    if (p->ticker_asleep) {
        p->ticker_asleep = 0;
        pthread_cond_signal(&p->tick);
    }
}

/* The epoch clock (see above): one tick every tick_us while a call is out, a guest runs outside the
 * pool, or the pool is stopping; asleep after IDLE_TICKS ticks with none. */
static void *ticker(void *arg) {
    aicirt_pool *p = arg;
    int idle = 0;
    pthread_mutex_lock(&p->mu);
    while (!p->ticker_stop) {
        if (p->stop || p->guests || p->busy || p->tail != p->head) {
            idle = 0;
        } else if (++idle > IDLE_TICKS) {
            p->ticker_asleep = 1;
            while (p->ticker_asleep && !p->ticker_stop) pthread_cond_wait(&p->tick, &p->mu);
            p->ticker_asleep = 0;
            idle = 0;
            continue;
        }
        struct timespec until;
        clock_gettime(CLOCK_MONOTONIC, &until);
        double ns = until.tv_nsec + p->tick_us * 1e3;
        until.tv_sec += (time_t)(ns / 1e9);
        until.tv_nsec = (long)(ns - (double)(time_t)(ns / 1e9) * 1e9);
        while (!p->ticker_stop && pthread_cond_timedwait(&p->tick, &p->mu, &until) == 0) {}   /* 0: a spurious wake-up */
        if (p->ticker_stop) break;
        /* calls queued a whole tick with every worker asleep (a deferred wake-up whose wait never came) */
        if (p->tail != p->head && p->sleepers && !__atomic_load_n(&p->spinners, __ATOMIC_ACQUIRE))
            pthread_cond_signal(&p->work);
        pthread_mutex_unlock(&p->mu);
        p_increment_epoch(p->engine);
        pthread_mutex_lock(&p->mu);
    }
    pthread_mutex_unlock(&p->mu);
    return 0;
}

/* Guest code runs outside the pool (delta +1 when it starts, -1 when it ends: e.g. an init export
 * at load): the clock ticks meanwhile. */
void aicirt_pool_guests(aicirt_pool *p, int delta) {
    pthread_mutex_lock(&p->mu);
    p->guests += delta;
    wake_ticker(p);
    pthread_mutex_unlock(&p->mu);
}

/* A pool of `n_threads` workers (up to `max_threads` with stalled ones replaced) and its epoch
 * clock, ticking `engine` every `tick_us`. NULL if the threads could not be started. */
aicirt_pool *aicirt_pool_new(int n_threads, int max_threads, double stall_us, void *engine, double tick_us) {
    aicirt_pool *p = calloc(1, sizeof *p);
    if (!p) return 0;
    if (n_threads > MAX_THREADS) n_threads = MAX_THREADS;
    if (max_threads > MAX_THREADS) max_threads = MAX_THREADS;
    if (max_threads < n_threads) max_threads = n_threads;
    pthread_mutex_init(&p->mu, 0);
    pthread_cond_init(&p->work, 0);
    pthread_cond_init(&p->done, 0);
    pthread_cond_init(&p->turn, 0);
    pthread_condattr_t monotonic;
    pthread_condattr_init(&monotonic);
    pthread_condattr_setclock(&monotonic, CLOCK_MONOTONIC);
    pthread_cond_init(&p->tick, &monotonic);
    pthread_condattr_destroy(&monotonic);
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    p->run_stalled_max = cores >= 4 ? (int)(cores / 2) : 1;
    p->cap = 1024;
    p->queue = malloc(p->cap * sizeof *p->queue);
    p->base_threads = n_threads;
    p->max_threads = max_threads;
    p->stall_us = stall_us;
    p->steal = 1;
    p->engine = engine;
    p->tick_us = tick_us;
    if (!p->queue || pthread_create(&p->ticker, 0, ticker, p) != 0) { free(p->queue); free(p); return 0; }
    pthread_mutex_lock(&p->mu);
    for (int i = 0; i < n_threads; i++) spawn_worker(p);
    int live = p->live;
    if (live == 0) {
        p->ticker_stop = 1;
        pthread_cond_signal(&p->tick);
    }
    pthread_mutex_unlock(&p->mu);
    if (live == 0) { pthread_join(p->ticker, 0); free(p->queue); free(p); return 0; }
    return p;
}

/* Wake the sleepers `n` queued calls need (under p->mu): a spinning worker takes a call without a
 * wake-up (a futex system call, several µs on a VM, on the engine's thread). A spinner that gives
 * up re-checks the queue under mu before it sleeps, so no call is left unseen. */
static void wake_workers(aicirt_pool *p, int n) {
    int wake = n - __atomic_load_n(&p->spinners, __ATOMIC_ACQUIRE);
    if (wake > 0 && p->sleepers) {
        if (wake >= p->sleepers) pthread_cond_broadcast(&p->work);
        else for (int k = 0; k < wake; k++) pthread_cond_signal(&p->work);
    }
}

/* Queue `n` calls; with `defer`, wake no worker if the caller is predicted to run them (see above). */
static int pool_submit(aicirt_pool *p, aicirt_slot **slots, int n, int defer) {
    pthread_mutex_lock(&p->mu);
    size_t used = p->tail - p->head;
    if (used + n > p->cap) {   /* grow the ring, keeping FIFO order */
        size_t cap = p->cap;
        while (used + n > cap) cap *= 2;
        aicirt_slot **q = malloc(cap * sizeof *q);
        if (!q) { pthread_mutex_unlock(&p->mu); return -1; }
        for (size_t i = 0; i < used; i++)
            if ((q[i] = p->queue[(p->head + i) % p->cap])) q[i]->qpos = i;
        free(p->queue);
        p->queue = q; p->cap = cap; p->head = 0; p->tail = used;
    }
    for (int i = 0; i < n; i++) {
        slots[i]->started = 0;
        slots[i]->claimed = 0;
        slots[i]->qpos = p->tail + i;
        p->queue[(p->tail + i) % p->cap] = slots[i];
    }
    __atomic_store_n(&p->tail, p->tail + n, __ATOMIC_RELEASE);
    wake_ticker(p);
    replace_stalled(p);
    double now = p->submit_end_us = now_us();
    if (!(defer && p->steal && p->last_gap_us < DEFER_GAP_US && now >= p->steal_paused_until))
        wake_workers(p, n);
    pthread_mutex_unlock(&p->mu);
    return 0;
}

int aicirt_pool_submit(aicirt_pool *p, aicirt_slot **slots, int n) {
    return pool_submit(p, slots, n, 0);
}

static int count_left(aicirt_slot **slots, int n) {
    int left = 0;
    for (int i = 0; i < n; i++) left += !__atomic_load_n(&slots[i]->done, __ATOMIC_ACQUIRE);
    return left;
}

/* Whether the caller may take `s`'s queued call with `left_us` to its wait's deadline (the rule
 * above; a hint read without mu: the claim itself is made under it). */
static int predicted_short(const aicirt_slot *s, double left_us) {
    return !s->steal_barred && !s->needs_init && s->calls > 1 && s->hist_calls > 0
        && s->hist_max_us * STEAL_HEADROOM <= left_us;
}

static int stealable(const aicirt_slot *s, double left_us) {
    return !__atomic_load_n(&s->claimed, __ATOMIC_ACQUIRE) && predicted_short(s, left_us);
}

/* The caller-runs rule: run on this thread the calls of `slots` that no worker has taken and that
 * the rule allows, last row first (the workers take the queue from its front). */
static void run_queued_here(aicirt_pool *p, aicirt_slot **slots, int n, double t_end) {
    for (int i = n - 1; i >= 0; i--) {
        aicirt_slot *s = slots[i];
        double now = now_us();
        if (!stealable(s, t_end - now) || __atomic_load_n(&s->done, __ATOMIC_ACQUIRE)) continue;
        pthread_mutex_lock(&p->mu);
        int mine = !s->claimed && !p->stop && now >= p->steal_paused_until;
        if (mine) {
            s->claimed = 1;
            p->busy++;
            /* its ring entry goes: the slot may be freed (its sequence closed) before a worker
             * would reach that entry */
            if (s->qpos >= p->head && s->qpos < p->tail && p->queue[s->qpos % p->cap] == s)
                p->queue[s->qpos % p->cap] = 0;
            /* cleared entries at either end go (with no worker woken, none would pop them) */
            size_t tail = p->tail, head = p->head;
            while (tail != head && !p->queue[(tail - 1) % p->cap]) tail--;
            while (head != tail && !p->queue[head % p->cap]) head++;
            __atomic_store_n(&p->tail, tail, __ATOMIC_RELEASE);
            __atomic_store_n(&p->head, head, __ATOMIC_RELEASE);
        }
        pthread_mutex_unlock(&p->mu);
        if (!mine) continue;
        aicirt_step(s);
        double end = now_us();
        pthread_mutex_lock(&p->mu);
        p->busy--;
        p->steals_total++;
        if (end > t_end) {   /* it outlasted the deadline: bar it, pause taking calls */
            s->steal_barred = 1;
            double until = end + STEAL_PAUSE * (end - t_end);
            if (until > p->steal_paused_until) p->steal_paused_until = until;
        }
        if (p->waiting) pthread_cond_broadcast(&p->done);
        pthread_mutex_unlock(&p->mu);
    }
}

/* Wake workers for the calls of `slots` still queued (their submit may have woken none). */
static void wake_for_queued(aicirt_pool *p, aicirt_slot **slots, int n) {
    int queued = 0;
    for (int i = 0; i < n; i++) queued += !__atomic_load_n(&slots[i]->claimed, __ATOMIC_ACQUIRE);
    if (!queued) return;
    pthread_mutex_lock(&p->mu);
    wake_workers(p, queued);
    pthread_mutex_unlock(&p->mu);
}

/* Wait until every slot is done or `timeout_us` passes; returns how many are not done. Calls still
 * queued may run on this thread first (the caller-runs rule above). While waiting, stalled workers
 * are replaced (see above). */
static int pool_wait(aicirt_pool *p, aicirt_slot **slots, int n, double timeout_us);

int aicirt_pool_wait(aicirt_pool *p, aicirt_slot **slots, int n, double timeout_us) {
    pthread_mutex_lock(&p->mu);   /* a caller running a call here must outlive neither the pool nor the Store */
    p->callers++;
    p->last_gap_us = now_us() - p->submit_end_us;
    pthread_mutex_unlock(&p->mu);
    int left = pool_wait(p, slots, n, timeout_us);
    pthread_mutex_lock(&p->mu);
    if (--p->callers == 0 && p->stop) pthread_cond_broadcast(&p->done);
    pthread_mutex_unlock(&p->mu);   /* the last touch of p: aicirt_pool_free may free it now */
    return left;
}

static int pool_wait(aicirt_pool *p, aicirt_slot **slots, int n, double timeout_us) {
    double t_end = now_us() + timeout_us;
    if (p->steal) run_queued_here(p, slots, n, t_end);
    wake_for_queued(p, slots, n);
    /* Spin briefly first: the caller is idle anyway, and a futex sleep + wake-up costs tens of µs
     * on a VM, more than most controller calls. */
    double spin_until = now_us() + (timeout_us < SPIN_US ? timeout_us : SPIN_US);
    int left;
    do {
        if (!(left = count_left(slots, n))) return 0;
        sched_yield();
    } while (now_us() < spin_until);
    pthread_mutex_lock(&p->mu);
    for (;;) {
        if (!(left = count_left(slots, n))) break;
        replace_stalled(p);
        double now = now_us();
        if (now >= t_end) break;
        /* wake at least every half stall period to replace stalled workers */
        double slice = t_end - now < p->stall_us / 2 ? t_end - now : p->stall_us / 2;
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        double ns = until.tv_nsec + slice * 1e3;
        until.tv_sec += (time_t)(ns / 1e9);
        until.tv_nsec = (long)(ns - (double)(time_t)(ns / 1e9) * 1e9);
        p->waiting++;
        pthread_cond_timedwait(&p->done, &p->mu, &until);
        p->waiting--;
    }
    pthread_mutex_unlock(&p->mu);
    return left;
}

/* Let the queue drain (running calls end by their time limits, the clock ticking), join the threads,
 * wait for the callers still in aicirt_pool_wait (a call one runs ends by its limits; the rest are
 * done), then stop the clock. */
void aicirt_pool_free(aicirt_pool *p) {
    pthread_mutex_lock(&p->mu);
    __atomic_store_n(&p->stop, 1, __ATOMIC_RELEASE);
    wake_ticker(p);
    pthread_cond_broadcast(&p->work);
    pthread_cond_broadcast(&p->turn);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < MAX_THREADS; i++)
        if (p->started[i]) pthread_join(p->threads[i], 0);
    pthread_mutex_lock(&p->mu);   /* callers still waiting: their calls are done or end by their limits */
    while (p->callers) pthread_cond_wait(&p->done, &p->mu);
    p->ticker_stop = 1;           /* every call has ended: no tick is needed, none reaches a freed engine */
    pthread_cond_signal(&p->tick);
    pthread_mutex_unlock(&p->mu);
    pthread_join(p->ticker, 0);
    free(p->queue);
    free(p);
}

/* The caller-runs rule on (1) or off (0); returns the calls run on a waiting caller so far. */
int aicirt_pool_steal(aicirt_pool *p, int on) {
    pthread_mutex_lock(&p->mu);
    if (on >= 0) p->steal = on;
    int n = p->steals_total;
    pthread_mutex_unlock(&p->mu);
    return n;
}

/* Calls running or queued. */
int aicirt_pool_pending(aicirt_pool *p) {
    pthread_mutex_lock(&p->mu);
    int n = p->busy + (int)(p->tail - p->head);
    pthread_mutex_unlock(&p->mu);
    return n;
}

/* Workers alive now (base plus extra ones started in place of stalled ones). */
int aicirt_pool_threads(aicirt_pool *p) {
    pthread_mutex_lock(&p->mu);
    int n = p->live;
    pthread_mutex_unlock(&p->mu);
    return n;
}

/* out[0..5]: workers alive, of which stalled (taking turns, leaving after their call), stalled
 * calls running now (holding a turn), workers busy, calls queued, calls ever stalled; returns 1 if the pool is
 * saturated (stalled calls hold every extra worker), else 0. */
int aicirt_pool_stats(aicirt_pool *p, int *out) {
    pthread_mutex_lock(&p->mu);
    out[0] = p->live; out[1] = p->stalled; out[2] = p->run_stalled; out[3] = p->busy;
    out[4] = (int)(p->tail - p->head); out[5] = p->stalls_total;
    int saturated = p->stalled > 0 && p->stalled >= p->max_threads - p->base_threads;
    pthread_mutex_unlock(&p->mu);
    return saturated;
}

/* ---- Rows: one engine step for a whole batch in one call ----------------------------------------
 * The engine's thread hands over arrays (slots, sampled tokens, the rare full token lists) and gets
 * arrays back (row status, kind, temperature): no Python object per sequence in the common case.
 * Each slot keeps the tokens its controller has seen, so the common row (the sampled token appended)
 * needs no token list at all, and a full list is diffed against them here. */
/* ROW_* (RowStatus) and KIND_* (RowKind) come from runtime/abi.py with the other generated #defines. */

static int seen_reserve(aicirt_slot *s, uint64_t n) {
    if (n <= s->seen_cap) return 1;
    uint64_t cap = s->seen_cap ? s->seen_cap : 64;
    while (cap < n) cap *= 2;
    if (cap > UINT32_MAX / 4) return 0;
    uint32_t *p = realloc(s->seen, cap * 4);
    if (!p) return 0;
    s->seen = p;
    s->seen_cap = (uint32_t)cap;
    return 1;
}

/* Start one step for `n` rows. Row i is slots[i] with sampled[i] (< 0: nothing sampled); where
 * edit_of[i] >= 0 (edit_of may be NULL) its token list is the first edit_unchanged[e] tokens the
 * controller saw, then edit_tok[edit_off[e], edit_off[e + 1]), and its net edit is the diff against what the
 * controller saw; every other row appends its sampled token. Branch 0's mask goes to row i of
 * mask_base. Returns 0 with row_status[] filled and the started rows queued, or, with nothing started,
 * -(i + 1) for misuse at row i (*misuse: 1 submitted twice in this batch, 2 in a batch not waited for,
 * 3 closed). */
int aicirt_rows_start(aicirt_pool *p, aicirt_slot **slots, int n, const int32_t *sampled, const int32_t *edit_of,
                      const int64_t *edit_off, const uint32_t *edit_tok, const uint32_t *edit_unchanged,
                      uint32_t *mask_base, uint32_t words, uint64_t stamp, int8_t *row_status, int *misuse) {
    for (int i = 0; i < n; i++) {
        aicirt_slot *s = slots[i];
        if (s->stamp == stamp) { *misuse = 1; return -(i + 1); }
        if (s->call_out == 1) { *misuse = 2; return -(i + 1); }
        if (s->stopped == 2) { *misuse = 3; return -(i + 1); }
        s->stamp = stamp;
    }
    aicirt_slot *small[256];   /* no allocation for the common batch */
    aicirt_slot **run = n <= 256 ? small : malloc((size_t)n * sizeof *run);
    if (!run) { *misuse = 4; return -1; }
    int m = 0;
    for (int i = 0; i < n; i++) {
        aicirt_slot *s = slots[i];
        if (s->stopped) { row_status[i] = ROW_STOPPED; continue; }
        if (s->call_out) { row_status[i] = ROW_LATE; continue; }
        int32_t smp = sampled[i];
        if (smp >= 0 && (uint32_t)smp >= s->vocab_size) { s->detail[0] = (uint32_t)smp; row_status[i] = ROW_BAD_TOKEN; continue; }
        uint32_t cp, n_new;
        const uint32_t *src;
        int32_t e = edit_of ? edit_of[i] : -1;
        if (e >= 0) {   /* the tokens past the first u, which are the ones the controller saw */
            const uint32_t *tok = edit_tok + edit_off[e];
            uint32_t u = edit_unchanged[e];
            uint64_t total = u + (uint64_t)(edit_off[e + 1] - edit_off[e]);
            if (u > s->n_seen || total > UINT32_MAX / 4) { row_status[i] = ROW_BAD_EDIT; continue; }
            uint32_t limit = total < s->n_seen ? (uint32_t)total : s->n_seen;
            cp = u;
            while (cp < limit && s->seen[cp] == tok[cp - u]) cp++;
            src = tok + (cp - u);
            n_new = (uint32_t)(total - cp);
        } else {
            cp = s->n_seen;
            src = (const uint32_t *)&sampled[i];
            n_new = smp >= 0;
        }
        if (!seen_reserve(s, (uint64_t)cp + n_new)) { row_status[i] = ROW_NO_MEMORY; continue; }
        s->backtrack = s->n_seen - cp;
        if (n_new) memcpy(s->seen + cp, src, (size_t)n_new * 4);
        s->n_seen = cp + n_new;
        s->tokens = s->seen + cp;
        s->n_tokens = n_new;
        s->sampled_is_some = smp >= 0;
        s->sampled = smp >= 0 ? (uint32_t)smp : 0;
        s->mask_row = mask_base + (size_t)i * words;
        s->budget_us = s->calls ? s->call_budget_us : s->first_budget_us;
        s->done = 0;
        s->calls++;
        s->call_out = 1;
        row_status[i] = ROW_STARTED;
        run[m++] = s;
    }
    int defer = m > 0;   /* every call predicted short enough for the caller-runs rule, and few (see the pool) */
    double work = 0;
    for (int k = 0; k < m && defer; k++) {
        defer = predicted_short(run[k], 2 * p->stall_us);   /* the wait's deadline: the soft deadline */
        work += run[k]->hist_max_us;
    }
    if (m > 1 && work > DEFER_WORK_US) defer = 0;
    if (m && pool_submit(p, run, m, defer)) {   /* out of memory for the queue: those calls fail */
        static const char msg[] = "the controller queue is out of memory";
        for (int k = 0; k < m; k++) {
            run[k]->status = AICIRT_TRAP;
            run[k]->error = run[k]->trap = 0;
            memcpy(run[k]->fault, msg, sizeof msg - 1);
            run[k]->fault_len = sizeof msg - 1;
            run[k]->elapsed_us = 0;
            __atomic_store_n(&run[k]->done, 1, __ATOMIC_RELEASE);
        }
    }
    if (run != small) free(run);
    return 0;
}

/* After the wait: kind[i] for the rows started this step (others are KIND_OTHER). A KIND_MASK row is
 * collected here: its mask is in its row, temperature[i] its temperature (NaN: none). Returns how
 * many rows are not KIND_MASK (Python looks at those). */
int aicirt_rows_collect(aicirt_slot **slots, int n, const int8_t *row_status, uint8_t *kind, float *temperature,
                        double *elapsed_us) {
    int other = 0;
    for (int i = 0; i < n; i++) {
        aicirt_slot *s = slots[i];
        elapsed_us[i] = 0;
        temperature[i] = NAN;
        if (row_status[i] != ROW_STARTED) { kind[i] = KIND_OTHER; continue; }
        if (!__atomic_load_n(&s->done, __ATOMIC_ACQUIRE)) { kind[i] = KIND_PENDING; continue; }
        elapsed_us[i] = s->elapsed_us;
        int temp_ok = !s->temp_is_some || (isfinite(s->temp) && s->temp >= 0);
        if (s->status == AICIRT_OK && !s->stopped && !s->call_log_len && temp_ok) {
            kind[i] = KIND_MASK;
            temperature[i] = s->temp_is_some ? s->temp : NAN;
            s->call_out = 0;
        } else {
            kind[i] = KIND_OTHER;
        }
    }
    for (int i = 0; i < n; i++) other += kind[i] != KIND_MASK;
    return other;
}

/* The slots of a batch's rows: out[i] = table[index[i]]. Returns 0, or -(i + 1) for the first row
 * whose index is no live sequence (outside the table, or a freed entry). */
int aicirt_rows_gather(const uint64_t *table, int64_t table_len, const int64_t *index, int n, uint64_t *out) {
    for (int i = 0; i < n; i++) {
        int64_t k = index[i];
        if (k < 0 || k >= table_len || !table[k]) return -(i + 1);
        out[i] = table[k];
    }
    return 0;
}

/* Wait (as aicirt_pool_wait) for the rows whose calls are out: started this step or late. */
int aicirt_rows_wait(aicirt_pool *p, aicirt_slot **slots, int n, const int8_t *row_status, double timeout_us) {
    aicirt_slot *small[256];
    aicirt_slot **out = n <= 256 ? small : malloc((size_t)n * sizeof *out);
    if (!out) return aicirt_pool_wait(p, slots, n, timeout_us);   /* every row: slower, still right */
    int m = 0;
    for (int i = 0; i < n; i++)
        if (row_status[i] == ROW_STARTED || row_status[i] == ROW_LATE) out[m++] = slots[i];
    int left = m ? aicirt_pool_wait(p, out, m, timeout_us) : 0;
    if (out != small) free(out);
    return left;
}

/* The tokens the controller saw: copy (a fork's child starts from its parent's view), free. */
int aicirt_seen_copy(const aicirt_slot *src, aicirt_slot *dst) {
    if (!seen_reserve(dst, src->n_seen)) return -1;
    if (src->n_seen) memcpy(dst->seen, src->seen, (size_t)src->n_seen * 4);
    dst->n_seen = src->n_seen;
    return 0;
}

void aicirt_seen_free(aicirt_slot *s) {
    free(s->seen);
    s->seen = 0;
    s->n_seen = s->seen_cap = 0;
}

/* ---- One batch in two calls: the engine thread's whole share of a step --------------------------
 * A batch of n rows keeps its arrays in one scratch buffer (native/__init__.py's RowScratch; one
 * buffer handed over once instead of six), 8-byte aligned: blocked_us (double) at 0, slots
 * (aicirt_slot *[n]) at 8, elapsed_us (double[n]) at 8 + 8n, temperature (float[n]) at 8 + 16n,
 * row_status (int8_t[n]) at 8 + 20n, kind (uint8_t[n]) at 8 + 21n; 8 + 22n bytes in all. */
#define SCR_BLOCKED(b) ((double *)(b))
#define SCR_SLOTS(b, n) ((aicirt_slot **)((b) + 8))
#define SCR_ELAPSED(b, n) ((double *)((b) + 8 + 8 * (size_t)(n)))
#define SCR_TEMP(b, n) ((float *)((b) + 8 + 16 * (size_t)(n)))
#define SCR_STATUS(b, n) ((int8_t *)((b) + 8 + 20 * (size_t)(n)))
#define SCR_KIND(b, n) ((uint8_t *)((b) + 8 + 21 * (size_t)(n)))

/* aicirt_rows_gather (the rows' slots from the registry's table) then aicirt_rows_start. Returns 0,
 * or -(i + 1) with nothing started and row_status[i] saying why: 5 no live sequence at index[i],
 * else aicirt_rows_start's misuse (1 twice in this batch, 2 in a batch not waited for, 3 closed,
 * 4 out of memory). */
int aicirt_rows_submit(aicirt_pool *p, const uint64_t *table, int64_t table_len, const int64_t *index, int n,
                       const int32_t *sampled, const int32_t *edit_of, const int64_t *edit_off,
                       const uint32_t *edit_tok, const uint32_t *edit_unchanged, uint32_t *mask_base,
                       uint32_t words, uint64_t stamp, uint8_t *scratch) {
    aicirt_slot **slots = SCR_SLOTS(scratch, n);
    int8_t *status = SCR_STATUS(scratch, n);
    int rc = aicirt_rows_gather(table, table_len, index, n, (uint64_t *)slots);
    if (rc < 0) { status[-rc - 1] = 5; return rc; }
    int misuse = 0;
    rc = aicirt_rows_start(p, slots, n, sampled, edit_of, edit_off, edit_tok, edit_unchanged, mask_base, words,
                           stamp, status, &misuse);
    if (rc < 0) status[-rc - 1] = (int8_t)misuse;
    return rc;
}

/* aicirt_rows_wait (p NULL: the pool is closed, no wait) then aicirt_rows_collect over the
 * batch's scratch, with blocked_us the time spent waiting (calls run here included). Returns how
 * many rows are not KIND_MASK. */
int aicirt_rows_finish(aicirt_pool *p, uint8_t *scratch, int n, double timeout_us) {
    aicirt_slot **slots = SCR_SLOTS(scratch, n);
    const int8_t *status = SCR_STATUS(scratch, n);
    double t0 = now_us();
    if (p && n) aicirt_rows_wait(p, slots, n, status, timeout_us);
    *SCR_BLOCKED(scratch) = now_us() - t0;
    return n ? aicirt_rows_collect(slots, n, status, SCR_KIND(scratch, n), SCR_TEMP(scratch, n),
                                   SCR_ELAPSED(scratch, n)) : 0;
}
