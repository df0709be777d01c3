/* tokenizer.h: byte-level BPE (GPT-2's, Llama 3's, tiktoken's gpt2 and cl100k_base), the
 * tokenizer of a Hugging Face model directory's tokenizer.json, built by shard.tokenizer.
 * encode: the text is cut at special tokens (leftmost, then longest), each piece between them is
 * split by the pre-tokenizer's regex (hand-written state machines of the two regexes below; \s is
 * Unicode White_Space, \p{L} and \p{N} come from tokenizer_unicode.c), and each split is merged
 * by BPE, lowest merge rank first, leftmost on ties, as `tokenizers` does (with ignore_merges, a
 * split that is itself a token is taken whole first, as Llama 3's file and tiktoken do).
 *   SH_BPE_SPLIT_GPT2:   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 *   SH_BPE_SPLIT_CL100K: (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
 *                        ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+   (Llama 3, cl100k_base)
 * Invalid UTF-8 bytes are taken one at a time as symbols (neither letter, number nor space), so
 * decode(encode(x)) == x for any bytes. A handle caches the ids of the words it has encoded: use
 * one handle per thread. Errors read "tokenizer: why" (sh_last_error). */
#pragma once
#include <stdint.h>

typedef struct sh_bpe sh_bpe;   /* opaque */

typedef enum sh_bpe_split { SH_BPE_SPLIT_GPT2 = 0, SH_BPE_SPLIT_CL100K = 1 } sh_bpe_split;

/* What encode does with the special tokens' text: cut them out as their ids (ALLOW), encode it
 * as ordinary text (TEXT), or fail naming the token and its byte offset (REFUSE). */
typedef enum sh_bpe_special { SH_BPE_SPECIAL_TEXT = 0, SH_BPE_SPECIAL_ALLOW = 1, SH_BPE_SPECIAL_REFUSE = 2 } sh_bpe_special;

int sh_bpe_create(sh_bpe **out, int split, int ignore_merges);
void sh_bpe_free(sh_bpe *t);   /* NULL is fine */

/* The vocabulary, a token as tokenizer.json spells it: its bytes in GPT-2's byte-level alphabet
 * (bytes_to_unicode: printable bytes as themselves, the others as U+0100 + n). */
int sh_bpe_add_token(sh_bpe *t, const char *mapped, int64_t len, int32_t id);
/* The next merge (its rank is the number added before it): two tokens in the byte-level
 * alphabet, both in the vocabulary, whose concatenation is too. */
int sh_bpe_add_merge(sh_bpe *t, const char *left, int64_t left_len, const char *right, int64_t right_len);
/* A special (added) token: its raw text and id, matched in the text before splitting. */
int sh_bpe_add_special(sh_bpe *t, const char *text, int64_t len, int32_t id);

/* Encodes len bytes of text into ids (capacity >= len always suffices: every id covers at least
 * one byte); *count is the number of ids. */
int sh_bpe_encode(sh_bpe *t, const char *text, int64_t len, int special, int32_t *ids, int64_t capacity,
                  int64_t *count);
/* Decodes n ids into out (capacity >= n * sh_bpe_max_token_bytes suffices); *len is the bytes. */
int sh_bpe_decode(const sh_bpe *t, const int32_t *ids, int64_t n, char *out, int64_t capacity, int64_t *len);

/* Where the pre-tokenizer's split that starts at byte i of text (0 <= i < len) ends, special
 * tokens not considered; -1 for bad arguments. (For tests and tools: encode does this itself.) */
int64_t sh_bpe_split_end(const sh_bpe *t, const char *text, int64_t len, int64_t i);

int32_t sh_bpe_vocab_size(const sh_bpe *t);      /* the largest id plus one */
int64_t sh_bpe_max_token_bytes(const sh_bpe *t);
/* The id of a token given by its raw bytes (a special token's text included), or -1. */
int32_t sh_bpe_token_id(const sh_bpe *t, const char *bytes, int64_t len);
/* The raw bytes of id (*len bytes, not NUL-terminated), or NULL when no token has that id. */
const char *sh_bpe_token_bytes(const sh_bpe *t, int32_t id, int64_t *len);
