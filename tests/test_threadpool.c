/* The thread pool (threadpool.c): every item runs exactly once for any item count, chunk size and
 * thread count; each thread starts on its own contiguous share; a thread that is held up has its
 * share finished by the others. */
#include "test.h"

#include "base/threadpool.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

typedef struct {
    atomic_int *runs;     /* per item: how many times it ran */
    int *ran_on;          /* per item: the thread that ran it */
    int64_t first[8];     /* per thread: the first item it ran (-1: none) */
    atomic_int started[8];
    int slow_thread;      /* this thread sleeps on its first chunk (-1: none) */
} count_job;

static void count_items(void *arg, int64_t begin, int64_t end, int thread) {
    count_job *j = arg;
    if (atomic_fetch_add(&j->started[thread], 1) == 0) {
        j->first[thread] = begin;
        if (thread == j->slow_thread) nanosleep(&(struct timespec){0, 50 * 1000 * 1000}, NULL);
    }
    for (int64_t i = begin; i < end; i++) {
        atomic_fetch_add(&j->runs[i], 1);
        j->ran_on[i] = thread;
    }
}

static count_job *new_job(int64_t n) {
    count_job *j = calloc(1, sizeof *j);
    j->runs = calloc((size_t)(n > 0 ? n : 1), sizeof *j->runs);
    j->ran_on = calloc((size_t)(n > 0 ? n : 1), sizeof *j->ran_on);
    for (int t = 0; t < 8; t++) j->first[t] = -1;
    j->slow_thread = -1;
    return j;
}

static void free_job(count_job *j) {
    free(j->runs);
    free(j->ran_on);
    free(j);
}

TEST(pool_runs_every_item_once) {
    const int64_t sizes[] = {0, 1, 2, 3, 7, 64, 1000, 4097};
    const int64_t grains[] = {1, 2, 5, 64, 10000};
    for (int threads = 1; threads <= 4; threads++) {
        quill_pool *pool = quill_pool_new(threads);
        CHECK(pool != NULL);
        CHECK_EQ_INT(quill_pool_size(pool), threads);
        for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
            for (size_t g = 0; g < sizeof grains / sizeof *grains; g++) {
                count_job *j = new_job(sizes[s]);
                /* twice in a row: the second job must not see the first one's claims */
                for (int rep = 0; rep < 2; rep++) quill_pool_run(pool, count_items, j, sizes[s], grains[g]);
                for (int64_t i = 0; i < sizes[s]; i++) {
                    if (atomic_load(&j->runs[i]) != 2) {
                        test_fail(__FILE__, __LINE__, "%d threads, %lld items, grain %lld: item %lld ran %d times, not twice",
                                  threads, (long long)sizes[s], (long long)grains[g], (long long)i, atomic_load(&j->runs[i]));
                        free_job(j);
                        quill_pool_free(pool);
                        return;
                    }
                }
                free_job(j);
            }
        }
        quill_pool_free(pool);
    }
}

TEST(pool_threads_start_on_their_own_share) {
    /* Each thread's first chunk comes from its own share [n·t/threads, n·(t+1)/threads) (its
     * front, unless a faster thread already took some of it). */
    const int threads = 3;
    const int64_t n = 300;
    quill_pool *pool = quill_pool_new(threads);
    CHECK(pool != NULL);
    count_job *j = new_job(n);
    quill_pool_run(pool, count_items, j, n, 1);
    for (int t = 0; t < threads; t++) {
        const int64_t lo = n * t / threads, hi = n * (t + 1) / threads;
        if (j->first[t] >= 0 && (j->first[t] < lo || j->first[t] >= hi)) {
            test_fail(__FILE__, __LINE__, "thread %d started at item %lld, outside its share [%lld, %lld)", t,
                      (long long)j->first[t], (long long)lo, (long long)hi);
            break;
        }
    }
    free_job(j);
    quill_pool_free(pool);
}

TEST(pool_others_finish_a_held_up_share) {
    /* The calling thread (0) sleeps 50 ms on its first item; the worker finishes its own share in
     * far less and must then take the rest of thread 0's share. */
    const int64_t n = 200;
    quill_pool *pool = quill_pool_new(2);
    CHECK(pool != NULL);
    count_job *j = new_job(n);
    j->slow_thread = 0;
    quill_pool_run(pool, count_items, j, n, 1);
    int64_t by_worker_in_share0 = 0;
    for (int64_t i = 0; i < n; i++) {
        if (atomic_load(&j->runs[i]) != 1) {
            test_fail(__FILE__, __LINE__, "item %lld ran %d times", (long long)i, atomic_load(&j->runs[i]));
            break;
        }
        if (i < n / 2 && j->ran_on[i] == 1) by_worker_in_share0++;
    }
    free_job(j);
    quill_pool_free(pool);
    CHECK(by_worker_in_share0 > n / 4, "the worker took %lld of the held-up share's %lld items",
          (long long)by_worker_in_share0, (long long)(n / 2));
}

/* Joined jobs: each job's items run exactly once, with the job's own item numbers, whatever the
 * thread count and chunk size; empty jobs and a NULL pool included. */
TEST(pool_joined_jobs_run_each_item_once) {
    const int64_t sizes[][4] = {{0, 0, 0, 0}, {5, 0, 17, 1}, {1, 1, 1, 1}, {64, 3, 0, 200}, {1000, 16, 16, 7}};
    const int64_t grains[] = {1, 3, 64};
    for (int threads = 0; threads <= 3; threads++) {
        quill_pool *pool = threads ? quill_pool_new(threads) : NULL; /* 0: no pool */
        CHECK(threads == 0 || pool != NULL);
        for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
            for (size_t g = 0; g < sizeof grains / sizeof *grains; g++) {
                count_job *jobs[4];
                quill_pool_task tasks[4];
                for (int t = 0; t < 4; t++) {
                    jobs[t] = new_job(sizes[s][t]);
                    tasks[t] = (quill_pool_task){count_items, jobs[t], sizes[s][t]};
                }
                quill_pool_run_joined(pool, tasks, 4, grains[g]);
                for (int t = 0; t < 4; t++) {
                    for (int64_t i = 0; i < sizes[s][t]; i++)
                        if (atomic_load(&jobs[t]->runs[i]) != 1)
                            test_fail(__FILE__, __LINE__, "%d threads, sizes %zu, grain %lld: job %d item %lld ran %d times",
                                      threads, s, (long long)grains[g], t, (long long)i,
                                      atomic_load(&jobs[t]->runs[i]));
                    free_job(jobs[t]);
                }
            }
        }
        quill_pool_free(pool);
    }
}
