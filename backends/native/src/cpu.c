/* cpu.c: CPU features from cpuid and the OS-enabled register state from xgetbv. <cpuid.h> is
 * accepted by gcc and clang alike (clang 14 rejects __builtin_cpu_supports("f16c")), and reading
 * xgetbv ourselves makes the OS check explicit rather than a compiler's detail. */
#include <stdint.h>
#include <stdlib.h>

#include "cpu.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>

static uint64_t xgetbv0(void) {
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return (uint64_t)hi << 32 | lo;
}

int ml_cpu_avx2(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return 0;
    const unsigned fma = 1u << 12, osxsave = 1u << 27, avx = 1u << 28, f16c = 1u << 29;
    if ((c & (fma | osxsave | avx | f16c)) != (fma | osxsave | avx | f16c)) return 0;
    if ((xgetbv0() & 0x6) != 0x6) return 0; /* XCR0 bits 1, 2: the OS saves XMM and YMM */
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return 0;
    return (b >> 5) & 1; /* leaf 7 EBX bit 5: AVX2 */
}

int ml_cpu_avxvnni(void) {
    unsigned a, b, c, d;
    if (!ml_cpu_avx2() || !__get_cpuid_count(7, 1, &a, &b, &c, &d)) return 0;
    return (a >> 4) & 1; /* leaf 7.1 EAX bit 4: AVX-VNNI */
}

int ml_cpu_avx512vnni(void) {
    unsigned a, b, c, d;
    if (!ml_cpu_avx2() || !__get_cpuid_count(7, 0, &a, &b, &c, &d)) return 0;
    const unsigned f = 1u << 16, bw = 1u << 30, vl = 1u << 31; /* EBX: AVX512F, AVX512BW, AVX512VL */
    if ((b & (f | bw | vl)) != (f | bw | vl) || !((c >> 11) & 1)) return 0; /* ECX bit 11: AVX512_VNNI */
    return (xgetbv0() & 0xE0) == 0xE0; /* XCR0 bits 5..7: opmask, ZMM0-15 upper halves, ZMM16-31 */
}
#else
int ml_cpu_avx2(void) { return 0; }
int ml_cpu_avxvnni(void) { return 0; }
int ml_cpu_avx512vnni(void) { return 0; }
#endif

const char *ml_isa_override(void) {
    const char *v = getenv("MLRT_ISA");
    return v != NULL && v[0] != '\0' ? v : NULL;
}
