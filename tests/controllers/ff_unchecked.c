/* ff_unchecked: fast-forwards " ok" three times, then stops, without asking capabilities():
 * the mistake the fuzzer exists to catch (a host that does not grant ff-tokens refuses it).
 * The shipped controllers check; tests/test_fuzz.py needs one that does not. */
#include "aici.h"

void aici_step(const aici_arg_t *arg, aici_result_t *res) {
  if (arg->call_index == 3) return;
  uint32_t n;
  aici_token_t *t = aici_tokenize_str(" ok", &n);
  aici_ff(res, 0, t, n);
  aici_free(t);
}
