/* The pool shares the machine. Decoding runs hundreds of small parallel loops per token, so a
 * waiting thread spins briefly (waking a sleeping thread costs more than many loops take), then
 * sleeps on a futex so that it does not take a core another thread or process needs.
 *
 * The caller never waits for a thread that is not working: it does every item itself if no worker
 * comes, and then waits only for the workers that claimed items and are still computing them. A
 * worker that arrives after the last item was claimed finds nothing and goes back to waiting. With
 * more threads than free cores (a busy machine, or -t above the CPU count) a job therefore costs
 * no more than the threads that actually got a core; when every worker had to run once per job,
 * each job waited for a scheduler time slice per descheduled worker (2 cores: 21,000 tokens/s
 * with 2 threads, 29 with 16, 2 with 200).
 *
 * At most (CPUs - 1) workers spin or are woken per job; the others sleep until a spinning slot is
 * free. Thread indices stay 0 .. size-1, so per-thread scratch memory is unchanged.
 *
 * Each share is a contiguous run of the items; a thread claims chunks of `grain` items from the
 * front of its own share, and when it is empty takes the back half of what is left of the fullest
 * other share, so faster threads take more. Contiguous runs matter for decoding: a matrix-vector
 * product streams its rows, prefetching ahead, and with items dealt round-robin from one counter
 * those rows were often the other thread's (chunks of 2 tiles ran at 7.4 GB/s against 12.4 for
 * contiguous halves). For the same reason a thread that runs out takes the back of another's share,
 * one new stream for it and none broken for the owner; taking the owner's next chunk, as the pool
 * did before, took the rows the owner had just prefetched, chunk after chunk to the end of the job
 * (2-thread decoding q4_0 +2 %, q6_K +6 %; a 2048 x 2048 q4_0 product alone +24 %). There are
 * min(threads, CPUs) shares: more threads than CPUs cannot run at once, and finer shares would
 * interleave the threads that do.
 *
 * A thread that waits is idle while memory is too: between a token's products the caller runs
 * norms, attention and the next input's quantization alone, and at the end of a product one
 * thread waits for the other's last chunk. The caller may announce the memory of a coming job
 * (quill_pool_warm); a waiting thread then prefetches the first WARM_BYTES of its part of it, a
 * few lines between its looks at `generation`, so that its next start reads from L2 and memory
 * is read in those gaps too (2-thread decoding +1.5-2 %, forward.c). Announcements are plain
 * atomic words without a lock: a torn one only prefetches the wrong bytes, and prefetches of
 * unmapped memory do not fault.
 *
 * Joining a job, worker side:  active += 1;  then proceed only if closed == generation - 1.
 * Closing it, caller side:     closed = generation;  then wait until active == 0.
 * Both pairs are sequentially consistent, so either the caller sees the worker in `active` and
 * waits for it, or the worker sees the job closed and leaves the job's state alone, which the
 * caller then rewrites for the next job. */
#if defined(__linux__)
#define _GNU_SOURCE /* sched_getaffinity, CPU_COUNT */
#endif
#include "base/threadpool.h"

#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#if defined(__linux__)
#include <linux/futex.h>
#include <sys/syscall.h>
#endif

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#elif defined(__aarch64__)
#define cpu_relax() __asm__ __volatile__("yield")
#else
#define cpu_relax() ((void)0)
#endif

/* About 0.1-0.3 ms of pausing: longer than the gap between two loops of one token, short enough
 * not to steal much from other processes. */
#define SPIN_ROUNDS 2000

/* Bytes of an announced job (quill_pool_warm) a waiting thread prefetches for its part, and how
 * many at a time between its looks for the job. */
#define WARM_BYTES ((size_t)256 << 10)
#define WARM_STEP 512

typedef struct {
    struct quill_pool *pool;
    int index;
} worker_arg;

/* The announced memory of share s, written by the caller, read by the waiting threads. Torn
 * reads are harmless: a prefetch changes no result and does not fault. */
typedef struct {
    _Alignas(64) _Atomic uintptr_t from;
    _Atomic size_t bytes;
} warm_target;

/* How far one thread got through the announcement numbered seq. */
typedef struct {
    unsigned seq;
    size_t done;
} warm_progress;

/* A share's unclaimed items are [next, end), one word so that the front (its owner) and the back
 * (the others) are claimed with one compare-and-swap: next in the high 32 bits, end in the low.
 * Own cache line, so that claiming from one's own share does not contend with the other threads. */
typedef struct {
    _Alignas(64) _Atomic uint64_t range;
} share;

static inline uint64_t share_range(int64_t next, int64_t end) { return (uint64_t)next << 32 | (uint64_t)end; }
static inline int64_t range_next(uint64_t r) { return (int64_t)(r >> 32); }
static inline int64_t range_end(uint64_t r) { return (int64_t)(r & 0xFFFFFFFFu); }

/* Without futexes (not Linux): the same wait/wake on a value, with one mutex and condition
 * variable per waited-on word. */
typedef struct {
    pthread_mutex_t lock;
    pthread_cond_t cond;
} wait_slot;

struct quill_pool {
    int n_threads;   /* counting the caller */
    int n_shares;    /* min(n_threads, CPUs) */
    int max_spinning; /* min(n_threads, CPUs) - 1: workers that spin or are woken for a job */
    pthread_t *threads;
    worker_arg *args;
    share *shares;
    warm_target *warm;           /* n_shares */
    _Alignas(64) atomic_uint warm_seq; /* changes with each announcement */
    warm_progress caller_warm;   /* the caller's (thread 0's) progress */
    /* the current job, written by the caller only while no worker is inside a job */
    quill_task_fn fn;
    void *ctx;
    int64_t grain;
    /* written by the caller once per job, read by waiting workers */
    _Alignas(64) atomic_uint generation; /* the latest job; workers wait for it to change */
    atomic_uint closed;                  /* the latest job whose items are all claimed */
    atomic_bool stop;
    /* written by workers */
    _Alignas(64) atomic_uint active;     /* workers inside a job; the caller waits for 0 */
    atomic_bool caller_waiting;
    _Alignas(64) atomic_int spinning;    /* workers spinning for the next job */
    atomic_int sleeping;                 /* workers asleep (or about to be) on `generation` */
    wait_slot generation_slot, active_slot;
};

#if defined(__linux__)
static void wait_while_equal(atomic_uint *word, unsigned value, wait_slot *slot) {
    (void)slot;
    /* returns early on a change, a signal or a spurious wake: callers re-check */
    syscall(SYS_futex, (unsigned *)word, FUTEX_WAIT_PRIVATE, value, NULL, NULL, 0);
}
static void wake(atomic_uint *word, int count, wait_slot *slot) {
    (void)slot;
    syscall(SYS_futex, (unsigned *)word, FUTEX_WAKE_PRIVATE, count, NULL, NULL, 0);
}
#else
static void wait_while_equal(atomic_uint *word, unsigned value, wait_slot *slot) {
    pthread_mutex_lock(&slot->lock);
    if (atomic_load(word) == value) pthread_cond_wait(&slot->cond, &slot->lock);
    pthread_mutex_unlock(&slot->lock);
}
static void wake(atomic_uint *word, int count, wait_slot *slot) {
    (void)word;
    pthread_mutex_lock(&slot->lock);
    if (count == 1) pthread_cond_signal(&slot->cond);
    else pthread_cond_broadcast(&slot->cond);
    pthread_mutex_unlock(&slot->lock);
}
#endif

/* The CPUs this process may run on (its affinity mask, e.g. taskset or a container's cpuset). */
static int usable_cpus(void) {
#if defined(__linux__)
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
        int n = CPU_COUNT(&set);
        if (n > 0) return n;
    }
#endif
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (n < INT_MAX ? (int)n : INT_MAX) : 1;
}

/* Claims up to `grain` items from the front of s into [*begin, *end); false when it is empty. */
static bool claim_front(share *s, int64_t grain, int64_t *begin, int64_t *end) {
    uint64_t r = atomic_load_explicit(&s->range, memory_order_relaxed);
    for (;;) {
        const int64_t next = range_next(r), stop = range_end(r);
        if (next >= stop) return false;
        const int64_t take = stop - next < grain ? stop - next : grain;
        if (atomic_compare_exchange_weak_explicit(&s->range, &r, share_range(next + take, stop), memory_order_relaxed,
                                                  memory_order_relaxed)) {
            *begin = next;
            *end = next + take;
            return true;
        }
    }
}

/* Claims the back half (rounded up) of what is left of s; false when it is empty. */
static bool claim_back_half(share *s, int64_t *begin, int64_t *end) {
    uint64_t r = atomic_load_explicit(&s->range, memory_order_relaxed);
    for (;;) {
        const int64_t next = range_next(r), stop = range_end(r);
        if (next >= stop) return false;
        const int64_t from = stop - (stop - next + 1) / 2;
        if (atomic_compare_exchange_weak_explicit(&s->range, &r, share_range(next, from), memory_order_relaxed,
                                                  memory_order_relaxed)) {
            *begin = from;
            *end = stop;
            return true;
        }
    }
}

/* Prefetches the next WARM_STEP bytes of thread's part of the announced job; false when there
 * is nothing (more) to prefetch. */
static bool warm_step(quill_pool *p, int thread, warm_progress *w) {
    if (thread >= p->n_shares) return false;
    const unsigned seq = atomic_load_explicit(&p->warm_seq, memory_order_acquire);
    if (seq != w->seq) *w = (warm_progress){seq, 0};
    const warm_target *t = &p->warm[thread];
    /* an address as an integer: a torn read may pair a withdrawn (null) start with a length */
    const uintptr_t from = atomic_load_explicit(&t->from, memory_order_relaxed);
    const size_t bytes = atomic_load_explicit(&t->bytes, memory_order_relaxed);
    if (!from || w->done >= bytes) return false;
    for (int i = 0; i < WARM_STEP / 64 && w->done < bytes; i++, w->done += 64)
        __builtin_prefetch((const void *)(from + w->done), 0, 2);
    return true;
}

void quill_pool_warm(quill_pool *p, const quill_pool_span *spans, int n_spans) {
    if (!p || p->n_shares < 2) return;
    size_t total = 0;
    for (int i = 0; i < n_spans; i++) total += spans[i].bytes;
    for (int s = 0; s < p->n_shares; s++) {
        /* share s's first byte, as the job's items will be split (equal items: bytes ∝ items) */
        const size_t at = total / (size_t)p->n_shares * (size_t)s + total % (size_t)p->n_shares * (size_t)s / (size_t)p->n_shares;
        uintptr_t from = 0;
        size_t bytes = 0, start = 0;
        for (int i = 0; i < n_spans; i++) {
            if (at < start + spans[i].bytes) {
                from = (uintptr_t)spans[i].addr + (at - start);
                bytes = start + spans[i].bytes - at < WARM_BYTES ? start + spans[i].bytes - at : WARM_BYTES;
                break;
            }
            start += spans[i].bytes;
        }
        atomic_store_explicit(&p->warm[s].from, from, memory_order_relaxed);
        atomic_store_explicit(&p->warm[s].bytes, bytes, memory_order_relaxed);
    }
    atomic_fetch_add_explicit(&p->warm_seq, 1, memory_order_release);
}

void quill_pool_warm_target(const quill_pool *p, int s, const void **from, size_t *bytes) {
    *from = NULL;
    *bytes = 0;
    if (!p || s < 0 || s >= p->n_shares) return;
    *from = (const void *)atomic_load_explicit(&p->warm[s].from, memory_order_relaxed);
    *bytes = atomic_load_explicit(&p->warm[s].bytes, memory_order_relaxed);
}

static void work(quill_pool *p, int thread) {
    share *own = &p->shares[thread % p->n_shares];
    /* the only thread that claims from the front of its share, so it may refill it */
    const bool sole_owner = p->n_threads <= p->n_shares;
    int64_t begin, end;
    for (;;) {
        while (claim_front(own, p->grain, &begin, &end)) p->fn(p->ctx, begin, end, thread);
        share *fullest = NULL;
        int64_t most = 0;
        for (int i = 0; i < p->n_shares; i++) {
            const uint64_t r = atomic_load_explicit(&p->shares[i].range, memory_order_relaxed);
            if (range_end(r) - range_next(r) > most) {
                most = range_end(r) - range_next(r);
                fullest = &p->shares[i];
            }
        }
        if (!fullest) return;
        if (!claim_back_half(fullest, &begin, &end)) continue;
        if (sole_owner) {
            /* empty, and nobody else changes an empty share: the taken run becomes ours to share in turn */
            atomic_store_explicit(&own->range, share_range(begin, end), memory_order_relaxed);
            continue;
        }
        for (int64_t at = begin; at < end; at += p->grain)
            p->fn(p->ctx, at, end - at < p->grain ? end : at + p->grain, thread);
    }
}

/* Returns once `generation` differs from `seen` or the pool stops. */
static unsigned wait_for_job(quill_pool *p, int index, unsigned seen, warm_progress *warm) {
    unsigned gen = atomic_load_explicit(&p->generation, memory_order_acquire);
    if (gen != seen) return gen;
    int spinning = atomic_load_explicit(&p->spinning, memory_order_relaxed);
    while (spinning < p->max_spinning &&
           !atomic_compare_exchange_weak_explicit(&p->spinning, &spinning, spinning + 1, memory_order_relaxed,
                                                  memory_order_relaxed)) {
    }
    if (spinning < p->max_spinning) {
        for (int i = 0; i < SPIN_ROUNDS && gen == seen; i++) {
            if (!warm_step(p, index, warm)) cpu_relax();
            gen = atomic_load_explicit(&p->generation, memory_order_acquire);
        }
        atomic_fetch_sub_explicit(&p->spinning, 1, memory_order_relaxed);
        if (gen != seen) return gen;
    }
    for (;;) {
        /* announce the sleep, then re-check: the caller stores `generation` before reading `sleeping` */
        atomic_fetch_add(&p->sleeping, 1);
        if (atomic_load(&p->generation) == seen && !atomic_load(&p->stop))
            wait_while_equal(&p->generation, seen, &p->generation_slot);
        atomic_fetch_sub(&p->sleeping, 1);
        gen = atomic_load(&p->generation);
        if (gen != seen || atomic_load(&p->stop)) return gen;
    }
}

static void *worker_main(void *arg) {
    quill_pool *p = ((worker_arg *)arg)->pool;
    const int index = ((worker_arg *)arg)->index;
    /* Generation 0 is "no job yet": reading the counter here instead could skip a job posted
     * before this thread got to run. */
    unsigned seen = 0;
    warm_progress warm = {0, 0};
    for (;;) {
        const unsigned gen = wait_for_job(p, index, seen, &warm);
        if (atomic_load(&p->stop)) return NULL;
        seen = gen;
        atomic_fetch_add(&p->active, 1);
        if (atomic_load(&p->closed) == gen - 1u) work(p, index);
        if (atomic_fetch_sub(&p->active, 1) == 1 && atomic_load(&p->caller_waiting))
            wake(&p->active, 1, &p->active_slot);
    }
}

quill_pool *quill_pool_new(int n_threads) {
    if (n_threads < 1) n_threads = 1;
    const size_t bytes = (sizeof(quill_pool) + _Alignof(quill_pool) - 1) / _Alignof(quill_pool) * _Alignof(quill_pool);
    quill_pool *p = aligned_alloc(_Alignof(quill_pool), bytes);
    if (!p) return NULL;
    memset(p, 0, bytes);
    p->n_threads = n_threads;
    const int cpus = usable_cpus();
    p->n_shares = n_threads < cpus ? n_threads : cpus;
    p->max_spinning = p->n_shares - 1;
    pthread_mutex_init(&p->generation_slot.lock, NULL);
    pthread_cond_init(&p->generation_slot.cond, NULL);
    pthread_mutex_init(&p->active_slot.lock, NULL);
    pthread_cond_init(&p->active_slot.cond, NULL);
    p->threads = calloc((size_t)n_threads, sizeof *p->threads);
    p->args = calloc((size_t)n_threads, sizeof *p->args);
    p->shares = aligned_alloc(_Alignof(share), (size_t)p->n_shares * sizeof *p->shares);
    p->warm = aligned_alloc(_Alignof(warm_target), (size_t)p->n_shares * sizeof *p->warm);
    if (p->warm) memset(p->warm, 0, (size_t)p->n_shares * sizeof *p->warm);
    if (!p->threads || !p->args || !p->shares || !p->warm) {
        p->n_threads = 1;
        quill_pool_free(p);
        return NULL;
    }
    /* Workers block the signals that terminals, shells and service managers send to a process
     * (they inherit the mask at creation), so that those reach a thread that waits for them.
     * Taken by a worker, quill chat's second Ctrl-C set its flag while the main thread stayed in
     * ppoll, which only a signal to itself ends: the chat hung (seen once in CI, 2026-11-26).
     * Other signals (SIGUSR1, which the pool's tests send to a worker by name; faults) still
     * reach the worker. */
    static const int process_signals[] = {SIGINT, SIGQUIT, SIGTERM, SIGHUP, SIGTSTP, SIGWINCH, SIGCHLD, SIGALRM};
    sigset_t block, old;
    sigemptyset(&block);
    for (size_t i = 0; i < sizeof process_signals / sizeof process_signals[0]; i++) sigaddset(&block, process_signals[i]);
    pthread_sigmask(SIG_BLOCK, &block, &old);
    for (int i = 1; i < n_threads; i++) {
        p->args[i] = (worker_arg){p, i};
        if (pthread_create(&p->threads[i], NULL, worker_main, &p->args[i]) != 0) {
            pthread_sigmask(SIG_SETMASK, &old, NULL);
            p->n_threads = i;
            quill_pool_free(p);
            return NULL;
        }
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return p;
}

void quill_pool_free(quill_pool *p) {
    if (!p) return;
    /* stop first, then change the generation, so that a worker woken by the change sees stop */
    atomic_store(&p->stop, true);
    atomic_fetch_add(&p->generation, 1);
    wake(&p->generation, INT_MAX, &p->generation_slot);
    for (int i = 1; i < p->n_threads; i++) pthread_join(p->threads[i], NULL);
    pthread_mutex_destroy(&p->generation_slot.lock);
    pthread_cond_destroy(&p->generation_slot.cond);
    pthread_mutex_destroy(&p->active_slot.lock);
    pthread_cond_destroy(&p->active_slot.cond);
    free(p->threads);
    free(p->args);
    free(p->shares);
    free(p->warm);
    free(p);
}

int quill_pool_size(const quill_pool *p) { return p->n_threads; }

int quill_pool_shares(const quill_pool *p) { return p ? p->n_shares : 1; }

void quill_pool_run(quill_pool *p, quill_task_fn fn, void *ctx, int64_t n_items, int64_t grain) {
    if (n_items <= 0) return;
    if (grain < 1) grain = 1;
    if (!p || p->n_shares == 1 || n_items <= grain || n_items > (int64_t)UINT32_MAX) { /* a share is 32-bit */
        fn(ctx, 0, n_items, 0);
        return;
    }
    p->fn = fn;
    p->ctx = ctx;
    p->grain = grain;
    for (int s = 0; s < p->n_shares; s++)
        atomic_store_explicit(&p->shares[s].range, share_range(n_items * s / p->n_shares, n_items * (s + 1) / p->n_shares),
                              memory_order_relaxed);
    const unsigned gen = atomic_load_explicit(&p->generation, memory_order_relaxed) + 1u;
    atomic_store(&p->generation, gen);
    /* Wake sleepers only up to (CPUs - 1) workers awake. Awake workers are not necessarily running
     * (a busy machine): the caller does their items if they do not come, and a worker that comes
     * late finds the job closed. */
    const int sleeping = atomic_load(&p->sleeping);
    if (sleeping > 0) {
        const int awake = p->n_threads - 1 - sleeping;
        int want = p->max_spinning - awake;
        if (want > sleeping) want = sleeping;
        if (want > 0) wake(&p->generation, want, &p->generation_slot);
    }
    work(p, 0);
    atomic_store(&p->closed, gen);
    /* only workers still computing claimed items remain: a short spin, then sleep */
    for (int spins = 0; spins < SPIN_ROUNDS; spins++) {
        if (atomic_load(&p->active) == 0) return;
        if (!warm_step(p, 0, &p->caller_warm)) cpu_relax();
    }
    atomic_store(&p->caller_waiting, true);
    for (unsigned a; (a = atomic_load(&p->active)) != 0;) wait_while_equal(&p->active, a, &p->active_slot);
    atomic_store_explicit(&p->caller_waiting, false, memory_order_relaxed);
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
