/* neon_main.c: standalone check of the SIMD kernel tables against the scalar twin.
 *
 * Written for aarch64 under qemu-user (tests/test_native_kernels.py cross-compiles it with
 * kern_scalar.c, kern_neon.c, kern_neon_dotprod.c, dispatch.c and cpu.c, -static), and builds
 * as well on x86-64 with kern_avx2.c, kern_avxvnni.c and kern_avx512.c. Every runnable non-scalar table is compared with ml_kernels_scalar:
 * quantizer bytes and scale bits, integer block sums and dot products (all ISAs use one float
 * order, so the dots are bit-identical too) on edge and random inputs; the four-row dots (dot4)
 * give each row the scalar single-row dot's bits.
 *
 *   neon_main [--expect ISA] [--force ISA] [--seed N] [--rounds N]
 *     --expect ISA  fail unless the automatic choice (ml_isa) is ISA
 *     --force ISA   ml_set_isa(ISA) and test only that table (e.g. neon on a dotprod CPU)
 * Prints one summary line per table; exit status 0 only if nothing differs.
 *   neon_main --quantize ISA < floats > bytes
 *     Q8_0 of the float32 (little-endian) on stdin with table ISA: n int8 then n/32 float32 scales
 *     on stdout, for comparison with the reference quantizer (tests/test_native_kernels.py).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../include/mlrt.h"
#include "../src/kernels.h"

#define MAXB 80 /* blocks per test vector */
#define N (MAXB * QK)

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t rnd(void) { /* splitmix64 */
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static float bits2f(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint32_t f2bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float unit(void) { return (float)(rnd() >> 40) / (float)(1 << 24); } /* [0, 1) */

typedef struct {
    long quant_blocks, isum_blocks, dots, dots4, bad;
    double max_dot_rel;
} stats;

/* ------------------------------------------------------------------ quantizer */
static void check_quant(const ml_kernel_table *t, const float *x, int nb, stats *st, const char *what) {
    static int8_t q0[N], q1[N];
    static float d0[MAXB], d1[MAXB];
    memset(q1, 0x55, sizeof q1);
    ml_kernels_scalar.quantize_q8_0(x, nb * QK, q0, d0);
    t->quantize_q8_0(x, nb * QK, q1, d1);
    for (int b = 0; b < nb; b++) {
        st->quant_blocks++;
        int ok = f2bits(d0[b]) == f2bits(d1[b]) && memcmp(q0 + b * QK, q1 + b * QK, QK) == 0;
        if (!ok) {
            if (st->bad++ < 10) {
                fprintf(stderr, "%s quantize %s block %d: d %a vs %a\n", t->name, what, b, d0[b], d1[b]);
                for (int j = 0; j < QK; j++)
                    if (q0[b * QK + j] != q1[b * QK + j])
                        fprintf(stderr, "  x[%d] = %a: q %d vs %d\n", j, x[b * QK + j], q0[b * QK + j],
                                q1[b * QK + j]);
            }
        }
    }
}

static void fill(float *x, int n, float v) {
    for (int i = 0; i < n; i++) x[i] = v;
}

static void quant_edges(const ml_kernel_table *t, stats *st) {
    static float x[N];
    const float M = 0x1.fffffep+127f;
    int k = 0; /* block being filled */
#define BLK(i) (x + (i) * QK)
    fill(x, N, 0.0f);
    fill(BLK(k++), QK, -0.0f);                                   /* amax 0, -0 */
    fill(BLK(k), QK, 0x1p-149f), BLK(k++)[5] = -0x1p-140f;       /* subnormals only */
    fill(BLK(k), QK, 0.0f), BLK(k++)[3] = 0x1.4484cp-100f;       /* float32(1e-30): quantized */
    fill(BLK(k), QK, 0.0f), BLK(k++)[3] = -0x1.4484bep-100f;     /* just below: zero block */
    for (int j = 0; j < QK; j++) BLK(k)[j] = (float)(j * 4 - 64) + 0.5f; /* ties with amax 127? */
    BLK(k++)[31] = 127.0f;
    for (int j = 0; j < QK; j++) BLK(k)[j] = (j & 1 ? -1.0f : 1.0f) * ((float)j + 0.5f); /* id = 1 ties */
    BLK(k++)[0] = 127.0f;
    fill(BLK(k), QK, 0x1.fffffep-2f), BLK(k)[0] = 127.0f, BLK(k++)[1] = -0x1.fffffep-2f; /* 0.5 - 2^-25 */
    fill(BLK(k), QK, M), BLK(k)[1] = -M, BLK(k++)[2] = 1.0f;     /* huge */
    for (int j = 0; j < QK; j++) BLK(k)[j] = (j & 1 ? -M : M) / (float)(j + 1);
    k++;
    for (int j = 0; j < QK; j++) BLK(k)[j] = (j & 1 ? -0x1p-126f : 0x1p-149f) * (float)(j + 1); /* subnormal */
    BLK(k++)[7] = 3.0f;
    for (int j = 0; j < QK; j++) BLK(k)[j] = ldexpf(1.0f, j - 16) * (j % 3 ? 1.0f : -1.0f);
    k++;
    fill(BLK(k), QK, 1.0f), BLK(k++)[9] = -1.0f; /* all |x| = amax */
    /* non-finite: refused by the API, but every ISA must give the same bytes */
    fill(BLK(k), QK, 2.0f), BLK(k++)[4] = NAN;
    fill(BLK(k), QK, NAN), k++;
    fill(BLK(k), QK, 0.25f), BLK(k++)[30] = INFINITY;
    fill(BLK(k), QK, -1.0f), BLK(k)[0] = -INFINITY, BLK(k++)[1] = NAN;
    check_quant(t, x, k, st, "edges");
    /* x * id = k + 0.5 exactly and its neighbours, for many amax */
    for (int r = 0; r < 400; r++) {
        for (int b = 0; b < MAXB; b++) {
            float amax = ldexpf(1.0f + unit(), (int)(rnd() % 200) - 100);
            float id = 127.0f / amax;
            BLK(b)[0] = (rnd() & 1) ? amax : -amax;
            for (int j = 1; j < QK; j++) {
                float v = ((float)(rnd() % 127) + 0.5f) / id;
                uint32_t u = f2bits(v) + (uint32_t)(rnd() % 5) - 2; /* one or two ulps around */
                v = bits2f(u);
                if (fabsf(v) > amax) v = amax;
                BLK(b)[j] = (rnd() & 1) ? v : -v;
            }
        }
        check_quant(t, x, MAXB, st, "ties");
    }
#undef BLK
}

static void quant_random(const ml_kernel_table *t, int rounds, stats *st) {
    static float x[N];
    for (int r = 0; r < rounds; r++) {
        int mode = r % 4;
        for (int b = 0; b < MAXB; b++) {
            int e = (int)(rnd() % 280) - 150; /* block scale 2^-150 .. 2^129 (clamped) */
            for (int j = 0; j < QK; j++) {
                float *v = &x[b * QK + j];
                switch (mode) {
                case 0: /* uniform */
                    *v = ldexpf(unit() * 2.0f - 1.0f, e);
                    break;
                case 1: /* wide dynamic range inside a block */
                    *v = ldexpf(unit() - 0.5f, e - (int)(rnd() % 40));
                    break;
                case 2: { /* random finite bit patterns */
                    uint32_t u;
                    do u = (uint32_t)rnd(); while ((u & 0x7f800000u) == 0x7f800000u);
                    *v = bits2f(u);
                    break;
                }
                default: /* small integers and halves: ties whenever amax = 127 */
                    *v = (float)((int)(rnd() % 255) - 127) * ((rnd() & 1) ? 1.0f : 0.5f);
                }
            }
        }
        check_quant(t, x, MAXB, st, "random");
        /* the same blocks at every length 0..MAXB (tails, n = 0) */
        check_quant(t, x, (int)(rnd() % (MAXB + 1)), st, "random-len");
    }
}

/* ------------------------------------------------------------------ integer sums and dots */
static void check_ints(const ml_kernel_table *t, int nb, const int8_t *w8, const uint8_t *w4, const int8_t *x,
                       const float *wd, const float *xd, stats *st, const char *what) {
    static int32_t s0[MAXB], s1[MAXB];
    for (int fmt = 0; fmt < 2; fmt++) {
        memset(s1, 0x55, sizeof s1);
        if (fmt == 0) {
            ml_kernels_scalar.isums_q8_0(nb, w8, x, s0);
            t->isums_q8_0(nb, w8, x, s1);
        } else {
            ml_kernels_scalar.isums_q4_0(nb, w4, x, s0);
            t->isums_q4_0(nb, w4, x, s1);
        }
        for (int b = 0; b < nb; b++) {
            st->isum_blocks++;
            if (s0[b] != s1[b] && st->bad++ < 10)
                fprintf(stderr, "%s isums_%s %s nb %d block %d: %d vs %d\n", t->name, fmt ? "q4_0" : "q8_0",
                        what, nb, b, s0[b], s1[b]);
        }
        float d0 = fmt ? ml_kernels_scalar.dot_q4_0(nb, w4, wd, x, xd) : ml_kernels_scalar.dot_q8_0(nb, w8, wd, x, xd);
        float d1 = fmt ? t->dot_q4_0(nb, w4, wd, x, xd) : t->dot_q8_0(nb, w8, wd, x, xd);
        st->dots++;
        double rel = fabs((double)d0 - (double)d1) / (fabs((double)d0) + 1e-30);
        if (rel > st->max_dot_rel) st->max_dot_rel = rel;
        if (f2bits(d0) != f2bits(d1) && st->bad++ < 10)
            fprintf(stderr, "%s dot_%s %s nb %d: %a vs %a\n", t->name, fmt ? "q4_0" : "q8_0", what, nb, d0, d1);
    }
}

/* dot4: row r of the four is the scalar single-row dot of x[r], bit for bit, for the table and
 * for the scalar twin's own dot4 */
static void check_dot4(const ml_kernel_table *t, int nb, const int8_t *w8, const uint8_t *w4, const float *wd,
                       const int8_t *const x[4], const float *const xd[4], stats *st, const char *what) {
    for (int fmt = 0; fmt < 2; fmt++) {
        float want[4], got[4], twin[4];
        for (int r = 0; r < 4; r++)
            want[r] = fmt ? ml_kernels_scalar.dot_q4_0(nb, w4, wd, x[r], xd[r])
                          : ml_kernels_scalar.dot_q8_0(nb, w8, wd, x[r], xd[r]);
        memset(got, 0x55, sizeof got);
        memset(twin, 0x55, sizeof twin);
        if (fmt) {
            t->dot4_q4_0(nb, w4, wd, x, xd, got);
            ml_kernels_scalar.dot4_q4_0(nb, w4, wd, x, xd, twin);
        } else {
            t->dot4_q8_0(nb, w8, wd, x, xd, got);
            ml_kernels_scalar.dot4_q8_0(nb, w8, wd, x, xd, twin);
        }
        for (int r = 0; r < 4; r++) {
            st->dots4++;
            if ((f2bits(got[r]) != f2bits(want[r]) || f2bits(twin[r]) != f2bits(want[r])) && st->bad++ < 10)
                fprintf(stderr, "%s dot4_%s %s nb %d row %d: %a (scalar dot4 %a) vs dot %a\n", t->name,
                        fmt ? "q4_0" : "q8_0", what, nb, r, got[r], twin[r], want[r]);
        }
    }
}

static void int_tests(const ml_kernel_table *t, int rounds, stats *st) {
    static int8_t w8[N], x[N];
    static uint8_t w4[N / 2];
    static float wd[MAXB], xd[MAXB];
    /* extremes: +-127 everywhere, Q4_0 nibbles 0 (-8) and 15 (7) */
    const int8_t vals[] = {127, -127, 0, 1, -1};
    for (int a = 0; a < 5; a++)
        for (int c = 0; c < 5; c++) {
            memset(w8, vals[a], sizeof w8);
            memset(x, vals[c], sizeof x);
            memset(w4, a & 1 ? 0x00 : 0xFF, sizeof w4);
            for (int b = 0; b < MAXB; b++) wd[b] = xd[b] = 1.0f;
            check_ints(t, MAXB, w8, w4, x, wd, xd, st, "extremes");
            const int8_t *xs[4] = {x, x, x, x};
            const float *xds[4] = {xd, xd, xd, xd};
            check_dot4(t, MAXB, w8, w4, wd, xs, xds, st, "extremes");
        }
    static int8_t x4[4][N];
    static float xd4[4][MAXB];
    for (int r = 0; r < rounds; r++) {
        for (int i = 0; i < N; i++) {
            w8[i] = (int8_t)((int)(rnd() % 255) - 127);
            x[i] = (int8_t)((int)(rnd() % 255) - 127);
        }
        for (int i = 0; i < N / 2; i++) w4[i] = (uint8_t)rnd();
        for (int b = 0; b < MAXB; b++) {
            wd[b] = ldexpf(unit() * 2.0f - 1.0f, (int)(rnd() % 20) - 14); /* Q4_0 d may be negative */
            xd[b] = ldexpf(unit(), (int)(rnd() % 20) - 14);
        }
        check_ints(t, r % (MAXB + 1), w8, w4, x, wd, xd, st, "random");
        for (int k = 0; k < 4; k++) {
            for (int i = 0; i < N; i++) x4[k][i] = (int8_t)((int)(rnd() % 255) - 127);
            for (int b = 0; b < MAXB; b++) xd4[k][b] = ldexpf(unit(), (int)(rnd() % 20) - 14);
        }
        const int8_t *xs[4] = {x4[0], x4[1], x4[2], x4[3]};
        const float *xds[4] = {xd4[0], xd4[1], xd4[2], xd4[3]};
        check_dot4(t, r % (MAXB + 1), w8, w4, wd, xs, xds, st, "random");
    }
}

/* ------------------------------------------------------------------ main */
static const char *const simd_names[] = {"avxvnni", "avx512", "avx2", "neon", "neon-dotprod"};
#define N_SIMD (int)(sizeof simd_names / sizeof simd_names[0])

static int quantize_stdin(const char *isa) {
    const ml_kernel_table *t = ml_kernels_named(isa);
    if (t == NULL) {
        fprintf(stderr, "%s: not runnable here\n", isa);
        return 1;
    }
    size_t cap = 1 << 16, n = 0;
    float *x = malloc(cap * sizeof *x);
    for (size_t got; x != NULL && (got = fread(x + n, sizeof *x, cap - n, stdin)) > 0;) {
        n += got;
        if (n == cap) x = realloc(x, (cap *= 2) * sizeof *x);
    }
    n -= n % QK;
    int8_t *q = malloc(n + 1);
    float *d = malloc((n / QK + 1) * sizeof *d);
    if (x == NULL || q == NULL || d == NULL || n > 0x7fffffff) return 1;
    t->quantize_q8_0(x, (int)n, q, d);
    int ok = fwrite(q, 1, n, stdout) == n && fwrite(d, sizeof *d, n / QK, stdout) == n / QK;
    free(x), free(q), free(d);
    return !ok;
}

int main(int argc, char **argv) {
    const char *expect = NULL, *force = NULL;
    if (argc == 3 && !strcmp(argv[1], "--quantize")) return quantize_stdin(argv[2]);
    int rounds = 300;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--expect") && i + 1 < argc) expect = argv[++i];
        else if (!strcmp(argv[i], "--force") && i + 1 < argc) force = argv[++i];
        else if (!strcmp(argv[i], "--seed") && i + 1 < argc) rng_state = strtoull(argv[++i], NULL, 0);
        else if (!strcmp(argv[i], "--rounds") && i + 1 < argc) rounds = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: %s [--expect ISA] [--force ISA] [--seed N] [--rounds N]\n", argv[0]);
            return 2;
        }
    }
    int fail = 0;
    printf("automatic choice: %s\n", ml_isa());
    if (expect && strcmp(ml_isa(), expect) != 0) {
        printf("FAIL: expected the automatic choice %s\n", expect);
        fail = 1;
    }
    const ml_kernel_table *tabs[N_SIMD];
    int nt = 0;
    if (force) {
        if (ml_set_isa(force) != ML_OK || strcmp(ml_kernels()->name, force) != 0 || strcmp(ml_isa(), force) != 0) {
            printf("FAIL: ml_set_isa(%s) did not take\n", force);
            return 1;
        }
        printf("forced: %s\n", ml_isa());
        tabs[nt++] = ml_kernels();
    } else {
        for (int i = 0; i < N_SIMD; i++) {
            const ml_kernel_table *t = ml_kernels_named(simd_names[i]);
            if (t) tabs[nt++] = t;
            else printf("%s: not runnable here\n", simd_names[i]);
        }
    }
    if (ml_set_isa("no-such-isa") != ML_E_UNSUPPORTED || ml_kernels_named("scalar") != &ml_kernels_scalar) {
        printf("FAIL: ml_set_isa / ml_kernels_named\n");
        fail = 1;
    }
    if (nt == 0 || tabs[0] == &ml_kernels_scalar) {
        printf("FAIL: no SIMD table to test\n");
        return 1;
    }
    uint64_t seed = rng_state;
    for (int i = 0; i < nt; i++) {
        stats st = {0};
        rng_state = seed; /* every table sees the same inputs */
        quant_edges(tabs[i], &st);
        quant_random(tabs[i], rounds, &st);
        int_tests(tabs[i], rounds * 4, &st);
        printf("%s: quantize %ld blocks, isums %ld blocks, dots %ld (max rel diff %.3g), dot4 rows %ld: %ld mismatches\n",
               tabs[i]->name, st.quant_blocks, st.isum_blocks, st.dots, st.max_dot_rel, st.dots4, st.bad);
        if (st.bad) fail = 1;
    }
    printf("%s\n", fail ? "FAIL" : "OK");
    return fail;
}
