/* pool.c: the matmul row workers. ml_pool_run(p, n, fn, arg) splits [0, n) into one contiguous
 * range per thread (thread k: [n k / T, n (k + 1) / T)), the caller running range 0 itself, and
 * returns when every range is done. Workers sleep on a condition variable between jobs (no
 * spinning: the machine may have as many threads as cores); a job is announced by bumping a
 * generation counter. One caller at a time (a model is used by one thread at a time).
 */
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

#include "model.h"

#define POOL_MAX_THREADS 256

struct ml_pool {
    int threads;               /* including the caller */
    pthread_t *tid;            /* threads - 1 workers */
    pthread_mutex_t mu;
    pthread_cond_t work, done;
    unsigned long gen;         /* bumped per job */
    int pending;               /* workers still running the current job */
    int stop;
    int64_t n;
    void (*fn)(void *arg, int64_t i0, int64_t i1);
    void *arg;
};

typedef struct {
    struct ml_pool *p;
    int k;                     /* range index, 1 .. threads - 1 */
} worker_arg;

/* Start of range k of T over [0, n), without overflowing n * k. */
static int64_t split(int64_t n, int k, int T) {
    return (n / T) * k + (n % T) * k / T;
}

static void run_range(struct ml_pool *p, int64_t n, int k) {
    int64_t i0 = split(n, k, p->threads), i1 = split(n, k + 1, p->threads);
    if (i1 > i0) p->fn(p->arg, i0, i1);
}

static void *worker(void *varg) {
    worker_arg *wa = varg;
    struct ml_pool *p = wa->p;
    int k = wa->k;
    free(wa);
    unsigned long seen = 0;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->stop && p->gen == seen) pthread_cond_wait(&p->work, &p->mu);
        if (p->stop) break;
        seen = p->gen;
        int64_t n = p->n;
        pthread_mutex_unlock(&p->mu);
        run_range(p, n, k);
        pthread_mutex_lock(&p->mu);
        if (--p->pending == 0) pthread_cond_signal(&p->done);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

static void stop_workers(struct ml_pool *p, int started) {
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_cond_broadcast(&p->work);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < started; i++) pthread_join(p->tid[i], NULL);
}

struct ml_pool *ml_pool_new(int threads) {
    if (threads <= 0) {
        long c = sysconf(_SC_NPROCESSORS_ONLN);
        threads = c > 0 ? (int)(c < POOL_MAX_THREADS ? c : POOL_MAX_THREADS) : 1;
    }
    if (threads > POOL_MAX_THREADS) threads = POOL_MAX_THREADS;
    struct ml_pool *p = calloc(1, sizeof *p);
    if (p == NULL) return NULL;
    p->threads = threads;
    if (threads == 1) return p; /* runs inline: no workers, no locks */
    p->tid = calloc((size_t)threads - 1, sizeof *p->tid);
    if (p->tid == NULL) {
        free(p);
        return NULL;
    }
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->work, NULL);
    pthread_cond_init(&p->done, NULL);
    for (int i = 0; i < threads - 1; i++) {
        worker_arg *wa = malloc(sizeof *wa);
        if (wa != NULL) *wa = (worker_arg){p, i + 1};
        if (wa == NULL || pthread_create(&p->tid[i], NULL, worker, wa) != 0) {
            free(wa);
            stop_workers(p, i);
            pthread_mutex_destroy(&p->mu);
            pthread_cond_destroy(&p->work);
            pthread_cond_destroy(&p->done);
            free(p->tid);
            free(p);
            return NULL;
        }
    }
    return p;
}

void ml_pool_free(struct ml_pool *p) {
    if (p == NULL) return;
    if (p->threads > 1) {
        stop_workers(p, p->threads - 1);
        pthread_mutex_destroy(&p->mu);
        pthread_cond_destroy(&p->work);
        pthread_cond_destroy(&p->done);
    }
    free(p->tid);
    free(p);
}

void ml_pool_run(struct ml_pool *p, int64_t n, void (*fn)(void *arg, int64_t i0, int64_t i1), void *arg) {
    if (n <= 0) return;
    if (p == NULL || p->threads == 1 || n == 1) {
        fn(arg, 0, n);
        return;
    }
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->arg = arg;
    p->n = n;
    p->pending = p->threads - 1;
    p->gen++;
    pthread_cond_broadcast(&p->work);
    pthread_mutex_unlock(&p->mu);
    run_range(p, n, 0);
    pthread_mutex_lock(&p->mu);
    while (p->pending > 0) pthread_cond_wait(&p->done, &p->mu);
    pthread_mutex_unlock(&p->mu);
}
