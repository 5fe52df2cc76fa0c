/* The hot path's shared ground, first of the C files built together (build.py: slot.c, clock.c,
 * step.c, pool.c, rows.c, host.c, wasi.c, pages.c, spawn.c, one translation unit):
 * the per-sequence slot (`aicirt_slot`), the libwasmtime entry points it calls, and two helpers.
 *
 * libwasmtime is not linked: the function pointers come from the library wasmtime-py already
 * loaded (aicirt_bind), so there is exactly one copy of wasmtime in the process.
 * The struct layouts below mirror wasmtime 50's C API (wasmtime/extern.h, val.h); the text between
 * the CDEF markers is also cffi's declaration of them (ffi_decl.py reads it from here).
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
    wt_func_t f_realloc, f_mid, f_post, f_init, f_prepare, f_prepare_template;
    wt_memory_t mem;
    int32_t has_post, needs_init;   /* needs_init: run _initialize before this (first) call */
    int32_t needs_prepare;          /* 1: run aicirt_prepare before this (first) call; -1: fail it at once with the
                                     * fault already written (a remembered failure: core/prepared.py) */
    void *capture;                  /* spawn.c's aicirt_capture: where the state after aicirt_prepare is copied, or NULL */
    int32_t has_prepare_template;   /* exports aicirt_prepare_template: run before that copy (step.c) */
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
    uint32_t notice_addr;           /* the guest's optional time notice (export aicirt_time_notice; 0: none): clock.c */
    int32_t notice_sent;            /* written this part */
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

