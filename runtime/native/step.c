/* The per-sequence step of the hot path, in C (built on first use by build.py, with zig cc).
 *
 * aicirt_step runs `mid-process` for one sequence on a worker thread of the pool (pool.c), with the
 * GIL released: allocate and write the arguments through the guest's cabi_realloc, call
 * mid-process, lift the common result (one branch, a mask, no splices) straight into the batch's
 * mask row, then call cabi_post_mid-process. Anything rarer (stop, forks, splices, no mask) is left to Python
 * (status AICIRT_LIFT), which reads the same linear memory through a numpy view; that result's
 * post-return runs here too, first thing in the sequence's next call.
 *
 * The slot and the libwasmtime bindings are in slot.c, the call's CPU clocks in clock.c (both
 * built before this file), the pool that runs aicirt_step in pool.c, host imports in host.c.
 */
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

void aicirt_capture_run(void *capture, aicirt_slot *src);   /* spawn.c */

void aicirt_step(aicirt_slot *s) {
    double t0 = s->started_us = now_us();
    s->cpu_us = 0;
    s->turn_wait_us = s->turn_wait_since_us = 0;
    aicirt_clock_start(s, s->budget_us);   /* before `started`: the engine thread reads the clock then */
    __atomic_store_n(&s->started, 1, __ATOMIC_RELEASE);
    s->error = s->trap = 0;
    s->n_branches = 0;
    if (s->needs_prepare < 0) {   /* a remembered prepare failure: the fault Python wrote is this call's error */
        s->needs_prepare = s->needs_init = 0;
        s->stage = AICIRT_STAGE_PREPARE;
        s->status = AICIRT_TRAP;
        goto out;
    }
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
    /* aicirt_prepare (docs/protocol.md#binary): the argument's own work, under a first call's limit;
     * the state it leaves is then copied into the template, if this call has one (core/prepared.py) */
    if (s->needs_prepare) {
        s->needs_prepare = 0;
        s->stage = AICIRT_STAGE_PREPARE;
        wt_val_raw_t none[1];
        if (!call(s, s->ctx, &s->f_prepare, none, 0)) {
            s->status = AICIRT_TRAP;
            goto out;
        }
        if (s->capture) {   /* this request's state becomes the template: its own part first */
            if (s->has_prepare_template) {
                s->stage = AICIRT_STAGE_PREPARE_TEMPLATE;
                if (!call(s, s->ctx, &s->f_prepare_template, none, 0)) {
                    s->status = AICIRT_TRAP;
                    goto out;
                }
            }
            aicirt_capture_run(s->capture, s);
        }
        s->started_us = now_us();   /* a fresh limit for mid-process; elapsed_us counts prepare too (its work) */
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

