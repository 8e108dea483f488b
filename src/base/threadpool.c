/* Workers spin briefly on a generation counter before sleeping on a condition variable: decoding
 * runs hundreds of small parallel loops per token, and waking a sleeping thread costs more than
 * many of them take.
 *
 * Each thread owns a contiguous share of the items and claims chunks from the front of it; a
 * thread done with its share then claims chunks of the others' shares, so faster threads take
 * more. Contiguous shares matter for decoding: a matrix-vector product prefetches the rows it will
 * read next, and with items dealt round-robin from one counter those rows were often the other
 * thread's (chunks of 2 tiles ran at 7.4 GB/s against 12.4 for contiguous halves). */
#include "base/threadpool.h"

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

/* A thread's share of the current job's items: [next, end) is still unclaimed. Own cache line, so
 * that claiming from one's own share does not contend with the other threads. */
typedef struct {
    _Alignas(64) atomic_llong next;
    int64_t end;
} share;

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
    int64_t grain;
    share *shares; /* one per thread */
};

static void work_share(quill_pool *p, share *s, int thread) {
    for (;;) {
        int64_t begin = atomic_fetch_add_explicit(&s->next, p->grain, memory_order_relaxed);
        if (begin >= s->end) return;
        int64_t end = begin + p->grain < s->end ? begin + p->grain : s->end;
        p->fn(p->ctx, begin, end, thread);
    }
}

static void work(quill_pool *p, int thread) {
    for (int i = 0; i < p->n_threads; i++) work_share(p, &p->shares[(thread + i) % p->n_threads], thread);
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
    p->shares = aligned_alloc(_Alignof(share), (size_t)n_threads * sizeof *p->shares);
    if (!p->threads || !p->args || !p->shares) {
        free(p->threads);
        free(p->args);
        free(p->shares);
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
    free(p->shares);
    free(p);
}

int quill_pool_size(const quill_pool *p) { return p->n_threads; }

void quill_pool_run(quill_pool *p, quill_task_fn fn, void *ctx, int64_t n_items, int64_t grain) {
    if (n_items <= 0) return;
    if (grain < 1) grain = 1;
    if (!p || p->n_threads == 1 || n_items <= grain) {
        fn(ctx, 0, n_items, 0);
        return;
    }
    p->fn = fn;
    p->ctx = ctx;
    p->grain = grain;
    for (int t = 0; t < p->n_threads; t++) {
        atomic_store_explicit(&p->shares[t].next, n_items * t / p->n_threads, memory_order_relaxed);
        p->shares[t].end = n_items * (t + 1) / p->n_threads;
    }
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

typedef struct {
    const quill_pool_task *tasks;
    int n_tasks;
} joined_job;

/* Items [begin, end) of the joined range, handed to the jobs they belong to. */
static void joined_items(void *arg, int64_t begin, int64_t end, int thread) {
    const joined_job *j = arg;
    int64_t first = 0; /* the joined index of job t's item 0 */
    for (int t = 0; t < j->n_tasks && begin < end; t++) {
        const int64_t past = first + (j->tasks[t].n_items > 0 ? j->tasks[t].n_items : 0);
        if (begin < past) {
            const int64_t stop = end < past ? end : past;
            j->tasks[t].fn(j->tasks[t].ctx, begin - first, stop - first, thread);
            begin = stop;
        }
        first = past;
    }
}

void quill_pool_run_joined(quill_pool *p, const quill_pool_task *tasks, int n_tasks, int64_t grain) {
    int64_t total = 0;
    for (int t = 0; t < n_tasks; t++) total += tasks[t].n_items > 0 ? tasks[t].n_items : 0;
    joined_job j = {tasks, n_tasks};
    quill_pool_run(p, joined_items, &j, total, grain);
}
