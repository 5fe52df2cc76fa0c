/* splice: free generation with conditional splices (argument: rules, one per line).
 *   "X => Y Z"  when token X is sampled, keep it and fast-forward the tokens of " Y Z"...
 *   "X -> Y"    when token X is sampled, backtrack it (backtrack 1) and fast-forward Y instead.
 * X must tokenize to a single token; the text after "=>"/"->" is used verbatim (one leading
 * space is dropped). Stops on EOS or after "max N" tokens (a rule line; default 32).
 * A rule is a conditional splice only where the host grants what it uses (conditional
 * ff-tokens, plus ff-tokens for a non-empty Y, plus backtrack for "->"). Else it is applied the
 * step after X was sampled: "=>" fast-forwards Y (ff-tokens) or forces its tokens one a step by
 * masks; "->" backtracks X and fast-forwards Y where backtrack (and ff-tokens) are granted, and
 * otherwise X is masked out (it can never be taken back). A host that takes tokens back itself
 * cancels a rule under way. */
#include "aici.h"

typedef struct { aici_token_t when; uint32_t backtrack; aici_token_t *ff; uint32_t n_ff; } rule_t;
static rule_t rules[32];
static uint32_t n_rules, max_tokens = 32, prompt_len;

static void parse_rules(void) {
  uint32_t n;
  char *a = (char *)aici_arg(&n);
  for (uint32_t s = 0; s < n;) {
    uint32_t e = s;
    while (e < n && a[e] != '\n') e++;
    uint32_t op = s;
    while (op + 1 < e && !((a[op] == '=' || a[op] == '-') && a[op + 1] == '>')) op++;
    if (e - s > 4 && !__builtin_memcmp(a + s, "max ", 4)) {
      max_tokens = 0;
      for (uint32_t i = s + 4; i < e && a[i] >= '0' && a[i] <= '9'; i++) max_tokens = max_tokens * 10 + (a[i] - '0');
    } else if (op + 1 < e && n_rules < 32) {
      uint32_t xe = op;
      while (xe > s && a[xe - 1] == ' ') xe--;  /* "X => Y": X is before the spaces */
      uint32_t ys = op + 2 + (op + 2 < e && a[op + 2] == ' ');
      uint32_t nx;
      aici_token_t *x = aici_tokenize(a + s, xe - s, &nx);
      if (nx != 1) {
        aici_logf("splice: '%.*s' is %u tokens, not one; rule skipped\n", (int)(xe - s), a + s, nx);
      } else {
        rule_t *r = &rules[n_rules++];
        r->when = x[0];
        r->backtrack = a[op] == '-';
        r->ff = aici_tokenize(a + ys, e - ys, &r->n_ff);
      }
      aici_free(x);
    }
    s = e + 1;
  }
  aici_free(a);
}

enum { CONDITIONAL, FOLLOW_UP, DENIED };
static int pending = -1;               /* a rule applied after its X was sampled */
static uint32_t pending_k;             /* its ff tokens forced by masks so far */
static bool forcing;                   /* the last result forced a token (which triggers no rule) */

static int mode(const rule_t *r, uint32_t caps) {
  bool ff = (caps & AICI_CAP_FF_TOKENS) || !r->n_ff;
  bool back = !r->backtrack || (caps & AICI_CAP_BACKTRACK);
  if ((caps & AICI_CAP_CONDITIONAL_FF) && ff && back) return CONDITIONAL;
  if (!r->backtrack) return FOLLOW_UP; /* Y by ff-tokens, or forced by masks */
  return back && ff ? FOLLOW_UP : DENIED;
}

/* The rule under way, if any: true when it produced this step's result. */
static bool follow_up(aici_result_t *res, uint32_t caps) {
  if (pending < 0) return false;
  rule_t *r = &rules[pending];
  if (r->backtrack || (caps & AICI_CAP_FF_TOKENS)) {
    aici_ff(res, r->backtrack, r->ff + pending_k, r->n_ff - pending_k);
    pending = -1;
    return true;
  }
  aici_tokset_t *m = aici_tokset_tmp();
  aici_tokset_allow(m, r->ff[pending_k++]);
  aici_sample(res, m);
  forcing = true;
  if (pending_k == r->n_ff) pending = -1;
  return true;
}

void aici_step(const aici_arg_t *arg, aici_result_t *res) {
  uint32_t caps = aici_capabilities();
  if (arg->call_index == 0) {
    parse_rules();
    prompt_len = arg->n_all_tokens;
  } else if (arg->has_sampled && arg->sampled == aici_eos_token()) {
    return;
  }
  if (arg->backtrack) {
    pending = -1;                      /* the host took tokens back: drop the rule under way */
  } else if (pending < 0 && arg->has_sampled && !forcing) {
    for (uint32_t i = 0; i < n_rules; i++)
      if (rules[i].when == arg->sampled) {
        if (mode(&rules[i], caps) == FOLLOW_UP && (rules[i].n_ff || rules[i].backtrack))
          pending = (int)i, pending_k = 0;
        break;                         /* first match wins, as for splices */
      }
  }
  forcing = false;
  if (arg->n_all_tokens - prompt_len >= max_tokens) return;
  if (follow_up(res, caps)) return;
  aici_tokset_t *all = aici_tokset_tmp();
  aici_tokset_fill(all);
  for (uint32_t i = 0; i < n_rules; i++)
    if (mode(&rules[i], caps) == DENIED) aici_tokset_deny(all, rules[i].when);
  aici_branch_t *b = aici_sample(res, all);
  for (uint32_t i = 0; i < n_rules; i++)
    if (mode(&rules[i], caps) == CONDITIONAL)
      aici_branch_splice(b, &rules[i].when, 1, rules[i].backtrack, rules[i].ff, rules[i].n_ff);
}
