/* pool_main.c: check of src/pool.c (tests/test_native_kernels.py builds it natively, also with
 * -fsanitize=thread). Every index of [0, n) must be visited exactly once, in at most T contiguous
 * ranges of n / T (rounded) each, whichever thread claims them, for many n and thread counts, over
 * many consecutive jobs (short ones back to back: workers that wake late must not claim a range
 * of the next job; jobs where one range is slow); pools are created and freed repeatedly (a clean
 * shutdown joins every worker). Exit status 0 if all hold.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../src/model.h"

#define MAXN 1000

typedef struct {
    int hits[MAXN];   /* each index written by one range: disjoint, no lock */
    int64_t len[512]; /* length of each call's range */
    int calls;        /* atomic */
} job;

static void visit(void *arg, int64_t i0, int64_t i1) {
    job *j = arg;
    int c = __atomic_fetch_add(&j->calls, 1, __ATOMIC_RELAXED);
    j->len[c] = i1 - i0;
    for (int64_t i = i0; i < i1; i++) j->hits[i]++;
}

/* At most one range per thread, none empty, each floor(n / T) or ceil(n / T) long. */
static int ranges_ok(const job *j, int64_t n, int T) {
    if (j->calls > T) return 0;
    for (int c = 0; c < j->calls; c++)
        if (j->len[c] <= 0 || j->len[c] < n / T || j->len[c] > (n + T - 1) / T) return 0;
    return 1;
}

/* visit, but the range holding index 0 takes a while */
static void slow_visit(void *arg, int64_t i0, int64_t i1) {
    if (i0 == 0) usleep(200);
    visit(arg, i0, i1);
}

static long long total;

static void sum(void *arg, int64_t i0, int64_t i1) {
    long long *partial = arg;
    long long s = 0;
    for (int64_t i = i0; i < i1; i++) s += i;
    __atomic_add_fetch(partial, s, __ATOMIC_RELAXED);
}

int main(void) {
    int fail = 0;
    static job jb;
    long jobs = 0;
    for (int threads = -1; threads <= 7; threads++) { /* <= 0: the number of cores */
        struct ml_pool *p = ml_pool_new(threads);
        if (p == NULL) {
            printf("FAIL: ml_pool_new(%d)\n", threads);
            return 1;
        }
        for (int n = 0; n <= 200; n++) {
            memset(&jb, 0, sizeof jb);
            ml_pool_run(p, n, visit, &jb);
            jobs++;
            for (int i = 0; i < n; i++)
                if (jb.hits[i] != 1) {
                    if (fail++ < 10) printf("FAIL: threads %d n %d: index %d visited %d times\n", threads, n, i, jb.hits[i]);
                }
            for (int i = n; i < MAXN; i++)
                if (jb.hits[i]) fail++;
            int T = threads > 0 ? threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
            if (!ranges_ok(&jb, n, T) && fail++ < 10) printf("FAIL: threads %d n %d: ranges\n", threads, n);
        }
        for (int r = 0; r < 2000; r++) { /* many short jobs back to back */
            total = 0;
            int64_t n = 1 + r % 97;
            ml_pool_run(p, n, sum, &total);
            jobs++;
            if (total != n * (n - 1) / 2 && fail++ < 10) printf("FAIL: threads %d sum of %lld\n", threads, (long long)n);
        }
        for (int r = 0; r < 20; r++) { /* a slow range: the others are claimed meanwhile */
            memset(&jb, 0, sizeof jb);
            ml_pool_run(p, 64, slow_visit, &jb);
            jobs++;
            for (int i = 0; i < 64; i++)
                if (jb.hits[i] != 1 && fail++ < 10) printf("FAIL: threads %d slow job: index %d\n", threads, i);
        }
        total = 0;
        ml_pool_run(p, (int64_t)1 << 20, sum, &total);
        if (total != ((1LL << 20) * ((1LL << 20) - 1)) / 2) fail++;
        ml_pool_free(p);
    }
    for (int i = 0; i < 200; i++) { /* create / free cycles, some never used */
        struct ml_pool *p = ml_pool_new(1 + i % 4);
        if (p == NULL) return 1;
        if (i % 2) {
            total = 0;
            ml_pool_run(p, 10, sum, &total);
            if (total != 45) fail++;
        }
        ml_pool_free(p);
    }
    ml_pool_free(NULL);
    printf("pool: %ld jobs, %d failures\n%s\n", jobs, fail, fail ? "FAIL" : "OK");
    return fail != 0;
}
