/* The thread pool (threadpool.c): every item runs exactly once for any item count, chunk size and
 * thread count; each thread starts on its own contiguous share; a thread that is held up has its
 * share finished by the others, from its back; the caller never waits for a worker that is not working; waiting
 * workers sleep; more threads than CPUs give the same logits and do not stall. */
#include "test.h"

#include "base/threadpool.h"
#include "quill.h"

#include <dirent.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

typedef struct {
    atomic_int *runs;     /* per item: how many times it ran */
    int *ran_on;          /* per item: the thread that ran it */
    int64_t first[8];     /* per thread: the first item it ran (-1: none) */
    int64_t half;         /* items below it are share 0's with two shares */
    int64_t first_in_share0[8]; /* per thread: the first chunk it ran below `half` (-1: none) */
    atomic_int started[8];
    int slow_thread;      /* this thread sleeps on its first chunk (-1: none) */
    long item_ns;         /* every chunk sleeps this long per item */
    long slow_item_ns;    /* and slow_thread's this long more */
} count_job;

static void count_items(void *arg, int64_t begin, int64_t end, int thread) {
    count_job *j = arg;
    if (atomic_fetch_add(&j->started[thread], 1) == 0) {
        j->first[thread] = begin;
        if (thread == j->slow_thread) nanosleep(&(struct timespec){0, 50 * 1000 * 1000}, NULL);
    }
    if (j->item_ns) nanosleep(&(struct timespec){0, j->item_ns * (end - begin)}, NULL);
    if (thread == j->slow_thread && j->slow_item_ns) nanosleep(&(struct timespec){0, j->slow_item_ns * (end - begin)}, NULL);
    if (begin < j->half && j->first_in_share0[thread] < 0) j->first_in_share0[thread] = begin;
    for (int64_t i = begin; i < end; i++) {
        atomic_fetch_add(&j->runs[i], 1);
        j->ran_on[i] = thread;
    }
}

static count_job *new_job(int64_t n) {
    count_job *j = calloc(1, sizeof *j);
    j->runs = calloc((size_t)(n > 0 ? n : 1), sizeof *j->runs);
    j->ran_on = calloc((size_t)(n > 0 ? n : 1), sizeof *j->ran_on);
    for (int t = 0; t < 8; t++) j->first[t] = j->first_in_share0[t] = -1;
    j->half = n / 2;
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
    /* Each thread's first chunk comes from its share s = t % shares, [n·s/shares, n·(s+1)/shares)
     * (its front, unless a faster thread already took some of it), unless that share was already
     * empty when the thread arrived: on a busy machine a late thread (3 threads on 2 shares, and
     * the caller shares its share) finds it all claimed and takes the back of another. It then runs
     * nothing of its own share, which is what is checked in that case. */
    const int threads = 3;
    const int64_t n = 300;
    quill_pool *pool = quill_pool_new(threads);
    CHECK(pool != NULL);
    const int shares = quill_pool_shares(pool);
    count_job *j = new_job(n);
    quill_pool_run(pool, count_items, j, n, 1);
    for (int t = 0; t < threads; t++) {
        const int s = t % shares;
        const int64_t lo = n * s / shares, hi = n * (s + 1) / shares;
        if (j->first[t] < 0 || (j->first[t] >= lo && j->first[t] < hi)) continue;
        int64_t own = lo;
        while (own < hi && j->ran_on[own] != t) own++;
        if (own < hi) {
            test_fail(__FILE__, __LINE__,
                      "thread %d started at item %lld, outside its share [%lld, %lld), though item %lld of it was left for it",
                      t, (long long)j->first[t], (long long)lo, (long long)hi, (long long)own);
            break;
        }
    }
    free_job(j);
    quill_pool_free(pool);
}

TEST(pool_warm_points_each_share_at_its_part) {
    /* share s starts at byte total·s/shares of the spans laid end to end (items of equal size) and
     * prefetches from there, never past the end of the span it starts in */
    quill_pool *pool = quill_pool_new(3);
    CHECK(pool != NULL);
    const int shares = quill_pool_shares(pool);
    static char a[1000], b[3000];
    char *c = malloc((size_t)2 << 20);
    CHECK(c != NULL);
    const quill_pool_span spans[3] = {{a, sizeof a}, {b, sizeof b}, {c, (size_t)2 << 20}};
    const size_t total = sizeof a + sizeof b + ((size_t)2 << 20);
    quill_pool_warm(pool, spans, 3);
    for (int s = 0; s < 3; s++) {
        const void *from;
        size_t bytes;
        quill_pool_warm_target(pool, s, &from, &bytes);
        if (s >= shares || shares < 2) {
            CHECK(bytes == 0, "share %d of %d: %zu bytes to prefetch", s, shares, bytes);
            continue;
        }
        const size_t at = total * (size_t)s / (size_t)shares;
        size_t start = 0;
        int i = 0;
        while (at >= start + spans[i].bytes) start += spans[i++].bytes;
        const char *want = (const char *)spans[i].addr + (at - start);
        CHECK(from == want, "share %d of %d: prefetches from %p, not %p (span %d, byte %zu)", s, shares, from,
              (const void *)want, i, at - start);
        CHECK(bytes > 0 && bytes <= start + spans[i].bytes - at, "share %d: %zu bytes from byte %zu of a %zu-byte span", s,
              bytes, at - start, spans[i].bytes);
    }
    quill_pool_warm(pool, NULL, 0); /* withdrawn */
    for (int s = 0; s < shares; s++) {
        const void *from;
        size_t bytes;
        quill_pool_warm_target(pool, s, &from, &bytes);
        CHECK(bytes == 0, "share %d still prefetches %zu bytes after the announcement was withdrawn", s, bytes);
    }
    quill_pool_warm(NULL, spans, 3); /* no pool: nothing to do */
    free(c);
    quill_pool_free(pool);
}

TEST(pool_warm_of_memory_gone_is_harmless) {
    /* An announcement is a hint: memory unmapped after it (a model freed before its pool) is only
     * prefetched, which never faults, and jobs still run every item once. */
    quill_pool *pool = quill_pool_new(2);
    CHECK(pool != NULL);
    const size_t size = (size_t)4 << 20;
    void *mem = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(mem != MAP_FAILED);
    quill_pool_warm(pool, &(quill_pool_span){mem, size}, 1);
    munmap(mem, size);
    for (int rep = 0; rep < 50; rep++) {
        count_job *j = new_job(64);
        quill_pool_run(pool, count_items, j, 64, 1);
        for (int64_t i = 0; i < 64; i++) CHECK(atomic_load(&j->runs[i]) == 1, "item %lld ran %d times", (long long)i, atomic_load(&j->runs[i]));
        free_job(j);
        nanosleep(&(struct timespec){0, 20 * 1000}, NULL); /* the worker waits, prefetching */
    }
    quill_pool_free(pool);
}

/* A pool of 2 threads with a share each, or NULL (the test skipped) on a machine with one CPU. */
static quill_pool *two_share_pool(void) {
    quill_pool *pool = quill_pool_new(2);
    if (!pool) {
        test_fail(__FILE__, __LINE__, "quill_pool_new(2) failed");
        return NULL;
    }
    if (quill_pool_shares(pool) < 2) {
        quill_pool_free(pool);
        test_skip("one usable CPU: the caller runs every item");
        return NULL;
    }
    return pool;
}

TEST(pool_others_finish_a_held_up_share) {
    /* The calling thread (0) sleeps 50 ms on its first item; the worker finishes its own share in
     * far less and must then take the rest of thread 0's share. (A run where the worker was
     * descheduled for those 50 ms, as on a busy machine, is tried again: 3 tries.) */
    const int64_t n = 200;
    quill_pool *pool = two_share_pool();
    if (!pool) return;
    int64_t by_worker_in_share0 = 0;
    for (int attempt = 0; attempt < 3 && by_worker_in_share0 <= n / 4; attempt++) {
        count_job *j = new_job(n);
        j->slow_thread = 0;
        quill_pool_run(pool, count_items, j, n, 1);
        by_worker_in_share0 = 0;
        for (int64_t i = 0; i < n; i++) {
            if (atomic_load(&j->runs[i]) != 1) {
                test_fail(__FILE__, __LINE__, "item %lld ran %d times", (long long)i, atomic_load(&j->runs[i]));
                break;
            }
            if (i < n / 2 && j->ran_on[i] == 1) by_worker_in_share0++;
        }
        free_job(j);
    }
    quill_pool_free(pool);
    CHECK(by_worker_in_share0 > n / 4, "the worker took %lld of the held-up share's %lld items",
          (long long)by_worker_in_share0, (long long)(n / 2));
}

TEST(pool_thief_takes_the_back_of_a_share) {
    /* Decoding streams each thread's rows front to back. The caller sleeps 50 ms on its first item
     * and then takes 0.4 ms an item, the worker 0.2 ms; the worker, done with its own share, must
     * take the rest of the caller's from the back, not the item the caller would claim next: its
     * first item in the caller's share lies in that share's back half. (The caller may later take
     * back part of the run the worker took, when the worker is descheduled on a busy machine; so
     * only the first theft is checked.) A run where the worker never reached the caller's share
     * (descheduled throughout) is tried again. */
    const int64_t n = 200;
    quill_pool *pool = two_share_pool();
    if (!pool) return;
    int64_t stolen_first = -1;
    int by_caller_first = 0;
    for (int attempt = 0; attempt < 3 && stolen_first < 0; attempt++) {
        count_job *j = new_job(n);
        j->slow_thread = 0;
        j->item_ns = 200 * 1000;
        j->slow_item_ns = 200 * 1000;
        quill_pool_run(pool, count_items, j, n, 1);
        stolen_first = j->first_in_share0[1];
        by_caller_first = j->ran_on[0] == 0;
        free_job(j);
    }
    quill_pool_free(pool);
    CHECK(stolen_first >= 0, "the worker never ran an item of the caller's share in 3 tries");
    CHECK(by_caller_first, "the caller did not run the first item of its own share");
    CHECK(stolen_first >= n / 4, "the worker's first item in the caller's share is %lld: not from its back half [%lld, %lld)",
          (long long)stolen_first, (long long)(n / 4), (long long)(n / 2));
}

TEST(pool_caller_waits_for_a_working_worker) {
    /* A worker sleeps 50 ms inside its first chunk: the caller, out of items long before, must wait
     * (past its spin, asleep) until that chunk is done. Items take 20 us, so that the worker joins. */
    quill_pool *pool = quill_pool_new(2);
    CHECK(pool != NULL);
    int64_t not_once = -1;
    bool worker_joined = false;
    for (int rep = 0; rep < 3 && not_once < 0; rep++) {
        count_job *j = new_job(200);
        j->slow_thread = 1;
        j->item_ns = 20 * 1000;
        quill_pool_run(pool, count_items, j, 200, 1);
        for (int64_t i = 0; i < 200 && not_once < 0; i++)
            if (atomic_load(&j->runs[i]) != 1) not_once = i;
        worker_joined |= atomic_load(&j->started[1]) > 0;
        free_job(j);
    }
    quill_pool_free(pool);
    CHECK(not_once < 0, "item %lld had not run exactly once when the job returned", (long long)not_once);
    CHECK(worker_joined, "the worker never ran an item");
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

/* Workers parked in a signal handler stand for workers that get no core (a busy machine). */
static atomic_int parked_workers;
static atomic_bool release_workers;

static void park_worker(int sig) {
    (void)sig;
    atomic_fetch_add(&parked_workers, 1);
    while (!atomic_load(&release_workers)) nanosleep(&(struct timespec){0, 1000 * 1000}, NULL);
    atomic_fetch_sub(&parked_workers, 1);
}

/* Releases the workers after 3 s at the latest (a pool that waits for them then finishes late). */
static void *release_later(void *arg) {
    (void)arg;
    for (int ms = 0; ms < 3000 && !atomic_load(&release_workers); ms++)
        nanosleep(&(struct timespec){0, 1000 * 1000}, NULL);
    atomic_store(&release_workers, true);
    return NULL;
}

/* The thread ids of this process, ascending; returns how many (at most cap). */
static int list_threads(pid_t *tids, int cap) {
    DIR *d = opendir("/proc/self/task");
    if (!d) return 0;
    int n = 0;
    for (struct dirent *e; (e = readdir(d)) && n < cap;)
        if (e->d_name[0] != '.') tids[n++] = (pid_t)atoi(e->d_name);
    closedir(d);
    return n;
}

/* A new pool of n_threads, and the threads it started (its workers) in out, at most cap: the
 * process's threads after it, less those before. NULL when the pool cannot be made. */
static quill_pool *pool_and_its_threads(int n_threads, pid_t *out, int cap, int *n_out) {
    pid_t before[64], now[64];
    const int n_before = list_threads(before, 64);
    quill_pool *pool = quill_pool_new(n_threads);
    const int n_now = pool ? list_threads(now, 64) : 0;
    int n = 0;
    for (int i = 0; i < n_now && n < cap; i++) {
        bool old_thread = false;
        for (int k = 0; k < n_before; k++) old_thread |= now[i] == before[k];
        if (!old_thread) out[n++] = now[i];
    }
    *n_out = n;
    return pool;
}

TEST(pool_caller_never_waits_for_idle_workers) {
    /* Every worker of a 4-thread pool is held in a signal handler for 3 s; 100 jobs must all finish
     * before then, run by the caller alone. */
    pid_t after[64];
    int n_after;
    quill_pool *pool = pool_and_its_threads(4, after, 64, &n_after);
    CHECK(pool != NULL);
    struct sigaction sa = {.sa_handler = park_worker}, old_sa;
    sigemptyset(&sa.sa_mask);
    CHECK(sigaction(SIGUSR1, &sa, &old_sa) == 0);
    atomic_store(&parked_workers, 0);
    atomic_store(&release_workers, false);
    int signalled = 0;
    for (int i = 0; i < n_after; i++)
        if (syscall(SYS_tgkill, getpid(), after[i], SIGUSR1) == 0) signalled++;
    pthread_t releaser;
    bool releasing = pthread_create(&releaser, NULL, release_later, NULL) == 0;
    while (releasing && atomic_load(&parked_workers) < signalled && !atomic_load(&release_workers))
        nanosleep(&(struct timespec){0, 1000 * 1000}, NULL);
    const bool all_parked = signalled == 3 && atomic_load(&parked_workers) == 3;

    const int64_t n = 1000;
    count_job *j = new_job(n);
    for (int rep = 0; rep < 100; rep++) quill_pool_run(pool, count_items, j, n, 7);
    const bool finished_alone = !atomic_load(&release_workers);
    int64_t wrong = -1;
    for (int64_t i = 0; i < n && wrong < 0; i++)
        if (atomic_load(&j->runs[i]) != 100 || j->ran_on[i] != 0) wrong = i;

    atomic_store(&release_workers, true);
    if (releasing) pthread_join(releaser, NULL);
    while (atomic_load(&parked_workers) > 0) nanosleep(&(struct timespec){0, 1000 * 1000}, NULL);
    quill_pool_free(pool);
    sigaction(SIGUSR1, &old_sa, NULL);
    free_job(j);
    CHECK(releasing && all_parked, "could not hold the 3 workers (%d signalled)", signalled);
    CHECK(finished_alone, "100 jobs waited for workers that were not running");
    CHECK(wrong < 0, "item %lld did not run 100 times on the caller", (long long)wrong);
}

TEST(pool_workers_block_process_signals) {
    /* A Ctrl-C must reach the thread that waits for it (quill chat's main thread), never a worker:
     * every new thread of a pool has SIGINT and SIGTERM blocked (SigBlk in its /proc status). */
    pid_t after[64];
    int workers;
    quill_pool *pool = pool_and_its_threads(3, after, 64, &workers);
    CHECK(pool != NULL);
    int blocking = 0;
    for (int i = 0; i < workers; i++) {
        char path[64], line[256];
        snprintf(path, sizeof path, "/proc/self/task/%d/status", (int)after[i]);
        FILE *f = fopen(path, "r");
        unsigned long long mask = 0;
        while (f && fgets(line, sizeof line, f))
            if (sscanf(line, "SigBlk: %llx", &mask) == 1) break;
        if (f) fclose(f);
        const unsigned long long want = 1ull << (SIGINT - 1) | 1ull << (SIGTERM - 1);
        if ((mask & want) == want) blocking++;
    }
    quill_pool_free(pool);
    CHECK(workers == 2 && blocking == 2, "%d new threads, %d of them with SIGINT and SIGTERM blocked", workers, blocking);
}

TEST(pool_waiting_workers_sleep) {
    /* After a job, waiting workers spin briefly and then sleep: 300 ms of waiting by 7 workers
     * costs far less than 300 ms of CPU time. */
    quill_pool *pool = quill_pool_new(8);
    CHECK(pool != NULL);
    count_job *j = new_job(64);
    quill_pool_run(pool, count_items, j, 64, 1);
    free_job(j);
    struct timespec t0, t1;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t0);
    nanosleep(&(struct timespec){0, 300 * 1000 * 1000}, NULL);
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t1);
    quill_pool_free(pool);
    const double cpu_ms = (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6;
    CHECK(cpu_ms < 60, "idle workers used %.1f ms of CPU time in 300 ms", cpu_ms);
}

/* More threads than CPUs: the same logits as one thread, and a 999-thread run of the CLI does not
 * stall (it took minutes when every worker had to run once per parallel loop). */
TEST(pool_oversubscribed_threads_same_logits) {
    REQUIRE_SHARED(shared);
    char *path = path_join(shared, "models/stories260K.gguf");
    const int32_t tokens[] = {1, 403, 407, 261, 378, 10, 172, 394, 259, 390, 2, 45, 500};
    const int n = (int)(sizeof tokens / sizeof *tokens);
    const int thread_counts[] = {1, 7, 64};
    float *logits[3] = {0};
    int64_t n_vocab = 0;
    for (int k = 0; k < 3; k++) {
        quill_model *m = NULL;
        quill_context *c = NULL;
        quill_error err;
        quill_context_params p = {.n_ctx = 64, .n_threads = thread_counts[k]};
        if (quill_model_load(path, &m, &err) || quill_context_new(m, &p, &c, &err)) {
            test_fail(__FILE__, __LINE__, "%s", err.message);
        } else {
            n_vocab = quill_model_hparams(m)->n_vocab;
            logits[k] = malloc((size_t)n * (size_t)n_vocab * sizeof(float));
            /* the prompt in one batch, then one token at a time: both kinds of parallel loops */
            if (quill_eval(c, tokens, n - 3, logits[k], true, &err) ||
                quill_eval(c, tokens + n - 3, 1, logits[k] + (size_t)(n - 3) * (size_t)n_vocab, true, &err) ||
                quill_eval(c, tokens + n - 2, 1, logits[k] + (size_t)(n - 2) * (size_t)n_vocab, true, &err) ||
                quill_eval(c, tokens + n - 1, 1, logits[k] + (size_t)(n - 1) * (size_t)n_vocab, true, &err)) {
                test_fail(__FILE__, __LINE__, "%d threads: %s", thread_counts[k], err.message);
                free(logits[k]);
                logits[k] = NULL;
            }
        }
        quill_context_free(c);
        quill_model_free(m);
    }
    bool same[3] = {true, true, true};
    for (int k = 1; k < 3; k++)
        same[k] = logits[0] && logits[k] && !memcmp(logits[0], logits[k], (size_t)n * (size_t)n_vocab * sizeof(float));
    for (int k = 0; k < 3; k++) free(logits[k]);

    char *cmd = NULL, *out1 = NULL, *out999 = NULL;
    const char *fmt = "timeout 60 %s run -m %s -p 'Once upon a time' -n 24 --temp 0 -t %d 2>/dev/null";
    int len = snprintf(NULL, 0, fmt, quill_bin(), path, 999) + 1;
    cmd = malloc((size_t)len);
    snprintf(cmd, (size_t)len, fmt, quill_bin(), path, 1);
    int rc1 = run_cmd(cmd, &out1, false);
    snprintf(cmd, (size_t)len, fmt, quill_bin(), path, 999);
    int rc999 = run_cmd(cmd, &out999, false);
    const bool same_text = rc1 == 0 && rc999 == 0 && out1 && out999 && !strcmp(out1, out999) && strlen(out1) > 20;
    free(cmd);
    free(path);
    if (!(same[1] && same[2])) free(out1), free(out999);
    CHECK(same[1] && same[2], "7 threads: %s, 64 threads: %s (against 1 thread)", same[1] ? "same" : "different",
          same[2] ? "same" : "different");
    if (!same_text)
        test_fail(__FILE__, __LINE__, "-t 999 (exit %d): \"%s\"; -t 1 (exit %d): \"%s\"", rc999,
                  out999 ? out999 : "", rc1, out1 ? out1 : "");
    free(out1);
    free(out999);
}
