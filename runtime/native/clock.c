/* The call's clocks: built after slot.c (one translation unit, see there). */
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
    s->notice_sent = 0;
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

/* The time notice (docs/protocol.md#limits): a controller that exports `aicirt_time_notice`, an i32
 * global holding the address of a u32 in its linear memory, gets 1 written there once the running
 * call is within two epoch ticks (at most a quarter of its limit) of the CPU limit, or within that
 * margin times the backstop's factor of the wall-clock backstop, so that it can end the call itself and say where it was (the js controller
 * interrupts the script and reports its JS stack). The hard limit stands: a guest that does not
 * react is ended by it as before. The guest clears the word itself. */
static void notice_time(aicirt_slot *s, double cpu, double wall, double limit) {
    double margin = 2 * s->tick_us < s->cpu_budget_us / 4 ? 2 * s->tick_us : s->cpu_budget_us / 4;
    if (cpu + margin < s->cpu_budget_us && !(s->wall_factor > 0 && wall + margin * s->wall_factor >= s->wall_factor * limit))
        return;
    s->notice_sent = 1;
    uint32_t one = 1;
    if ((uint64_t)s->notice_addr + sizeof one <= p_mem_size(s->ctx, &s->mem))   /* else: a bad address, ignored */
        memcpy(p_mem_data(s->ctx, &s->mem) + s->notice_addr, &one, sizeof one);
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
    if (s->notice_addr && !s->notice_sent) notice_time(s, cpu, wall, limit);
    s->wall_start_us += stalled_turn(s, now, cpu);   /* waiting for its turn is the pool's doing, not the machine's */
    return 0;
}

void aicirt_bind_clock(void *error_new, void *increment_epoch) {
    p_error_new = (error_new_fn)error_new;
    p_increment_epoch = (increment_epoch_fn)increment_epoch;
}

