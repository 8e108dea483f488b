/* The tables of every kernel set and the run-time choice among them: each set's table starts from
 * the scalar set's (kernels_scalar.c) and the set's files install their kernels over it. Built
 * without instruction-set flags: it runs on any CPU, and calls into an instruction-set file only
 * once the CPU is known to have that set. */
#include "kernels/kernels.h"
#include "base/cpu.h"
#include "base/error.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The sets, fastest first. */
enum { SET_AMX, SET_VNNI, SET_AVX512, SET_AVXVNNI, SET_AVX2, SET_I8MM, SET_DOTPROD, SET_SCALAR, N_SETS };
static const char *const set_names[N_SETS] = {"amx",  "vnni",    "avx512", "avxvnni",
                                              "avx2", "i8mm",    "dotprod", "scalar"};
static quill_kernels tables[N_SETS];
static bool offered[N_SETS];

static void build_tables(void) {
    offered[SET_SCALAR] = true;
    const quill_kernels scalar_table = *quill_kernels_scalar();
    tables[SET_SCALAR] = scalar_table;
#if defined(__x86_64__)
    const quill_cpu_features *f = quill_cpu_features_get();
    offered[SET_AVX2] = f->avx2 && f->fma && f->f16c;
    offered[SET_AVXVNNI] = offered[SET_AVX2] && f->avxvnni;
    offered[SET_AVX512] = offered[SET_AVX2] && f->avx512f && f->avx512bw && f->avx512vl && f->avx512dq;
    /* both decode on the vector unit with VNNI byte products and VBMI byte permutes */
    offered[SET_VNNI] = offered[SET_AVX512] && f->avx512vbmi && f->avx512vnni;
    offered[SET_AMX] = offered[SET_VNNI] && f->amx_tile && f->amx_bf16;
    if (offered[SET_AVX2]) {
        tables[SET_AVX2] = scalar_table;
        quill_kernels_install_avx2(&tables[SET_AVX2]);
        quill_kernels_install_avx2_exact(&tables[SET_AVX2]);
        quill_kernels_install_recurrent_avx2(&tables[SET_AVX2]);
        quill_kernels_install_avx2_packed(&tables[SET_AVX2]);
    }
    if (offered[SET_AVXVNNI]) {
        /* the avx2 set with its exact products' sums by VEX vpdpbusd */
        tables[SET_AVXVNNI] = tables[SET_AVX2];
        quill_kernels_install_avxvnni_exact(&tables[SET_AVXVNNI]);
    }
    if (offered[SET_AVX512]) {
        /* Without VNNI (Skylake-SP; Cascade Lake lacks VBMI) the AVX2 exact products still beat
         * the f32 kernels: pp64 1.5x, tg32 1.75x on a q4_0 model (both sets forced), and they give
         * the bits every exact set gives. */
        tables[SET_AVX512] = scalar_table;
        quill_kernels_install_avx512(&tables[SET_AVX512]);
        quill_kernels_install_avx2_exact(&tables[SET_AVX512]);
        quill_kernels_install_recurrent_avx2(&tables[SET_AVX512]);
    }
    if (offered[SET_VNNI]) {
        tables[SET_VNNI] = tables[SET_AVX512];
        quill_kernels_install_vnni(&tables[SET_VNNI]);
    }
    if (offered[SET_AMX]) {
        tables[SET_AMX] = tables[SET_AVX512];
        quill_kernels_install_amx(&tables[SET_AMX]);
    }
#elif defined(__aarch64__)
    /* every aarch64 CPU has NEON; the sets differ in the byte products of the exact ones */
    const quill_cpu_features *f = quill_cpu_features_get();
    offered[SET_DOTPROD] = f->asimd_dotprod;
    offered[SET_I8MM] = f->asimd_dotprod && f->i8mm;
    if (offered[SET_DOTPROD]) {
        tables[SET_DOTPROD] = scalar_table;
        quill_kernels_install_neon(&tables[SET_DOTPROD]);
        quill_kernels_install_dotprod(&tables[SET_DOTPROD]);
    }
    if (offered[SET_I8MM]) {
        tables[SET_I8MM] = tables[SET_DOTPROD];
        quill_kernels_install_i8mm(&tables[SET_I8MM]);
    }
#endif
    for (int i = 0; i < N_SETS; i++) tables[i].isa = set_names[i];
}

static void ensure_tables(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, build_tables);
}

const quill_kernels *quill_kernels_for(const char *isa) {
    ensure_tables();
    for (int i = 0; i < N_SETS; i++)
        if (!strcmp(isa, set_names[i])) return offered[i] ? &tables[i] : NULL;
    return NULL;
}

const quill_kernels *quill_kernels_best(void) {
    ensure_tables();
    for (int i = 0; i < N_SETS; i++)
        if (offered[i]) return &tables[i];
    return &tables[SET_SCALAR];
}

quill_status quill_kernels_choose(const quill_kernels **out, quill_error *err) {
    const char *name = getenv("QUILL_ISA");
    *out = quill_kernels_best();
    if (!name || !*name) return QUILL_OK;
    const quill_kernels *k = quill_kernels_for(name);
    if (k) {
        *out = k;
        return QUILL_OK;
    }
    char list[64] = "";
    for (int i = 0; i < N_SETS; i++)
        if (offered[i]) snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", *list ? ", " : "", set_names[i]);
    bool known = false;
    for (int i = 0; i < N_SETS; i++) known |= !strcmp(name, set_names[i]);
    *out = NULL;
    return quill_fail(err, QUILL_E_ARG,
                      "QUILL_ISA=%.32s: %s; this CPU offers %s (unset QUILL_ISA to use the fastest, %s)", name,
                      known ? "this CPU lacks that kernel set"
                            : "no such kernel set (amx, vnni, avx512, avxvnni, avx2, i8mm, dotprod, scalar)",
                      list, quill_kernels_best()->isa);
}

quill_row_dequant_fn quill_kernels_dequant(const quill_kernels *k, uint32_t type) {
    if (type < QUILL_TYPE_COUNT && k->dequant[type]) return k->dequant[type];
    const quill_type_traits *tr = quill_type_traits_of(type);
    return tr ? tr->to_float : NULL;
}
