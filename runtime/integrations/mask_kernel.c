/* Masking float32 logits rows in place: -inf wherever a mask bit is clear (aicirt.integrations.torch_masks).
 *
 * masks are uint32 words, xgrammar's/AICI's bit layout (bit t of the mask is bit t % 32 of word t / 32);
 * a token at or past 32 * words (a vocabulary padded past the tokenizer's) is masked too. A word of
 * all ones leaves its 32 logits untouched; any other is applied by a branch-free select over its 32
 * lanes that compilers turn into vector code (compare, and, or), so a row costs about one pass
 * over its logits, with no bias row to read. */
#include <stdint.h>

#define NEG_INF_BITS 0xFF800000u   /* float32 -inf */

static const uint32_t BIT[32] = {1u << 0, 1u << 1, 1u << 2, 1u << 3, 1u << 4, 1u << 5, 1u << 6, 1u << 7, 1u << 8, 1u << 9, 1u << 10, 1u << 11, 1u << 12, 1u << 13, 1u << 14, 1u << 15, 1u << 16, 1u << 17, 1u << 18, 1u << 19, 1u << 20, 1u << 21, 1u << 22, 1u << 23, 1u << 24, 1u << 25, 1u << 26, 1u << 27, 1u << 28, 1u << 29, 1u << 30, 1u << 31};

static void mask_row(uint32_t *x, const uint32_t *m, int64_t words, int64_t width) {
    int64_t full = width / 32 < words ? width / 32 : words;
    for (int64_t i = 0; i < full; i++) {
        uint32_t w = m[i], *y = x + 32 * i;
        if (w == 0xFFFFFFFFu) continue;
        for (int j = 0; j < 32; j++) {
            uint32_t off = (uint32_t)0 - (uint32_t)((w & BIT[j]) == 0u);   /* all ones where disallowed */
            y[j] = (y[j] & ~off) | (NEG_INF_BITS & off);
        }
    }
    for (int64_t t = 32 * full; t < width; t++) {   /* the tail: a partial word, then past the mask */
        if (t / 32 >= words || !(m[t / 32] & BIT[t % 32])) x[t] = NEG_INF_BITS;
    }
}

/* logits[rows[k] * row_stride .. + width) masked by masks[k * words .. + words), for k < n. */
void aicirt_mask_rows_f32(float *logits, int64_t row_stride, const int64_t *rows, int64_t n,
                          const uint32_t *masks, int64_t words, int64_t width) {
    for (int64_t k = 0; k < n; k++)
        mask_row((uint32_t *)(logits + rows[k] * row_stride), masks + k * words, words, width);
}
