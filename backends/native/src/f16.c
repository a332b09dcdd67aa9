/* f16.c: IEEE binary16 <-> binary32, exact, in integer arithmetic.
 *
 * Integer bit manipulation gives the same answer on every target (no F16C, no x87 excess
 * precision). f32 -> f16 rounds to nearest, ties to even, as numpy's astype(float16); values
 * from 65520 up become inf; a NaN keeps its sign and top 10 payload bits (numpy's npy_half rule:
 * a payload that would vanish becomes 1, so the result stays a NaN).
 */
#include <string.h>

#include "kernels.h"

float ml_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1F;
    uint32_t man = h & 0x3FF;
    uint32_t bits;
    if (exp == 0x1F) {              /* inf, NaN */
        bits = sign | 0x7F800000u | man << 13;
    } else if (exp != 0) {          /* normal: rebias 15 -> 127 */
        bits = sign | (exp + 112) << 23 | man << 13;
    } else if (man == 0) {          /* signed zero */
        bits = sign;
    } else {                        /* subnormal man * 2^-24: normalize */
        int shift = 0;
        while (!(man & 0x400)) {
            man <<= 1;
            shift++;
        }
        bits = sign | (uint32_t)(113 - shift) << 23 | (man & 0x3FF) << 13;
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* v >> s rounded to nearest, ties to even (1 <= s <= 31). */
static uint32_t shift_rne(uint32_t v, int s) {
    uint32_t r = v >> s, rem = v & ((1u << s) - 1), half = 1u << (s - 1);
    return r + (rem > half || (rem == half && (r & 1)));
}

uint16_t ml_f32_to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    uint32_t ax = x & 0x7FFFFFFFu;
    if (ax > 0x7F800000u) {                     /* NaN */
        uint16_t payload = (uint16_t)((ax >> 13) & 0x3FF);
        return sign | 0x7C00 | (payload ? payload : 1);
    }
    if (ax >= 0x477FF000u)                      /* >= 65520 (the tie above 65504) and inf */
        return sign | 0x7C00;
    if (ax >= 0x38800000u)                      /* normal f16 (>= 2^-14); a carry may bump the exponent */
        return sign | (uint16_t)shift_rne(ax - 0x38000000u, 13);
    uint32_t e = ax >> 23;                      /* subnormal f16: |f| / 2^-24, rounded */
    if (e < 102)                                /* below 2^-25: rounds to zero */
        return sign;
    uint32_t man = (ax & 0x7FFFFFu) | 0x800000u; /* |f| = man * 2^(e - 150) */
    return sign | (uint16_t)shift_rne(man, (int)(126 - e));
}
