/* tokenizer.c: the byte-level BPE of tokenizer.h: the vocabulary (raw token bytes <-> id, an
 * open-addressing hash), the merges (a hash of (left id, right id) -> rank and merged id), the
 * special tokens, a cache of the ids of words already merged, encode and decode. */
#include "tokenizer.h"
#include "tokenizer_internal.h"
#include "core/status_internal.h"
#include <stdlib.h>
#include <string.h>

#define NO_RANK INT32_MAX
#define MAX_ID (1 << 26)
#define CACHE_SLOTS (1u << 17)        /* power of two */
#define CACHE_WORDS (CACHE_SLOTS / 2) /* cleared when it holds this many words */
#define CACHE_BYTES (1u << 22)
#define CACHE_MAX_WORD 128            /* longer words are merged every time */

typedef struct pair_slot { uint64_t key; int32_t rank, id; } pair_slot;        /* key 0: empty */
typedef struct cache_slot { uint64_t hash; uint32_t off, ids; uint16_t len, n; } cache_slot; /* len 0: empty */

struct sh_bpe {
  int split, ignore_merges;
  char *bytes; int64_t bytes_len, bytes_cap;  /* every token's raw bytes */
  int64_t *off; int32_t *len; uint8_t *kind;  /* by id: where its bytes are; 1 vocabulary, 2 special */
  int32_t id_cap, max_id;
  int32_t *slots; uint32_t slot_mask; int32_t nvocab;   /* vocabulary hash: ids, -1 empty */
  int32_t byte_id[256];
  pair_slot *pairs; uint32_t pair_mask; int32_t npairs;
  int32_t *special; int32_t nspecial, special_cap; uint8_t special_first[256];
  int64_t max_token_bytes;
  int32_t *sym, *rank, *merged; int64_t scratch_cap;    /* the merge loop's work arrays */
  int32_t *next, *prev; uint64_t *heap; int64_t long_cap; /* and those of long words' */
  cache_slot *cache; uint8_t *cache_bytes; int32_t *cache_ids; uint32_t cache_words, cache_used;
};

static uint64_t hash_bytes(const uint8_t *p, size_t n) {
  uint64_t h = 0x9E3779B97F4A7C15ull ^ (n * 0xff51afd7ed558ccdull);
  while (n >= 8) {
    uint64_t w;
    memcpy(&w, p, 8);
    h = (h ^ w) * 0xff51afd7ed558ccdull;
    h ^= h >> 32;
    p += 8;
    n -= 8;
  }
  uint64_t w = 0;
  memcpy(&w, p, n);
  h = (h ^ w) * 0xc4ceb9fe1a85ec53ull;
  return h ^ (h >> 29);
}

static uint64_t hash_pair(uint64_t key) {
  key *= 0x9E3779B97F4A7C15ull;
  return key ^ (key >> 31);
}

/* ---- the byte-level alphabet: GPT-2's bytes_to_unicode, inverted ---- */

static int printable_byte(int b) { return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE); }

/* The byte a code point of the alphabet stands for, or -1. */
static int alphabet_byte(uint32_t cp) {
  if (cp < 256) return printable_byte((int)cp) ? (int)cp : -1;
  if (cp >= 256 + 68) return -1;
  int n = (int)cp - 256;
  for (int b = 0; b < 256; b++)
    if (!printable_byte(b) && n-- == 0) return b;
  return -1;
}

/* Raw bytes of a token spelled in the alphabet (UTF-8 of code points < 324) into out (>= len
 * bytes); returns their count, or -1 if the spelling holds something else. */
static int64_t unmap(const char *mapped, int64_t len, uint8_t *out) {
  const uint8_t *s = (const uint8_t *)mapped;
  int64_t n = 0;
  for (int64_t i = 0; i < len;) {
    uint32_t cp;
    if (s[i] < 0x80) cp = s[i++];
    else if ((s[i] & 0xE0) == 0xC0 && i + 1 < len && (s[i + 1] & 0xC0) == 0x80) {
      cp = ((uint32_t)(s[i] & 0x1F) << 6) | (s[i + 1] & 0x3F);
      i += 2;
    } else return -1;
    int b = alphabet_byte(cp);
    if (b < 0) return -1;
    out[n++] = (uint8_t)b;
  }
  return n;
}

/* ---- the vocabulary ---- */

static const uint8_t *token_at(const sh_bpe *t, int32_t id) { return (const uint8_t *)t->bytes + t->off[id]; }

static int32_t vocab_find(const sh_bpe *t, const uint8_t *p, int64_t n) {
  if (!t->slots) return -1;
  for (uint32_t k = (uint32_t)hash_bytes(p, (size_t)n) & t->slot_mask;; k = (k + 1) & t->slot_mask) {
    int32_t id = t->slots[k];
    if (id < 0) return -1;
    if (t->len[id] == n && memcmp(token_at(t, id), p, (size_t)n) == 0) return id;
  }
}

static void slot_insert(sh_bpe *t, int32_t id) {
  uint32_t k = (uint32_t)hash_bytes(token_at(t, id), (size_t)t->len[id]) & t->slot_mask;
  while (t->slots[k] >= 0) k = (k + 1) & t->slot_mask;
  t->slots[k] = id;
}

static int grow_slots(sh_bpe *t) {
  if (t->slots && (uint32_t)(t->nvocab + 1) * 2 <= t->slot_mask + 1) return SH_OK;
  uint32_t cap = t->slots ? (t->slot_mask + 1) * 2 : 1024;
  int32_t *old = t->slots;
  uint32_t old_cap = old ? t->slot_mask + 1 : 0;
  t->slots = malloc(cap * sizeof *t->slots);
  if (!t->slots) { t->slots = old; return sh_fail(SH_ERR_OOM, "tokenizer: out of memory for the vocabulary"); }
  memset(t->slots, 0xff, cap * sizeof *t->slots);
  t->slot_mask = cap - 1;
  for (uint32_t k = 0; k < old_cap; k++)
    if (old[k] >= 0) slot_insert(t, old[k]);
  free(old);
  return SH_OK;
}

static int grow_ids(sh_bpe *t, int32_t id) {
  if (id < t->id_cap) return SH_OK;
  int32_t cap = t->id_cap ? t->id_cap : 1024;
  while (cap <= id) cap *= 2;
  int64_t *off = realloc(t->off, (size_t)cap * sizeof *off);
  if (off) t->off = off;
  int32_t *len = realloc(t->len, (size_t)cap * sizeof *len);
  if (len) t->len = len;
  uint8_t *kind = realloc(t->kind, (size_t)cap);
  if (kind) t->kind = kind;
  if (!off || !len || !kind) return sh_fail(SH_ERR_OOM, "tokenizer: out of memory for %d ids", cap);
  memset(t->kind + t->id_cap, 0, (size_t)(cap - t->id_cap));
  t->id_cap = cap;
  return SH_OK;
}

static int store_bytes(sh_bpe *t, int32_t id, const uint8_t *p, int64_t n) {
  if (t->bytes_len + n > t->bytes_cap) {
    int64_t cap = t->bytes_cap ? t->bytes_cap : 1 << 16;
    while (cap < t->bytes_len + n) cap *= 2;
    char *b = realloc(t->bytes, (size_t)cap);
    if (!b) return sh_fail(SH_ERR_OOM, "tokenizer: out of memory for the tokens' bytes");
    t->bytes = b;
    t->bytes_cap = cap;
  }
  memcpy(t->bytes + t->bytes_len, p, (size_t)n);
  t->off[id] = t->bytes_len;
  t->len[id] = (int32_t)n;
  t->bytes_len += n;
  if (id > t->max_id) t->max_id = id;
  if (n > t->max_token_bytes) t->max_token_bytes = n;
  return SH_OK;
}

static int check_id(const sh_bpe *t, int32_t id, const char *what, const char *text, int64_t len) {
  if (!t) return sh_fail(SH_ERR_ARG, "tokenizer: NULL handle");
  if (!text && len) return sh_fail(SH_ERR_ARG, "tokenizer: %s id %d: NULL text", what, id);
  if (len <= 0 || len > 1 << 20) return sh_fail(SH_ERR_ARG, "tokenizer: %s id %d: length %lld (1 to 1 MiB)", what, id, (long long)len);
  if (id < 0 || id >= MAX_ID) return sh_fail(SH_ERR_ARG, "tokenizer: %s '%.*s': id %d outside [0, %d)", what, (int)len, text, id, MAX_ID);
  return SH_OK;
}

int sh_bpe_add_token(sh_bpe *t, const char *mapped, int64_t len, int32_t id) {
  SH_TRY(check_id(t, id, "token", mapped, len));
  uint8_t *raw = malloc((size_t)len);
  if (!raw) return sh_fail(SH_ERR_OOM, "tokenizer: out of memory");
  int64_t n = unmap(mapped, len, raw);
  int rc = SH_OK;
  if (n < 0) rc = sh_fail(SH_ERR_ARG, "tokenizer: token '%.*s' (id %d) is not spelled in the byte-level alphabet", (int)len, mapped, id);
  else if (vocab_find(t, raw, n) >= 0)
    rc = sh_fail(SH_ERR_ARG, "tokenizer: token '%.*s' given two ids (%d and %d)", (int)len, mapped, vocab_find(t, raw, n), id);
  else if (!(rc = grow_ids(t, id)) && (t->kind[id] & 1))
    rc = sh_fail(SH_ERR_ARG, "tokenizer: id %d given to two tokens", id);
  if (!rc && !(rc = grow_slots(t)) && !(rc = store_bytes(t, id, raw, n))) {
    t->kind[id] |= 1;
    t->nvocab++;
    slot_insert(t, id);
    if (n == 1) t->byte_id[raw[0]] = id;
  }
  free(raw);
  return rc;
}

/* ---- merges ---- */

static const pair_slot *pair_find(const sh_bpe *t, int32_t a, int32_t b) {
  uint64_t key = ((uint64_t)(uint32_t)(a + 1) << 32) | (uint32_t)(b + 1);
  for (uint32_t k = (uint32_t)hash_pair(key) & t->pair_mask;; k = (k + 1) & t->pair_mask) {
    const pair_slot *s = &t->pairs[k];
    if (s->key == key || s->key == 0) return s;
  }
}

static int grow_pairs(sh_bpe *t) {
  if (t->pairs && (uint32_t)(t->npairs + 1) * 2 <= t->pair_mask + 1) return SH_OK;
  uint32_t cap = t->pairs ? (t->pair_mask + 1) * 2 : 1024, old_cap = t->pairs ? t->pair_mask + 1 : 0;
  pair_slot *old = t->pairs;
  t->pairs = calloc(cap, sizeof *t->pairs);
  if (!t->pairs) { t->pairs = old; return sh_fail(SH_ERR_OOM, "tokenizer: out of memory for the merges"); }
  t->pair_mask = cap - 1;
  for (uint32_t k = 0; k < old_cap; k++) {
    if (!old[k].key) continue;
    uint32_t j = (uint32_t)hash_pair(old[k].key) & t->pair_mask;
    while (t->pairs[j].key) j = (j + 1) & t->pair_mask;
    t->pairs[j] = old[k];
  }
  free(old);
  return SH_OK;
}

static int32_t mapped_id(const sh_bpe *t, const char *mapped, int64_t len, uint8_t *raw, int64_t *n) {
  *n = unmap(mapped, len, raw);
  return *n < 0 ? -1 : vocab_find(t, raw, *n);
}

int sh_bpe_add_merge(sh_bpe *t, const char *left, int64_t left_len, const char *right, int64_t right_len) {
  if (!t || !left || !right || left_len <= 0 || right_len <= 0 || left_len + right_len > 1 << 20)
    return sh_fail(SH_ERR_ARG, "tokenizer: merge %d: empty or NULL side", t ? t->npairs : -1);
  uint8_t *raw = malloc((size_t)(left_len + right_len));
  if (!raw) return sh_fail(SH_ERR_OOM, "tokenizer: out of memory");
  int64_t na, nb;
  int32_t a = mapped_id(t, left, left_len, raw, &na);
  int32_t b = a < 0 ? -1 : mapped_id(t, right, right_len, raw + na, &nb);
  int32_t c = b < 0 ? -1 : vocab_find(t, raw, na + nb);
  free(raw);
  if (c < 0)
    return sh_fail(SH_ERR_ARG, "tokenizer: merge %d ('%.*s' '%.*s'): %s is not in the vocabulary", t->npairs,
                   (int)left_len, left, (int)right_len, right, a < 0 ? "the left token" : b < 0 ? "the right token" : "their concatenation");
  SH_TRY(grow_pairs(t));
  pair_slot *s = (pair_slot *)pair_find(t, a, b);
  if (!s->key) {   /* a repeated merge keeps its first rank */
    s->key = ((uint64_t)(uint32_t)(a + 1) << 32) | (uint32_t)(b + 1);
    s->rank = t->npairs;
    s->id = c;
  }
  t->npairs++;
  return SH_OK;
}

/* ---- special tokens ---- */

int sh_bpe_add_special(sh_bpe *t, const char *text, int64_t len, int32_t id) {
  SH_TRY(check_id(t, id, "special token", text, len));
  SH_TRY(grow_ids(t, id));
  if (t->kind[id] && (t->len[id] != len || memcmp(token_at(t, id), text, (size_t)len) != 0))
    return sh_fail(SH_ERR_ARG, "tokenizer: special token '%.*s' has id %d, which is the token '%.*s'", (int)len, text,
                   id, t->len[id], (const char *)token_at(t, id));
  for (int32_t k = 0; k < t->nspecial; k++)
    if (t->len[t->special[k]] == len && memcmp(token_at(t, t->special[k]), text, (size_t)len) == 0)
      return sh_fail(SH_ERR_ARG, "tokenizer: special token '%.*s' given two ids (%d and %d)", (int)len, text, t->special[k], id);
  if (t->nspecial == t->special_cap) {
    int32_t cap = t->special_cap ? 2 * t->special_cap : 16;
    int32_t *s = realloc(t->special, (size_t)cap * sizeof *s);
    if (!s) return sh_fail(SH_ERR_OOM, "tokenizer: out of memory");
    t->special = s;
    t->special_cap = cap;
  }
  if (!t->kind[id]) SH_TRY(store_bytes(t, id, (const uint8_t *)text, len));
  t->kind[id] |= 2;
  t->special[t->nspecial++] = id;
  t->special_first[(uint8_t)text[0]] = 1;
  return SH_OK;
}

/* The first special token at or after byte i (the longest of those starting there): its index
 * in t->special, and *at its byte offset; -1 if none. */
static int32_t next_special(const sh_bpe *t, const uint8_t *s, int64_t i, int64_t len, int64_t *at) {
  for (; i < len; i++) {
    if (!t->special_first[s[i]]) continue;
    int32_t best = -1;
    for (int32_t k = 0; k < t->nspecial; k++) {
      int32_t id = t->special[k];
      if (t->len[id] <= len - i && (best < 0 || t->len[id] > t->len[t->special[best]]) &&
          memcmp(token_at(t, id), s + i, (size_t)t->len[id]) == 0)
        best = k;
    }
    if (best >= 0) { *at = i; return best; }
  }
  return -1;
}

/* ---- the handle ---- */

int sh_bpe_create(sh_bpe **out, int split, int ignore_merges) {
  if (!out) return sh_fail(SH_ERR_ARG, "tokenizer: NULL output");
  *out = NULL;
  if (split != SH_BPE_SPLIT_GPT2 && split != SH_BPE_SPLIT_CL100K)
    return sh_fail(SH_ERR_ARG, "tokenizer: unknown pre-tokenizer %d (SH_BPE_SPLIT_GPT2 or SH_BPE_SPLIT_CL100K)", split);
  sh_bpe *t = calloc(1, sizeof *t);
  if (!t) return sh_fail(SH_ERR_OOM, "tokenizer: out of memory");
  t->split = split;
  t->ignore_merges = ignore_merges != 0;
  t->max_id = -1;
  for (int b = 0; b < 256; b++) t->byte_id[b] = -1;
  if (grow_pairs(t)) { sh_bpe_free(t); return SH_ERR_OOM; }
  *out = t;
  return SH_OK;
}

void sh_bpe_free(sh_bpe *t) {
  if (!t) return;
  free(t->bytes); free(t->off); free(t->len); free(t->kind); free(t->slots); free(t->pairs); free(t->special);
  free(t->sym); free(t->rank); free(t->merged); free(t->next); free(t->prev); free(t->heap);
  free(t->cache); free(t->cache_bytes); free(t->cache_ids);
  free(t);
}

int32_t sh_bpe_vocab_size(const sh_bpe *t) { return t ? t->max_id + 1 : 0; }
int64_t sh_bpe_max_token_bytes(const sh_bpe *t) { return t ? t->max_token_bytes : 0; }

int32_t sh_bpe_token_id(const sh_bpe *t, const char *bytes, int64_t len) {
  if (!t || !bytes || len <= 0) return -1;
  for (int32_t k = 0; k < t->nspecial; k++) {
    int32_t id = t->special[k];
    if (t->len[id] == len && memcmp(token_at(t, id), bytes, (size_t)len) == 0) return id;
  }
  return vocab_find(t, (const uint8_t *)bytes, len);
}

const char *sh_bpe_token_bytes(const sh_bpe *t, int32_t id, int64_t *len) {
  if (!t || id < 0 || id > t->max_id || !t->kind[id]) return NULL;
  if (len) *len = t->len[id];
  return (const char *)token_at(t, id);
}

/* ---- BPE of one word ---- */

static int grow_scratch(sh_bpe *t, int64_t n) {
  if (n <= t->scratch_cap) return SH_OK;
  int64_t cap = t->scratch_cap ? t->scratch_cap : 256;
  while (cap < n) cap *= 2;
  free(t->sym); free(t->rank); free(t->merged);
  t->sym = malloc((size_t)cap * sizeof(int32_t));
  t->rank = malloc((size_t)cap * sizeof(int32_t));
  t->merged = malloc((size_t)cap * sizeof(int32_t));
  t->scratch_cap = t->sym && t->rank && t->merged ? cap : 0;
  return t->scratch_cap ? SH_OK : sh_fail(SH_ERR_OOM, "tokenizer: out of memory for a word of %lld bytes", (long long)n);
}

static inline void rank_pair(const sh_bpe *t, int64_t k) {
  const pair_slot *s = pair_find(t, t->sym[k], t->sym[k + 1]);
  t->rank[k] = s->key ? s->rank : NO_RANK;
  t->merged[k] = s->id;
}

/* Long words (a run of 100,000 spaces is one) merge through a min-heap of (rank, position of the
 * left symbol) over a linked list of symbols, in O(n log n): an entry is stale when its pair no
 * longer has that rank. The order of merges is the short loop's. */
#define LONG_WORD 256

static int grow_long(sh_bpe *t, int64_t n) {
  if (n <= t->long_cap) return SH_OK;
  free(t->next); free(t->prev); free(t->heap);
  t->next = malloc((size_t)n * sizeof *t->next);
  t->prev = malloc((size_t)n * sizeof *t->prev);
  t->heap = malloc((size_t)n * 3 * sizeof *t->heap);
  t->long_cap = t->next && t->prev && t->heap ? n : 0;
  return t->long_cap ? SH_OK : sh_fail(SH_ERR_OOM, "tokenizer: out of memory for a word of %lld bytes", (long long)n);
}

static void heap_push(uint64_t *h, int64_t *n, uint64_t v) {
  int64_t k = (*n)++;
  while (k > 0 && h[(k - 1) / 2] > v) { h[k] = h[(k - 1) / 2]; k = (k - 1) / 2; }
  h[k] = v;
}

static uint64_t heap_pop(uint64_t *h, int64_t *n) {
  uint64_t top = h[0], v = h[--*n];
  int64_t k = 0;
  for (;;) {
    int64_t c = 2 * k + 1;
    if (c >= *n) break;
    if (c + 1 < *n && h[c + 1] < h[c]) c++;
    if (h[c] >= v) break;
    h[k] = h[c];
    k = c;
  }
  h[k] = v;
  return top;
}

static void push_pair(sh_bpe *t, int64_t *nh, int32_t k) {
  if (k < 0 || t->next[k] < 0) return;
  const pair_slot *s = pair_find(t, t->sym[k], t->sym[t->next[k]]);
  if (s->key) heap_push(t->heap, nh, ((uint64_t)(uint32_t)s->rank << 32) | (uint32_t)k);
}

static int64_t bpe_long(sh_bpe *t, int64_t n) {
  if (grow_long(t, n)) return -1;
  int32_t *sym = t->sym, *next = t->next, *prev = t->prev;
  int64_t nh = 0;
  for (int64_t k = 0; k < n; k++) { next[k] = k + 1 < n ? (int32_t)k + 1 : -1; prev[k] = (int32_t)k - 1; }
  for (int64_t k = 0; k + 1 < n; k++) push_pair(t, &nh, (int32_t)k);
  while (nh) {
    uint64_t e = heap_pop(t->heap, &nh);
    int32_t k = (int32_t)(uint32_t)e, r = (int32_t)(e >> 32), nx = next[k];
    if (sym[k] < 0 || nx < 0) continue;
    const pair_slot *s = pair_find(t, sym[k], sym[nx]);
    if (!s->key || s->rank != r) continue;
    sym[k] = s->id;
    sym[nx] = -1;
    next[k] = next[nx];
    if (next[nx] >= 0) prev[next[nx]] = k;
    push_pair(t, &nh, prev[k]);
    push_pair(t, &nh, k);
  }
  int64_t m = 0;
  for (int32_t k = 0; k >= 0; k = next[k]) sym[m++] = sym[k];
  return m;
}

/* Merges the n bytes of p into t->sym; returns the number of symbols, or -1 (error set). The
 * lowest-ranked adjacent pair is merged first, the leftmost of equal ranks. */
static int64_t bpe_word(sh_bpe *t, const uint8_t *p, int64_t n) {
  if (grow_scratch(t, n)) return -1;
  int32_t *sym = t->sym, *rank = t->rank, *merged = t->merged;
  if (t->ignore_merges && (sym[0] = vocab_find(t, p, n)) >= 0) return 1;
  for (int64_t k = 0; k < n; k++)
    if ((sym[k] = t->byte_id[p[k]]) < 0)
      return sh_fail(SH_ERR_ARG, "tokenizer: the byte 0x%02x has no token in the vocabulary", p[k]), -1;
  if (n > LONG_WORD) return bpe_long(t, n);
  for (int64_t k = 0; k + 1 < n; k++) rank_pair(t, k);
  while (n > 1) {
    int64_t best = -1;
    int32_t r = NO_RANK;
    for (int64_t k = 0; k + 1 < n; k++)
      if (rank[k] < r) { r = rank[k]; best = k; }
    if (best < 0) break;
    sym[best] = merged[best];
    memmove(sym + best + 1, sym + best + 2, (size_t)(n - best - 2) * sizeof *sym);
    memmove(rank + best, rank + best + 1, (size_t)(n - best - 2) * sizeof *rank);
    memmove(merged + best, merged + best + 1, (size_t)(n - best - 2) * sizeof *merged);
    n--;
    if (best + 1 < n) rank_pair(t, best);
    if (best > 0) rank_pair(t, best - 1);
  }
  return n;
}

/* ---- the word cache ---- */

static int cache_init(sh_bpe *t) {
  if (t->cache) return SH_OK;
  t->cache = calloc(CACHE_SLOTS, sizeof *t->cache);
  t->cache_bytes = malloc(CACHE_BYTES);
  t->cache_ids = malloc(CACHE_BYTES * sizeof *t->cache_ids);
  if (t->cache && t->cache_bytes && t->cache_ids) return SH_OK;
  free(t->cache); free(t->cache_bytes); free(t->cache_ids);
  t->cache = NULL;
  return sh_fail(SH_ERR_OOM, "tokenizer: out of memory for the word cache");
}

static cache_slot *cache_find(sh_bpe *t, const uint8_t *p, int64_t n, uint64_t h) {
  for (uint32_t k = (uint32_t)h & (CACHE_SLOTS - 1);; k = (k + 1) & (CACHE_SLOTS - 1)) {
    cache_slot *s = &t->cache[k];
    if (!s->len || (s->hash == h && s->len == n && memcmp(t->cache_bytes + s->off, p, (size_t)n) == 0)) return s;
  }
}

static void cache_put(sh_bpe *t, cache_slot *s, const uint8_t *p, int64_t n, uint64_t h, const int32_t *ids, int64_t m) {
  if (t->cache_words >= CACHE_WORDS || t->cache_used + n > CACHE_BYTES) {   /* full: start over */
    memset(t->cache, 0, CACHE_SLOTS * sizeof *t->cache);
    t->cache_words = t->cache_used = 0;
    s = cache_find(t, p, n, h);
  }
  memcpy(t->cache_bytes + t->cache_used, p, (size_t)n);
  memcpy(t->cache_ids + t->cache_used, ids, (size_t)m * sizeof *ids);
  s->hash = h;
  s->off = s->ids = t->cache_used;
  s->len = (uint16_t)n;
  s->n = (uint16_t)m;
  t->cache_used += (uint32_t)n;
  t->cache_words++;
}

/* ---- encode and decode ---- */

typedef struct out_t { int32_t *ids; int64_t cap, n; } out_t;

static int room(out_t *o, int64_t m) {
  if (o->n + m <= o->cap) return SH_OK;
  return sh_fail(SH_ERR_ARG, "tokenizer: encode: more than the %lld ids of room given (capacity >= the text's bytes suffices)",
                 (long long)o->cap);
}

static int encode_word(sh_bpe *t, const uint8_t *p, int64_t n, out_t *o) {
  if (n == 1 && t->byte_id[p[0]] >= 0) {
    SH_TRY(room(o, 1));
    o->ids[o->n++] = t->byte_id[p[0]];
    return SH_OK;
  }
  cache_slot *s = NULL;
  uint64_t h = 0;
  if (n <= CACHE_MAX_WORD) {
    h = hash_bytes(p, (size_t)n);
    s = cache_find(t, p, n, h);
    if (s->len) {
      SH_TRY(room(o, s->n));
      memcpy(o->ids + o->n, t->cache_ids + s->ids, s->n * sizeof *o->ids);
      o->n += s->n;
      return SH_OK;
    }
  }
  int64_t m = bpe_word(t, p, n);
  if (m < 0) return sh_last_status();
  SH_TRY(room(o, m));
  memcpy(o->ids + o->n, t->sym, (size_t)m * sizeof *o->ids);
  o->n += m;
  if (s) cache_put(t, s, p, n, h, t->sym, m);
  return SH_OK;
}

typedef size_t (*split_fn)(const uint8_t *, size_t, size_t);
static split_fn split_of(const sh_bpe *t) { return t->split == SH_BPE_SPLIT_GPT2 ? sh_bpe_split_gpt2 : sh_bpe_split_cl100k; }

int64_t sh_bpe_split_end(const sh_bpe *t, const char *text, int64_t len, int64_t i) {
  if (!t || !text || i < 0 || i >= len) return -1;
  return (int64_t)split_of(t)((const uint8_t *)text, (size_t)i, (size_t)len);
}

static int encode_piece(sh_bpe *t, const uint8_t *s, int64_t begin, int64_t end, out_t *o) {
  split_fn split = split_of(t);
  for (int64_t i = begin; i < end;) {
    int64_t j = (int64_t)split(s, (size_t)i, (size_t)end);
    SH_TRY(encode_word(t, s + i, j - i, o));
    i = j;
  }
  return SH_OK;
}

int sh_bpe_encode(sh_bpe *t, const char *text, int64_t len, int special, int32_t *ids, int64_t capacity, int64_t *count) {
  if (count) *count = 0;
  if (!t || !count || (!text && len) || len < 0 || (!ids && capacity) || capacity < 0)
    return sh_fail(SH_ERR_ARG, "tokenizer: encode: NULL or negative argument");
  if (special < SH_BPE_SPECIAL_TEXT || special > SH_BPE_SPECIAL_REFUSE)
    return sh_fail(SH_ERR_ARG, "tokenizer: encode: unknown special mode %d (TEXT 0, ALLOW 1, REFUSE 2)", special);
  SH_TRY(cache_init(t));
  const uint8_t *s = (const uint8_t *)text;
  out_t o = { ids, capacity, 0 };
  for (int64_t i = 0; i < len;) {
    int64_t at = len;
    int32_t k = special == SH_BPE_SPECIAL_TEXT || !t->nspecial ? -1 : next_special(t, s, i, len, &at);
    if (k >= 0 && special == SH_BPE_SPECIAL_REFUSE) {
      int32_t id = t->special[k];
      return sh_fail(SH_ERR_ARG, "tokenizer: encode: the text holds the special token '%.*s' at byte %lld, and special "
                     "tokens are refused (allow them, or encode them as text)", t->len[id], (const char *)token_at(t, id), (long long)at);
    }
    SH_TRY(encode_piece(t, s, i, at, &o));
    i = at;
    if (k >= 0) {
      SH_TRY(room(&o, 1));
      o.ids[o.n++] = t->special[k];
      i += t->len[t->special[k]];
    }
  }
  *count = o.n;
  return SH_OK;
}

int sh_bpe_decode(const sh_bpe *t, const int32_t *ids, int64_t n, char *out, int64_t capacity, int64_t *len) {
  if (len) *len = 0;
  if (!t || !len || (!ids && n) || n < 0 || (!out && capacity) || capacity < 0)
    return sh_fail(SH_ERR_ARG, "tokenizer: decode: NULL or negative argument");
  int64_t m = 0;
  for (int64_t k = 0; k < n; k++) {
    int32_t id = ids[k];
    if (id < 0 || id > t->max_id || !t->kind[id])
      return sh_fail(SH_ERR_ARG, "tokenizer: decode: id %d (at %lld) is no token (vocabulary size %d)", id, (long long)k, t->max_id + 1);
    if (m + t->len[id] > capacity)
      return sh_fail(SH_ERR_ARG, "tokenizer: decode: more than the %lld bytes of room given", (long long)capacity);
    memcpy(out + m, token_at(t, id), (size_t)t->len[id]);
    m += t->len[id];
  }
  *len = m;
  return SH_OK;
}
