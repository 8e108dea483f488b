#!/bin/sh
# quill against the reference implementation (../shared/ref), side by side on the same machine in
# the same minutes: each measurement is a pair of runs back to back, quill and the reference's
# llama-bench on the same model file (which of the two goes first alternates from pair to pair),
# one timed repetition each after its own warm-up. A pair gives the ratio quill / reference; the
# table shows, per line, the median of each program's speed, the median ratio and the spread of
# the ratios (lowest-highest) over the pairs. These machines change speed by up to 2x from minute
# to minute, so only the ratios of neighbouring runs mean much, and only on a quiet machine: the
# load average is printed before and after. (The reference's threads spin at every barrier, as its
# releases are built: with more runnable threads than cores its multi-threaded tg collapses, see
# bench/README.md.)
#
#   bench/vs_ref.sh             the whole table: TinyLlama-1.1B-shaped models (random weights, real
#                               tokenizer) in q4_0 q8_0 q4_k_m q6_k q5_k_m, 1 and 2 threads, pp512
#                               and tg128, 5 pairs each; then batched decoding of 4 and 8 sequences
#                               (2 threads) against llama-batched-bench, per sequence: 30 lines,
#                               300 runs; narrow it with the variables below.
#   SHAPE=qwen3moe TYPES=q4_k_m TESTS="pp tg" bench/vs_ref.sh
#                               mixture of experts: Qwen3-30B-A3B's layer (n_embd 2048, 128 experts,
#                               8 used, expert FFN 768, 32 heads, 4 KV heads of 128) or, with
#                               SHAPE=gpt-oss, gpt-oss-20b's (n_embd 2880, 32 experts, 4 used, FFN
#                               2880, 64 heads, 8 KV heads of 64, window 128), LAYERS of them.
#   SHAPE=qwen35moe TYPES=q4_k_m TESTS="pp tg" bench/vs_ref.sh
#                               hybrid recurrent: Qwen3.6-35B-A3B's layers (n_embd 2048; Gated
#                               DeltaNet with 16 key and 32 value heads, state 128, 4 taps; every
#                               fourth layer gated attention, 16 heads, 2 KV heads of 256; 256
#                               experts, 8 used, expert FFN 512, a shared expert of 512) or, with
#                               SHAPE=qwen35, a dense Qwen3.5 stack of the same attention and DeltaNet
#                               shapes with an FFN of 6144; LAYERS of them (a multiple of 4 keeps
#                               the real three-to-one mix).
#   SHAPE=glm4moe TYPES=q4_k_m TESTS="pp tg" bench/vs_ref.sh
#                               issue 48's families: GLM-4.5's layers (partial RoPE, biases, a sigmoid
#                               router, a shared expert, a dense first layer) at Qwen3-30B-A3B's
#                               widths; SHAPE=deepseek2, DeepSeek-V2-Lite's (latent attention of rank
#                               512, 64 experts, 6 used); SHAPE=nemotron_h_moe LAYERS=6, Nemotron 3
#                               Nano's pattern of Mamba-2, attention and MoE layers at n_embd 2048;
#                               SHAPE=granitehybrid, Granite-4.0-H-Tiny's (n_embd 1536, 64 experts).
#   SHAPE=lfm2 LAYERS=6 TYPES=q4_0 TESTS="pp tg" bench/vs_ref.sh
#                               LFM2's gated short convolutions: LFM2-1.2B's layers (n_embd 2048, 32
#                               heads, 8 KV heads of 64, FFN 8192, 3 taps; every third layer attention)
#                               or, with SHAPE=lfm2moe, LFM2-8B-A1B's (FFN 7168 in the 2 dense layers,
#                               then 32 experts, 4 used, expert FFN 1792).
#
# Environment (defaults in brackets):
#   QUILL_BENCH_DIR  models and raw results [../quill-bench-models, beside the repository]: the
#                    f16 model is made with `quill synth --like tinyllama-1.1b` (or the SHAPE's
#                    synth options), the others from it with the reference's llama-quantize, each
#                    only when absent
#   SHAPE [tinyllama: tinyllama, qwen3moe, gpt-oss, qwen35moe, qwen35, lfm2, lfm2moe, glm4moe,
#          deepseek2, nemotron_h_moe or granitehybrid]   LAYERS [4: the MoE shapes' layer count]
#   ARCH [llama: with SHAPE=tinyllama, another dense family of that shape, e.g. granite or olmo2]
#   TYPES [q4_0 q8_0 q4_k_m q6_k q5_k_m]   THREADS [1 2]   PAIRS [5]   PP [512]   TG [128]
#   TESTS [pp tg batched]   NPL [4 8]   BATCH_THREADS [2]   BATCH_PP [128]   BATCH_TG [128]
#   QUILL [build/quill]   QUILL_BATCHED [build/quill_batched: make bench-batched]
#   REF [../shared/ref/bin]   IK [../shared/peers/ik/llama-bench when present; none: left out]
#   IK_FLAGS [-rtr 1; -rtr 1 -fmoe 1 for the MoE shapes]
# Needs sh, awk, sed and sort.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
QUILL=${QUILL:-$root/build/quill}
QUILL_BATCHED=${QUILL_BATCHED:-$root/build/quill_batched}
REF=${REF:-$root/../shared/ref/bin}
. "$root/bench/ref_dir.sh"
REF=$(ref_usable "$REF")   # a copy whose library links are text files (bench/ref_dir.sh)
# ik_llama.cpp's llama-bench (../shared/peers/ik: the fastest CPU peer, an AVX2 build), a third
# column in pp and tg when present; IK=none leaves it out. IK_FLAGS: its repacking at load, which its
# users turn on (and -fmoe 1, its fused experts, for the MoE shapes).
IK_DEFAULT=$root/../shared/peers/ik/llama-bench
IK=${IK:-$IK_DEFAULT}
DIR=${QUILL_BENCH_DIR:-$root/../quill-bench-models}
VOCAB=$root/../shared/tokenizer/ggml-vocab-llama-spm.gguf
SHAPE=${SHAPE:-tinyllama}
LAYERS=${LAYERS:-4}
TYPES=${TYPES:-q4_0 q8_0 q4_k_m q6_k q5_k_m}
THREADS=${THREADS:-1 2}
PAIRS=${PAIRS:-5}
PP=${PP:-512}
TG=${TG:-128}
TESTS=${TESTS:-pp tg batched}
NPL=${NPL:-4 8}
BATCH_THREADS=${BATCH_THREADS:-2}
BATCH_PP=${BATCH_PP:-128}
BATCH_TG=${BATCH_TG:-128}

die() { echo "vs_ref.sh: $*" >&2; exit 1; }
number() { case $2 in '' | *[!0-9]*) die "$1 must be a whole number, not '$2'" ;; esac; }
number LAYERS "$LAYERS"
case $SHAPE in
    tinyllama) SYNTH="--like tinyllama-1.1b"; SHAPE_NAME="TinyLlama-1.1B shape"; GOALS="1.0 1.2 20" ;;
    qwen3moe) SYNTH="--arch qwen3moe --embd 2048 --layers $LAYERS --heads 32 --kv-heads 4 --head-dim 128 --ff 6144
                     --experts 128 --experts-used 8 --expert-ff 768"
              SHAPE_NAME="Qwen3-30B-A3B shape, $LAYERS layers"; GOALS="1.2 1.5 35" ;;
    gpt-oss) SYNTH="--arch gpt-oss --embd 2880 --layers $LAYERS --heads 64 --kv-heads 8 --head-dim 64 --ff 2880
                    --experts 32 --experts-used 4 --window 128"
             SHAPE_NAME="gpt-oss-20b shape, $LAYERS layers"; GOALS="1.2 1.5 35" ;;
    qwen35moe) SYNTH="--arch qwen35moe --embd 2048 --layers $LAYERS --heads 16 --kv-heads 2 --head-dim 256 --ff 512
                      --experts 256 --experts-used 8 --expert-ff 512 --ssm-heads 16,32"
               SHAPE_NAME="Qwen3.6-35B-A3B shape, $LAYERS layers"; GOALS="1.2 1.5 36" ;;
    qwen35) SYNTH="--arch qwen35 --embd 2048 --layers $LAYERS --heads 16 --kv-heads 2 --head-dim 256 --ff 6144
                   --ssm-heads 16,32"
            SHAPE_NAME="dense Qwen3.5 shape (n_embd 2048, FFN 6144), $LAYERS layers"; GOALS="1.2 1.5 36" ;;
    lfm2) SYNTH="--arch lfm2 --embd 2048 --layers $LAYERS --heads 32 --kv-heads 8 --ff 8192"
          SHAPE_NAME="LFM2-1.2B shape (every third layer attention), $LAYERS layers"; GOALS="1.2 1.5 48" ;;
    lfm2moe) SYNTH="--arch lfm2moe --embd 2048 --layers $LAYERS --heads 32 --kv-heads 8 --ff 7168
                    --experts 32 --experts-used 4 --expert-ff 1792 --dense-lead 2"
             SHAPE_NAME="LFM2-8B-A1B shape (2 dense layers), $LAYERS layers"; GOALS="1.2 1.5 48" ;;
    glm4moe) SYNTH="--arch glm4moe --embd 2048 --layers $LAYERS --heads 32 --kv-heads 4 --head-dim 128 --ff 6144
                    --experts 128 --experts-used 8 --expert-ff 768"
             SHAPE_NAME="GLM-4.5 layers at Qwen3-30B-A3B's widths (a dense first layer), $LAYERS layers"; GOALS="1.2 1.5 48" ;;
    deepseek2) SYNTH="--arch deepseek2 --embd 2048 --layers $LAYERS --heads 16 --ff 10944 --experts 64 --experts-used 6
                      --expert-ff 1408 --mla 0,512,128,64,128 --groups 1,1"
               SHAPE_NAME="DeepSeek-V2-Lite shape (latent attention, a dense first layer), $LAYERS layers"; GOALS="1.2 1.5 48" ;;
    nemotron_h_moe) SYNTH="--arch nemotron_h_moe --embd 2048 --layers $LAYERS --heads 32 --kv-heads 2 --ff 3712
                           --experts 128 --experts-used 6 --expert-ff 1856"
                    SHAPE_NAME="Nemotron-3-Nano layers at n_embd 2048 (Mamba-2, attention, MoE: LAYERS=6 keeps its pattern), $LAYERS layers"
                    GOALS="1.2 1.5 48" ;;
    granitehybrid) SYNTH="--arch granitehybrid --embd 1536 --layers $LAYERS --heads 12 --kv-heads 4 --ff 512
                          --experts 64 --experts-used 6"
                   SHAPE_NAME="Granite-4.0-H-Tiny shape (Mamba-2, attention, MoE), $LAYERS layers"; GOALS="1.2 1.5 48" ;;
    *) die "SHAPE is tinyllama, qwen3moe, gpt-oss, qwen35moe, qwen35, lfm2, lfm2moe, glm4moe, deepseek2, nemotron_h_moe or granitehybrid, not '$SHAPE'" ;;
esac
number PAIRS "$PAIRS"; number PP "$PP"; number TG "$TG"; number BATCH_PP "$BATCH_PP"; number BATCH_TG "$BATCH_TG"
[ "$PAIRS" -ge 1 ] || die "PAIRS must be at least 1"
for t in $THREADS $BATCH_THREADS $NPL; do number "a thread or sequence count" "$t"; done
for t in $TESTS; do case $t in pp | tg | batched) ;; *) die "TESTS lists pp, tg or batched, not '$t'" ;; esac; done
[ -x "$QUILL" ] || die "$QUILL is not built (run make, or set QUILL)"
[ -x "$REF/llama-bench" ] || die "$REF/llama-bench is missing (the shared reference data, or set REF)"
if [ "$IK" != none ] && [ ! -x "$IK" ]; then
    [ "$IK" = "$IK_DEFAULT" ] || die "IK=$IK is not an executable (ik_llama.cpp's llama-bench, or IK=none)"
    IK=none
fi
case $SHAPE in tinyllama | qwen35 | lfm2) IK_FLAGS=${IK_FLAGS:--rtr 1} ;; *) IK_FLAGS=${IK_FLAGS:--rtr 1 -fmoe 1} ;; esac
case " $TESTS " in *" batched "*)
    [ -x "$QUILL_BATCHED" ] || die "$QUILL_BATCHED is not built (make bench-batched, or leave batched out of TESTS)"
    [ -x "$REF/llama-batched-bench" ] || die "$REF/llama-batched-bench is missing" ;;
esac
mkdir -p "$DIR" || die "cannot create $DIR"

# ---------------------------------------------------------------- models

PREFIX=$SHAPE
[ "$SHAPE" = tinyllama ] || PREFIX=$SHAPE-$LAYERS
# another dense family in the TinyLlama shape (issue 40's speed check): ARCH=granite, olmo2, ...
if [ -n "${ARCH:-}" ]; then
    [ "$SHAPE" = tinyllama ] || die "ARCH goes with SHAPE=tinyllama"
    SYNTH="--arch $ARCH --like tinyllama-1.1b"; SHAPE_NAME="TinyLlama-1.1B shape as $ARCH"; PREFIX=tinyllama-$ARCH
fi
f16=$DIR/$PREFIX-f16.gguf
# shellcheck source=bench/synth_f16.sh
. "$here/synth_f16.sh"
model() { echo "$DIR/$PREFIX-$1.gguf"; }
ref_type() {
    case $1 in
        q4_0) echo Q4_0 ;; q8_0) echo Q8_0 ;; q4_k_m) echo Q4_K_M ;; q6_k) echo Q6_K ;; q5_k_m) echo Q5_K_M ;;
        q4_1) echo Q4_1 ;; q5_0) echo Q5_0 ;; q5_1) echo Q5_1 ;; q4_k_s) echo Q4_K_S ;; q5_k_s) echo Q5_K_S ;;
        q2_k) echo Q2_K ;; q3_k_m) echo Q3_K_M ;; tq1_0) echo TQ1_0 ;; tq2_0) echo TQ2_0 ;; mxfp4_moe) echo MXFP4_MOE ;;
        iq3_s) echo IQ3_S ;; iq3_m) echo IQ3_M ;; iq4_xs) echo IQ4_XS ;; iq4_nl) echo IQ4_NL ;;
        *) die "no llama-quantize name known for type '$1'" ;;
    esac
}
for t in $TYPES; do
    q=$(model "$t")
    [ -f "$q" ] && continue
    make_f16 "$f16"
    echo "quantizing $q with the reference's llama-quantize" >&2
    "$REF/llama-quantize" "$f16" "$q.part" "$(ref_type "$t")" 2 > "$DIR/quantize-$t.log" 2>&1 ||
        { tail -n 20 "$DIR/quantize-$t.log" >&2; die "llama-quantize $t failed"; }
    mv "$q.part" "$q"
done

# ---------------------------------------------------------------- one run of each program

# t/s of quill bench's "pp" or "tg" line (its JSON is one key per line). A small bandwidth buffer
# keeps the run short; the bandwidth is not what is compared here.
quill_run() { # model threads test n
    if [ "$3" = pp ]; then args="-p $4 -n 0"; else args="-p 0 -n $4"; fi
    # shellcheck disable=SC2086 # $args is a list of options
    "$QUILL" bench -m "$1" -t "$2" $args -r 1 --bw-mib 64 --json 2> "$LOG.err" > "$LOG.out" ||
        { cat "$LOG.err" >&2; die "quill bench failed: $QUILL bench -m $1 -t $2 $args -r 1"; }
    sed -n 's/^  "kernels": "\(.*\)",*$/\1/p' "$LOG.out" > "$OUT/quill-kernels"
    awk -v key="\"$3\"" 'index($0, key ":") { sub(/.*"mean": */, ""); sub(/,.*/, ""); print; exit }' "$LOG.out"
}

ref_run() { # model threads test n
    if [ "$3" = pp ]; then args="-p $4 -n 0"; else args="-p 0 -n $4"; fi
    # shellcheck disable=SC2086
    "$REF/llama-bench" -m "$1" -t "$2" $args -r 1 -o jsonl 2> "$LOG.err" > "$LOG.out" ||
        { cat "$LOG.err" >&2; die "llama-bench failed: $REF/llama-bench -m $1 -t $2 $args -r 1"; }
    grep -o 'libggml-cpu-[a-z0-9_]*\.so' "$LOG.err" | head -n 1 > "$OUT/ref-backend" || true
    sed -n 's/.*"avg_ts": *\([0-9.eE+-]*\).*/\1/p' "$LOG.out" | head -n 1
}

ik_run() { # model threads test n
    if [ "$3" = pp ]; then args="-p $4 -n 0"; else args="-p 0 -n $4"; fi
    # shellcheck disable=SC2086
    # (a file it cannot load, an architecture it lacks: its column left out for that model)
    if ! "$IK" -m "$1" -t "$2" $args -r 1 $IK_FLAGS -o json 2> "$LOG.err" > "$LOG.out"; then
        echo "vs_ref.sh: ik_llama.cpp's llama-bench cannot run $1 (its column left out): $(tail -n 1 "$LOG.err")" >&2
        return 0
    fi
    sed -n 's/.*"avg_ts": *\([0-9.eE+-]*\).*/\1/p' "$LOG.out" | head -n 1
}

# Batched decoding: tokens of all sequences per second while they generate.
quill_batched_run() { # model threads npl
    "$QUILL_BATCHED" -m "$1" -t "$2" -npp "$BATCH_PP" -ntg "$BATCH_TG" -npl "$3" 2> "$LOG.err" > "$LOG.out" ||
        { cat "$LOG.err" >&2; die "quill_batched failed: $QUILL_BATCHED -m $1 -t $2 -npl $3"; }
    sed -n 's/.*"kernels": "\([a-z0-9]*\)".*/\1/p' "$LOG.out" > "$OUT/quill-kernels"
    sed -n 's/.*"speed_tg": *\([0-9.eE+-]*\).*/\1/p' "$LOG.out" | head -n 1
}

ref_batched_run() { # model threads npl
    ctx=$(( $3 * (BATCH_PP + BATCH_TG) + 64 ))
    "$REF/llama-batched-bench" -m "$1" -t "$2" -c "$ctx" -b 512 -ub 512 -npp "$BATCH_PP" -ntg "$BATCH_TG" \
        -npl "$3" --output-format jsonl 2> "$LOG.err" > "$LOG.out" ||
        { cat "$LOG.err" >&2; die "llama-batched-bench failed on $1 (-t $2 -npl $3)"; }
    sed -n 's/.*"speed_tg": *\([0-9.eE+-]*\).*/\1/p' "$LOG.out" | head -n 1
}

# ---------------------------------------------------------------- the pairs

stamp=$(date -u +%Y%m%d-%H%M%S)
OUT=$DIR/vs_ref-$stamp
mkdir -p "$OUT"
LOG=$OUT/run
RAW=$OUT/pairs.txt
: > "$RAW"
load_before=$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo "?")

# One run of one side: quill or ref, kind pp, tg or batched (ARG: tokens, or sequences).
one() { # side kind model threads arg
    case "$1 $2" in
        "quill pp" | "quill tg") quill_run "$3" "$4" "$2" "$5" ;;
        "ref pp" | "ref tg") ref_run "$3" "$4" "$2" "$5" ;;
        "ik pp" | "ik tg") ik_run "$3" "$4" "$2" "$5" ;;
        "quill batched") quill_batched_run "$3" "$4" "$5" ;;
        "ref batched") ref_batched_run "$3" "$4" "$5" ;;
    esac
}

# One line of the table: PAIRS pairs of runs (with ik_llama.cpp, triples: which program goes first
# rotates); raw lines "type threads label pair quill ref ik" go to $RAW, ik "-" when not run.
measure() { # type model threads kind arg label
    i=1
    while [ "$i" -le "$PAIRS" ]; do
        k=-
        if [ "$IK" != none ] && [ "$4" != batched ] && [ "$2" != "${IK_CANNOT:-}" ]; then
            case $((i % 3)) in
                1) q=$(one quill "$4" "$2" "$3" "$5"); r=$(one ref "$4" "$2" "$3" "$5"); k=$(one ik "$4" "$2" "$3" "$5") ;;
                2) r=$(one ref "$4" "$2" "$3" "$5"); k=$(one ik "$4" "$2" "$3" "$5"); q=$(one quill "$4" "$2" "$3" "$5") ;;
                0) k=$(one ik "$4" "$2" "$3" "$5"); q=$(one quill "$4" "$2" "$3" "$5"); r=$(one ref "$4" "$2" "$3" "$5") ;;
            esac
            [ -n "$k" ] || { k=-; IK_CANNOT=$2; }
        elif [ $((i % 2)) -eq 1 ]; then
            q=$(one quill "$4" "$2" "$3" "$5"); r=$(one ref "$4" "$2" "$3" "$5")
        else
            r=$(one ref "$4" "$2" "$3" "$5"); q=$(one quill "$4" "$2" "$3" "$5")
        fi
        [ -n "$q" ] && [ -n "$r" ] || die "a run gave no figure ($1, $3 threads, $6, pair $i): see $LOG.*"
        echo "$1 $3 $6 $i $q $r $k" >> "$RAW"
        echo "  $1 -t $3 $6 pair $i: quill $q, reference $r, ik_llama.cpp $k t/s" >&2
        i=$((i + 1))
    done
}

for t in $TYPES; do
    m=$(model "$t")
    for th in $THREADS; do
        for test in $TESTS; do
            case $test in
                pp) measure "$t" "$m" "$th" pp "$PP" "pp$PP" ;;
                tg) measure "$t" "$m" "$th" tg "$TG" "tg$TG" ;;
            esac
        done
    done
    case " $TESTS " in *" batched "*)
        for th in $BATCH_THREADS; do
            for n in $NPL; do measure "$t" "$m" "$th" batched "$n" "batch$n"; done
        done ;;
    esac
done
load_after=$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo "?")

# ---------------------------------------------------------------- the table

cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo 2>/dev/null | head -n 1)
flags=$(sed -n 's/^flags[[:space:]]*: //p' /proc/cpuinfo 2>/dev/null | head -n 1 | tr ' ' '\n' |
        grep -E '^(avx|avx2|fma|f16c|avx512|avx_vnni|amx)' | tr '\n' ' ')
kernels=$(cat "$OUT/quill-kernels" 2>/dev/null || true)
backend=$(cat "$OUT/ref-backend" 2>/dev/null || true)
{
    echo "quill vs the reference, $SHAPE_NAME (random weights), $PAIRS alternating pairs per line"
    echo "CPU: ${cpu:-unknown}, $(nproc 2>/dev/null || echo '?') CPUs; flags: $flags"
    echo "quill: $(git -C "$root" describe --always --dirty 2>/dev/null || echo '?'), kernels ${kernels:-?};" \
         "reference: $REF${backend:+ ($backend)}"
    [ "$IK" = none ] || echo "ik_llama.cpp: $IK $IK_FLAGS"
    echo "load average before: $load_before, after: $load_after; $(date -u '+%Y-%m-%d %H:%M UTC')"
    # shellcheck disable=SC2086 # three words: the tg and pp goals and the issue
    set -- $GOALS
    echo "goals: tg >= $1x, pp >= $2x, batched per sequence >= 1.0x (issue $3)"
    goal_tg=$1 goal_pp=$2
    echo
    awk -v goal_tg="$goal_tg" -v goal_pp="$goal_pp" '
        function flush() {
            if (!n) return
            # insertion sorts: n is small
            for (i = 1; i <= n; i++) { for (j = i; j > 1 && r[j - 1] > r[j]; j--) { t = r[j]; r[j] = r[j - 1]; r[j - 1] = t } }
            for (i = 1; i <= n; i++) { for (j = i; j > 1 && q[j - 1] > q[j]; j--) { t = q[j]; q[j] = q[j - 1]; q[j - 1] = t } }
            for (i = 1; i <= n; i++) { for (j = i; j > 1 && f[j - 1] > f[j]; j--) { t = f[j]; f[j] = f[j - 1]; f[j - 1] = t } }
            for (i = 1; i <= nk; i++) { for (j = i; j > 1 && k[j - 1] > k[j]; j--) { t = k[j]; k[j] = k[j - 1]; k[j - 1] = t } }
            for (i = 1; i <= nk; i++) { for (j = i; j > 1 && rk[j - 1] > rk[j]; j--) { t = rk[j]; rk[j] = rk[j - 1]; rk[j - 1] = t } }
            mr = n % 2 ? r[(n + 1) / 2] : (r[n / 2] + r[n / 2 + 1]) / 2
            mq = n % 2 ? q[(n + 1) / 2] : (q[n / 2] + q[n / 2 + 1]) / 2
            mf = n % 2 ? f[(n + 1) / 2] : (f[n / 2] + f[n / 2 + 1]) / 2
            per = substr(test, 1, 5) == "batch" ? substr(test, 6) : 1
            goal = substr(test, 1, 2) == "pp" ? goal_pp : goal_tg
            ik = ""; vs_ik = ""
            if (nk) {
                mk = nk % 2 ? k[(nk + 1) / 2] : (k[nk / 2] + k[nk / 2 + 1]) / 2
                mrk = nk % 2 ? rk[(nk + 1) / 2] : (rk[nk / 2] + rk[nk / 2 + 1]) / 2
                ik = sprintf("%10.2f", mk); vs_ik = sprintf("%6.3fx", mrk)
            }
            printf "%-7s %3s  %-8s %10.2f %10.2f   %6.3fx  %6.3f-%6.3f  %5d   %-6s", type, th, test, mq / per, mf / per,
                   mr, r[1], r[n], n, (mr >= goal ? "met" : "missed")
            if (with_ik) printf " %10s  %7s", ik, vs_ik
            printf "\n"
            n = 0; nk = 0
        }
        BEGIN { printf "%-7s %3s  %-8s %10s %10s   %7s  %13s  %5s   %-6s", "type", "thr", "test", "quill t/s",
                       "ref t/s", "ratio", "ratio range", "pairs", "goal"
                if (with_ik) printf " %10s  %7s", "ik t/s", "vs ik"
                printf "\n" }
        { key = $1 " " $2 " " $3; if (key != last) { flush(); last = key; type = $1; th = $2; test = $3 }
          n++; q[n] = $5; f[n] = $6; r[n] = $5 / $6
          if (NF >= 7 && $7 != "-") { nk++; k[nk] = $7; rk[nk] = $5 / $7 } }
        END { flush() }' with_ik="$([ "$IK" = none ] && echo 0 || echo 1)" "$RAW"
    echo
    echo "t/s: medians over the pairs (batchN: per sequence, while N sequences generate together);"
    echo "ratio: median of quill / reference per pair, and the lowest and highest of them;"
    [ "$IK" = none ] || echo "vs ik: median of quill / ik_llama.cpp per pair (goal >= 1.0x, issue 46)."
    echo "raw pairs: $RAW"
} | tee "$OUT/table.txt"
