/* What this CPU and the operating system let the process run, asked once: the kernel sets are
 * chosen from these (kernels.c), and nothing else reads CPUID or the auxiliary vector. On x86-64
 * the x86 fields are set, on aarch64 the Arm ones; on any other target every feature is false and
 * the scalar kernels run. */
#ifndef QUILL_CPU_H
#define QUILL_CPU_H

#include <stdbool.h>

typedef struct {
    /* each true only when the operating system also saves the registers it uses (XCR0) */
    bool avx2, fma, f16c;
    bool avx512f, avx512bw, avx512vl, avx512dq, avx512vbmi, avx512vnni;
    /* VEX vpdpbusd on 256-bit registers (Alder Lake and later client chips, Zen 4 and 5) */
    bool avxvnni;
    /* the tile unit, and Linux's permission for this process to use its 8 KiB of state */
    bool amx_tile, amx_bf16;
    /* aarch64, as Linux reports them (getauxval): the signed byte dot product (sdot) and the 8-bit
     * integer matrix multiply (smmla) */
    bool asimd_dotprod, i8mm;
} quill_cpu_features;

const quill_cpu_features *quill_cpu_features_get(void);

#endif
