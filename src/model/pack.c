/* Weights copied, once per model, into the load-time layout of the kernel set a context computes
 * with (kernels.h: packed_layout). The first context whose set has a layout packs every weight
 * matrix of the types the set packs, on its thread pool; later contexts of that set find them
 * packed. The copies replace the file's pages in memory: the mapping's pages of a packed matrix
 * are dropped (they stay in the page cache and come back if a path that reads the file's layout,
 * such as the float64 reference, touches them), so resident memory stays about the file's size. */
#include "model/context.h"
#include "base/error.h"
#include "gguf/gguf_internal.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* One lock for all models: packing happens once per model, and a context of another thread that
 * shares the model waits for it instead of packing again. */
static pthread_mutex_t pack_lock = PTHREAD_MUTEX_INITIALIZER;

/* Matrices whose file pages are asked for ahead of the one being packed (read_ahead). */
enum { PACK_READ_AHEAD = 2 };

/* Every weight matrix the fast forward pass multiplies (output may alias token_embd); an expert
 * tensor is packed expert by expert, each expert's copy a matrix of its own. */
static int model_weights(quill_model *m, quill_weight **list, int cap) {
    int n = 0;
    if (n < cap) list[n++] = &m->output;
    if (m->ple_model_proj.data && n < cap) list[n++] = &m->ple_model_proj;
    for (int64_t l = 0; l < m->hp.n_layer; l++) {
        quill_layer *L = &m->layers[l];
        quill_weight *w[] = {&L->wq,     &L->wk,       &L->wv,         &L->wo,        &L->w_gate, &L->w_up, &L->w_down,
                             &L->w_router, &L->w_gate_shexp, &L->w_up_shexp, &L->w_down_shexp,
                             /* a DeltaNet layer's (model/deltanet.c) */
                             &L->ssm_in, &L->ssm_gate, &L->ssm_beta, &L->ssm_alpha, &L->ssm_out,
                             /* per-layer inputs (model/per_layer.c) */
                             &L->ple_gate, &L->ple_proj};
        for (size_t i = 0; i < sizeof w / sizeof w[0]; i++)
            if (w[i]->data && w[i]->rows > 0 && n < cap) list[n++] = w[i];
    }
    return n;
}

typedef struct {
    const quill_kernels *k;
    const quill_weight *w;
    uint8_t *dst;
} pack_job;

static void pack_tiles(void *arg, int64_t t0, int64_t t1, int thread) {
    (void)thread;
    const pack_job *j = arg;
    j->k->pack(j->w->type, j->w->data, j->w->row_bytes, j->w->rows, j->w->cols, j->dst, t0, t1);
}

/* A file not in the page cache yet: the next matrices are read in while one packs, where page
 * faults alone read 128 KiB at a time, each waited for (a 3.6 GiB q4_0 7B from a cold cache: 39
 * -> 29 s to the first token, bench/README.md). */
static void read_ahead(const quill_weight *w, long page) {
    const uintptr_t from = (uintptr_t)w->data & ~((uintptr_t)page - 1);
    const size_t len = (size_t)w->n_expert * (size_t)w->rows * w->row_bytes + ((uintptr_t)w->data - from);
    (void)madvise((void *)from, len, MADV_WILLNEED);
}

/* What the system can still give (MemAvailable: free memory and reclaimable cache, the model
 * file's own pages among them), or SIZE_MAX when /proc does not say. */
static size_t available_memory(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return SIZE_MAX;
    char line[128];
    unsigned long long kb = 0;
    bool found = false;
    while (!found && fgets(line, sizeof line, f)) found = sscanf(line, "MemAvailable: %llu kB", &kb) == 1;
    fclose(f);
    return found && kb < SIZE_MAX / 1024 ? (size_t)kb * 1024 : SIZE_MAX;
}

/* Bytes of the packed copy of every matrix in list, each page-aligned; a type whose copy is larger
 * than its rows in the file (the grid types iq3_s and iq3_xxs: 4.25 bits a weight against 3.44
 * and 3.06) only when `grow`. at[i] is where matrix i goes, SIZE_MAX for one left in the file's
 * layout. */
static size_t plan_packing(quill_weight **list, int n, const quill_kernels *k, bool grow, size_t *at) {
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        quill_weight *w = list[i];
        size_t bytes = k->pack_bytes(w->type, w->rows, w->cols);
        if (bytes > (size_t)w->rows * w->row_bytes * 21 / 20 + 4096 && !grow) bytes = 0;
        /* experts 64-byte aligned (the pack's promise), the matrices page-aligned */
        w->packed_expert_bytes = (bytes + 63) & ~(size_t)63;
        at[i] = bytes ? total : SIZE_MAX;
        total += (w->packed_expert_bytes * (size_t)w->n_expert + 4095) & ~(size_t)4095;
    }
    return total;
}

static bool repack_disabled(void) {
    const char *v = getenv("QUILL_REPACK");
    return v && strcmp(v, "0") == 0;
}

bool quill_model_pack(quill_model *m, const quill_kernels *k, quill_pool *pool) {
    if (!k->packed_layout || repack_disabled()) return false;
    pthread_mutex_lock(&pack_lock);
    bool ok = m->packed_layout != NULL;
    if (ok) { /* packed before, by this context's set or another one */
        ok = strcmp(m->packed_layout, k->packed_layout) == 0;
        pthread_mutex_unlock(&pack_lock);
        return ok;
    }
    const int cap = 2 + 18 * (int)m->hp.n_layer;
    quill_weight **list = malloc((size_t)cap * sizeof *list);
    size_t *at = malloc((size_t)cap * sizeof *at);
    int n = list && at ? model_weights(m, list, cap) : 0;
    size_t total = plan_packing(list, n, k, true, at);
    /* A copy larger than the file's rows is faster to read but must fit: a model chosen in a
     * low-bit type to fit in memory keeps those matrices in the file's layout rather than swap. */
    const size_t available = available_memory();
    if (total > available) {
        const size_t fitting = plan_packing(list, n, k, false, at);
        if (fitting < total)
            quill_log(QUILL_LOG_WARN,
                      "repacking every matrix needs %.1f MB, %.1f MB available: the types whose copy is larger "
                      "than the file's rows (iq3_s, iq3_xxs) stay in the file's layout, more slowly",
                      total / 1e6, available / 1e6);
        total = fitting;
    }
    void *mem = total ? mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0) : MAP_FAILED;
    if (mem == MAP_FAILED) {
        /* nothing to pack, or no memory for it: the file's layout serves, more slowly */
        if (total) quill_log(QUILL_LOG_WARN, "no memory to repack %.1f MB of weights; using the file's layout", total / 1e6);
        free(list);
        free(at);
        pthread_mutex_unlock(&pack_lock);
        return false;
    }
    /* generation streams these once per token: 2 MiB pages spare a TLB miss every 4 KiB */
    (void)madvise(mem, total, MADV_HUGEPAGE);
    const bool mapped = quill_gguf_is_mapped(m->gguf);
    const long page = sysconf(_SC_PAGESIZE);
    for (int i = 0; i < n; i++) {
        quill_weight *w = list[i];
        if (mapped && page > 0)
            for (int k = i == 0 ? 1 : i + PACK_READ_AHEAD; k <= i + PACK_READ_AHEAD && k < n; k++)
                if (at[k] != SIZE_MAX) read_ahead(list[k], page);
        if (at[i] == SIZE_MAX) continue;
        const int64_t tiles = (w->rows + QUILL_PACK_ROWS - 1) / QUILL_PACK_ROWS;
        /* the file's pages of this matrix leave the process as it is packed (whole pages inside it
         * only), expert by expert, so that a 3-D tensor's file pages and its copy are not both
         * resident (a qwen3moe IQ3_M layer's peak: +86 MB); not the embedding's when the output
         * reuses it, which every token reads a row of */
        const bool drop = mapped && page > 0 && w->data != m->token_embd.data;
        const uintptr_t page_mask = ~((uintptr_t)page - 1);
        uintptr_t dropped = ((uintptr_t)w->data + (uintptr_t)page - 1) & page_mask;
        for (int64_t e = 0; e < w->n_expert; e++) {
            const quill_weight expert = quill_weight_expert(w, e);
            pack_job j = {k, &expert, (uint8_t *)mem + at[i] + (size_t)e * w->packed_expert_bytes};
            quill_pool_run(pool, pack_tiles, &j, tiles, tiles / (4 * quill_pool_size(pool)) + 1);
            const uintptr_t to = ((uintptr_t)expert.data + (size_t)w->rows * w->row_bytes) & page_mask;
            if (drop && to > dropped) {
                (void)madvise((void *)dropped, to - dropped, MADV_DONTNEED);
                dropped = to;
            }
        }
        w->packed = (uint8_t *)mem + at[i];
    }
    (void)mprotect(mem, total, PROT_READ);
    m->packed_mem = mem;
    m->packed_size = total;
    m->packed_layout = k->packed_layout;
    free(list);
    free(at);
    pthread_mutex_unlock(&pack_lock);
    return true;
}

void quill_model_unpack(quill_model *m) {
    if (m->packed_mem) munmap(m->packed_mem, m->packed_size);
}
