/* WASI preview 1 for controllers (docs/wasi.md), the functions a libc calls, as native callbacks
 * (compiled after host.c, whose fault and guest-memory helpers these use). runtime/host/wasi.py is the
 * same logic for the init template: same results, same messages.
 *
 * No real I/O, and nothing that makes a controller's results depend on when or where it runs:
 *   - clocks are virtual: every clock reads `calls` ms (the mid-process calls started so far on
 *     this sequence), so time moves one millisecond a step and never within a call; resolution 1 ms;
 *   - random_get is a splitmix64 stream seeded from the request's argument (lazily, on first
 *     use: `wasi_rng` 0 means unseeded); a fork's children split it (wasi.py: split), so a replay
 *     of the same request reads the same bytes;
 *   - fd_write to 1 and 2 appends to the sequence's log; other fds are EBADF;
 *   - args and environment are empty; fd_fdstat_get says 0-2 are character devices;
 *   - proc_exit ends the sequence in error, its message the tail of what this call logged (a
 *     libc program writes why to stderr, then exits);
 *   - everything else (files, sockets, poll) is not here: the Python side answers ENOSYS.
 */
#define WASI_ESUCCESS 0
#define WASI_EBADF 8
#define WASI_EINVAL 28
#define WASI_CLOCK_NS 1000000ull      /* one virtual millisecond a call */
#define WASI_MAX_IOVS 1024

static uint64_t wasi_mix(uint64_t *state) {   /* splitmix64 */
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* The request's seed: FNV-1a 64 of its argument, never 0 (0 marks "not seeded yet"). */
static uint64_t wasi_seed(const uint8_t *arg, uint32_t n) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (uint32_t i = 0; i < n; i++) h = (h ^ arg[i]) * 0x100000001b3ull;
    h ^= 0x6a09e667f3bcc909ull;
    return h ? h : 1;
}

#define WASI_RET(v) (a[0].i32 = (v), (void *)0)

static void *w_clock_time_get(void *env, void *caller, wt_val_raw_t *a, size_t n) {
    SLOT(caller, ctx);
    void *trap = 0;
    uint64_t t = (uint64_t)s->calls * WASI_CLOCK_NS;
    if (!guest_write(s, ctx, "clock_time_get", (uint32_t)a[2].i32, &t, 8, &trap)) return trap;
    return WASI_RET((uint32_t)a[0].i32 > 3 ? WASI_EINVAL : WASI_ESUCCESS);
}

static void *w_clock_res_get(void *env, void *caller, wt_val_raw_t *a, size_t n) {
    SLOT(caller, ctx);
    void *trap = 0;
    uint64_t r = WASI_CLOCK_NS;
    if ((uint32_t)a[0].i32 > 3) return WASI_RET(WASI_EINVAL);
    if (!guest_write(s, ctx, "clock_res_get", (uint32_t)a[1].i32, &r, 8, &trap)) return trap;
    return WASI_RET(WASI_ESUCCESS);
}

static void *w_random_get(void *env, void *caller, wt_val_raw_t *a, size_t n) {
    SLOT(caller, ctx);
    void *trap = 0;
    uint32_t ptr = (uint32_t)a[0].i32, len = (uint32_t)a[1].i32;
    if (len > s->host_arg_cap)
        return fault(s, "WASI function `random_get`: %u bytes is over the limit of %u (Limits.host_arg_bytes)", len,
                     s->host_arg_cap);
    uint8_t *dst = (uint8_t *)guest_bytes(s, ctx, "random_get", ptr, len, &trap);
    if (!dst) return trap;
    if (!s->wasi_rng) s->wasi_rng = wasi_seed(s->arg, s->arg_len);
    for (uint32_t i = 0; i < len; i += 8) {
        uint64_t r = wasi_mix(&s->wasi_rng);
        memcpy(dst + i, &r, len - i < 8 ? len - i : 8);
    }
    return WASI_RET(WASI_ESUCCESS);
}

static void *w_fd_write(void *env, void *caller, wt_val_raw_t *a, size_t n) {
    SLOT(caller, ctx);
    void *trap = 0;
    uint32_t fd = (uint32_t)a[0].i32, iovs = (uint32_t)a[1].i32, n_iovs = (uint32_t)a[2].i32;
    if (fd != 1 && fd != 2) return WASI_RET(WASI_EBADF);
    if (n_iovs > WASI_MAX_IOVS)
        return fault(s, "WASI function `fd_write`: %u iovecs is over the limit of %u", n_iovs, WASI_MAX_IOVS);
    const uint8_t *vec = guest_bytes(s, ctx, "fd_write", iovs, n_iovs * 8, &trap);
    if (!vec) return trap;
    uint64_t total = 0;
    for (uint32_t i = 0; i < n_iovs; i++) {
        uint32_t io[2];
        memcpy(io, vec + 8 * i, 8);
        total += io[1];
        if (total > s->host_arg_cap)
            return fault(s, "WASI function `fd_write`: writes %llu bytes or more, over the limit of %u "
                            "(Limits.host_arg_bytes)", (unsigned long long)total, s->host_arg_cap);
        const uint8_t *p = guest_bytes(s, ctx, "fd_write", io[0], io[1], &trap);
        if (!p) return trap;
        aicirt_log_append(s, p, io[1]);
    }
    uint32_t written = (uint32_t)total;
    if (!guest_write(s, ctx, "fd_write", (uint32_t)a[3].i32, &written, 4, &trap)) return trap;
    return WASI_RET(WASI_ESUCCESS);
}

static void *w_fd_fdstat_get(void *env, void *caller, wt_val_raw_t *a, size_t n) {
    SLOT(caller, ctx);
    void *trap = 0;
    if ((uint32_t)a[0].i32 > 2) return WASI_RET(WASI_EBADF);
    uint8_t st[24] = {2};   /* filetype: character device; no flags, no rights */
    if (!guest_write(s, ctx, "fd_fdstat_get", (uint32_t)a[1].i32, st, sizeof st, &trap)) return trap;
    return WASI_RET(WASI_ESUCCESS);
}

/* args_sizes_get / environ_sizes_get: zero of each. */
static void *w_sizes_get(void *env, void *caller, wt_val_raw_t *a, size_t n) {
    SLOT(caller, ctx);
    void *trap = 0;
    uint32_t zero = 0;
    if (!guest_write(s, ctx, "args_sizes_get", (uint32_t)a[0].i32, &zero, 4, &trap) ||
        !guest_write(s, ctx, "args_sizes_get", (uint32_t)a[1].i32, &zero, 4, &trap))
        return trap;
    return WASI_RET(WASI_ESUCCESS);
}

static void *w_success(void *env, void *caller, wt_val_raw_t *a, size_t n) { return WASI_RET(WASI_ESUCCESS); }

/* proc_exit(code): the sequence ends in error. The message quotes the last entry of this call's
 * log: its last line that does not begin with a space, and the indented lines after it (a stack),
 * joined by " | " and cut to the fault's size; that is where a libc program (and the js
 * controller) says why. wasi.py's exit_message is the same rule. */
static void *w_proc_exit(void *env, void *caller, wt_val_raw_t *a, size_t n) {
    SLOT(caller, ctx);
    (void)ctx;
    char head[48];
    int hn = snprintf(head, sizeof head, "controller exited with proc_exit(%d)", a[0].i32);
    uint32_t len = s->call_log_len <= s->log_len ? s->call_log_len : s->log_len;
    const uint8_t *p = s->log ? s->log + (s->log_len - len) : 0;
    while (len && (p[len - 1] == '\n' || p[len - 1] == ' ' || p[len - 1] == '\t')) len--;
    uint32_t i = len;
    while (i > 0) {   /* back to the start of the last line that is not indented */
        uint32_t start = i;
        while (start > 0 && p[start - 1] != '\n') start--;
        i = start;
        if (p[start] != ' ' && p[start] != '\t') break;
        if (i) i--;
    }
    uint32_t room = (uint32_t)sizeof s->fault - 1 - (uint32_t)hn - 2, k = 0;
    char tail[256];
    for (; i < len && k < room; i++) {
        if (p[i] == '\n') {
            if (k + 3 > room) break;
            memcpy(tail + k, " | ", 3), k += 3;
            while (i + 1 < len && (p[i + 1] == ' ' || p[i + 1] == '\t')) i++;
        } else {
            tail[k++] = (char)p[i];
        }
    }
    while (k && (tail[k - 1] & 0xC0) == 0x80) k--;   /* no cut UTF-8 character */
    if (k && (uint8_t)tail[k - 1] >= 0xC0) k--;
    return k ? fault(s, "%s: %.*s", head, (int)k, tail) : fault(s, "%s", head);
}

/* The native callback for WASI function `name`, or NULL (then the Python side answers). */
void *aicirt_wasi_callback(const char *name) {
    static const struct { const char *name; void *fn; } table[] = {
        {"clock_time_get", (void *)w_clock_time_get}, {"clock_res_get", (void *)w_clock_res_get},
        {"random_get", (void *)w_random_get},         {"fd_write", (void *)w_fd_write},
        {"fd_fdstat_get", (void *)w_fd_fdstat_get},   {"args_sizes_get", (void *)w_sizes_get},
        {"environ_sizes_get", (void *)w_sizes_get},   {"args_get", (void *)w_success},
        {"environ_get", (void *)w_success},           {"sched_yield", (void *)w_success},
        {"proc_exit", (void *)w_proc_exit},
    };
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
        if (!strcmp(table[i].name, name)) return table[i].fn;
    return 0;
}
