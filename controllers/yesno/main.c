/* yesno: sample one of two answers ("Yes"/"No" unless the argument gives "A\nB"), then stop.
 * The mask allows the answers' first tokens; a multi-token answer's rest is fast-forwarded by a
 * conditional splice where the host grants conditional ff-tokens (and ff-tokens), else by an
 * unconditional splice the next step where it grants ff-tokens, else forced one token a step by
 * masks. Each call reads where it is from the tokens it sees, so a host that takes tokens back
 * only makes it repeat them. The answer goes to variable "answer". The default answers are
 * tokenized once per tokenizer, in the init (docs/snapshots.md). */
#include "aici.h"

static aici_token_t *opt[2];
static uint32_t n_opt[2], prompt_len;
static aici_token_t *yes_no[2];        /* "Yes" and "No" tokenized by the init (once per tokenizer) */
static uint32_t n_yes_no[2];

AICI_EXPORT_INIT void yesno_init(void) {
  yes_no[0] = aici_tokenize("Yes", 3, &n_yes_no[0]);
  yes_no[1] = aici_tokenize("No", 2, &n_yes_no[1]);
}

static void parse_arg(void) {
  uint32_t n;
  char *a = (char *)aici_arg(&n);
  const char *text[2] = {"Yes", "No"};
  uint32_t len[2] = {3, 2};
  uint32_t nl = 0;
  while (nl < n && a[nl] != '\n') nl++;
  if (nl < n) text[0] = a, len[0] = nl, text[1] = a + nl + 1, len[1] = n - nl - 1;
  for (int i = 0; i < 2; i++) {
    if (nl == n && yes_no[i]) opt[i] = yes_no[i], n_opt[i] = n_yes_no[i];   /* the defaults, from the init */
    else opt[i] = aici_tokenize(text[i], len[i], &n_opt[i]);
  }
  if (!n_opt[0] || !n_opt[1] || opt[0][0] == opt[1][0])
    aici_fail("yesno: the two answers need distinct first tokens");
}

static void sample_first(aici_result_t *res) {
  aici_tokset_t *m = aici_tokset_tmp();
  aici_tokset_allow(m, opt[0][0]);
  aici_tokset_allow(m, opt[1][0]);
  aici_branch_t *b = aici_sample(res, m);
  uint32_t caps = aici_capabilities();
  if ((caps & AICI_CAP_CONDITIONAL_FF) && (caps & AICI_CAP_FF_TOKENS))
    for (int i = 0; i < 2; i++)
      if (n_opt[i] > 1) aici_branch_splice(b, opt[i], 1, 0, opt[i] + 1, n_opt[i] - 1);
}

void aici_step(const aici_arg_t *arg, aici_result_t *res) {
  if (arg->call_index == 0) {
    parse_arg();
    prompt_len = arg->n_all_tokens;
  }
  const aici_token_t *gen = arg->all_tokens + prompt_len;
  uint32_t k = arg->n_all_tokens - prompt_len;      /* answer tokens so far */
  if (k == 0) {                                     /* first call, or the host took them all back */
    sample_first(res);
    return;
  }
  int i = gen[0] == opt[0][0] ? 0 : 1;
  if (k > n_opt[i] || __builtin_memcmp(gen, opt[i], k * sizeof(aici_token_t)))
    aici_fail("yesno: the tokens after the prompt are no answer's");
  if (k == n_opt[i]) {
    aici_var_set("answer", i == 0 ? "yes" : "no", i == 0 ? 3 : 2);
    return;                                         /* no branch: stop */
  }
  if (aici_capabilities() & AICI_CAP_FF_TOKENS) {
    aici_ff(res, 0, opt[i] + k, n_opt[i] - k);
  } else {
    aici_tokset_t *m = aici_tokset_tmp();
    aici_tokset_allow(m, opt[i][k]);
    aici_sample(res, m);
  }
}
