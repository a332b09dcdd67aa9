/* i2s_main.c: standalone driver of the I2_S kernel tables and API (backends/bitnet/src), for the
 * checks that cannot load the shared library: the NEON table, cross-compiled for aarch64 (-static)
 * and run under qemu-aarch64, and sanitizer builds (tests/test_bitnet_kernels.py). Builds on
 * x86-64 too (with i2s_avx2.c). Sources: this file, every backends/bitnet/src file but bench.c and
 * testhooks.c (with the machine's SIMD file), and the native runtime's pool.c and f16.c.
 *
 *   i2s_main ISA quantize_act N      stdin: rows of N float32; stdout per row: int8 q[N], float32
 *                                    scale, int32 sum
 *   i2s_main ISA dot N               stdin: records of packed[N/4] + int8 x[N]; stdout: int32
 *   i2s_main ISA dot4 N              stdin: records of packed[N/4] + int8 x[4][N]; stdout: int32[4]
 *   i2s_main ISA dot_rows4 N         stdin: records of packed[4][N/4] + int8 x[N]; stdout: int32[4]
 *   i2s_main ISA quantize ROWS COLS  stdin: float32 w[ROWS*COLS]; stdout: the payload
 *   i2s_main ISA matmul ROWS COLS N  stdin: payload + float32 x[N*COLS]; stdout: float32 y[N*ROWS]
 *   i2s_main ISA embed PATH POOL NORM  stdin: int32 tokens; stdout: float32 embedding[dim] of the
 *                                    GGUF at PATH (ml_embed_load with 1 thread, ml_embed with
 *                                    pooling POOL (-1, 1, 2, 3) and normalize NORM)
 *   i2s_main ISA selftest ROUNDS     every op of table ISA against the scalar twin on random and
 *                                    edge inputs generated here; prints the automatic choice
 *                                    (ml_isa) and "ISA: ... 0 mismatches"
 * The kernel ops run table ISA directly; the API ops (quantize, matmul, embed) first ml_set_isa(ISA).
 * Exit status: 0 on success, 2 usage or I/O, 3 ISA not runnable here ("not runnable" on stderr),
 * 10 + the ML_E_* status an API call returned, 1 a selftest mismatch. All data little endian.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../src/bitnet.h"

static uint8_t *read_all(size_t *len) {
    size_t cap = 1 << 16, n = 0;
    uint8_t *buf = malloc(cap);
    for (size_t got; buf != NULL && (got = fread(buf + n, 1, cap - n, stdin)) > 0;) {
        n += got;
        if (n == cap) {
            uint8_t *b = realloc(buf, cap *= 2);
            if (b == NULL) free(buf);
            buf = b;
        }
    }
    *len = n;
    return buf;
}

static int put(const void *p, size_t n) { return fwrite(p, 1, n, stdout) == n; }

/* ------------------------------------------------------------------ selftest */
static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t rnd(void) { /* splitmix64 */
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static float unit(void) { return (float)(rnd() >> 40) / (float)(1 << 24); } /* [0, 1) */

#define MAXN 4096

static long selftest(const i2s_kernel_table *t, int rounds, long *checks) {
    static float x[MAXN];
    static int8_t q0[MAXN], q1[MAXN], xs[4][MAXN];
    static uint8_t w[4 * MAXN / 4];
    const i2s_kernel_table *s = &i2s_kernels_scalar;
    long bad = 0;
    for (int r = 0; r < rounds; r++) {
        /* quantize_act: any length 1..MAXN, values of several kinds */
        int n = r % 3 == 0 ? (int)(rnd() % MAXN) + 1 : 128 * ((int)(rnd() % (MAXN / 128)) + 1);
        int mode = r % 5;
        float amax = ldexpf(1.0f + unit(), (int)(rnd() % 60) - 40);
        float a = (float)(127.0 / (double)amax);
        for (int k = 0; k < n; k++) {
            switch (mode) {
            case 0: x[k] = ldexpf(unit() * 2.0f - 1.0f, (int)(rnd() % 40) - 20); break;
            case 1: { /* finite random bit patterns */
                uint32_t u;
                do u = (uint32_t)rnd(); while ((u & 0x7f800000u) == 0x7f800000u);
                memcpy(&x[k], &u, 4);
                break;
            }
            case 2: { /* t = x * a near k + 0.5 */
                float v = ((float)(rnd() % 127) + 0.5f) / a;
                uint32_t u;
                memcpy(&u, &v, 4);
                u += (uint32_t)(rnd() % 5) - 2;
                memcpy(&v, &u, 4);
                x[k] = fminf(v, amax) * ((rnd() & 1) ? 1.0f : -1.0f);
                break;
            }
            case 3: x[k] = (float)((int)(rnd() % 255) - 127) * 0.5f; break; /* halves with amax 63.5 */
            default: x[k] = (rnd() % 4) ? 0.0f : ldexpf(unit(), -140); /* zeros and subnormals */
            }
        }
        if (mode == 2) x[rnd() % (unsigned)n] = amax;
        int32_t sum0, sum1;
        float a0 = s->quantize_act(x, n, q0, &sum0), a1 = t->quantize_act(x, n, q1, &sum1);
        (*checks)++;
        if (memcmp(&a0, &a1, 4) || sum0 != sum1 || memcmp(q0, q1, (size_t)n)) {
            if (bad++ < 10) fprintf(stderr, "%s quantize_act round %d n %d: scale %a vs %a, sum %d vs %d\n", t->name, r, n, a0, a1, sum0, sum1);
        }
        /* dots: any bytes (code 3 too), any int8 (-128 too); round 0..3: extremes */
        n = 128 * ((int)(rnd() % (MAXN / 128)) + 1);
        for (int i = 0; i < n; i++) {
            w[i] = r < 4 ? (uint8_t)(r & 1 ? 0xFF : 0xAA) : (uint8_t)rnd();
            for (int u = 0; u < 4; u++) xs[u][i] = r < 4 ? (int8_t)(r & 2 ? -128 : 127) : (int8_t)rnd();
        }
        int32_t d0[4], d1[4];
        const int8_t *xp[4] = {xs[0], xs[1], xs[2], xs[3]};
        d0[0] = s->dot(n, w, xs[0]);
        d1[0] = t->dot(n, w, xs[0]);
        (*checks)++;
        if (d0[0] != d1[0] && bad++ < 10) fprintf(stderr, "%s dot n %d: %d vs %d\n", t->name, n, d0[0], d1[0]);
        s->dot4(n, w, xp, d0);
        t->dot4(n, w, xp, d1);
        for (int u = 0; u < 4; u++) {
            (*checks)++;
            if ((d0[u] != d1[u] || d0[u] != s->dot(n, w, xs[u])) && bad++ < 10)
                fprintf(stderr, "%s dot4 n %d row %d: %d vs %d\n", t->name, n, u, d0[u], d1[u]);
        }
        s->dot_rows4(n, w, xs[1], d0);
        t->dot_rows4(n, w, xs[1], d1);
        for (int u = 0; u < 4; u++) {
            (*checks)++;
            if ((d0[u] != d1[u] || d0[u] != s->dot(n, w + (size_t)u * (size_t)(n / 4), xs[1])) && bad++ < 10)
                fprintf(stderr, "%s dot_rows4 n %d row %d: %d vs %d\n", t->name, n, u, d0[u], d1[u]);
        }
        /* float dots (the float reading, attention): any length 1..MAXN, mixed magnitudes and
         * signs, f16 weights of any finite bits; the table's fixed order makes them bit-identical */
        n = (int)(rnd() % MAXN) + 1;
        static uint16_t wh[MAXN];
        static float wf[MAXN];
        for (int k = 0; k < n; k++) {
            uint16_t h;
            do h = (uint16_t)rnd(); while ((h & 0x7c00u) == 0x7c00u);
            wh[k] = h;
            wf[k] = ldexpf(unit() * 2.0f - 1.0f, (int)(rnd() % 30) - 15);
            x[k] = ldexpf(unit() * 2.0f - 1.0f, (int)(rnd() % 30) - 15);
        }
        float f0 = s->dot_f16(n, wh, x), f1 = t->dot_f16(n, wh, x);
        float g0 = s->dot_f32(n, wf, x), g1 = t->dot_f32(n, wf, x);
        (*checks) += 2;
        if (memcmp(&f0, &f1, 4) && bad++ < 10) fprintf(stderr, "%s dot_f16 n %d: %a vs %a\n", t->name, n, f0, f1);
        if (memcmp(&g0, &g1, 4) && bad++ < 10) fprintf(stderr, "%s dot_f32 n %d: %a vs %a\n", t->name, n, g0, g1);
        {   /* attention's kernels on one tile: scores, the online-softmax step, the weighted values */
            enum { AQ = 16, AK = 64, AD = 136 };
            static float q[AQ * AD], kt[AK * AD], v[AK * AD], sc0[AQ * AK], sc1[AQ * AK], o0[AQ * AD], o1[AQ * AD];
            int nq = (int)(rnd() % AQ) + 1, nk = (int)(rnd() % AK) + 1, hd = (int)(rnd() % AD) + 1;
            for (int k = 0; k < AQ * AD; k++) q[k] = ldexpf(unit() * 2.0f - 1.0f, (int)(rnd() % 12) - 6);
            for (int k = 0; k < AK * AD; k++)
                kt[k] = ldexpf(unit() * 2.0f - 1.0f, (int)(rnd() % 12) - 6), v[k] = unit() * 2.0f - 1.0f;
            float scale = 1.0f / sqrtf((float)hd);
            s->att_scores(hd, nq, q, AD, nk, kt, scale, sc0, AK);
            t->att_scores(hd, nq, q, AD, nk, kt, scale, sc1, AK);
            (*checks)++;
            if (memcmp(sc0, sc1, sizeof sc0) && bad++ < 10) fprintf(stderr, "%s att_scores hd %d nq %d nk %d\n", t->name, hd, nq, nk);
            int lo[AQ], hi[AQ];
            float m0[AQ], m1[AQ], l0[AQ], l1[AQ], al0[AQ], al1[AQ];
            for (int i = 0; i < nq; i++) {
                lo[i] = (int)(rnd() % (uint64_t)(nk + 1)), hi[i] = lo[i] + (int)(rnd() % (uint64_t)(nk - lo[i] + 1));
                m0[i] = m1[i] = i % 2 ? -INFINITY : sc0[i * AK] - 1.0f, l0[i] = l1[i] = i % 2 ? 0.0f : 2.0f;
            }
            s->att_softmax(nq, nk, lo, hi, sc0, AK, m0, l0, al0);
            t->att_softmax(nq, nk, lo, hi, sc1, AK, m1, l1, al1);
            (*checks)++;
            if ((memcmp(sc0, sc1, sizeof sc0) || memcmp(m0, m1, sizeof(float) * (size_t)nq) ||
                 memcmp(l0, l1, sizeof(float) * (size_t)nq) || memcmp(al0, al1, sizeof(float) * (size_t)nq)) &&
                bad++ < 10)
                fprintf(stderr, "%s att_softmax nq %d nk %d\n", t->name, nq, nk);
            for (int k = 0; k < AQ * AD; k++) o0[k] = o1[k] = unit();
            s->att_pv(hd, nq, nk, sc0, AK, v, al0, o0, AD);
            t->att_pv(hd, nq, nk, sc0, AK, v, al0, o1, AD);
            (*checks)++;
            if (memcmp(o0, o1, sizeof o0) && bad++ < 10) fprintf(stderr, "%s att_pv hd %d nq %d nk %d\n", t->name, hd, nq, nk);
        }
        /* element-wise kernels (epilogue, act_mul): integer sums of any size, activations
         * from tiny to past exp's clamp, both signs, the same bits as the twin's formulas */
        static int32_t si[MAXN];
        static float y0[MAXN], y1[MAXN], u[MAXN];
        for (int k = 0; k < n; k++) {
            si[k] = (int32_t)(rnd() >> 32) >> (rnd() % 32);
            x[k] = ldexpf(unit() * 2.0f - 1.0f, (int)(rnd() % 16) - 8) * (rnd() % 8 ? 1.0f : 64.0f);
            u[k] = ldexpf(unit() * 2.0f - 1.0f, (int)(rnd() % 20) - 10);
        }
        float sa = ldexpf(1.0f + unit(), (int)(rnd() % 40) - 20), sd = unit() + 0.01f;
        int32_t ss = (int32_t)(rnd() >> 40) - (1 << 23);
        s->epilogue(n, si, ss, sa, sd, y0);
        t->epilogue(n, si, ss, sa, sd, y1);
        (*checks)++;
        if (memcmp(y0, y1, sizeof(float) * (size_t)n) && bad++ < 10) fprintf(stderr, "%s epilogue n %d\n", t->name, n);
        for (int gelu = 0; gelu < 2; gelu++) {
            memcpy(y0, x, sizeof(float) * (size_t)n);
            memcpy(y1, x, sizeof(float) * (size_t)n);
            s->act_mul(gelu, n, y0, u);
            t->act_mul(gelu, n, y1, u);
            (*checks)++;
            if (memcmp(y0, y1, sizeof(float) * (size_t)n) && bad++ < 10)
                fprintf(stderr, "%s act_mul gelu %d n %d\n", t->name, gelu, n);
        }
    }
    return bad;
}

/* ------------------------------------------------------------------ main */
/* ------------------------------------------------------------------ embed */
static int embed(const char *isa, const char *path, int pooling, int normalize) {
    if (ml_set_isa(isa) != ML_OK) return 2;
    size_t len;
    uint8_t *in = read_all(&len);
    if (in == NULL || len % 4) return 2;
    int32_t *tokens = malloc(len + 4); /* aligned copy */
    memcpy(tokens, in, len);
    free(in);
    char reason[512];
    ml_embedder *e = NULL;
    int rc = ml_embed_load(path, 1, &e, reason, sizeof reason);
    if (rc != ML_OK) {
        fprintf(stderr, "%s\n", reason);
        free(tokens);
        return 10 + rc;
    }
    float *out = malloc(sizeof(float) * (size_t)ml_embed_dim(e));
    rc = ml_embed(e, tokens, (int32_t)(len / 4), pooling, normalize, out);
    int ok = rc == ML_OK && put(out, sizeof(float) * (size_t)ml_embed_dim(e));
    free(out);
    free(tokens);
    ml_embed_free(e);
    return rc != ML_OK ? 10 + rc : ok ? 0 : 2;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s ISA OP N... (see the file comment)\n", argv[0]);
        return 2;
    }
    const char *isa = argv[1], *op = argv[2];
    const i2s_kernel_table *t = i2s_kernels_named(isa);
    if (t == NULL) {
        fprintf(stderr, "%s: not runnable here\n", isa);
        return 3;
    }
    if (!strcmp(op, "embed")) return embed(isa, argv[3], argc > 4 ? atoi(argv[4]) : -1, argc > 5 ? atoi(argv[5]) : 0);
    long a1 = atol(argv[3]), a2 = argc > 4 ? atol(argv[4]) : 0, a3 = argc > 5 ? atol(argv[5]) : 0;
    if (!strcmp(op, "selftest")) {
        long checks = 0, bad = selftest(t, (int)a1, &checks);
        printf("automatic choice: %s\n", ml_isa());
        printf("%s: %ld checks against scalar, %ld mismatches\n", t->name, checks, bad);
        return bad != 0;
    }
    size_t len;
    uint8_t *in = read_all(&len);
    if (in == NULL || a1 <= 0) return 2;
    int ok = 1;
    const size_t n = (size_t)a1;
    if (!strcmp(op, "quantize_act")) {
        int8_t *q = malloc(n);
        for (size_t off = 0; q && ok && off + 4 * n <= len; off += 4 * n) {
            float *x = malloc(4 * n); /* aligned copy */
            int32_t sum;
            memcpy(x, in + off, 4 * n);
            float a = t->quantize_act(x, (int)n, q, &sum);
            ok = put(q, n) && put(&a, 4) && put(&sum, 4);
            free(x);
        }
        free(q);
    } else if (!strcmp(op, "dot") || !strcmp(op, "dot4") || !strcmp(op, "dot_rows4")) {
        int which = op[3] == 0 ? 0 : op[3] == '4' ? 1 : 2;
        size_t wb = which == 2 ? n : n / 4, xb = which == 1 ? 4 * n : n, rec = wb + xb;
        if (n % I2S_BLOCK) return 2;
        uint8_t *buf = malloc(rec);
        for (size_t off = 0; buf && ok && off + rec <= len; off += rec) {
            memcpy(buf, in + off, rec);
            const int8_t *x = (const int8_t *)buf + wb;
            int32_t out[4];
            if (which == 0) out[0] = t->dot((int)n, buf, x);
            else if (which == 1) {
                const int8_t *xs[4] = {x, x + n, x + 2 * n, x + 3 * n};
                t->dot4((int)n, buf, xs, out);
            } else t->dot_rows4((int)n, buf, x, out);
            ok = put(out, which == 0 ? 4 : 16);
        }
        free(buf);
    } else if (!strcmp(op, "quantize") || !strcmp(op, "matmul")) {
        if (ml_set_isa(isa) != ML_OK || a2 <= 0) return 2;
        size_t rows = n, cols = (size_t)a2, pay = rows * cols / 4 + I2S_TAIL;
        int rc;
        if (op[0] == 'q') {
            if (len != 4 * rows * cols) return 2;
            float *w = malloc(len);
            uint8_t *p = malloc(pay);
            memcpy(w, in, len);
            rc = ml_i2s_quantize(w, rows, cols, p);
            ok = rc != ML_OK || put(p, pay);
            free(w), free(p);
        } else {
            size_t nt = (size_t)a3;
            if (len != pay + 4 * nt * cols) return 2;
            uint8_t *p = malloc(pay);
            float *x = malloc(4 * nt * cols + 4), *y = malloc(4 * nt * rows + 4);
            memcpy(p, in, pay);
            memcpy(x, in + pay, 4 * nt * cols);
            rc = ml_i2s_matmul(p, rows, cols, x, nt, y);
            ok = rc != ML_OK || put(y, 4 * nt * rows);
            free(p), free(x), free(y);
        }
        if (rc != ML_OK) {
            free(in);
            return 10 + rc;
        }
    } else {
        fprintf(stderr, "unknown op %s\n", op);
        return 2;
    }
    free(in);
    return ok ? 0 : 2;
}
