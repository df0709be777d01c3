/* test_tokenizer: the BPE of runtime/io/tokenizer.h built by hand: words of every length (the
 * long-word heap path beyond 256 bytes included) against a naive BPE written here, special
 * tokens, and the errors. tests/spec/tokenizer_spec.lua checks real tokenizer.json files against
 * Hugging Face tokenizers. */
#include "check.h"
#include "core/status.h"
#include "io/tokenizer.h"
#include <stdlib.h>

/* GPT-2's bytes_to_unicode: the spelling of byte b in UTF-8 (1 or 2 bytes) into out. */
static int spell_byte(int b, char *out) {
  int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
  int cp = b;
  if (!printable) {
    cp = 256;
    for (int c = 0; c < b; c++)
      if (!((c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || c >= 0xAE)) cp++;
  }
  if (cp < 0x80) { out[0] = (char)cp; return 1; }
  out[0] = (char)(0xC0 | (cp >> 6));
  out[1] = (char)(0x80 | (cp & 0x3F));
  return 2;
}

static int spell(const char *raw, int n, char *out) {
  int m = 0;
  for (int k = 0; k < n; k++) m += spell_byte((uint8_t)raw[k], out + m);
  return m;
}

/* Tokens over {a, b} beyond the bytes (ids 256...), each merge making the next. */
static const char *MERGES[][2] = { { "a", "b" }, { "b", "a" }, { "a", "a" }, { "ab", "ab" }, { "b", "b" },
                                   { "aa", "b" }, { "ba", "ab" }, { "ab", "a" }, { "abab", "abab" }, { "bb", "a" } };
#define NMERGES (int)(sizeof MERGES / sizeof MERGES[0])

static sh_bpe *build(int split) {
  sh_bpe *t = NULL;
  char buf[64], raw[2];
  if (sh_bpe_create(&t, split, 0)) return NULL;
  for (int b = 0; b < 256; b++) {
    raw[0] = (char)b;
    if (sh_bpe_add_token(t, buf, spell(raw, 1, buf), b)) return NULL;
  }
  for (int k = 0; k < NMERGES; k++) {
    char joined[32];
    snprintf(joined, sizeof joined, "%s%s", MERGES[k][0], MERGES[k][1]);
    if (sh_bpe_add_token(t, joined, (int64_t)strlen(joined), 256 + k)) return NULL;
  }
  for (int k = 0; k < NMERGES; k++)
    if (sh_bpe_add_merge(t, MERGES[k][0], (int64_t)strlen(MERGES[k][0]), MERGES[k][1], (int64_t)strlen(MERGES[k][1]))) return NULL;
  if (sh_bpe_add_special(t, "<eos>", 5, 300)) return NULL;
  return t;
}

/* The naive BPE: the token text of each symbol, the lowest-ranked adjacent pair merged first,
 * the leftmost of equal ranks. Returns the number of ids. */
static int naive(const char *word, int n, int32_t *ids) {
  static char sym[1024][32];
  int m = n;
  for (int k = 0; k < n; k++) { sym[k][0] = word[k]; sym[k][1] = 0; }
  for (;;) {
    int best = -1, rank = NMERGES;
    for (int k = 0; k + 1 < m; k++)
      for (int r = 0; r < rank; r++)
        if (!strcmp(sym[k], MERGES[r][0]) && !strcmp(sym[k + 1], MERGES[r][1])) { best = k; rank = r; break; }
    if (best < 0) break;
    size_t la = strlen(sym[best]), lb = strlen(sym[best + 1]);
    memcpy(sym[best] + la, sym[best + 1], lb + 1);
    memmove(sym[best + 1], sym[best + 2], (size_t)(m - best - 2) * sizeof sym[0]);
    m--;
  }
  for (int k = 0; k < m; k++) {
    ids[k] = (uint8_t)sym[k][0];
    for (int r = 0; r < NMERGES && sym[k][1]; r++) {
      char joined[32];
      snprintf(joined, sizeof joined, "%s%s", MERGES[r][0], MERGES[r][1]);
      if (!strcmp(joined, sym[k])) ids[k] = 256 + r;
    }
  }
  return m;
}

static void test_words_against_naive(void) {
  sh_bpe *t = build(SH_BPE_SPLIT_GPT2);
  CHECK(t != NULL, "build: %s", sh_last_error());
  if (!t) return;
  static char word[1000];
  static int32_t got[1000], want[1000];
  char back[1000];
  unsigned seed = 12345;
  int bad = 0;
  for (int trial = 0; trial < 400; trial++) {
    int n = 1 + trial * 2 % 997;
    for (int k = 0; k < n; k++) { seed = seed * 1103515245u + 12345u; word[k] = (seed >> 16) % 3 ? 'a' : 'b'; }
    int64_t count = 0, len = 0;
    CHECK_OK(sh_bpe_encode(t, word, n, SH_BPE_SPECIAL_ALLOW, got, n, &count));
    int m = naive(word, n, want);
    if (count != m || memcmp(got, want, (size_t)m * sizeof *got)) bad++;
    CHECK_OK(sh_bpe_decode(t, got, count, back, sizeof back, &len));
    if (len != n || memcmp(back, word, (size_t)n)) bad++;
  }
  CHECK(bad == 0, "%d of 400 words differ from the naive BPE or do not round-trip", bad);
  sh_bpe_free(t);
}

static void test_special_and_errors(void) {
  sh_bpe *t = build(SH_BPE_SPLIT_CL100K);
  if (!t) { CHECK(0, "build: %s", sh_last_error()); return; }
  int32_t ids[64];
  int64_t n = 0;
  CHECK_OK(sh_bpe_encode(t, "ab<eos>ba", 9, SH_BPE_SPECIAL_ALLOW, ids, 64, &n));
  CHECK(n == 3 && ids[0] == 256 && ids[1] == 300 && ids[2] == 257, "ab<eos>ba: %lld ids", (long long)n);
  CHECK_OK(sh_bpe_encode(t, "ab<eos>ba", 9, SH_BPE_SPECIAL_TEXT, ids, 64, &n));
  CHECK(n > 3, "<eos> as text: %lld ids", (long long)n);
  CHECK_FAILS(sh_bpe_encode(t, "ab<eos>", 7, SH_BPE_SPECIAL_REFUSE, ids, 64, &n), SH_ERR_ARG, "special token '<eos>' at byte 2");
  CHECK_FAILS(sh_bpe_encode(t, "a b c d", 7, SH_BPE_SPECIAL_ALLOW, ids, 2, &n), SH_ERR_ARG, "ids of room");
  CHECK_FAILS(sh_bpe_encode(t, "a", 1, 7, ids, 2, &n), SH_ERR_ARG, "unknown special mode 7");
  int32_t bad_ids[2] = { 1, 999 };
  char out[64];
  CHECK_FAILS(sh_bpe_decode(t, bad_ids, 2, out, 64, &n), SH_ERR_ARG, "id 999 (at 1) is no token");
  CHECK_FAILS(sh_bpe_add_merge(t, "a", 1, "zz", 2), SH_ERR_ARG, "the right token is not in the vocabulary");
  CHECK_FAILS(sh_bpe_add_merge(t, "bb", 2, "b", 1), SH_ERR_ARG, "their concatenation is not in the vocabulary");
  CHECK_FAILS(sh_bpe_add_token(t, "a", 1, 400), SH_ERR_ARG, "given two ids");
  CHECK_FAILS(sh_bpe_add_token(t, "\x01", 1, 401), SH_ERR_ARG, "not spelled in the byte-level alphabet");
  CHECK(sh_bpe_token_id(t, "<eos>", 5) == 300 && sh_bpe_token_id(t, "abab", 4) == 259 && sh_bpe_token_id(t, "zzz", 3) == -1,
        "token_id");
  CHECK(sh_bpe_vocab_size(t) == 301, "vocab size %d", sh_bpe_vocab_size(t));
  sh_bpe_free(t);
  sh_bpe *u = NULL;
  CHECK_FAILS(sh_bpe_create(&u, 9, 0), SH_ERR_ARG, "unknown pre-tokenizer 9");
  CHECK_OK(sh_bpe_create(&u, SH_BPE_SPLIT_GPT2, 0));
  CHECK_FAILS(sh_bpe_encode(u, "x", 1, SH_BPE_SPECIAL_ALLOW, ids, 64, &n), SH_ERR_ARG, "byte 0x78 has no token");
  sh_bpe_free(u);
}

/* Texts glued from fragments (scripts, invalid UTF-8, whitespace, digits, contractions, the
 * special token): every split advances and stays inside the text, and decode(encode(x)) == x. */
static void test_random_texts_round_trip(void) {
  static const char *frag[] = { "a", "b", "ab", " ", "  ", "\n", "\r\n", "\t", "'s", "'LL", "\xc3\xa9", "\xe4\xb8\x96",
                                "\xf0\x9f\x98\x80", "\xff", "\xc3", "\xed\xa0\x80", "1", "12345", "!", "?!", "<eos>",
                                "<eo", "\xe2\x80\x83", "\xc2\xa0", "\xd9\xa1", "e\xcc\x81" };
  int nfrag = (int)(sizeof frag / sizeof frag[0]), bad = 0;
  static char text[4096], back[4096 * 8];
  static int32_t ids[4096];
  unsigned seed = 7;
  for (int split = SH_BPE_SPLIT_GPT2; split <= SH_BPE_SPLIT_CL100K; split++) {
    sh_bpe *t = build(split);
    if (!t) { CHECK(0, "build: %s", sh_last_error()); return; }
    for (int trial = 0; trial < 3000; trial++) {
      int n = 0, parts = trial % 97;
      for (int k = 0; k < parts; k++) {
        seed = seed * 1103515245u + 12345u;
        const char *f = frag[(seed >> 16) % (unsigned)nfrag];
        int reps = 1 + (int)((seed >> 8) % 4);
        for (int r = 0; r < reps && n + 8 < (int)sizeof text; r++) { memcpy(text + n, f, strlen(f)); n += (int)strlen(f); }
      }
      for (int64_t i = 0; i < n;) {
        int64_t j = sh_bpe_split_end(t, text, n, i);
        if (j <= i || j > n) { bad++; break; }
        i = j;
      }
      int64_t count = 0, len = 0;
      int mode = trial % 2 ? SH_BPE_SPECIAL_ALLOW : SH_BPE_SPECIAL_TEXT;
      if (sh_bpe_encode(t, text, n, mode, ids, n, &count) || sh_bpe_decode(t, ids, count, back, sizeof back, &len) ||
          len != n || memcmp(back, text, (size_t)n))
        bad++;
    }
    sh_bpe_free(t);
  }
  CHECK(bad == 0, "%d of 6000 texts failed to split, encode or round-trip", bad);
}

/* A pair whose rank changes after it was queued: with merges bc, ab, bcd, abc, "abcd" is
 * a + bcd (ab's rank is stale once bc merged), in the short loop and in the long words' heap. */
static void test_stale_pairs(void) {
  static const char *tokens[] = { "bc", "ab", "bcd", "abc" }, *merges[][2] = { { "b", "c" }, { "a", "b" }, { "bc", "d" }, { "a", "bc" } };
  sh_bpe *t = NULL;
  char buf[8], raw[2] = { 0, 0 };
  CHECK_OK(sh_bpe_create(&t, SH_BPE_SPLIT_GPT2, 0));
  for (int b = 0; b < 256; b++) { raw[0] = (char)b; CHECK_OK(sh_bpe_add_token(t, buf, spell(raw, 1, buf), b)); }
  for (int k = 0; k < 4; k++) CHECK_OK(sh_bpe_add_token(t, tokens[k], (int64_t)strlen(tokens[k]), 256 + k));
  for (int k = 0; k < 4; k++) CHECK_OK(sh_bpe_add_merge(t, merges[k][0], (int64_t)strlen(merges[k][0]), merges[k][1], (int64_t)strlen(merges[k][1])));
  static char text[400];
  static int32_t ids[400];
  for (int reps = 1; reps <= 100; reps += 99) {
    for (int k = 0; k < reps; k++) memcpy(text + 4 * k, "abcd", 4);
    int64_t n = 0, good = 1;
    CHECK_OK(sh_bpe_encode(t, text, 4 * reps, SH_BPE_SPECIAL_ALLOW, ids, 400, &n));
    for (int k = 0; k < reps; k++) good &= ids[2 * k] == 'a' && ids[2 * k + 1] == 258;
    CHECK(n == 2 * reps && good, "abcd x %d: %lld ids, the first %d %d", reps, (long long)n, ids[0], ids[1]);
  }
  sh_bpe_free(t);
}

int main(int argc, char **argv) {
  check_args(argc, argv);
  RUN(test_stale_pairs);
  RUN(test_random_texts_round_trip);
  RUN(test_words_against_naive);
  RUN(test_special_and_errors);
  return check_summary("test_tokenizer");
}
