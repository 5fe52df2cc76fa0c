/* choice: one branch per option (argument: options, one per line).
 * With fork: each child produces its option (fast-forwarded where the host grants ff-tokens,
 * else forced one token a step by masks), writes it to variable "choice.<i>" and stops; the
 * parent waits (no-op) until every child has written, then writes "choices" (the options seen,
 * one per line, in order) and stops.
 * Without fork: this sequence picks one option itself, sampling under masks that allow only
 * the options' next tokens (fast-forwarding the rest where one option is left and ff-tokens is
 * granted), and writes it to "choices" (one line).
 * Each call reads where it is from the tokens it sees, so a host that takes tokens back only
 * makes it repeat them. */
#include "aici.h"

#define MAX_OPTS 64
#define MAX_WAIT 200                   /* parent steps before it gives up on missing children */
static aici_token_t *opt[MAX_OPTS];
static uint32_t n_opt[MAX_OPTS], n_opts, waited, prompt_len;
static int mine = -1;                  /* a child's option; -1 in the parent */
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

static void parse_options(void) {
  uint32_t n;
  char *a = (char *)aici_arg(&n);
  for (uint32_t s = 0; s < n;) {
    uint32_t e = s;
    while (e < n && a[e] != '\n') e++;
    if (e > s) {
      if (n_opts == MAX_OPTS) aici_fail("choice: more than %d options", MAX_OPTS);
      opt[n_opts] = aici_tokenize(a + s, e - s, &n_opt[n_opts]);
      if (n_opt[n_opts]) n_opts++;
    }
    s = e + 1;
  }
  aici_free(a);
}

static bool has_prefix(uint32_t i, const aici_token_t *gen, uint32_t k) {
  return n_opt[i] >= k && !__builtin_memcmp(gen, opt[i], k * sizeof(aici_token_t));
}

/* Option i's text to variable `name` (with a newline if `line`). */
static void write_option(const char *name, uint32_t i, bool line) {
  uint32_t len;
  uint8_t *text = aici_detokenize(opt[i], n_opt[i], &len);
  uint8_t *out = aici_tmp_alloc(len + 1);
  __builtin_memcpy(out, text, len);
  out[len] = '\n';
  aici_var_set(name, out, len + line);
  aici_free(text);
}

/* Option i's token k onwards: fast-forwarded, or its next token forced by a mask. */
static void continue_option(aici_branch_t *b, uint32_t i, uint32_t k, bool ff) {
  if (ff) {
    aici_branch_splice(b, 0, 0, 0, opt[i] + k, n_opt[i] - k);
  } else {
    aici_tokset_t *m = aici_tokset_tmp();
    aici_tokset_allow(m, opt[i][k]);
    aici_branch_mask(b, m);
  }
}

static void fork_options(aici_result_t *res, bool ff) {
  aici_noop(res);                      /* branch 0: this sequence waits */
  for (uint32_t i = 0; i < n_opts; i++) continue_option(aici_branch(res), i, 0, ff);
  forked = true;
}

static void child(aici_result_t *res, const aici_token_t *gen, uint32_t k, bool ff) {
  if (!has_prefix((uint32_t)mine, gen, k)) aici_fail("choice: the tokens after the prompt are not option %d's", mine);
  if (k < n_opt[mine]) {
    continue_option(aici_branch(res), (uint32_t)mine, k, ff);
    return;
  }
  char name[24];
  var_name(name, (uint32_t)mine);
  write_option(name, (uint32_t)mine, false);
  /* no branch: stop */
}

static void parent(aici_result_t *res) {   /* done when every child has written its variable */
  char name[24];
  uint32_t total = 0, got = 0;
  uint8_t *vals[MAX_OPTS];
  uint32_t lens[MAX_OPTS];
  for (uint32_t i = 0; i < n_opts; i++) {
    var_name(name, i);
    vals[i] = aici_var_get(name, &lens[i]);
    if (vals[i]) got++, total += lens[i] + 1;
  }
  if (got == n_opts) {
    char *all = aici_tmp_alloc(total + 1);
    uint32_t k = 0;
    for (uint32_t i = 0; i < n_opts; i++) {
      __builtin_memcpy(all + k, vals[i], lens[i]);
      k += lens[i];
      all[k++] = '\n';
    }
    aici_var_set("choices", all, k);
  } else if (++waited > MAX_WAIT) {
    aici_logs("choice: gave up waiting for the branches\n");
  } else {
    aici_noop(res);
  }
  for (uint32_t i = 0; i < n_opts; i++) aici_free(vals[i]);
}

/* No fork: the options consistent with what was generated so far give the mask. An option
 * that is complete while a longer one goes on is written now, and EOS allowed to end there. */
static void pick(aici_result_t *res, const aici_token_t *gen, uint32_t k, bool ff) {
  aici_tokset_t *m = aici_tokset_tmp();
  int done = -1, only = -1;
  uint32_t going = 0;
  for (uint32_t i = 0; i < n_opts; i++) {
    if (!has_prefix(i, gen, k)) continue;
    if (n_opt[i] == k) {
      if (done < 0) done = (int)i;
    } else {
      aici_tokset_allow(m, opt[i][k]);
      only = going++ ? -1 : (int)i;    /* the one option still going, if only one is */
    }
  }
  if (done >= 0) write_option("choices", (uint32_t)done, true);
  if (!going) {
    if (done < 0) aici_fail("choice: the tokens after the prompt are no option's");
    return;                            /* no branch: stop */
  }
  if (done < 0 && only >= 0) {
    continue_option(aici_branch(res), (uint32_t)only, k, ff);
    return;
  }
  if (done >= 0) aici_tokset_allow(m, aici_eos_token());
  aici_sample(res, m);
}

void aici_step(const aici_arg_t *arg, aici_result_t *res) {
  uint32_t caps = aici_capabilities();
  bool ff = caps & AICI_CAP_FF_TOKENS;
  if (arg->call_index == 0) {
    parse_options();
    prompt_len = arg->n_all_tokens;
    if (!n_opts) {
      aici_var_set("choices", "", 0);
      return;
    }
    if (caps & AICI_CAP_FORK) {
      fork_options(res, ff);
      return;
    }
  }
  const aici_token_t *gen = arg->all_tokens + prompt_len;
  uint32_t k = arg->n_all_tokens - prompt_len;
  if (!forked) {
    pick(res, gen, k, ff);
    return;
  }
  if (arg->n_fork_group && arg->fork_group[0] != aici_self_seq_id()) {   /* a child's first call */
    uint32_t me = 0;
    while (me < arg->n_fork_group && arg->fork_group[me] != aici_self_seq_id()) me++;
    mine = (int)me - 1;
  }
  if (mine >= 0)
    child(res, gen, k, ff);
  else
    parent(res);
}
