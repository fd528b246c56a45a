/* bf16 on the host: the top 16 bits of an fp32. */
#ifndef CTITAN_BF16_H
#define CTITAN_BF16_H

#include <stdint.h>
#include <string.h>

/* fp32 -> bf16, round to nearest even; a NaN stays a (quiet) NaN. */
static inline uint16_t bf16_of(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}

/* bf16 -> fp32 (exact). */
static inline float bf16_float(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

#endif
