/* A persistent pool of worker threads for data-parallel loops. Work is split into items that are
 * computed independently, so results never depend on which thread ran which item — this is what
 * makes logits bitwise identical for any thread count. */
#ifndef QUILL_THREADPOOL_H
#define QUILL_THREADPOOL_H

#include <stddef.h>
#include <stdint.h>

typedef struct quill_pool quill_pool;

/* Computes items [begin, end); `thread` (0 .. size-1) indexes per-thread scratch memory. */
typedef void (*quill_task_fn)(void *ctx, int64_t begin, int64_t end, int thread);

/* n_threads counts the caller, which works too; NULL on failure. */
quill_pool *quill_pool_new(int n_threads);
void quill_pool_free(quill_pool *p);
int quill_pool_size(const quill_pool *p);
/* How many contiguous shares a job's items are split into: min(size, usable CPUs). Thread t starts
 * on share t % shares. 1 for a NULL pool. */
int quill_pool_shares(const quill_pool *p);
/* Runs fn over [0, n_items) in chunks of at most `grain` items and returns when all are done. Each
 * thread works through a contiguous share of the items front to back, then takes the back half of
 * what is left of the fullest other share (threadpool.c). Threads that do not get a core in time
 * run no items: the caller never waits for them.
 * p may be NULL: the caller's thread then runs every item. */
void quill_pool_run(quill_pool *p, quill_task_fn fn, void *ctx, int64_t n_items, int64_t grain);

/* One job of a joined run: fn over its own items [0, n_items). */
typedef struct {
    quill_task_fn fn;
    void *ctx;
    int64_t n_items;
} quill_pool_task;

/* Runs several jobs as one loop over their items laid end to end (job i's items follow job i - 1's):
 * one wake-up and one wait for all of them instead of one each, and threads that finish their
 * part of one job early go on with the next instead of waiting. p may be NULL, as above. */
void quill_pool_run_joined(quill_pool *p, const quill_pool_task *tasks, int n_tasks, int64_t grain);

/* Memory that a coming job reads, item order: its spans laid end to end, items of equal size. */
typedef struct {
    const void *addr;
    size_t bytes;
} quill_pool_span;

/* Announces the memory of a coming job (typically the product after the next one): a thread that
 * waits, for a job or for the others to finish theirs, meanwhile prefetches the first bytes of the
 * part it will start on (thread t < shares: from byte total · t / shares). Only a hint: it changes
 * no result, and a job that comes first ends it. n_spans 0 withdraws it; p may be NULL. */
void quill_pool_warm(quill_pool *p, const quill_pool_span *spans, int n_spans);
/* What the threads of share s prefetch while they wait: *bytes from *from (0 bytes: nothing). */
void quill_pool_warm_target(const quill_pool *p, int s, const void **from, size_t *bytes);

#endif
