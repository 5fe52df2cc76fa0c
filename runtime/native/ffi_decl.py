"""cffi declarations (hand-kept): slot.c's slot, read from it; the hot path's own functions; and
the libwasmtime 50 entry points called from Python (error text, host imports)."""
from pathlib import Path

_SLOT_C = (Path(__file__).resolve().parent / "slot.c").read_text()
# The slot and wasmtime handle layouts, declared once in slot.c between its CDEF markers.
CDEF_SLOT = _SLOT_C[_SLOT_C.index("/* CDEF BEGIN */"):_SLOT_C.index("/* CDEF END */")]
_SPAWN_C = (Path(__file__).resolve().parent / "spawn.c").read_text()
# spawn.c's plan of one controller's instances (compiled mode only)
CDEF_SPAWN = _SPAWN_C[_SPAWN_C.index("/* CDEF SPAWN BEGIN */"):_SPAWN_C.index("/* CDEF SPAWN END */")]
_ROWS_C = (Path(__file__).resolve().parent / "rows.c").read_text()
# rows.c's inputs of a submit (CPool keeps one)
CDEF_ROWS = _ROWS_C[_ROWS_C.index("/* CDEF ROWS BEGIN */"):_ROWS_C.index("/* CDEF ROWS END */")]

# host.c's variables are opaque to Python (CVars holds a pointer).
CDEF_VARS = ""

# The hot path's own functions (slot.c ... spawn.c).
CDEF_STEP = CDEF_SPAWN + """
void aicirt_bind_spawn(void **fns);
int aicirt_spawn(const aicirt_spawn_plan *pl, aicirt_slot *s);
void aicirt_store_delete(aicirt_slot *s);
void aicirt_spawn_timing(int on, uint64_t *out);
int64_t aicirt_fork_copy(const aicirt_spawn_plan *pl, aicirt_slot *src, aicirt_slot *dst, size_t img_lo, size_t img_hi);
int64_t aicirt_template_fork(const aicirt_spawn_plan *pl, aicirt_slot *tpl, aicirt_slot *dst, size_t img_lo,
                             size_t img_hi);
int aicirt_bind(void *call, void *mem_data, void *mem_size, void *deadline, void *caller_context,
                void *get_data, void *trap_new, void *error_delete);
uint8_t *aicirt_memory(aicirt_slot *s, size_t *size);
int aicirt_check_mask(const uint8_t *m, size_t size, uint32_t ptr, uint32_t words, uint32_t vocab_size,
                      uint32_t *row, uint32_t *detail);
typedef struct aicirt_pool aicirt_pool;
aicirt_pool *aicirt_pool_new(int n_threads, int max_threads, double stall_us, void *engine, double tick_us);
void aicirt_pool_guests(aicirt_pool *p, int delta);
int aicirt_pool_threads(aicirt_pool *p);
int aicirt_pool_pending(aicirt_pool *p);
int aicirt_pool_submit(aicirt_pool *p, aicirt_slot **slots, int n);
int aicirt_pool_wait(aicirt_pool *p, aicirt_slot **slots, int n, double timeout_us);
void aicirt_pool_free(aicirt_pool *p);
int aicirt_rows_start(aicirt_pool *p, aicirt_slot **slots, int n, const int32_t *sampled, const int32_t *edit_of,
                      const int64_t *edit_off, const uint32_t *edit_tok, const uint32_t *edit_unchanged,
                      const int32_t *expect_seen, uint32_t *mask_base, uint32_t words, uint64_t stamp, int8_t *row_status, int *misuse);
int aicirt_rows_collect(aicirt_slot **slots, int n, const int8_t *row_status, uint8_t *kind, float *temperature,
                        double *elapsed_us);
int aicirt_rows_gather(const uint64_t *table, int64_t table_len, const int64_t *index, int n, uint64_t *out);
int aicirt_rows_wait(aicirt_pool *p, aicirt_slot **slots, int n, const int8_t *row_status, double timeout_us);
int aicirt_seen_copy(const aicirt_slot *src, aicirt_slot *dst);
void aicirt_seen_free(aicirt_slot *s);
int aicirt_pool_stats(aicirt_pool *p, int *out);
int aicirt_pool_steal(aicirt_pool *p, int on);
""" + CDEF_ROWS + """
int aicirt_rows_submit(const aicirt_rows_args *a, int n, uint64_t stamp);
int aicirt_rows_finish(aicirt_pool *p, uint8_t *scratch, int n, double timeout_us);
void aicirt_bind_clock(void *error_new, void *increment_epoch);
void aicirt_clock_start(aicirt_slot *s, double budget_us);
double aicirt_call_cpu_us(aicirt_slot *s);
void *aicirt_epoch_cb(void *ctx, void *data, uint64_t *delta, uint8_t *kind);

void aicirt_log_append(aicirt_slot *s, const uint8_t *data, uint32_t n);
void aicirt_slot_release(aicirt_slot *s);
aicirt_vars *aicirt_vars_new(uint64_t limit);
void aicirt_vars_free(aicirt_vars *v);
int aicirt_vars_set(aicirt_vars *v, uint32_t seq_id, const uint8_t *name, uint32_t nlen, const uint8_t *val,
                    uint32_t vlen, int append, uint64_t *would);
int aicirt_vars_get(aicirt_vars *v, const uint8_t *name, uint32_t nlen, uint8_t **copy, uint32_t *len);
uint64_t aicirt_vars_held(aicirt_vars *v);
int64_t aicirt_vars_take(aicirt_vars *v, uint8_t **out, uint64_t *bytes);
int64_t aicirt_vars_snapshot(aicirt_vars *v, uint8_t **out, uint64_t *bytes);
void aicirt_free(void *p);
void *aicirt_host_callback(int index);
void *aicirt_wasi_callback(const char *name);
uint8_t *aicirt_ctx_memory(aicirt_slot *s, void *ctx, size_t *size);
int64_t aicirt_ctx_alloc(aicirt_slot *s, void *ctx, uint32_t align, uint32_t bytes, const char *name);
size_t aicirt_copy_changed(uint8_t *dst, const uint8_t *src, size_t n, size_t img_lo, size_t img_hi, size_t src_backed,
                           size_t dst_backed);
void aicirt_nonzero_extent(const uint8_t *p, size_t n, size_t *lo, size_t *hi);
void aicirt_bind_py_import(void *fn);
"""

# libwasmtime entry points called directly from Python (through cffi's ABI mode).
CDEF_WASMTIME = """
typedef struct wasm_trap_t wasm_trap_t;
typedef struct wasmtime_error_t wasmtime_error_t;
typedef struct { size_t size; char *data; } wasm_byte_vec_t;
wasmtime_error_t *wasmtime_func_call_unchecked(void *ctx, const wt_func_t *f, wt_val_raw_t *args, size_t n, wasm_trap_t **trap);
uint8_t *wasmtime_memory_data(void *ctx, const wt_memory_t *m);
size_t wasmtime_memory_data_size(void *ctx, const wt_memory_t *m);
void wasmtime_context_set_epoch_deadline(void *ctx, uint64_t ticks);
wasmtime_error_t *wasmtime_error_new(const char *msg);
typedef wasmtime_error_t *(*wt_epoch_cb)(void *ctx, void *data, uint64_t *delta, uint8_t *kind);
void wasmtime_store_epoch_deadline_callback(void *store, wt_epoch_cb func, void *data, void *finalizer);
bool wasmtime_trap_code(const wasm_trap_t *trap, uint8_t *code);
void wasm_trap_message(const wasm_trap_t *trap, wasm_byte_vec_t *out);
void wasm_trap_delete(wasm_trap_t *trap);
wasm_trap_t *wasmtime_trap_new(const char *msg, size_t len);
void wasmtime_error_message(const wasmtime_error_t *err, wasm_byte_vec_t *out);
void wasmtime_error_delete(wasmtime_error_t *err);
void wasm_byte_vec_delete(wasm_byte_vec_t *v);
void *wasmtime_caller_context(void *caller);
void *wasmtime_context_get_data(void *ctx);
void wasmtime_context_set_data(void *ctx, void *data);
typedef wasm_trap_t *(*wt_unchecked_cb)(void *env, void *caller, wt_val_raw_t *args, size_t n);
void *wasmtime_store_new(void *engine, void *data, void *finalizer);
void *wasmtime_store_context(void *store);
void wasmtime_store_limiter(void *store, int64_t memory_size, int64_t table_elements, int64_t instances,
                            int64_t tables, int64_t memories);
void wasmtime_store_delete(void *store);
wasmtime_error_t *wasmtime_instance_pre_instantiate(void *pre, void *ctx, wt_instance_t *out, wasm_trap_t **trap);
bool wasmtime_instance_export_get(void *ctx, const wt_instance_t *inst, const char *name, size_t len, wt_extern_t *item);
wasmtime_error_t *wasmtime_memory_grow(void *ctx, const wt_memory_t *m, uint64_t delta, uint64_t *prev);
void wasmtime_global_get(void *ctx, const void *g, void *val);
wasmtime_error_t *wasmtime_global_set(void *ctx, const void *g, const void *val);
wasmtime_error_t *wasmtime_linker_define_func_unchecked(void *linker, const char *module, size_t module_len,
    const char *name, size_t name_len, const void *ty, void *cb, void *env, void *finalizer);
"""
