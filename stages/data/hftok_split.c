/* The two pre-tokenizer regexes of Hugging Face byte-level BPEs (hftok_int.h), written out as
 * scanners over UTF-8 with the Unicode classes of unicode_tab.c: no regex engine. Each returns
 * the length of the next pre-token, as Oniguruma's leftmost-first alternation would match it. */
#include "stages/data/hftok_int.h"

size_t hf_utf8(const uint8_t *p, size_t n, uint32_t *cp)
{
    uint8_t b = p[0];
    *cp = 0x110000;
    if (b < 0x80) {
        *cp = b;
        return 1;
    }
    size_t len;
    uint32_t c, lo = 0x80, hi = 0xBF;
    if (b >= 0xC2 && b <= 0xDF) len = 2, c = b & 0x1F;
    else if (b >= 0xE0 && b <= 0xEF) len = 3, c = b & 0x0F;
    else if (b >= 0xF0 && b <= 0xF4) len = 4, c = b & 0x07;
    else return 1;
    if (b == 0xE0) lo = 0xA0;
    else if (b == 0xED) hi = 0x9F; /* no surrogates */
    else if (b == 0xF0) lo = 0x90;
    else if (b == 0xF4) hi = 0x8F; /* nothing past U+10FFFF */
    if (n < len || p[1] < lo || p[1] > hi) return 1;
    c = c << 6 | (p[1] & 0x3F);
    for (size_t i = 2; i < len; i++) {
        if (p[i] < 0x80 || p[i] > 0xBF) return 1;
        c = c << 6 | (p[i] & 0x3F);
    }
    *cp = c;
    return len;
}

typedef struct {
    size_t len;
    uint32_t cp;
    int cls;
} ch_t;

static inline ch_t ch_at(const uint8_t *p, size_t n, size_t i)
{
    ch_t c;
    if (p[i] < 0x80) {
        c.len = 1;
        c.cp = p[i];
    } else {
        c.len = hf_utf8(p + i, n - i, &c.cp);
    }
    c.cls = uni_class(c.cp);
    return c;
}

/* End of the run of class cls that starts at i. */
static size_t run_end(const uint8_t *p, size_t n, size_t i, int cls)
{
    while (i < n) {
        ch_t c = ch_at(p, n, i);
        if (c.cls != cls) break;
        i += c.len;
    }
    return i;
}

static inline uint8_t lower_if(uint8_t c, int ci) { return ci && c >= 'A' && c <= 'Z' ? c + 32 : c; }

/* After an apostrophe: the length of s, t, re, ve, m, ll or d, or 0. Case-insensitive (ci)
 * as Oniguruma folds: also U+017F (long s) for s. */
static size_t contraction(const uint8_t *p, size_t n, int ci)
{
    if (!n) return 0;
    if (ci && n >= 2 && p[0] == 0xC5 && p[1] == 0xBF) return 2;
    uint8_t a = lower_if(p[0], ci);
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return 1;
    if (n < 2) return 0;
    uint8_t b = lower_if(p[1], ci);
    if (((a == 'r' || a == 'v') && b == 'e') || (a == 'l' && b == 'l')) return 2;
    return 0;
}

/* A pre-token starting with whitespace: with nl, \s*[\r\n]+ first (up to the run's last CR
 * or LF); then \s+(?!\S), which leaves the last space of a run to what follows; then \s+. */
static size_t space_run(const uint8_t *p, size_t n, int nl)
{
    size_t i = 0, last_nl = 0, count = 0, last_len = 0;
    while (i < n) {
        ch_t c = ch_at(p, n, i);
        if (c.cls != UNI_SPACE) break;
        i += c.len;
        count++;
        last_len = c.len;
        if (c.cp == '\r' || c.cp == '\n') last_nl = i;
    }
    if (nl && last_nl) return last_nl;
    if (i == n || count < 2) return i;
    return i - last_len;
}

size_t hf_split_llama3(const uint8_t *p, size_t n)
{
    if (p[0] == '\'') {
        size_t k = contraction(p + 1, n - 1, 1);
        if (k) return 1 + k;
    }
    ch_t c = ch_at(p, n, 0);
    if (c.cls == UNI_LETTER) return run_end(p, n, c.len, UNI_LETTER);
    if (c.cls != UNI_NUMBER && c.cp != '\r' && c.cp != '\n' && c.len < n) {
        ch_t d = ch_at(p, n, c.len);
        if (d.cls == UNI_LETTER) return run_end(p, n, c.len + d.len, UNI_LETTER);
    }
    if (c.cls == UNI_NUMBER) {
        size_t i = c.len;
        for (int k = 1; k < 3 && i < n; k++) {
            ch_t d = ch_at(p, n, i);
            if (d.cls != UNI_NUMBER) break;
            i += d.len;
        }
        return i;
    }
    size_t i = 0;
    if (p[0] == ' ' && n > 1 && ch_at(p, n, 1).cls == UNI_OTHER) i = 1;
    if (i == 1 || c.cls == UNI_OTHER) {
        i = run_end(p, n, i, UNI_OTHER);
        while (i < n && (p[i] == '\r' || p[i] == '\n')) i++;
        return i;
    }
    return space_run(p, n, 1);
}

size_t hf_split_gpt2(const uint8_t *p, size_t n)
{
    if (p[0] == '\'') {
        size_t k = contraction(p + 1, n - 1, 0);
        if (k) return 1 + k;
    }
    size_t i = p[0] == ' ' && n > 1 ? 1 : 0;
    ch_t c = ch_at(p, n, i);
    if (c.cls != UNI_SPACE) return run_end(p, n, i + c.len, c.cls);
    return space_run(p, n, 0);
}
