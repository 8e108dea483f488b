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
                             &L->ple_gate, &L->ple_proj,
                             /* latent attention's q_a (model/mla.c) */
                             &L->q_a};
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

/* Whether a type's copy is larger than its rows in the file (the grid types: 4.25-4.375 bits a
 * weight against the file's 1.56-3.44). */
static bool copy_grows(const quill_weight *w, size_t bytes) {
    return bytes > (size_t)w->rows * w->row_bytes * 21 / 20 + 4096;
}

/* Bytes of the packed copy of the matrices in list that the plan packs, each page-aligned; at[i]
 * is where matrix i goes, SIZE_MAX for one left in the file's layout. Every matrix whose copy is
 * no larger than its rows is packed (its file pages are dropped: memory stays the same); the
 * others, in list order (the output first, then layer by layer), while what the plan keeps in
 * memory (copies, and the rows of the matrices left in the file) stays within `budget`. *grown
 * and *left count the growing matrices packed and left. */
static size_t plan_packing(quill_weight **list, int n, const quill_kernels *k, size_t budget, size_t *at, int *grown,
                           int *left) {
    size_t kept = 0; /* the file's rows of the growing matrices, then each one's copy instead once taken */
    for (int i = 0; i < n; i++) {
        const size_t bytes = k->pack_bytes(list[i]->type, list[i]->rows, list[i]->cols);
        kept += (copy_grows(list[i], bytes) ? (size_t)list[i]->rows * list[i]->row_bytes : bytes) * (size_t)list[i]->n_expert;
    }
    size_t total = 0;
    *grown = *left = 0;
    for (int i = 0; i < n; i++) {
        quill_weight *w = list[i];
        size_t bytes = k->pack_bytes(w->type, w->rows, w->cols);
        if (copy_grows(w, bytes)) {
            const size_t more = (bytes - (size_t)w->rows * w->row_bytes) * (size_t)w->n_expert;
            if (kept > budget || budget - kept < more) bytes = 0, ++*left;
            else kept += more, ++*grown;
        }
        /* experts 64-byte aligned (the pack's promise), the matrices page-aligned */
        w->packed_expert_bytes = (bytes + 63) & ~(size_t)63;
        at[i] = bytes ? total : SIZE_MAX;
        total += (w->packed_expert_bytes * (size_t)w->n_expert + 4095) & ~(size_t)4095;
    }
    return total;
}

/* The memory the copies may keep: what the system can still give, or less where QUILL_PACK_MEMORY
 * says so (MiB, or a number with a K, M or G suffix: room for other programs, and the tests' way
 * to a short budget). */
static size_t pack_budget(void) {
    size_t budget = available_memory();
    const char *v = getenv("QUILL_PACK_MEMORY");
    if (!v || !*v) return budget; /* unset, or set empty */
    char *end = NULL;
    const unsigned long long n = strtoull(v, &end, 10);
    int shift = 20;
    if (end != v && (*end == 'K' || *end == 'k')) shift = 10, end++;
    else if (end != v && (*end == 'M' || *end == 'm')) end++;
    else if (end != v && (*end == 'G' || *end == 'g')) shift = 30, end++;
    if (end == v || *end != '\0' || n > (SIZE_MAX >> shift)) {
        quill_log(QUILL_LOG_WARN, "QUILL_PACK_MEMORY=%s is not a size (MiB, or a number with K, M or G): ignored", v);
        return budget;
    }
    const size_t cap = (size_t)n << shift;
    return cap < budget ? cap : budget;
}

/* The experts' copier: the plan's matrices (the expert tensors among them are left to it). */
struct quill_expert_packer {
    const quill_model *m;
    const quill_kernels *k;
    quill_weight **list;
    size_t *at;
    int n;
    long page; /* the file's page size when it is mapped, else 0 */
    int stop;  /* set when the model is freed before the copies are done */
    pthread_t thread;
};

/* Packs matrix w (an expert tensor expert by expert, each marked ready when its copy is complete),
 * on pool or (NULL) on this thread alone; the file's pages of what is packed leave the process as
 * it goes (whole pages inside the matrix only), expert by expert, so that a 3-D tensor's file pages
 * and its copy are not both resident (a qwen3moe IQ3_M layer's peak: +86 MB); not the embedding's
 * when the output reuses it, which every token reads a row of. Stops early when *stop is set. */
static void pack_matrix(const quill_model *m, const quill_kernels *k, quill_weight *w, quill_pool *pool, long page,
                        const int *stop) {
    const int64_t tiles = (w->rows + QUILL_PACK_ROWS - 1) / QUILL_PACK_ROWS;
    const bool drop = page > 0 && w->data != m->token_embd.data;
    const uintptr_t page_mask = ~((uintptr_t)page - 1);
    uintptr_t dropped = ((uintptr_t)w->data + (uintptr_t)page - 1) & page_mask;
    for (int64_t e = 0; e < w->n_expert; e++) {
        if (stop && __atomic_load_n(stop, __ATOMIC_RELAXED)) return;
        quill_weight expert = *w;
        expert.n_expert = 1;
        expert.data = w->data + (size_t)e * w->expert_bytes;
        pack_job j = {k, &expert, (uint8_t *)w->packed + (size_t)e * w->packed_expert_bytes};
        if (pool) quill_pool_run(pool, pack_tiles, &j, tiles, tiles / (4 * quill_pool_size(pool)) + 1);
        else pack_tiles(&j, 0, tiles, 0);
        if (w->expert_ready) __atomic_store_n((uint8_t *)&w->expert_ready[e], 1, __ATOMIC_RELEASE);
        const uintptr_t to = ((uintptr_t)expert.data + (size_t)w->rows * w->row_bytes) & page_mask;
        if (drop && to > dropped) {
            (void)madvise((void *)dropped, to - dropped, MADV_DONTNEED);
            dropped = to;
        }
    }
}

/* Every expert tensor of the plan, one after another (on pool, or NULL: this thread), the next
 * ones' file pages asked for ahead. */
static void pack_experts_of(struct quill_expert_packer *a, quill_pool *pool) {
    for (int i = 0; i < a->n; i++) {
        quill_weight *w = a->list[i];
        if (a->at[i] == SIZE_MAX || !w->expert_ready) continue;
        if (a->page > 0)
            for (int r = i + 1, ahead = 0; r < a->n && ahead < PACK_READ_AHEAD; r++)
                if (a->at[r] != SIZE_MAX && a->list[r]->expert_ready) read_ahead(a->list[r], a->page), ahead++;
        pack_matrix(a->m, a->k, w, pool, a->page, &a->stop);
    }
}

static void *pack_experts(void *arg) {
    struct quill_expert_packer *a = arg;
    pack_experts_of(a, NULL);
    if (!__atomic_load_n(&a->stop, __ATOMIC_RELAXED)) (void)mprotect(a->m->packed_mem, a->m->packed_size, PROT_READ);
    return NULL;
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
    const int cap = 2 + 19 * (int)m->hp.n_layer;
    quill_weight **list = malloc((size_t)cap * sizeof *list);
    size_t *at = malloc((size_t)cap * sizeof *at);
    int n = list && at ? model_weights(m, list, cap) : 0;
    /* A copy larger than the file's rows is faster to read but must fit: a model chosen in a
     * low-bit type to fit in memory keeps as many of those matrices in the file's layout as it
     * must, rather than swap. */
    int grown, left;
    const size_t budget = pack_budget();
    size_t total = plan_packing(list, n, k, budget, at, &grown, &left);
    if (left)
        quill_log(QUILL_LOG_WARN,
                  "%d of %d matrices of the types whose copy is larger than the file's rows (the iq1, iq2 and iq3 "
                  "types) stay in the file's layout, more slowly: %.1f MB of memory to use (MemAvailable, or "
                  "QUILL_PACK_MEMORY) cannot hold their copies",
                  left, grown + left, budget / 1e6);
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
    m->packed_mem = mem;
    m->packed_size = total;
    m->packed_layout = k->packed_layout;
    /* the plain matrices now, on the pool; the expert tensors (most of a MoE model, of which a
     * prompt reads only some) by a thread of their own, so that the first context is made
     * without waiting for them: until its copy is complete an expert is read from the file */
    int64_t n_flags = 0;
    for (int i = 0; i < n; i++)
        if (at[i] != SIZE_MAX && list[i]->n_expert > 1) n_flags += list[i]->n_expert;
    m->expert_ready = n_flags ? calloc((size_t)n_flags, 1) : NULL;
    struct quill_expert_packer *bg = n_flags && m->expert_ready ? calloc(1, sizeof *bg) : NULL;
    const bool mapped = quill_gguf_is_mapped(m->gguf);
    const long page = mapped ? sysconf(_SC_PAGESIZE) : 0;
    int64_t flag = 0;
    for (int i = 0; i < n; i++) {
        quill_weight *w = list[i];
        if (at[i] == SIZE_MAX) continue;
        w->packed = (uint8_t *)mem + at[i];
        if (bg && w->n_expert > 1) {
            w->expert_ready = m->expert_ready + flag;
            flag += w->n_expert;
            continue;
        }
        if (page > 0)
            for (int r = i + 1; r <= i + PACK_READ_AHEAD && r < n; r++)
                if (at[r] != SIZE_MAX) read_ahead(list[r], page);
        pack_matrix(m, k, w, pool, page, NULL);
    }
    if (bg) {
        *bg = (struct quill_expert_packer){.m = m, .k = k, .list = list, .at = at, .n = n, .page = page};
        if (pthread_create(&bg->thread, NULL, pack_experts, bg) == 0) {
            m->expert_packer = bg;
            pthread_mutex_unlock(&pack_lock);
            return true;
        }
        pack_experts_of(bg, pool); /* no thread: the experts here and now */
        free(bg);
    }
    (void)mprotect(mem, total, PROT_READ);
    free(list);
    free(at);
    pthread_mutex_unlock(&pack_lock);
    return true;
}

void quill_model_finish_packing(quill_model *m, bool stop) {
    pthread_mutex_lock(&pack_lock);
    struct quill_expert_packer *bg = m->expert_packer;
    if (bg) {
        if (stop) __atomic_store_n(&bg->stop, 1, __ATOMIC_RELAXED);
        pthread_join(bg->thread, NULL);
        free(bg->list);
        free(bg->at);
        free(bg);
        m->expert_packer = NULL;
    }
    pthread_mutex_unlock(&pack_lock);
}

void quill_model_unpack(quill_model *m) {
    quill_model_finish_packing(m, true);
    if (m->packed_mem) munmap(m->packed_mem, m->packed_size);
    free(m->expert_ready);
}
