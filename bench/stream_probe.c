/* How much of a plain read's memory bandwidth a streaming loop keeps when it does a product's
 * work on every line it reads, apart from quill's kernels: a ceiling to set their ratios against.
 *
 *   build/stream_probe [THREADS [ROUNDS]]            e.g. 2 25; taskset -c 1 ... 1 25
 *
 * Each round reads a 1 GiB buffer (2 MiB pages) once per loop below, in turn, by THREADS threads
 * over contiguous shares, and prints per loop its mean GB/s and the median (quartiles) over the
 * rounds of its speed over the plain read's in the same round. Every loop but the first takes
 * each 64-byte line into a register and adds it into two vpdpbusd, as a q8_0 product does (one
 * for the activation's high bytes, one for its low bytes; two accumulators per plane, reset every
 * 8 lines). They differ only in where the 4 activation bytes of each vpdpbusd come from:
 *
 *   register   the same register for every product: no instruction besides the two vpdpbusd
 *   broadcast  broadcast from a 4 KiB array in L1, one load per product (q8_0's loop)
 *   shuffle    16 bytes loaded per 4 lines and plane, the word taken by a vpshufd (q4_0's loop)
 *
 * and each once more with a non-temporal prefetch of the line 4 KiB ahead, as quill's q4_0 and
 * q8_0 loops issue it. x86-64 with AVX-512 VNNI only.
 *
 *   build/stream_probe THREADS ROUNDS pieces
 *
 * The plain read only, as a token's products read memory: the buffer as a series of matrices
 * ("chunks" of THREADS pieces), each thread reading its piece of one chunk, then of the next
 * (a new stream at every chunk), against the plain read of contiguous shares; the same with the
 * threads waiting for each other after every chunk, as they do after a product; and with that
 * wait but each thread's pieces side by side, so that its stream goes on from chunk to chunk. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "../cli/plain_read.h"

#if defined(PLAIN_READ_HAVE_AVX2)

#define BUFFER ((size_t)1 << 30)
#define MAX_ROUNDS 200
#define MAX_THREADS 64

static _Alignas(64) int8_t activations[4096];

enum { FROM_REGISTER, FROM_BROADCAST, FROM_SHUFFLE };

/* The 4 activation bytes for line i (0..7) of a group of 8, plane 0 (high) or 1 (low). */
#define STREAM_LOOP(name, source, prefetch)                                                                  \
    __attribute__((target("avx512f,avx512bw,avx512vnni"))) static uint64_t name(const uint8_t *from,         \
                                                                                 const uint8_t *to) {        \
        const __m512i fixed = _mm512_set1_epi32(0x01020304);                                                 \
        __m512i total = _mm512_setzero_si512();                                                              \
        size_t at = 0;                                                                                       \
        for (const __m512i *p = (const __m512i *)from; (const uint8_t *)(p + 8) <= to; p += 8, at += 64) {   \
            __m512i h[2] = {_mm512_setzero_si512(), _mm512_setzero_si512()}, l[2] = {h[0], h[0]};            \
            __m512i quad[2][2];                                                                              \
            if (source == FROM_SHUFFLE)                                                                      \
                for (int k = 0; k < 2; k++)                                                                  \
                    for (int plane = 0; plane < 2; plane++)                                                  \
                        quad[plane][k] = _mm512_broadcast_i32x4(                                             \
                            _mm_load_si128((const __m128i *)(activations + ((at + 16 * k + 2048 * plane) & 4095)))); \
            _Pragma("GCC unroll 8") for (int i = 0; i < 8; i++) {                                            \
                if (prefetch) _mm_prefetch((const char *)(p + i) + 4096, _MM_HINT_NTA);                      \
                const __m512i v = _mm512_load_si512(p + i);                                                  \
                __m512i wh = fixed, wl = fixed;                                                              \
                if (source == FROM_BROADCAST) {                                                              \
                    wh = _mm512_set1_epi32(*(const int32_t *)(activations + ((at + 4 * i) & 4095)));         \
                    wl = _mm512_set1_epi32(*(const int32_t *)(activations + ((at + 4 * i + 2048) & 4095)));  \
                } else if (source == FROM_SHUFFLE) {                                                         \
                    switch (i & 3) {                                                                         \
                    case 0: wh = _mm512_shuffle_epi32(quad[0][i / 4], 0x00); wl = _mm512_shuffle_epi32(quad[1][i / 4], 0x00); break; \
                    case 1: wh = _mm512_shuffle_epi32(quad[0][i / 4], 0x55); wl = _mm512_shuffle_epi32(quad[1][i / 4], 0x55); break; \
                    case 2: wh = _mm512_shuffle_epi32(quad[0][i / 4], 0xAA); wl = _mm512_shuffle_epi32(quad[1][i / 4], 0xAA); break; \
                    default: wh = _mm512_shuffle_epi32(quad[0][i / 4], 0xFF); wl = _mm512_shuffle_epi32(quad[1][i / 4], 0xFF); break; \
                    }                                                                                        \
                }                                                                                            \
                h[i & 1] = _mm512_dpbusd_epi32(h[i & 1], v, wh);                                             \
                l[i & 1] = _mm512_dpbusd_epi32(l[i & 1], v, wl);                                             \
            }                                                                                                \
            total = _mm512_add_epi32(total, _mm512_add_epi32(_mm512_add_epi32(h[0], h[1]), _mm512_add_epi32(l[0], l[1]))); \
        }                                                                                                    \
        return (uint64_t)(uint32_t)_mm512_reduce_add_epi32(total);                                           \
    }

STREAM_LOOP(from_register, FROM_REGISTER, 0)
STREAM_LOOP(from_broadcast, FROM_BROADCAST, 0)
STREAM_LOOP(from_shuffle, FROM_SHUFFLE, 0)
STREAM_LOOP(from_register_prefetched, FROM_REGISTER, 1)
STREAM_LOOP(from_broadcast_prefetched, FROM_BROADCAST, 1)
STREAM_LOOP(from_shuffle_prefetched, FROM_SHUFFLE, 1)

static uint64_t plain(const uint8_t *from, const uint8_t *to) {
    return plain_read_avx2((const uint64_t *)from, (size_t)(to - from) / 8);
}

static const struct {
    const char *name;
    uint64_t (*loop)(const uint8_t *, const uint8_t *);
} loops[] = {
    {"plain read", plain},
    {"register", from_register},
    {"broadcast", from_broadcast},
    {"shuffle", from_shuffle},
    {"register + prefetch", from_register_prefetched},
    {"broadcast + prefetch", from_broadcast_prefetched},
    {"shuffle + prefetch", from_shuffle_prefetched},
};
#define N_LOOPS (int)(sizeof loops / sizeof loops[0])

/* The pieces mode's readings: one thread's piece of each chunk. */
enum { INTERLEAVED, INTERLEAVED_WAITING, OWN_STREAM_WAITING };
static const struct {
    const char *name;
    size_t piece;
    int layout;
} piece_reads[] = {
    {"plain read", BUFFER, OWN_STREAM_WAITING}, /* one piece per thread: its contiguous share */
    {"2 MiB pieces", (size_t)2 << 20, INTERLEAVED},
    {"512 KiB pieces", (size_t)512 << 10, INTERLEAVED},
    {"128 KiB pieces", (size_t)128 << 10, INTERLEAVED},
    {"2 MiB, waiting", (size_t)2 << 20, INTERLEAVED_WAITING},
    {"512 KiB, waiting", (size_t)512 << 10, INTERLEAVED_WAITING},
    {"128 KiB, waiting", (size_t)128 << 10, INTERLEAVED_WAITING},
    {"2 MiB, own stream", (size_t)2 << 20, OWN_STREAM_WAITING},
    {"512 KiB, own stream", (size_t)512 << 10, OWN_STREAM_WAITING},
    {"128 KiB, own stream", (size_t)128 << 10, OWN_STREAM_WAITING},
};
#define N_PIECE_READS (int)(sizeof piece_reads / sizeof piece_reads[0])

static uint8_t *buffer;
static int n_threads, current = -1;
static bool pieces;
static _Atomic unsigned arrived; /* the threads' spinning wait between chunks */
static pthread_barrier_t start, done;
static volatile uint64_t sink[MAX_THREADS];

/* Waits, spinning, until every thread has arrived `round` times. */
static void wait_for_all(unsigned round) {
    atomic_fetch_add(&arrived, 1);
    while (atomic_load(&arrived) < round * (unsigned)n_threads) _mm_pause();
}

/* Thread id's part of piece_reads[k]: its piece of every chunk of n_threads pieces. */
static uint64_t read_pieces(int id, int k) {
    const size_t piece = piece_reads[k].piece < BUFFER / (size_t)n_threads ? piece_reads[k].piece
                                                                           : BUFFER / (size_t)n_threads / 512 * 512;
    const size_t chunk = piece * (size_t)n_threads, chunks = BUFFER / chunk;
    uint64_t sum = 0;
    for (size_t c = 0; c < chunks; c++) {
        const size_t at = piece_reads[k].layout == OWN_STREAM_WAITING ? ((size_t)id * chunks + c) * piece
                                                                      : c * chunk + (size_t)id * piece;
        sum += plain(buffer + at, buffer + at + piece);
        if (piece_reads[k].layout != INTERLEAVED) wait_for_all((unsigned)(c + 1));
    }
    return sum;
}

static void *reader(void *arg) {
    const int id = (int)(intptr_t)arg;
    /* contiguous shares of whole 512-byte groups */
    const uint8_t *from = buffer + BUFFER / 512 * (size_t)id / (size_t)n_threads * 512;
    const uint8_t *to = buffer + BUFFER / 512 * (size_t)(id + 1) / (size_t)n_threads * 512;
    for (;;) {
        pthread_barrier_wait(&start);
        if (current < 0) return NULL;
        sink[id] += pieces ? read_pieces(id, current) : loops[current].loop(from, to);
        pthread_barrier_wait(&done);
    }
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int by_value(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    n_threads = argc > 1 ? atoi(argv[1]) : 2;
    const int rounds = argc > 2 ? atoi(argv[2]) : 25;
    pieces = argc > 3 && strcmp(argv[3], "pieces") == 0;
    if (n_threads < 1 || n_threads > MAX_THREADS || rounds < 1 || rounds > MAX_ROUNDS || (argc > 3 && !pieces) ||
        argc > 4) {
        fprintf(stderr, "usage: %s [THREADS (1-%d) [ROUNDS (1-%d) [pieces]]]\n", argv[0], MAX_THREADS, MAX_ROUNDS);
        return 2;
    }
    const int n_reads = pieces ? N_PIECE_READS : N_LOOPS;
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bw") ||
        !__builtin_cpu_supports("avx512vnni")) {
        fprintf(stderr, "stream_probe: this CPU has no AVX-512 VNNI\n");
        return 1;
    }
    buffer = mmap(NULL, BUFFER, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (buffer == MAP_FAILED) {
        fprintf(stderr, "stream_probe: no memory for a %zu MiB buffer\n", BUFFER >> 20);
        return 1;
    }
    (void)madvise(buffer, BUFFER, MADV_HUGEPAGE);
    memset(buffer, 1, BUFFER);
    memset(activations, 3, sizeof activations);
    pthread_barrier_init(&start, NULL, (unsigned)n_threads + 1);
    pthread_barrier_init(&done, NULL, (unsigned)n_threads + 1);
    pthread_t threads[MAX_THREADS];
    for (int i = 0; i < n_threads; i++)
        if (pthread_create(&threads[i], NULL, reader, (void *)(intptr_t)i) != 0) {
            fprintf(stderr, "stream_probe: could not start thread %d\n", i);
            return 1;
        }

    static double speed[N_LOOPS > N_PIECE_READS ? N_LOOPS : N_PIECE_READS][MAX_ROUNDS];
    static double ratio[N_LOOPS > N_PIECE_READS ? N_LOOPS : N_PIECE_READS][MAX_ROUNDS];
    for (int r = 0; r < rounds; r++)
        for (int k = 0; k < n_reads; k++) {
            current = k;
            atomic_store(&arrived, 0);
            const double t0 = now_s();
            pthread_barrier_wait(&start);
            pthread_barrier_wait(&done);
            speed[k][r] = (double)BUFFER / (now_s() - t0) / 1e9;
            ratio[k][r] = speed[k][r] / speed[0][r];
        }
    current = -1;
    pthread_barrier_wait(&start);
    for (int i = 0; i < n_threads; i++) pthread_join(threads[i], NULL);

    printf("%d thread(s), %d rounds over %zu MiB; per loop: mean GB/s, and its speed / the plain read's in the same round: median (quartiles)\n",
           n_threads, rounds, BUFFER >> 20);
    for (int k = 0; k < n_reads; k++) {
        double mean = 0;
        for (int r = 0; r < rounds; r++) mean += speed[k][r] / rounds;
        qsort(ratio[k], (size_t)rounds, sizeof ratio[k][0], by_value);
        printf("  %-22s %6.1f GB/s  %.3f (%.3f-%.3f)\n", pieces ? piece_reads[k].name : loops[k].name, mean, ratio[k][rounds / 2], ratio[k][rounds / 4],
               ratio[k][3 * rounds / 4]);
    }
    return 0;
}

#else

int main(void) {
    fprintf(stderr, "stream_probe: x86-64 only\n");
    return 1;
}

#endif
