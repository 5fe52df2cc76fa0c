"""cffi declarations, hand-kept to match wasmtime 50's C API and step.c (edit them together)."""

# Mirrors step.c. wasmtime_memory_t is 24 bytes and wasmtime_func_t 16 in wasmtime 50.
CDEF_SLOT = """
typedef struct { uint64_t store_id; void *priv; } wt_func_t;
typedef struct { struct { uint64_t store_id; uint32_t p1; } a; uint32_t p2; } wt_memory_t;
typedef union { int32_t i32; int64_t i64; float f32; double f64; uint8_t v128[16]; void *ref; } wt_val_raw_t;
typedef struct {
    void *ctx;
    wt_func_t f_realloc, f_mid, f_post;
    wt_memory_t mem;
    int32_t has_post;
    uint64_t deadline_ticks;
    uint32_t backtrack, n_tokens, sampled_is_some, sampled, n_group;
    const uint32_t *tokens, *group;
    uint32_t *mask_row;
    uint32_t mask_words, vocab_size;
    int32_t status;
    uint32_t result_ptr;
    uint32_t n_branches, branches_ptr;
    int32_t temp_is_some;
    float temp;
    void *error, *trap;
    double elapsed_us;
    volatile int32_t done;
} aicirt_slot;
"""

CDEF_STEP = """
int aicirt_bind(void *call, void *mem_data, void *mem_size, void *deadline);
void aicirt_step_many(aicirt_slot **slots, int n);
void aicirt_post(aicirt_slot *s);
uint8_t *aicirt_memory(aicirt_slot *s, size_t *size);
"""

# The libwasmtime entry points the Python fallback and the error formatting call directly.
CDEF_WASMTIME = """
typedef struct wasm_trap_t wasm_trap_t;
typedef struct wasmtime_error_t wasmtime_error_t;
typedef struct { size_t size; char *data; } wasm_byte_vec_t;
wasmtime_error_t *wasmtime_func_call_unchecked(void *ctx, const wt_func_t *f, wt_val_raw_t *args, size_t n, wasm_trap_t **trap);
uint8_t *wasmtime_memory_data(void *ctx, const wt_memory_t *m);
size_t wasmtime_memory_data_size(void *ctx, const wt_memory_t *m);
void wasmtime_context_set_epoch_deadline(void *ctx, uint64_t ticks);
bool wasmtime_trap_code(const wasm_trap_t *trap, uint8_t *code);
void wasm_trap_message(const wasm_trap_t *trap, wasm_byte_vec_t *out);
void wasm_trap_delete(wasm_trap_t *trap);
void wasmtime_error_message(const wasmtime_error_t *err, wasm_byte_vec_t *out);
void wasmtime_error_delete(wasmtime_error_t *err);
void wasm_byte_vec_delete(wasm_byte_vec_t *v);
"""
