/* Workers spin briefly on a generation counter before sleeping on a condition variable: decoding
 * runs hundreds of small parallel loops per token, and waking a sleeping thread costs more than
 * many of them take. Chunks are claimed from an atomic counter so faster threads take more. */
#include "threadpool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#else
#define cpu_relax() ((void)0)
#endif

/* About 0.1-0.3 ms of pausing: longer than the gap between two loops of one token, short enough
 * not to steal much from other processes when the machine is oversubscribed. */
#define SPIN_ROUNDS 2000

typedef struct {
    struct quill_pool *pool;
    int index;
} worker_arg;

struct quill_pool {
    int n_threads;
    pthread_t *threads;
    worker_arg *args;
    pthread_mutex_t lock;
    pthread_cond_t wake;
    atomic_uint generation;     /* bumped for every job; workers run when it changes */
    atomic_int busy;            /* workers still inside the current job */
    atomic_bool stop;
    /* the current job */
    quill_task_fn fn;
    void *ctx;
    int64_t n_items, grain;
    atomic_llong next;
};

static void work(quill_pool *p, int thread) {
    for (;;) {
        int64_t begin = atomic_fetch_add(&p->next, p->grain);
        if (begin >= p->n_items) return;
        int64_t end = begin + p->grain < p->n_items ? begin + p->grain : p->n_items;
        p->fn(p->ctx, begin, end, thread);
    }
}

static void *worker_main(void *arg) {
    quill_pool *p = ((worker_arg *)arg)->pool;
    int index = ((worker_arg *)arg)->index;
    /* Generation 0 is "no job yet": reading the counter here instead could skip a job posted
     * before this thread got to run. */
    unsigned seen = 0;
    for (;;) {
        unsigned gen;
        int spins = 0;
        while ((gen = atomic_load_explicit(&p->generation, memory_order_acquire)) == seen &&
               !atomic_load(&p->stop)) {
            if (++spins < SPIN_ROUNDS) {
                cpu_relax();
                continue;
            }
            pthread_mutex_lock(&p->lock);
            while (atomic_load(&p->generation) == seen && !atomic_load(&p->stop))
                pthread_cond_wait(&p->wake, &p->lock);
            pthread_mutex_unlock(&p->lock);
        }
        if (atomic_load(&p->stop)) return NULL;
        seen = gen;
        work(p, index);
        atomic_fetch_sub_explicit(&p->busy, 1, memory_order_release);
    }
}

quill_pool *quill_pool_new(int n_threads) {
    if (n_threads < 1) n_threads = 1;
    quill_pool *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->n_threads = n_threads;
    pthread_mutex_init(&p->lock, NULL);
    pthread_cond_init(&p->wake, NULL);
    p->threads = calloc((size_t)n_threads, sizeof *p->threads);
    p->args = calloc((size_t)n_threads, sizeof *p->args);
    if (!p->threads || !p->args) {
        free(p->threads);
        free(p->args);
        free(p);
        return NULL;
    }
    for (int i = 1; i < n_threads; i++) {
        p->args[i] = (worker_arg){p, i};
        if (pthread_create(&p->threads[i], NULL, worker_main, &p->args[i]) != 0) {
            p->n_threads = i;
            quill_pool_free(p);
            return NULL;
        }
    }
    return p;
}

void quill_pool_free(quill_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->lock);
    atomic_store(&p->stop, true);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->lock);
    for (int i = 1; i < p->n_threads; i++) pthread_join(p->threads[i], NULL);
    pthread_mutex_destroy(&p->lock);
    pthread_cond_destroy(&p->wake);
    free(p->threads);
    free(p->args);
    free(p);
}

int quill_pool_size(const quill_pool *p) { return p->n_threads; }

void quill_pool_run(quill_pool *p, quill_task_fn fn, void *ctx, int64_t n_items, int64_t grain) {
    if (n_items <= 0) return;
    if (grain < 1) grain = 1;
    if (p->n_threads == 1 || n_items <= grain) {
        fn(ctx, 0, n_items, 0);
        return;
    }
    p->fn = fn;
    p->ctx = ctx;
    p->n_items = n_items;
    p->grain = grain;
    atomic_store(&p->next, 0);
    atomic_store(&p->busy, p->n_threads - 1);
    pthread_mutex_lock(&p->lock);
    atomic_fetch_add_explicit(&p->generation, 1, memory_order_release);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->lock);
    work(p, 0);
    /* A worker may have been descheduled: after a short spin, give the core away while waiting. */
    for (int spins = 0; atomic_load_explicit(&p->busy, memory_order_acquire) > 0; spins++) {
        if (spins < SPIN_ROUNDS) cpu_relax();
        else sched_yield();
    }
}
