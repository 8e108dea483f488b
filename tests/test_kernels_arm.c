/* The aarch64 sets (src/kernels/arm/): offered as Linux reports the CPU's features, ordered
 * i8mm > dotprod > scalar, and their f32 dot in the avx2 set's order, so that a model's float
 * products give the same bits on both architectures (`make cross-test` runs these under qemu and
 * compares whole models' logits). Their exact products are checked with every other set's in
 * test_kernels_exact.c, their other f32 kernels in test_kernels.c. */
#include "test.h"

#include "base/cpu.h"
#include "kernels/kernels.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

/* kernels_avx2.c's dot_nt for one token, in plain C: two 8-lane chains of fused multiply-adds
 * over each 16 columns, the columns past the last 16 summed apart (multiply, then add), the lanes
 * added a + b, folded 4 apart, then lanes 0 + 2 and 1 + 3, then those two, then the tail. */
static float dot_in_avx2_order(const float *w, const float *x, int64_t n) {
    float a[8] = {0}, b[8] = {0}, tail = 0;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int l = 0; l < 8; l++) {
            a[l] = fmaf(w[i + l], x[i + l], a[l]);
            b[l] = fmaf(w[i + 8 + l], x[i + 8 + l], b[l]);
        }
    for (; i < n; i++) {
        const float p = w[i] * x[i];
        tail += p;
    }
    float v[8], s[4];
    for (int l = 0; l < 8; l++) v[l] = a[l] + b[l];
    for (int l = 0; l < 4; l++) s[l] = v[l] + v[l + 4];
    const float s0 = s[0] + s[2], s1 = s[1] + s[3];
    return (s0 + s1) + tail;
}

/* (The avx2 set itself has this order where its file is built without contraction, as gcc builds
 * C11 by default: clang fuses its tail's multiply-add.) */
TEST(kernels_arm_dot_in_the_avx2_order) {
    const char *const sets[] = {"dotprod", "i8mm"};
    int checked = 0;
    for (size_t k = 0; k < sizeof sets / sizeof sets[0]; k++) {
        const quill_kernels *kern = quill_kernels_for(sets[k]);
        if (!kern) continue;
        checked++;
        bool ok = true;
        for (int64_t n = 1; n <= 300 && ok; n += (n < 40 ? 1 : 29)) {
            const int nt = 1 + (int)(n % 6); /* 1..6 tokens: the 4-token groups and the rest */
            float *w = malloc((size_t)n * sizeof *w), *x = malloc((size_t)(n * nt) * sizeof *x), out[6];
            for (int64_t i = 0; i < n; i++) w[i] = test_randf(&rng_state);
            for (int64_t i = 0; i < n * nt; i++) x[i] = test_randf(&rng_state) * (i % 7 == 0 ? 50.0f : 1.0f);
            kern->dot(w, x, n, nt, n, out, 1);
            for (int t = 0; t < nt && ok; t++) {
                const float want = dot_in_avx2_order(w, x + t * n, n);
                ok = memcmp(&out[t], &want, sizeof want) == 0;
                if (!ok)
                    test_fail(__FILE__, __LINE__, "%s dot of %lld columns, token %d of %d: %.9g, the avx2 order gives %.9g",
                              sets[k], (long long)n, t, nt, out[t], want);
            }
            free(w);
            free(x);
        }
    }
    if (!checked) test_skip("this CPU offers neither the dotprod nor the i8mm set");
}

/* Which sets this CPU offers follows its features, fastest first; the i8mm set is the dotprod set
 * with other exact products, its f32 kernels the same. */
TEST(kernels_arm_sets_follow_the_cpu_features) {
    const quill_kernels *dotprod = quill_kernels_for("dotprod"), *i8mm = quill_kernels_for("i8mm");
#if defined(__aarch64__)
    const quill_cpu_features *f = quill_cpu_features_get();
    CHECK(!dotprod == !f->asimd_dotprod, "dotprod set %s, the CPU %s asimddp", dotprod ? "offered" : "not offered",
          f->asimd_dotprod ? "reports" : "lacks");
    CHECK(!i8mm == !(f->asimd_dotprod && f->i8mm), "i8mm set %s, the CPU %s i8mm", i8mm ? "offered" : "not offered",
          f->i8mm ? "reports" : "lacks");
    const quill_kernels *want = i8mm ? i8mm : dotprod ? dotprod : quill_kernels_for("scalar");
    CHECK(quill_kernels_best() == want, "the default set is %s, want %s", quill_kernels_best()->isa, want->isa);
    CHECK(!quill_kernels_for("avx2") && !quill_kernels_for("vnni"), "no x86 set on aarch64");
    if (i8mm && dotprod) {
        CHECK(i8mm->dot == dotprod->dot && i8mm->weighted_sum == dotprod->weighted_sum && i8mm->softmax == dotprod->softmax,
              "the i8mm set keeps the dotprod set's f32 kernels");
        CHECK(i8mm->matmul[QUILL_TYPE_Q4_K] && i8mm->matmul[QUILL_TYPE_Q4_K] != dotprod->matmul[QUILL_TYPE_Q4_K],
              "the i8mm set has exact products of its own");
    }
    if (dotprod) CHECK(!strcmp(dotprod->isa, "dotprod") && dotprod->dot != quill_kernels_scalar()->dot, "NEON f32 kernels");
    if (!dotprod) test_skip("this CPU lacks dotprod: only the scalar set runs");
#else
    CHECK(!dotprod && !i8mm, "the aarch64 sets are offered on aarch64 only");
#endif
}
