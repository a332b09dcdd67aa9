/* pool.c: the matmul row workers. ml_pool_run(p, n, fn, arg) splits [0, n) into C contiguous
 * chunks (chunk c: [n c / C, n (c + 1) / C), C = min(n, POOL_CHUNKS x threads)), which the caller
 * and the workers claim one at a time, and returns when every chunk is done. Which thread runs a
 * chunk does not matter to the results (the caller's ranges are independent). One caller at a time
 * (a model is used by one thread at a time).
 *
 * Why so: a forward pass runs hundreds of jobs of a few microseconds each. Waking a sleeping
 * thread (futex, context switch: tens of microseconds under a hypervisor) would cost more than
 * the job, so idle threads spin for SPIN_NS before they sleep on a condition variable. Spinning
 * pauses, then yields the core: when a busy machine puts two of our threads on one core, the
 * yield hands it to the one with work. Claimed chunks (not a fixed range per thread) let the
 * caller do the work of a worker that is not running (descheduled, or still asleep) instead of
 * waiting for it. A pool with more threads than cores never spins.
 *
 * The job word packs (job id, chunk count, next chunk) so that a worker that wakes late, after
 * the caller has moved on to the next job, cannot claim a chunk of a job it did not see start:
 * its compare-and-swap carries the id. A chunk's claimer reads the job's fields after the claim,
 * while the job cannot end (its chunk is not done).
 *
 * Sleep and wake without a lost wake-up (Dekker with seq_cst atomics): a worker about to sleep
 * takes the mutex, counts itself in `sleepers`, then reads the job word again; the caller
 * publishes the job word, then reads `sleepers` and broadcasts under the mutex if it is not
 * zero. One of the two sees the other's write. The caller's sleep on `remaining` and the signal
 * of the worker that finishes the last chunk mirror this.
 */
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "model.h"

#define POOL_MAX_THREADS 256
#define POOL_CHUNKS 1   /* chunks per thread: more cost more in claims than they gain (measured) */
#define SPIN_NS 200000  /* 0.2 ms: longer than the serial steps between two jobs of a pass */
#define SPIN_PAUSES 256 /* pause rounds before spinning turns to sched_yield */

struct ml_pool {
    int threads;               /* including the caller */
    int spin;                  /* threads <= cores: spin before sleeping */
    pthread_t *tid;            /* threads - 1 workers */
    pthread_mutex_t mu;
    pthread_cond_t work, done;
    /* the job: written by the caller before it publishes the job word */
    int64_t n;
    void (*fn)(void *arg, int64_t i0, int64_t i1);
    void *arg;
    /* atomics */
    _Alignas(8) uint64_t job;  /* id << 32 | chunks << 16 | next chunk (aligned: atomic on -m32) */
    int remaining;             /* chunks of the current job not done yet */
    int sleepers;              /* workers asleep (or going to sleep) on `work` */
    int waiting;               /* the caller is asleep (or going to sleep) on `done` */
    int stop;
};

typedef struct {
    struct ml_pool *p;
} worker_arg;

static uint32_t job_id(uint64_t w) { return (uint32_t)(w >> 32); }

static inline void relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static int64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* A bounded spin: keep_spinning() waits a little and says whether the time is not over yet. */
typedef struct {
    int64_t end;
    unsigned rounds;
} spinner;

static int keep_spinning(spinner *s) {
    if (++s->rounds < SPIN_PAUSES) {
        relax();
        return 1;
    }
    sched_yield();
    int64_t t = now_ns();
    if (s->end == 0) s->end = t + SPIN_NS;
    return t <= s->end;
}

/* Claim and run chunks of job `id` until none is left; the claimer of the last chunk to finish
 * wakes a sleeping caller. */
static void run_chunks(struct ml_pool *p, uint32_t id) {
    uint64_t w = __atomic_load_n(&p->job, __ATOMIC_ACQUIRE);
    for (;;) {
        uint64_t chunks = (w >> 16) & 0xFFFF, c = w & 0xFFFF;
        if (job_id(w) != id || c >= chunks) return;
        if (!__atomic_compare_exchange_n(&p->job, &w, w + 1, 1, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) continue;
        int64_t n = p->n, C = (int64_t)chunks;
        int64_t i0 = (n / C) * (int64_t)c + (n % C) * (int64_t)c / C;
        int64_t i1 = (n / C) * (int64_t)(c + 1) + (n % C) * (int64_t)(c + 1) / C;
        p->fn(p->arg, i0, i1);
        if (__atomic_sub_fetch(&p->remaining, 1, __ATOMIC_SEQ_CST) == 0 && __atomic_load_n(&p->waiting, __ATOMIC_SEQ_CST)) {
            pthread_mutex_lock(&p->mu);
            pthread_cond_signal(&p->done);
            pthread_mutex_unlock(&p->mu);
        }
        w = __atomic_load_n(&p->job, __ATOMIC_ACQUIRE);
    }
}

static void *worker(void *varg) {
    worker_arg *wa = varg;
    struct ml_pool *p = wa->p;
    free(wa);
    uint32_t seen = 0; /* the last job id this worker took part in */
    for (;;) {
        spinner sp = {0, 0};
        while (p->spin && job_id(__atomic_load_n(&p->job, __ATOMIC_ACQUIRE)) == seen &&
               !__atomic_load_n(&p->stop, __ATOMIC_RELAXED) && keep_spinning(&sp))
            continue;
        if (job_id(__atomic_load_n(&p->job, __ATOMIC_ACQUIRE)) == seen) {
            pthread_mutex_lock(&p->mu);
            __atomic_add_fetch(&p->sleepers, 1, __ATOMIC_SEQ_CST);
            while (!__atomic_load_n(&p->stop, __ATOMIC_SEQ_CST) &&
                   job_id(__atomic_load_n(&p->job, __ATOMIC_SEQ_CST)) == seen)
                pthread_cond_wait(&p->work, &p->mu);
            __atomic_sub_fetch(&p->sleepers, 1, __ATOMIC_SEQ_CST);
            pthread_mutex_unlock(&p->mu);
        }
        if (__atomic_load_n(&p->stop, __ATOMIC_ACQUIRE)) break;
        seen = job_id(__atomic_load_n(&p->job, __ATOMIC_ACQUIRE));
        run_chunks(p, seen);
    }
    return NULL;
}

static void stop_workers(struct ml_pool *p, int started) {
    pthread_mutex_lock(&p->mu);
    __atomic_store_n(&p->stop, 1, __ATOMIC_SEQ_CST);
    pthread_cond_broadcast(&p->work);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < started; i++) pthread_join(p->tid[i], NULL);
}

struct ml_pool *ml_pool_new(int threads) {
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    if (threads <= 0) threads = cores > 0 ? (int)(cores < POOL_MAX_THREADS ? cores : POOL_MAX_THREADS) : 1;
    if (threads > POOL_MAX_THREADS) threads = POOL_MAX_THREADS;
    struct ml_pool *p = calloc(1, sizeof *p);
    if (p == NULL) return NULL;
    p->threads = threads;
    p->spin = cores > 0 && threads <= cores;
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
        if (wa != NULL) wa->p = p;
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
    int64_t chunks = (int64_t)POOL_CHUNKS * p->threads;
    if (chunks > n) chunks = n;
    if (chunks > 0xFFFF) chunks = 0xFFFF;
    /* the previous job is over: every worker's claim of it fails from here on */
    uint32_t id = job_id(__atomic_load_n(&p->job, __ATOMIC_RELAXED)) + 1;
    if (id == 0) id = 1; /* 0 is "no job yet" for the workers */
    p->fn = fn;
    p->arg = arg;
    p->n = n;
    __atomic_store_n(&p->remaining, (int)chunks, __ATOMIC_RELAXED);
    __atomic_store_n(&p->job, (uint64_t)id << 32 | (uint64_t)chunks << 16, __ATOMIC_SEQ_CST); /* publishes */
    if (__atomic_load_n(&p->sleepers, __ATOMIC_SEQ_CST) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->work);
        pthread_mutex_unlock(&p->mu);
    }
    run_chunks(p, id);
    spinner sp = {0, 0};
    while (p->spin && __atomic_load_n(&p->remaining, __ATOMIC_ACQUIRE) > 0 && keep_spinning(&sp))
        continue;
    if (__atomic_load_n(&p->remaining, __ATOMIC_ACQUIRE) == 0) return;
    pthread_mutex_lock(&p->mu);
    __atomic_store_n(&p->waiting, 1, __ATOMIC_SEQ_CST);
    while (__atomic_load_n(&p->remaining, __ATOMIC_SEQ_CST) > 0) pthread_cond_wait(&p->done, &p->mu);
    __atomic_store_n(&p->waiting, 0, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&p->mu);
}
