/* CPUID, XCR0 and the AMX permission request on x86-64, the auxiliary vector's HWCAP words on
 * aarch64: see cpu.h. Built without any instruction-set flag, like every file outside the kernels
 * chosen at run time, so it runs on any CPU of its architecture. */
#include "base/cpu.h"

#include <pthread.h>

#if defined(__x86_64__)
#include <cpuid.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <unistd.h>

/* XCR0: the register state the OS saves on a context switch (SDM vol. 1, 13.3). */
#define XCR0_AVX ((1u << 1) | (1u << 2))                /* XMM, upper YMM */
#define XCR0_AVX512 ((1u << 5) | (1u << 6) | (1u << 7)) /* opmask, upper ZMM 0-15, ZMM 16-31 */
#define XCR0_AMX ((1u << 17) | (1u << 18))              /* tile configuration, tile data */

/* Linux asks a process to request the tile data state before its first tile instruction. */
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

static uint64_t xcr0(void) {
    uint32_t lo, hi;
    /* xgetbv by its bytes' name: the intrinsic would need -mxsave on this portable file */
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return (uint64_t)hi << 32 | lo;
}

static quill_cpu_features detect(void) {
    quill_cpu_features f = {0};
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
    /* ECX: FMA (12), OSXSAVE (27), AVX (28), F16C (29) */
    const bool osxsave = c & (1u << 27), avx = c & (1u << 28);
    if (!osxsave || !avx) return f;
    const uint64_t xcr = xcr0();
    if ((xcr & XCR0_AVX) != XCR0_AVX) return f;
    f.fma = c & (1u << 12);
    f.f16c = c & (1u << 29);
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return f;
    /* leaf 7: EBX AVX2 (5), AVX512F (16), AVX512DQ (17), AVX512BW (30), AVX512VL (31); ECX
     * AVX512_VBMI (1), AVX512_VNNI (11); EDX AMX-BF16 (22), AMX-TILE (24) */
    f.avx2 = b & (1u << 5);
    if ((xcr & XCR0_AVX512) == XCR0_AVX512) {
        f.avx512f = b & (1u << 16);
        f.avx512dq = b & (1u << 17);
        f.avx512bw = b & (1u << 30);
        f.avx512vl = b & (1u << 31);
        f.avx512vbmi = c & (1u << 1);
        f.avx512vnni = c & (1u << 11);
    }
    unsigned a1, b1, c1, d1; /* leaf 7, sub-leaf 1: EAX AVX-VNNI (4), on the AVX state alone */
    if (__get_cpuid_count(7, 1, &a1, &b1, &c1, &d1)) f.avxvnni = a1 & (1u << 4);
    if ((xcr & XCR0_AMX) == XCR0_AMX && (d & (1u << 24)) &&
        syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0) {
        f.amx_tile = true;
        f.amx_bf16 = d & (1u << 22);
    }
    return f;
}
#elif defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>

/* the kernel's bits (asm/hwcap.h), for C libraries whose headers predate them */
#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1ul << 20)
#endif
#ifndef HWCAP2_I8MM
#define HWCAP2_I8MM (1ul << 13)
#endif

static quill_cpu_features detect(void) {
    quill_cpu_features f = {0};
    /* Linux sets a bit only where the CPU has the feature and the kernel supports it */
    const unsigned long hw = getauxval(AT_HWCAP), hw2 = getauxval(AT_HWCAP2);
    f.asimd_dotprod = hw & HWCAP_ASIMDDP;
    f.i8mm = hw2 & HWCAP2_I8MM;
    return f;
}
#else
static quill_cpu_features detect(void) { return (quill_cpu_features){0}; }
#endif

static quill_cpu_features features;
static void init(void) { features = detect(); }

const quill_cpu_features *quill_cpu_features_get(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, init);
    return &features;
}
