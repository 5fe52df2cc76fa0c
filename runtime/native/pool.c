/* The worker pool and the epoch clock: built after step.c (one translation unit, see slot.c). */
/* ---- Worker pool -------------------------------------------------------------------------------
 * Plain pthreads, not Python threads: a submit wakes a worker in a few µs and a wait returns as
 * soon as the last `done` flag flips, with the GIL released throughout. Slots queue FIFO.
 *
 * Isolation without oversubscribing the cores: a worker whose call has used `stall_us` of CPU
 * (half the soft deadline), or a QUEUED_STALL_DIVISOR-th of it while calls wait in the queue, is
 * stalled. The stalled worker itself starts a fresh worker in its place at once (up to
 * `max_threads` in all, MAX_THREADS at most: Limits.max_extra_workers, 512 by default, gives every
 * stuck call its own parked thread), so `base_threads` workers are always free for healthy calls
 * and a queued call waits for at most one quantum of each call ahead of it; the stalled one
 * leaves once its call ends. Stalled calls take turns to run: at most `run_stalled_max` (half the
 * cores, at least one) at once, each for a slice of STALL_SLICE_US while others wait, the one that
 * has used the least CPU first (a legal call demoted a moment ago before loopers that have used
 * hundreds of ms; loopers of equal standing round-robin); the others wait inside the epoch
 * callback, on their own thread, where they are not runnable and their CPU clocks (their time
 * limits) stand still. So the runnable workers are at most `base_threads` plus that bounded few
 * however many calls are stuck, and forty loopers cost a legal call beside them wall-clock time,
 * never CPU budget. When stalled calls hold every extra worker the pool is saturated
 * (aicirt_pool_stats): a further stuck call holds up the queue. Host imports in Python take the
 * GIL themselves.
 *
 * The caller-runs rule is off unless the Runtime asks for it (steal=True): a call running on the
 * caller's thread cannot be handed back to a worker, so it cannot be bounded. With it on, the
 * caller runs what no worker has taken (aicirt_pool_wait): a caller that reaches wait() while a
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
#define SPIN_MAX_US 1000.0
#define PAUSE_US 0.5
#define YIELD_LATE_US 20.0
#define PAUSE_OFF_US 5000.0
#define IDLE_TICKS 16
#define DEFER_GAP_US 20.0
#define DEFER_WORK_US 20.0
#define STEAL_HEADROOM 10.0
#define STEAL_PAUSE 100.0
#define MAX_THREADS 1024
#define QUEUED_STALL_DIVISOR 4.0
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
    int exited;                 /* workers that have left and are not joined yet (under mu) */
    worker_arg args[MAX_THREADS];
    /* stalled calls' turns: at most run_stalled_max hold one; the rest wait in FIFO order */
    pthread_cond_t turn;
    int run_stalled_max, run_stalled;
    int holds[MAX_THREADS];
    double turn_since[MAX_THREADS];
    double turn_cpu[MAX_THREADS];     /* the CPU time a waiting stalled call had used when it queued */
    int waiting_turn[MAX_THREADS];    /* worker indices waiting for a turn (unordered) */
    int turn_len;
    /* the caller-runs rule */
    int steal;                  /* 0: every call goes to a worker */
    double steal_paused_until;  /* now_us() before which no caller takes a call (under mu) */
    int steals_total;           /* calls run on a waiting caller (a counter; under mu) */
    int callers;                /* threads inside aicirt_pool_wait (under mu): the free waits for them */
    double submit_end_us;       /* when the last submit queued its calls (under mu) */
    double call_end_us;         /* when a worker last ended a call (under mu) */
    double idle_gap_us;         /* from a call's end to the next submit, averaged (under mu; see worker) */
    double last_gap_us;         /* from that submit to the wait that followed it (under mu) */
    long long pause_off_until;  /* µs (now_us) until which spin looks only yield (atomic, relaxed: spin_look) */
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
        if (p->started[i]) { pthread_join(p->threads[i], 0); p->started[i] = 0; p->exited--; }
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

/* Give turns to waiting stalled calls while there is room (under p->mu): the one that has used the
 * least CPU first, so a legal call demoted a moment ago (a few ms of CPU) runs before loopers that
 * have used hundreds, and loopers of equal standing take turns round-robin (each turn raises what
 * the holder has used). */
static void grant_turns(aicirt_pool *p) {
    int granted = 0;
    while (p->turn_len && p->run_stalled < p->run_stalled_max) {
        int best = 0;
        for (int k = 1; k < p->turn_len; k++)
            if (p->turn_cpu[p->waiting_turn[k]] < p->turn_cpu[p->waiting_turn[best]]) best = k;
        int j = p->waiting_turn[best];
        p->waiting_turn[best] = p->waiting_turn[--p->turn_len];
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
 * call's turn_wait_us). `cpu_us`: what the call has used (the turn order's key). */
static double take_turn(aicirt_pool *p, int i, aicirt_slot *s, double cpu_us) {
    double t0 = s->turn_wait_since_us = now_us();
    p->turn_cpu[i] = cpu_us;
    p->waiting_turn[p->turn_len++] = i;
    grant_turns(p);
    while (!p->holds[i] && !p->stop) pthread_cond_wait(&p->turn, &p->mu);
    if (!p->holds[i]) {   /* stopping: run on, out of turn (the call ends at its limit) */
        for (int k = 0; k < p->turn_len; k++)
            if (p->waiting_turn[k] == i) {
                p->waiting_turn[k] = p->waiting_turn[--p->turn_len];
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
    if (!p->demoted[i] && cpu_us < p->stall_us
        && !(cpu_us >= p->stall_us / QUEUED_STALL_DIVISOR
             && __atomic_load_n(&p->tail, __ATOMIC_ACQUIRE) != __atomic_load_n(&p->head, __ATOMIC_ACQUIRE)))
        return 0;
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
        replace_stalled(p);   /* a fresh worker takes the queue now, not at the engine's next wait */
    }
    if (!p->holds[i]) {
        waited = take_turn(p, i, s, cpu_us);
    } else if (p->turn_len && now - p->turn_since[i] >= STALL_SLICE_US) {   /* others wait: let one run */
        release_turn(p, i);
        waited = take_turn(p, i, s, cpu_us);
    }
    pthread_mutex_unlock(&p->mu);
    return waited;
}

/* How long a worker that just ended a call spins for the next before it sleeps (read without mu:
 * a hint). SPIN_US, or twice the usual time from a call's end to the next submit where that is
 * under SPIN_MAX_US: a caller that submits again within a few hundred µs (a decode loop with
 * nothing to overlap, a grammar check, a small model's forward pass) finds its worker awake, and
 * on a VM a sleeping worker costs the submit a futex system call and the call a cold core (its
 * own time doubled: json masks 13.5 -> 7.9 µs p50 with the worker awake). An engine whose steps
 * are further apart than that (a forward pass of milliseconds) gets SPIN_US, as before. The spin
 * yields the core every PAUSE_US (see spin_look): a busy machine's other threads are not held up. */
static double spin_for(const aicirt_pool *p) {
    double gap = p->idle_gap_us;
    return gap * 2 > SPIN_US && gap * 2 <= SPIN_MAX_US ? gap * 2 : SPIN_US;
}

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* One look of a spin (the workers' for work, a wait's for its rows): until `done(arg)`, watch
 * with the CPU's pause instruction for up to PAUSE_US, then yield the core (sched_yield).
 * Yielding at every look made each side of a hand-off one system call late: a round trip
 * between two threads on two idle cores took 0.6-2.7 µs with sched_yield alone, 0.1 µs this way
 * (a ping-pong in C on this VM). But where other threads want the core (a busy machine), a
 * thread that spins without yielding uses up its share of it and then waits out others' time
 * slices (ms) when its call comes: so a look that came back late (another thread ran) turns the
 * pause off, pool-wide, for PAUSE_OFF_US, and every look is a bare yield as before. Returns
 * whether `done(arg)` held. */
static int spin_look(aicirt_pool *p, int (*done)(const void *), const void *arg) {
    double t0 = now_us();
    if (t0 >= (double)__atomic_load_n(&p->pause_off_until, __ATOMIC_RELAXED)) {
        double until = t0 + PAUSE_US;
        do {
            for (int k = 0; k < 16; k++) {
                if (done(arg)) return 1;
                cpu_relax();
            }
        } while (now_us() < until);
    } else if (done(arg)) {
        return 1;
    }
    sched_yield();
    double t2 = now_us();
    if (t2 - t0 > PAUSE_US + YIELD_LATE_US)   /* preempted, or the yield let another thread run */
        __atomic_store_n(&p->pause_off_until, (long long)(t2 + PAUSE_OFF_US), __ATOMIC_RELAXED);
    return done(arg);
}

static int work_queued(const void *arg) {
    const aicirt_pool *p = arg;
    return __atomic_load_n(&p->tail, __ATOMIC_ACQUIRE) != __atomic_load_n(&p->head, __ATOMIC_ACQUIRE)
        || __atomic_load_n(&p->stop, __ATOMIC_ACQUIRE);
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
            double until = now_us() + spin_for(p);
            while (now_us() < until && !spin_look(p, work_queued, p)) {}   /* a look sees queued work first */
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
        p->call_end_us = now_us();
        if (p->waiting) pthread_cond_broadcast(&p->done);
        release_turn(p, w->index);
        if (p->demoted[w->index]) break;   /* stalled: leave; the worker that replaced it stays */
    }
    if (p->demoted[w->index]) p->stalled--;
    p->alive[w->index] = 0;
    p->live--;
    p->exited++;   /* the ticker joins it (join_exited) */
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

/* Join the workers that have left (stalled ones leave once replaced), called by the ticker with
 * p->mu held, which it drops while joining. Until joined, a thread that has exited keeps its stack
 * mapped (8 MiB, its top pages resident: about 23 KiB each), and spawn_worker joined only the entry
 * it reused: after bursts of stalled calls, up to max_threads dead workers held their stacks
 * (bench/hostile_soak.py's full mix: 97 more 8 MiB mappings, +2.3 MiB of RSS, over 4,000 sequences).
 * Not once the pool stops: aicirt_pool_free joins every started thread itself. */
static void join_exited(aicirt_pool *p) {
    pthread_t gone[64];
    while (p->exited && !p->stop) {
        int n = 0;
        for (int i = 0; i < MAX_THREADS && n < 64; i++)
            if (p->started[i] && !p->alive[i]) { gone[n++] = p->threads[i]; p->started[i] = 0; }
        p->exited -= n;
        if (!n) { p->exited = 0; break; }   /* cannot happen: the count and the flags agree */
        pthread_mutex_unlock(&p->mu);
        for (int k = 0; k < n; k++) pthread_join(gone[k], 0);
        pthread_mutex_lock(&p->mu);
    }
}

/* The epoch clock (see above): one tick every tick_us while a call is out, a guest runs outside the
 * pool, or the pool is stopping; asleep after IDLE_TICKS ticks with none. */
static void *ticker(void *arg) {
    aicirt_pool *p = arg;
    int idle = 0;
    pthread_mutex_lock(&p->mu);
    while (!p->ticker_stop) {
        if (p->exited) join_exited(p);
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
    if (p->call_end_us > 0) {   /* how long workers wait between calls: their spin follows it (spin_for) */
        double gap = now - p->call_end_us;
        p->idle_gap_us = p->idle_gap_us > 0 ? 0.8 * p->idle_gap_us + 0.2 * gap : gap;
    }
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

struct rows_ref { aicirt_slot **slots; int n; };

static int rows_done(const void *arg) {
    const struct rows_ref *r = arg;
    return count_left(r->slots, r->n) == 0;
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
    /* Spin first: the caller is idle anyway, and a futex sleep + wake-up costs 15-20 µs on a VM,
     * more than most controller calls. For as long as the calls may take: twice the longest of
     * their sequences' last calls and of their longest calls so far, SPIN_US at least and
     * SPIN_MAX_US at most; where a last call took longer than that (a slow phase), SPIN_US. A
     * grammar mask of 40-60 µs used to find its caller asleep (the return 18 µs after the call's
     * end at the median), and the json controller's key positions (50-1000 µs, among steps of
     * 10) did while the spin followed the last call alone: its wall p90 past the call's end 24 µs.
     * Looking as spin_look does (the workers' way). */
    double last = 0, most = 0;
    for (int i = 0; i < n; i++) {
        double e = slots[i]->elapsed_us, h = slots[i]->hist_max_us;   /* hints: the worker may be writing them */
        if (e > last) last = e;
        if (h > most) most = h;
    }
    if (last > most) most = last;
    double spin = 2 * most < SPIN_US ? SPIN_US : 2 * most > SPIN_MAX_US ? SPIN_MAX_US : 2 * most;
    if (2 * last > SPIN_MAX_US) spin = SPIN_US;   /* a slow phase: a wake-up is small beside its calls */
    double spin_until = now_us() + (timeout_us < spin ? timeout_us : spin);
    struct rows_ref rows = {slots, n};
    do {
        if (spin_look(p, rows_done, &rows)) return 0;
    } while (now_us() < spin_until);
    int left;
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

