/* choice: fork one branch per option (argument: options, one per line). Each child
 * fast-forwards its option, writes it to variable "choice.<i>" and stops; the parent waits
 * (no-op) until every child has written, then writes "choices" (the options seen, one per
 * line, in order) and stops. */
#include "aici.h"

#define MAX_WAIT 200                   /* parent steps before it gives up on missing children */
static uint32_t n_opts, waited;
static bool forked;

static void var_name(char *buf, uint32_t i) {   /* "choice.<i>" */
  const char *p = "choice.";
  uint32_t k = 0;
  while (*p) buf[k++] = *p++;
  char t[12]; int n = 0;
  do t[n++] = (char)('0' + i % 10), i /= 10; while (i);
  while (n) buf[k++] = t[--n];
  buf[k] = 0;
}

static void fork_options(aici_result_t *res) {
  uint32_t n;
  char *a = (char *)aici_arg(&n);
  if (!(aici_capabilities() & AICI_CAP_FORK)) aici_fail("choice: the host does not grant fork");
  aici_noop(res);                      /* branch 0: this sequence waits */
  for (uint32_t s = 0; s < n;) {
    uint32_t e = s;
    while (e < n && a[e] != '\n') e++;
    if (e > s) {
      uint32_t nt;
      aici_token_t *t = aici_tokenize(a + s, e - s, &nt);
      aici_ff(res, 0, t, nt);
      aici_free(t);
      n_opts++;
    }
    s = e + 1;
  }
  aici_free(a);
  forked = true;
}

void aici_step(const aici_arg_t *arg, aici_result_t *res) {
  if (arg->call_index == 0) {
    fork_options(res);
    return;
  }
  if (!forked) return;
  if (arg->n_fork_group && arg->fork_group[0] != aici_self_seq_id()) {   /* a child */
    uint32_t me = 0;
    while (me < arg->n_fork_group && arg->fork_group[me] != aici_self_seq_id()) me++;
    uint32_t len;
    uint8_t *text = aici_detokenize(arg->tokens, arg->n_tokens, &len);
    char name[24];
    var_name(name, me - 1);
    aici_var_set(name, text, len);
    aici_free(text);
    return;                            /* stop */
  }
  /* the parent: done when every child has written its variable */
  char name[24];
  uint32_t total = 0;
  uint8_t *vals[64];
  uint32_t lens[64];
  uint32_t got = 0;
  for (uint32_t i = 0; i < n_opts && i < 64; i++) {
    var_name(name, i);
    vals[i] = aici_var_get(name, &lens[i]);
    if (vals[i]) got++, total += lens[i] + 1;
  }
  if (got == n_opts || n_opts > 64 || ++waited > MAX_WAIT) {
    if (got == n_opts && n_opts <= 64) {
      char *all = aici_tmp_alloc(total + 1);
      uint32_t k = 0;
      for (uint32_t i = 0; i < n_opts; i++) {
        __builtin_memcpy(all + k, vals[i], lens[i]);
        k += lens[i];
        all[k++] = '\n';
      }
      aici_var_set("choices", all, k);
    } else {
      aici_logs("choice: gave up waiting for the branches\n");
    }
  } else {
    aici_noop(res);
  }
  for (uint32_t i = 0; i < n_opts && i < 64; i++) aici_free(vals[i]);
}
