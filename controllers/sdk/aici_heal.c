/* aici_heal.c - forced text as the tokenizer would write it (token healing): the last token and
 * the forced bytes tokenized together, so the split is canonical, and each token of the result
 * checked against the text (a tokenizer may normalize). The json and program controllers'
 * fast-forwards share it. */
#include "aici.h"

bool aici_heal_tokenize(aici_heal_t *h, const aici_token_t *last, const uint8_t *forced, uint32_t n) {
  h->plen = 0, h->joined = false, h->toks = 0, h->nt = 0;
  if (n > 256) n = 256;
  if (last) {
    uint32_t plen, whole;
    const uint8_t *lb = aici_token_bytes(*last, &plen);
    if (lb && plen <= 256 && aici_utf8_whole(lb, plen, &whole)) {
      __builtin_memcpy(h->text, lb, plen);
      h->plen = plen, h->joined = true;
    }
  }
  __builtin_memcpy(h->text + h->plen, forced, n);
  h->len = h->plen + n;
  h->toks = aici_tokenize((const char *)h->text, h->len, &h->nt);
  return h->toks != 0;
}

bool aici_heal_token_at(const aici_heal_t *h, aici_token_t t, uint32_t *pos, const uint8_t **bytes, uint32_t *len) {
  const uint8_t *b = aici_token_bytes(t, len);
  bool ok = b && *pos + *len <= h->len && !__builtin_memcmp(b, h->text + *pos, *len);
  *pos += *len;
  *bytes = b;
  return ok;
}
