/* The rows API: built after pool.c (one translation unit, see slot.c). */
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
 * mask_base. Where expect_seen (may be NULL) has expect_seen[i] >= 0, the caller built row i on the
 * belief that its controller saw that many tokens (the object API's copy of them): a row that would
 * start and whose controller saw another count is stale. Returns how many rows started (>= 0) with
 * row_status[] filled and the started rows queued, or, with nothing started, -(i + 1) for misuse at
 * row i (*misuse: 1 submitted twice in this batch, 2 in a batch not waited for, 3 closed), or for the
 * first stale row (*misuse 6; then row_status[k] is 6 for every stale row k, 0 for the others). */
int aicirt_rows_start(aicirt_pool *p, aicirt_slot **slots, int n, const int32_t *sampled, const int32_t *edit_of,
                      const int64_t *edit_off, const uint32_t *edit_tok, const uint32_t *edit_unchanged,
                      const int32_t *expect_seen, uint32_t *mask_base, uint32_t words, uint64_t stamp,
                      int8_t *row_status, int *misuse) {
    int stale = -1;
    for (int i = 0; i < n; i++) {
        aicirt_slot *s = slots[i];
        if (s->stamp == stamp) { *misuse = 1; return -(i + 1); }
        if (s->call_out == 1) { *misuse = 2; return -(i + 1); }
        if (s->stopped == 2) { *misuse = 3; return -(i + 1); }
        s->stamp = stamp;
        if (expect_seen) {
            int is_stale = expect_seen[i] >= 0 && !s->stopped && !s->call_out && s->n_seen != (uint32_t)expect_seen[i];
            row_status[i] = is_stale ? 6 : 0;
            if (is_stale && stale < 0) stale = i;
        }
    }
    if (stale >= 0) { *misuse = 6; return -(stale + 1); }
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
    return m;
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

/* aicirt_rows_submit's inputs, in a struct the caller keeps (one per pool) and writes only where a
 * field changed since its last submit: cffi's ABI mode (libffi) converts every argument of every
 * call, and the fifteen of a submit cost 1.1 µs a call, as much as all the rest of a one-row
 * submit's Python (a three-argument call: 0.4). `edit_*` and `expect_seen` as aicirt_rows_start's
 * (NULL: none). */
/* CDEF ROWS BEGIN */
typedef struct {
    struct aicirt_pool *pool;
    const uint64_t *table;
    int64_t table_len;
    const int64_t *index;
    const int32_t *sampled;
    const int32_t *edit_of;
    const int64_t *edit_off;
    const uint32_t *edit_tok;
    const uint32_t *edit_unchanged;
    const int32_t *expect_seen;
    uint32_t *mask_base;
    uint32_t words;
    uint8_t *scratch;
} aicirt_rows_args;
/* CDEF ROWS END */

/* aicirt_rows_gather (the rows' slots from the registry's table) then aicirt_rows_start, for the
 * `n` rows of `a`. Returns how many rows started (the object API looks at its rows again only when
 * that is not all of them), or -(i + 1) with nothing started and row_status[i] saying why: 5 no
 * live sequence at index[i], else aicirt_rows_start's misuse (1 twice in this batch, 2 in a batch
 * not waited for, 3 closed, 4 out of memory, 6 stale: see there). */
int aicirt_rows_submit(const aicirt_rows_args *a, int n, uint64_t stamp) {
    aicirt_slot **slots = SCR_SLOTS(a->scratch, n);
    int8_t *status = SCR_STATUS(a->scratch, n);
    int rc = aicirt_rows_gather(a->table, a->table_len, a->index, n, (uint64_t *)slots);
    if (rc < 0) { status[-rc - 1] = 5; return rc; }
    int misuse = 0;
    rc = aicirt_rows_start(a->pool, slots, n, a->sampled, a->edit_of, a->edit_off, a->edit_tok, a->edit_unchanged,
                           a->expect_seen, a->mask_base, a->words, stamp, status, &misuse);
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
