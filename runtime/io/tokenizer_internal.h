/* tokenizer_internal.h: what tokenizer.c and tokenizer_split.c share (not part of the FFI). */
#pragma once
#include <stddef.h>
#include <stdint.h>

/* The code point ranges of \p{L} and \p{N} (tokenizer_unicode.c, generated). */
extern const uint32_t sh_bpe_letter_ranges[][2];
extern const int sh_bpe_letter_ranges_count;
extern const uint32_t sh_bpe_number_ranges[][2];
extern const int sh_bpe_number_ranges_count;

/* The end (exclusive) of the split that starts at byte i of s, i < end: the match of the
 * pre-tokenizer's regex at i within s[0, end) (tokenizer.h spells both regexes). */
size_t sh_bpe_split_gpt2(const uint8_t *s, size_t i, size_t end);
size_t sh_bpe_split_cl100k(const uint8_t *s, size_t i, size_t end);
