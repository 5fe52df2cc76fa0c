"""cffi declarations: step.c's slot (read from it) and the libwasmtime 50 entry points we call."""
from pathlib import Path

_STEP_C = (Path(__file__).resolve().parent / "step.c").read_text()
# The slot and wasmtime handle layouts, declared once in step.c between its CDEF markers.
CDEF_SLOT = _STEP_C[_STEP_C.index("/* CDEF BEGIN */"):_STEP_C.index("/* CDEF END */")]

CDEF_STEP = """
int aicirt_bind(void *call, void *mem_data, void *mem_size, void *deadline);
void aicirt_post(aicirt_slot *s);
uint8_t *aicirt_memory(aicirt_slot *s, size_t *size);
typedef struct aicirt_pool aicirt_pool;
aicirt_pool *aicirt_pool_new(int n_threads);
int aicirt_pool_submit(aicirt_pool *p, aicirt_slot **slots, int n);
int aicirt_pool_wait(aicirt_pool *p, aicirt_slot **slots, int n, double timeout_us);
void aicirt_pool_free(aicirt_pool *p);
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
