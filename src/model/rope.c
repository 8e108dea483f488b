/* The RoPE angles of every family: a function of the model's hyperparameters and the context's
 * frequency factors alone, below everything that rotates (context.c's tables, the float64 path,
 * latent attention's decoupled part), which call it and which it never calls. */
#include "model/context.h"

#include <math.h>

double quill_rope_angle(const quill_context *c, int table, int pos, int64_t i) {
    const quill_hparams *hp = c->hp;
    const quill_arch_params *ap = &c->model->ap;
    const double base = table ? ap->rope_base_local : hp->rope_base;
    const double scale = table ? ap->rope_scale_local : hp->rope_freq_scale;
    /* θ_i = pos · s · base^(-2i/n_rot) (s: the linear scaling, usually 1), divided by the file's
     * frequency factor when it has them */
    if (c->model->arch->rope_sections) {
        /* multi-section RoPE with text positions: time, height and width sections (interleaved)
         * rotate by the position, the pairs of the fourth by position 0 */
        const int *sec = ap->rope_sections;
        const int64_t sector = i % (sec[0] + sec[1] + sec[2] + sec[3]);
        if (!((sector % 3 == 0 && sector < 3 * sec[0]) || (sector % 3 == 1 && sector < 3 * sec[1]) ||
              (sector % 3 == 2 && sector < 3 * sec[2])))
            return 0;
    }
    const int64_t dims = quill_rope_dims(c->model, table);
    double theta = pos * scale * pow(base, -2.0 * (double)i / (double)dims);
    /* (the factors are the global table's: the sliding layers of Gemma 4 rotate without them) */
    if (c->rope_factors && !table) theta /= (double)c->rope_factors[i];
    if (ap->rope_yarn) {
        /* YaRN: the pairs below dimension `low` keep their unscaled angle, those above `high` the
         * scaled one, a linear ramp between; low and high are where a pair's wavelength fits
         * beta_fast (32) and beta_slow (1) times in the original context, rounded out as the
         * reference rounds them (in float) */
        const float n_rot = (float)dims, orig = (float)ap->n_ctx_orig, two_pi = 6.283185307179586f;
        const float lo = floorf(n_rot * logf(orig / ((float)ap->yarn_beta_fast * two_pi)) / (2 * logf((float)base)));
        const float hi = ceilf(n_rot * logf(orig / ((float)ap->yarn_beta_slow * two_pi)) / (2 * logf((float)base)));
        const double low = lo > 0 ? lo : 0, high = hi < n_rot - 1 ? hi : n_rot - 1;
        const double y = ((double)i - low) / (high - low > 0.001 ? high - low : 0.001);
        const double ramp = 1 - (y < 0 ? 0 : y > 1 ? 1 : y);
        theta = theta * (1 - ramp) + theta / scale * ramp;
    }
    return theta;
}
