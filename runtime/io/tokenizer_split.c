/* tokenizer_split.c: the two pre-tokenizer regexes of tokenizer.h as state machines over code
 * points. Each alternative is tried in the regex's order at the split's first code point, and
 * the lookahead of \s+(?!\S) becomes "the whitespace run minus its last code point, unless the
 * run reaches the end of the piece or is one code point long". */
#include "tokenizer_internal.h"

enum { OTHER = 0, LETTER = 1, NUMBER = 2, SPACE = 3 };

typedef struct cp_t { uint32_t cp; uint32_t len; int cls; } cp_t;

/* Classes of the ASCII range: \s is \t \n \v \f \r and space. */
static const uint8_t ascii_class[128] = {
  0,0,0,0,0,0,0,0,0,3,3,3,3,3,0,0, 0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,
  3,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0, 2,2,2,2,2,2,2,2,2,2,0,0,0,0,0,0,
  0,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1, 1,1,1,1,1,1,1,1,1,1,1,0,0,0,0,0,
  0,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1, 1,1,1,1,1,1,1,1,1,1,1,0,0,0,0,0,
};

static int in_ranges(uint32_t cp, const uint32_t (*r)[2], int n) {
  int lo = 0, hi = n - 1;
  while (lo <= hi) {
    int mid = (lo + hi) >> 1;
    if (cp < r[mid][0]) hi = mid - 1;
    else if (cp > r[mid][1]) lo = mid + 1;
    else return 1;
  }
  return 0;
}

/* Unicode White_Space beyond ASCII (what \s matches in Oniguruma and Rust's regex). */
static int is_unicode_space(uint32_t cp) {
  return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 ||
         cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

static int class_of(uint32_t cp) {
  if (is_unicode_space(cp)) return SPACE;
  if (in_ranges(cp, sh_bpe_letter_ranges, sh_bpe_letter_ranges_count)) return LETTER;
  if (in_ranges(cp, sh_bpe_number_ranges, sh_bpe_number_ranges_count)) return NUMBER;
  return OTHER;
}

/* The multi-byte code point at s[i] (s[i] >= 0x80); an invalid or truncated sequence is its
 * first byte alone, of class OTHER. */
static cp_t decode_multi(const uint8_t *s, size_t i, size_t end) {
  cp_t bad = { 0xFFFFFFFFu, 1, OTHER };
  uint8_t b = s[i];
  uint32_t n, cp, min;
  if (b >= 0xC2 && b <= 0xDF) { n = 2; cp = b & 0x1F; min = 0x80; }
  else if (b >= 0xE0 && b <= 0xEF) { n = 3; cp = b & 0x0F; min = 0x800; }
  else if (b >= 0xF0 && b <= 0xF4) { n = 4; cp = b & 0x07; min = 0x10000; }
  else return bad;
  if (i + n > end) return bad;
  for (uint32_t k = 1; k < n; k++) {
    if ((s[i + k] & 0xC0) != 0x80) return bad;
    cp = (cp << 6) | (s[i + k] & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return bad;
  cp_t r = { cp, n, class_of(cp) };
  return r;
}

static inline cp_t at(const uint8_t *s, size_t i, size_t end) {
  if (s[i] < 0x80) { cp_t r = { s[i], 1, ascii_class[s[i]] }; return r; }
  return decode_multi(s, i, end);
}

/* The end of the run of code points of class cls starting at i. */
static inline size_t run(const uint8_t *s, size_t i, size_t end, int cls) {
  while (i < end) {
    if (s[i] < 0x80) {
      if (ascii_class[s[i]] != cls) break;
      i++;
    } else {
      cp_t c = decode_multi(s, i, end);
      if (c.cls != cls) break;
      i += c.len;
    }
  }
  return i;
}

/* After an apostrophe at p - 1: the length of s|t|re|ve|m|ll|d there (case-folded when fold,
 * where U+017F LONG S folds to s), or 0. */
static size_t contraction(const uint8_t *s, size_t p, size_t end, int fold) {
  if (p >= end) return 0;
  int c = s[p];
  if (fold && c >= 'A' && c <= 'Z') c += 32;
  if (c == 's' || c == 't' || c == 'm' || c == 'd') return 1;
  if (fold && c == 0xC5 && p + 1 < end && s[p + 1] == 0xBF) return 2;
  if (p + 1 >= end) return 0;
  int c2 = s[p + 1];
  if (fold && c2 >= 'A' && c2 <= 'Z') c2 += 32;
  if ((c == 'r' || c == 'v') && c2 == 'e') return 2;
  if (c == 'l' && c2 == 'l') return 2;
  return 0;
}

/* \s+(?!\S)|\s+ at i (a whitespace code point); with newlines, \s*[\r\n]+ first: the run up to
 * and including its last \r or \n. */
static size_t space_run(const uint8_t *s, size_t i, size_t end, int newlines) {
  size_t j = i, last = i, nl = (size_t)-1;
  while (j < end) {
    cp_t d = at(s, j, end);
    if (d.cls != SPACE) break;
    if (d.cp == '\r' || d.cp == '\n') nl = j;
    last = j;
    j += d.len;
  }
  if (newlines && nl != (size_t)-1) return nl + 1;
  if (j == end || last == i) return j;
  return last;
}

size_t sh_bpe_split_gpt2(const uint8_t *s, size_t i, size_t end) {
  cp_t c = at(s, i, end);
  if (c.cp == '\'') {
    size_t k = contraction(s, i + 1, end, 0);
    if (k) return i + 1 + k;
  }
  if (c.cls != SPACE) return run(s, i + c.len, end, c.cls);
  if (c.cp == ' ' && i + 1 < end) {
    cp_t d = at(s, i + 1, end);
    if (d.cls != SPACE) return run(s, i + 1 + d.len, end, d.cls);
  }
  return space_run(s, i, end, 0);
}

/* [\r\n]* after a run of symbols. */
static size_t newlines_after(const uint8_t *s, size_t i, size_t end) {
  while (i < end && (s[i] == '\r' || s[i] == '\n')) i++;
  return i;
}

size_t sh_bpe_split_cl100k(const uint8_t *s, size_t i, size_t end) {
  cp_t c = at(s, i, end);
  if (c.cp == '\'') {
    size_t k = contraction(s, i + 1, end, 1);
    if (k) return i + 1 + k;
  }
  if (c.cls == LETTER) return run(s, i + c.len, end, LETTER);
  if (c.cls != NUMBER && c.cp != '\r' && c.cp != '\n' && i + c.len < end) {
    cp_t d = at(s, i + c.len, end);
    if (d.cls == LETTER) return run(s, i + c.len + d.len, end, LETTER);
  }
  if (c.cls == NUMBER) {
    size_t j = i + c.len;
    for (int k = 1; k < 3 && j < end; k++) {
      cp_t d = at(s, j, end);
      if (d.cls != NUMBER) break;
      j += d.len;
    }
    return j;
  }
  if (c.cls == OTHER) return newlines_after(s, run(s, i + c.len, end, OTHER), end);
  if (c.cp == ' ' && i + 1 < end) {
    cp_t d = at(s, i + 1, end);
    if (d.cls == OTHER) return newlines_after(s, run(s, i + 1 + d.len, end, OTHER), end);
  }
  return space_run(s, i, end, 1);
}
