/* yesno: sample one of two answers ("Yes"/"No" unless the argument gives "A\nB"), then stop.
 * Multi-token answers: the first tokens are sampled, the rest fast-forwarded by a conditional
 * splice when the host grants conditional ff-tokens. The answer goes to variable "answer". */
#include "aici.h"

static aici_token_t *opt[2];
static uint32_t n_opt[2];

void aici_step(const aici_arg_t *arg, aici_result_t *res) {
  if (arg->call_index == 0) {
    uint32_t n;
    char *a = (char *)aici_arg(&n);
    const char *text[2] = {"Yes", "No"};
    uint32_t len[2] = {3, 2};
    uint32_t nl = 0;
    while (nl < n && a[nl] != '\n') nl++;
    if (nl < n) text[0] = a, len[0] = nl, text[1] = a + nl + 1, len[1] = n - nl - 1;
    for (int i = 0; i < 2; i++) opt[i] = aici_tokenize(text[i], len[i], &n_opt[i]);
    if (!n_opt[0] || !n_opt[1] || opt[0][0] == opt[1][0])
      aici_fail("yesno: the two answers need distinct first tokens");
    aici_tokset_t *m = aici_tokset_tmp();
    aici_tokset_allow(m, opt[0][0]);
    aici_tokset_allow(m, opt[1][0]);
    aici_branch_t *b = aici_sample(res, m);
    if (aici_capabilities() & AICI_CAP_CONDITIONAL_FF)
      for (int i = 0; i < 2; i++)
        if (n_opt[i] > 1) aici_branch_splice(b, opt[i], 1, 0, opt[i] + 1, n_opt[i] - 1);
    return;
  }
  if (arg->has_sampled) {
    bool yes = arg->sampled == opt[0][0];
    aici_var_set("answer", yes ? "yes" : "no", yes ? 3 : 2);
  }
  /* no branch: stop */
}
