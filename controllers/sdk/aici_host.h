/* aici_host.h - internal: the host imports of world `controller`, lowered by the canonical ABI
 * (docs/protocol.md#binary). Controllers use the wrappers in aici.h instead. Results that do not fit one
 * core value come back through a return-area pointer (the last parameter). */
#ifndef AICI_HOST_H
#define AICI_HOST_H
#include <stdint.h>

#define HOST(name) __attribute__((import_module("aici:controller/host@0.1.0"), import_name(name)))

HOST("vocab-size") int32_t aici_h_vocab_size(void);
HOST("eos-token") int32_t aici_h_eos_token(void);
HOST("token-trie") void aici_h_token_trie(int32_t ret);
HOST("tokenize") void aici_h_tokenize(int32_t ptr, int32_t len, int32_t ret);
HOST("detokenize") void aici_h_detokenize(int32_t ptr, int32_t len, int32_t ret);
HOST("arg") void aici_h_arg(int32_t ret);
HOST("self-seq-id") int32_t aici_h_self_seq_id(void);
HOST("capabilities") int32_t aici_h_capabilities(void);
HOST("var-get") void aici_h_var_get(int32_t nptr, int32_t nlen, int32_t ret);
HOST("var-set") void aici_h_var_set(int32_t nptr, int32_t nlen, int32_t vptr, int32_t vlen);
HOST("var-append") void aici_h_var_append(int32_t nptr, int32_t nlen, int32_t vptr, int32_t vlen);
HOST("log") void aici_h_log(int32_t ptr, int32_t len);

#endif
