/* A hostile controller written against the SDK: its argument names what it does ("mode" or
 * "mode:N"). Every mode is something a real, careless or malicious controller author could
 * ship; the runtime must end only this sequence (or let it run, where it is legal) and never
 * slow down or change its neighbours. Healthy fallback: allow token 'A' (65). */
#include "aici.h"
#include "aici_host.h"


static uint32_t atoi_n(const char *s, uint32_t n) {
  uint32_t v = 0;
  for (uint32_t i = 0; i < n && s[i] >= '0' && s[i] <= '9'; i++) v = v * 10 + (uint32_t)(s[i] - '0');
  return v;
}

static char mode[64];
static uint32_t n_arg;

static void parse_mode(void) {
  uint8_t *a = aici_arg(&n_arg);
  uint32_t i = 0;
  for (; i < n_arg && i < sizeof mode - 1 && a[i] != ':'; i++) mode[i] = (char)a[i];
  mode[i] = 0;
  n_arg = i < n_arg ? (uint32_t)atoi_n((const char *)a + i + 1, n_arg - i - 1) : 0;
}

static int is(const char *m) { const char *a = mode; while (*a && *a == *m) a++, m++; return *a == *m; }

static volatile uint32_t sink;
static void spin(uint32_t n) { for (uint32_t i = 0; i < n; i++) sink += i * 2654435761u; }

static void allow_a(aici_result_t *res) {
  aici_tokset_t *m = aici_tokset_tmp();
  aici_tokset_allow(m, 65);
  aici_sample(res, m);
}

void aici_step(const aici_arg_t *arg, aici_result_t *res) {
  if (arg->call_index == 0) parse_mode();
  if (is("spin-every-call")) {                 /* a busy loop N million iterations long, every call */
    spin(n_arg * 1000000u);
  } else if (is("spin-first-call") && arg->call_index == 0) {
    spin(n_arg * 1000000u);
  } else if (is("malloc-until-fail")) {        /* the allocator traps when memory cannot grow */
    for (;;) { char *p = aici_malloc(1 << 20); if (!p) __builtin_trap(); p[0] = 1; }
  } else if (is("touch-all-memory")) {         /* legal: fill most of the 64 MiB limit every call */
    static char *big;
    if (!big) big = aici_malloc(48u << 20);
    if (!big) __builtin_trap();
    __builtin_memset(big, (int)arg->call_index, 48u << 20);
  } else if (is("fork-bomb")) {                /* fork into 4 every call until the fork limit */
    for (int i = 0; i < 4; i++) allow_a(res);
    return;
  } else if (is("tokenize-huge")) {            /* 2 MiB of text: over Limits.host_arg_bytes */
    uint32_t n;
    char *text = aici_malloc(2u << 20);
    __builtin_memset(text, 'x', 2u << 20);
    aici_tokenize(text, 2u << 20, &n);
  } else if (is("detokenize-bad-id")) {
    aici_token_t bad[2] = {65, 1000000};
    uint32_t n;
    aici_detokenize(bad, 2, &n);
  } else if (is("var-flood")) {                /* a variable grown past Limits.variable_bytes */
    static char chunk[1 << 16];
    for (int i = 0; i < 1024; i++) aici_var_append("flood", chunk, sizeof chunk);
  } else if (is("empty-append-flood")) {       /* zero-byte appends: change records for nothing */
    for (uint32_t i = 0; i < (n_arg ? n_arg : 100000); i++) aici_var_append("e", "", 0);
  } else if (is("log-flood")) {                /* legal: 1 MiB of log a call, the host keeps 64 KiB */
    static char line[4096];
    __builtin_memset(line, 'L', sizeof line);
    for (int i = 0; i < 256; i++) aici_log(line, sizeof line);
  } else if (is("trie-every-call")) {          /* legal: the host copies the token trie in each call */
    static uint32_t ret[2];
    aici_h_token_trie((int32_t)(uintptr_t)ret);
  } else if (is("stop-at-once")) {             /* legal: no branch */
    return;
  } else if (is("noop-forever")) {             /* legal: wait forever */
    aici_noop(res);
    return;
  }
  allow_a(res);
}
