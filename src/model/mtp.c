/* The MTP (next-token prediction) blocks that DeepSeek V3 and GLM-4.5 files carry after their main
 * layers: block_count counts them, the reference loads their tensors and runs them only for speculative
 * drafting, so quill checks each one's shape (and claims it) without running it. Then, for these
 * architectures, every tensor of the file must have been claimed: one nobody reads means the file is not
 * what its metadata says. */
#include "model/model.h"
#include "base/error.h"

#include <stdio.h>
#include <string.h>

typedef struct {
    const char *suffix;
    int64_t cols, rows, depth; /* depth > 0: a 3-D tensor of `depth` matrices */
    bool required;
} mtp_tensor;

static quill_status check(quill_model *m, int64_t l, const mtp_tensor *t, quill_error *err) {
    char name[128];
    snprintf(name, sizeof name, "blk.%lld.%s", (long long)l, t->suffix);
    if (!t->required && !quill_gguf_find_tensor(m->gguf, name)) return QUILL_OK;
    quill_weight w;
    return t->depth ? quill_model_bind_experts(m, name, t->cols, t->rows, t->depth, &w, err)
                    : quill_model_bind(m, name, t->cols, t->rows, &w, err);
}

quill_status quill_mtp_check(quill_model *m, quill_error *err) {
    const quill_hparams *hp = &m->hp;
    const quill_arch_params *ap = &m->ap;
    const quill_arch *a = m->arch;
    char key[96];
    snprintf(key, sizeof key, "%s.nextn_predict_layers", a->name);
    int64_t n_mtp = 0;
    quill_status s = quill_gguf_get_i64(m->gguf, key, &n_mtp, err);
    if (s && s != QUILL_E_NOT_FOUND) return s;
    const int64_t d = hp->n_embd, E = ap->n_expert, ff = ap->n_ff_exp, ffs = ap->n_ff_shexp, H = hp->n_head;
    const int64_t qk = ap->qk_nope + ap->qk_rope, q_dim = H * hp->head_dim, kv_dim = hp->n_head_kv * hp->head_dim;
    const bool kv_b = a->mla && quill_gguf_find_tensor(m->gguf, "blk.0.attn_kv_b.weight");
    for (int64_t l = hp->n_layer; l < hp->n_layer + n_mtp; l++) {
        const mtp_tensor common[] = {
            {"attn_norm.weight", d, 1, 0, true},
            {"nextn.eh_proj.weight", 2 * d, d, 0, true},
            {"nextn.enorm.weight", d, 1, 0, true},
            {"nextn.hnorm.weight", d, 1, 0, true},
            {"nextn.embed_tokens.weight", d, hp->n_vocab, 0, false},
            {"nextn.shared_head_head.weight", d, hp->n_vocab, 0, false},
            {"nextn.shared_head_norm.weight", d, 1, 0, false},
            {"ffn_gate_inp.weight", d, E, 0, true},
            {"exp_probs_b.bias", E, 1, 0, a->probs_bias == 2},
            {"ffn_gate_exps.weight", d, ff, E, true},
            {"ffn_up_exps.weight", d, ff, E, true},
            {"ffn_down_exps.weight", ff, d, E, true},
            {"ffn_gate_shexp.weight", d, ffs, 0, ffs > 0},
            {"ffn_up_shexp.weight", d, ffs, 0, ffs > 0},
            {"ffn_down_shexp.weight", ffs, d, 0, ffs > 0},
        };
        const mtp_tensor latent[] = {
            {"ffn_norm.weight", d, 1, 0, true},
            {"attn_q_a_norm.weight", ap->q_lora, 1, 0, ap->q_lora > 0},
            {"attn_q_a.weight", d, ap->q_lora, 0, ap->q_lora > 0},
            {"attn_q_b.weight", ap->q_lora, H * qk, 0, ap->q_lora > 0},
            {"attn_q.weight", d, H * qk, 0, ap->q_lora == 0},
            {"attn_kv_a_norm.weight", ap->kv_lora, 1, 0, true},
            {"attn_kv_a_mqa.weight", d, ap->kv_lora + ap->qk_rope, 0, true},
            {"attn_k_b.weight", ap->qk_nope, ap->kv_lora, H, !kv_b},
            {"attn_v_b.weight", ap->kv_lora, ap->v_head, H, !kv_b},
            {"attn_kv_b.weight", ap->kv_lora, H * (ap->qk_nope + ap->v_head), 0, kv_b},
            {"attn_output.weight", H * ap->v_head, d, 0, true},
        };
        const mtp_tensor plain[] = {
            {"post_attention_norm.weight", d, 1, 0, true},
            {"attn_q.weight", d, q_dim, 0, true},
            {"attn_k.weight", d, kv_dim, 0, true},
            {"attn_v.weight", d, kv_dim, 0, true},
            {"attn_q.bias", q_dim, 1, 0, false},
            {"attn_k.bias", kv_dim, 1, 0, false},
            {"attn_v.bias", kv_dim, 1, 0, false},
            {"attn_q_norm.weight", hp->head_dim, 1, 0, false},
            {"attn_k_norm.weight", hp->head_dim, 1, 0, false},
            {"attn_output.weight", q_dim, d, 0, true},
        };
        for (size_t i = 0; i < sizeof common / sizeof common[0]; i++)
            if (common[i].rows > 0 && (s = check(m, l, &common[i], err))) return s;
        const mtp_tensor *own = a->mla ? latent : plain;
        const size_t n_own = a->mla ? sizeof latent / sizeof latent[0] : sizeof plain / sizeof plain[0];
        for (size_t i = 0; i < n_own; i++)
            if (own[i].rows > 0 && own[i].cols > 0 && (s = check(m, l, &own[i], err))) return s;
    }
    return QUILL_OK;
}

quill_status quill_model_all_claimed(const quill_model *m, quill_error *err) {
    for (uint64_t i = 0; i < quill_gguf_n_tensors(m->gguf); i++)
        if (!m->claimed[i])
            return quill_fail(err, QUILL_E_FORMAT,
                              "%s: tensor '%s' is not part of a %s model of these hyperparameters (nothing would "
                              "read it): the file does not match its metadata",
                              quill_gguf_path(m->gguf), quill_gguf_tensor_at(m->gguf, i)->name, m->arch->name);
    return QUILL_OK;
}
