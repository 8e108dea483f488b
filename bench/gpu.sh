#!/bin/sh
# The Vulkan backend on a real GPU (issue 47, docs/gpu.md): the one prepared script a session lent a
# GPU machine runs there (the device tool: /work/.library/device/README.md). It checks the backend
# (`quill devices --selftest`), checks the logits of the forward pass against the CPU path's (the
# exact types bit for bit, the float ones within 1e-4 of the largest |logit| with the same greedy
# tokens), and measures ppN and tgN of quill's Vulkan path against its CPU path, and against the
# reference's Vulkan llama-bench when one was carried. Everything it writes goes to $OUT.
#
#   bench/gpu.sh prepare    HERE, before the device call: builds quill (make) and gathers into .gpu/
#                           (ignored by git) what the bare GPU machine lacks: the quill binary and
#                           every shared library it links but the C library (the Vulkan loader
#                           among them), the Debian packages of the GL dispatch libraries that the
#                           NVIDIA Vulkan driver loads (apt-get download), the tokenizers of
#                           ../shared/tokenizer the synthesized models take, and stories260K.
#                           REF_VULKAN=DIR also packs the reference's Vulkan build (DIR/llama-bench,
#                           the libraries beside it and those it links, gzipped; docs/gpu.md says how
#                           to build it); BASE_QUILL=FILE another quill binary (an earlier commit's),
#                           measured on the device beside this one (the table's "base"). The
#                           whole must stay under the device tool's 64 MiB: it says the size.
#   bench/gpu.sh            THERE, as the device call's command, with carry [".gpu"] and a timeout
#                           of 600 s: the suite's Vulkan tests (TESTS=1, the default there; about
#                           10 MiB of the test binary and the validation layer, packed by prepare),
#                           the checks (a small Qwen3-MoE's logits first, then a
#                           small Qwen3.6-MoE's: DeltaNet layers, their products on the device),
#                           then TinyLlama-1.1B-shaped q4_0, q8_0, q4_k_m and iq4_xs
#                           and a Llama-3.1-8B-shaped q4_k_m (random weights, real tokenizers; made
#                           there with quill synth and quill quantize), pp512 and tg128, while
#                           BUDGET_S lasts (what did not fit is named in the results).
#   SMALL=1 bench/gpu.sh    the same in small on any Vulkan device, lavapipe included: stories260K
#                           (f32), a synthesized 64-wide model in q8_0 and q4_k_m and a 64-wide
#                           Qwen3-MoE (16 experts, 4 used) in q8_0, pp64 and tg16,
#                           one run each: checks the script itself (tests/test_vulkan.c runs it).
#
# Results in $OUT (at most 8 files, as the device tool returns them): results.md (the table and
# the machine), selftest.txt, logits.txt, bench.txt (every raw `quill bench --json` and llama-bench
# output), speeds.txt (model, side, pp and tg: every side's), profile.txt (PROFILE=1), log.txt
# (everything the commands said).
#
# Environment (defaults in brackets): OUT [gpu-out]; WORK (models) [/tmp/quill-gpu]; DEVICE [the
# first discrete GPU `quill devices` lists, else 0]; THREADS (the CPU path's) [all CPUs]; PP [512;
# SMALL: 64]; TG [128; SMALL: 16]; REPS [3; SMALL: 1]; MODELS [moe64-q8_0 hybrid64-q8_0
# tinyllama-q4_0 tinyllama-q8_0 tinyllama-q4_k_m tinyllama-iq4_xs llama8b-q4_k_m; SMALL: stories260K
# synth64-q8_0 synth64-q4_k_m moe64-q8_0]; SIDES (what each model is measured with, in this order:
# vulkan, base (.gpu/quill-base on the device), ref (the carried reference), fma64 (vulkan with the
# exact multiply-adds in float64 steps, QUILL_VULKAN_FMA=float64), cpu) [vulkan base ref cpu]; PROFILE
# (1: each model's prompt and generation profiled per shader into profile.txt) [0]; TESTS (1: the
# suite's Vulkan tests first, where prepare packed them) [1; SMALL: 0]; BUDGET_S
# [480: no model is started after that many seconds]; STEP_S [150: a run or bench command that
# takes longer is stopped, and reported as failed or slow]; MAKE_S [300: the same for synthesizing
# and quantizing a model]; LAYERS_8B [32: fewer make the 8B shape's model, single-threaded in quill
# synth, in less time]; BW_MIB (quill bench's bandwidth test) [1024;
# SMALL: 16]; QUILL [.gpu/quill, else build/quill].
# Needs sh, awk, sed, od, cmp and paste.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
pack=$root/.gpu
die() { echo "gpu.sh: $*" >&2; exit 1; }

if [ "${1:-}" = prepare ]; then
    cd "$root"
    make -j2 all >/dev/null || die "make failed"
    rm -rf "$pack"
    mkdir -p "$pack/lib" "$pack/deb" "$pack/models"
    cp build/quill "$pack/quill" && strip --strip-debug "$pack/quill"
    # the suite's Vulkan tests, to run on the GPU too (issue 47: NVIDIA's subgroups of 32 as well as
    # lavapipe's 8), with the Khronos validation layer they open the device with
    make -j2 build/quill_test >/dev/null || die "make build/quill_test failed"
    cp build/quill_test "$pack/quill_test" && strip --strip-debug "$pack/quill_test"
    layer=/usr/lib/x86_64-linux-gnu/libVkLayer_khronos_validation.so
    manifest=/usr/share/vulkan/explicit_layer.d/VkLayer_khronos_validation.json
    if [ -f "$layer" ] && [ -f "$manifest" ]; then
        tar -czf "$pack/layer.tar.gz" -C "$(dirname "$layer")" "$(basename "$layer")" \
            -C "$(dirname "$manifest")" "$(basename "$manifest")" || die "packing the validation layer failed"
    else
        echo "gpu.sh: no Khronos validation layer here (vulkan-validationlayers): the tests will not run there" >&2
    fi
    # every library the binary links, but those of the C library, which the machine has
    ldd build/quill | awk '$2 == "=>" && $3 ~ /^\// { print $3 }' |
        grep -Ev '/(libc|libm|libpthread|libdl|librt|ld-linux[^/]*)\.so' | while read -r lib; do
        cp -L "$lib" "$pack/lib/"
    done
    # the NVIDIA Vulkan driver's GL dispatch libraries, as the device README has them unpacked there
    (cd "$pack/deb" && apt-get download libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2 >/dev/null) ||
        echo "gpu.sh: apt-get download failed: the machine's own GL libraries will have to do" >&2
    shared=$root/../shared
    for f in tokenizer/ggml-vocab-llama-spm.gguf tokenizer/ggml-vocab-llama-bpe.gguf models/stories260K.gguf; do
        [ -f "$shared/$f" ] || die "$shared/$f is missing (the shared reference data)"
        cp "$shared/$f" "$pack/models/"
    done
    if [ -n "${BASE_QUILL:-}" ]; then
        # another build of quill (an earlier commit's), measured beside this one in the same minutes
        [ -x "$BASE_QUILL" ] || die "BASE_QUILL=$BASE_QUILL is not an executable"
        cp "$BASE_QUILL" "$pack/quill-base" && strip --strip-debug "$pack/quill-base"
    fi
    if [ -n "${REF_VULKAN:-}" ]; then
        [ -x "$REF_VULKAN/llama-bench" ] || die "REF_VULKAN=$REF_VULKAN has no llama-bench"
        # its libraries (ggml's, with the SPIR-V of every shader, tens of MiB) and those it links
        # but the C library's, compressed: gpu.sh unpacks them into $WORK there
        rm -rf "$pack/ref.tmp" && mkdir -p "$pack/ref.tmp"
        cp -L "$REF_VULKAN/llama-bench" "$pack/ref.tmp/" && cp -P "$REF_VULKAN"/lib*.so* "$pack/ref.tmp/" ||
            die "copying the reference from $REF_VULKAN failed"
        LD_LIBRARY_PATH="$REF_VULKAN" ldd "$REF_VULKAN/llama-bench" | awk '$2 == "=>" && $3 ~ /^\// { print $3 }' |
            grep -Ev '/(libc|libm|libpthread|libdl|librt|ld-linux[^/]*)\.so' | while read -r lib; do
            [ -f "$pack/ref.tmp/$(basename "$lib")" ] || cp -L "$lib" "$pack/ref.tmp/"
        done
        find "$pack/ref.tmp" -type f -exec strip --strip-debug {} + 2>/dev/null || true
        tar -C "$pack/ref.tmp" -cf - . | gzip -9 > "$pack/ref.tar.gz" || die "packing the reference failed"
        rm -rf "$pack/ref.tmp"
    fi
    mib=$(du -sm "$pack" | awk '{ print $1 }')
    echo "gpu.sh: .gpu/ holds $mib MiB (the device tool carries 64 MiB with the working tree)"
    [ "$mib" -lt 60 ] || die ".gpu/ is too large to carry: leave REF_VULKAN out, or strip more"
    exit 0
fi

SMALL=${SMALL:-0}
OUT=${OUT:-$root/gpu-out}
WORK=${WORK:-/tmp/quill-gpu}
BUDGET_S=${BUDGET_S:-480}
STEP_S=${STEP_S:-150}
MAKE_S=${MAKE_S:-300}
if [ "$SMALL" = 1 ]; then
    PP=${PP:-64} TG=${TG:-16} REPS=${REPS:-1} BW_MIB=${BW_MIB:-16}
    MODELS=${MODELS:-stories260K synth64-q8_0 synth64-q4_k_m moe64-q8_0}
else
    PP=${PP:-512} TG=${TG:-128} REPS=${REPS:-3} BW_MIB=${BW_MIB:-1024}
    MODELS=${MODELS:-moe64-q8_0 hybrid64-q8_0 tinyllama-q4_0 tinyllama-q8_0 tinyllama-q4_k_m tinyllama-iq4_xs llama8b-q4_k_m}
fi
THREADS=${THREADS:-$(nproc)}
SIDES=${SIDES:-vulkan base ref cpu}
TESTS=${TESTS:-$([ "$SMALL" = 1 ] && echo 0 || echo 1)}
PROFILE=${PROFILE:-0}
mkdir -p "$OUT" "$WORK" || die "cannot create $OUT and $WORK"
log=$OUT/log.txt
: > "$log"
started=$(date +%s)

# the carried binary and libraries (bench/gpu.sh prepare), else this checkout's build
if [ -z "${QUILL:-}" ]; then
    if [ -x "$pack/quill" ]; then
        QUILL=$pack/quill
        export LD_LIBRARY_PATH="$pack/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    else
        QUILL=$root/build/quill
    fi
fi
[ -x "$QUILL" ] || die "$QUILL is not built (make, or bench/gpu.sh prepare before the device call)"
# the bare GPU machine: the GL dispatch libraries the NVIDIA driver needs (as root, as the device
# README does it), and the driver's manifest where the loader does not look
if [ "$SMALL" != 1 ] && [ -d "$pack/deb" ] && [ "$(id -u)" = 0 ] && ! ldconfig -p | grep -q libGLdispatch; then
    for f in "$pack"/deb/*.deb; do [ -f "$f" ] && dpkg -x "$f" /; done
    ldconfig
fi
nvidia_icd=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
if [ -z "${VK_DRIVER_FILES:-}" ] && [ -f "$nvidia_icd" ]; then export VK_DRIVER_FILES=$nvidia_icd; fi

# the reference's Vulkan build, when carried (gpu.sh prepare with REF_VULKAN)
ref_dir=""
if [ -f "$pack/ref.tar.gz" ]; then
    rm -rf "$WORK/ref" && mkdir -p "$WORK/ref" &&
        gzip -dc "$pack/ref.tar.gz" | tar -C "$WORK/ref" -xf - && [ -x "$WORK/ref/llama-bench" ] && ref_dir=$WORK/ref ||
        echo "gpu.sh: the carried reference did not unpack: it is left out" >&2
    # the C++ runtime the machine has is newer than the one it was built with: the machine's (its
    # drivers may need the newer one)
    for lib in libstdc++.so.6 libgcc_s.so.1 libgomp.so.1; do
        ldconfig -p | grep -q "$lib" && rm -f "$WORK/ref/$lib"
    done
fi

models=$pack/models
[ -d "$models" ] || models=$root/../shared/models
vocab_dir=$pack/models
[ -d "$vocab_dir" ] || vocab_dir=$root/../shared/tokenizer

{
    echo "# bench/gpu.sh $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo
    echo "- quill: $("$QUILL" --version 2>&1 | head -n 1); $(cd "$root" && git rev-parse --short HEAD 2>/dev/null || echo 'no git')"
    echo "- CPU: $(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo), $(nproc) CPUs; load: $(uptime | sed 's/.*load average: //')"
    if command -v nvidia-smi > /dev/null 2>&1; then
        echo "- GPU: $(nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv,noheader 2>&1 | head -n 1)"
    fi
} > "$WORK/head.md"

echo "== quill devices" >> "$log"
"$QUILL" devices --json > "$WORK/devices.jsonl" 2>> "$log" || die "quill devices failed: $(tail -n 5 "$log")"
cat "$WORK/devices.jsonl" >> "$log"
if [ -z "${DEVICE:-}" ]; then
    DEVICE=$(awk '/"kind": *"discrete"/ { print NR - 1; exit }' "$WORK/devices.jsonl")
    DEVICE=${DEVICE:-0}
fi
device_line=$(sed -n "$((DEVICE + 1))p" "$WORK/devices.jsonl")
echo "- Vulkan device $DEVICE: $device_line" >> "$WORK/head.md"

echo "== quill devices --selftest --device $DEVICE" >> "$log"
selftest=ok
"$QUILL" devices --selftest --device "$DEVICE" > "$OUT/selftest.txt" 2>&1 || selftest=FAILED
cat "$OUT/selftest.txt" >> "$log"
echo "- \`quill devices --selftest\`: $selftest (selftest.txt)" >> "$WORK/head.md"

# The suite's Vulkan tests on this device (TESTS=1, when gpu.sh prepare packed them): stories260K as
# their reference data, the validation layer unpacked beside them.
if [ "$TESTS" = 1 ] && [ -x "$pack/quill_test" ] && [ -f "$pack/layer.tar.gz" ]; then
    mkdir -p "$WORK/shared/models" "$WORK/layer"
    cp "$pack/models/stories260K.gguf" "$WORK/shared/models/"
    echo "stories260K alone, for the Vulkan tests (bench/gpu.sh)" > "$WORK/shared/README.md"
    gzip -dc "$pack/layer.tar.gz" | tar -C "$WORK/layer" -xf -
    echo "== quill_test vulkan" >> "$log"
    tests=$(cd "$root" && VK_LAYER_PATH="$WORK/layer" LD_LIBRARY_PATH="$WORK/layer${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
        QUILL_SHARED="$WORK/shared" QUILL_REQUIRE_SHARED=1 QUILL_BIN="$QUILL" timeout "$((STEP_S * 2))" "$pack/quill_test" vulkan 2>&1 |
        tee -a "$log" | tail -n 1)
    echo "- the suite's Vulkan tests here (\`quill_test vulkan\`): ${tests:-no result} (log.txt)" >> "$WORK/head.md"
    case $tests in *" 0 failed") ;; *) selftest="$selftest, tests FAILED" ;; esac
fi

# A model by name, made in $WORK when absent (random weights of a real shape, real tokenizer).
make_model() { # name -> path on stdout
    name=$1
    case $name in
    stories260K) echo "$models/stories260K.gguf"; return ;;
    tinyllama-*) f16=$WORK/tinyllama-f16.gguf synth="--like tinyllama-1.1b" vocab=ggml-vocab-llama-spm.gguf ;;
    llama8b-*)
        f16=$WORK/llama8b-f16.gguf vocab=ggml-vocab-llama-bpe.gguf
        synth="--embd 4096 --layers ${LAYERS_8B:-32} --heads 32 --kv-heads 8 --ff 14336 --ctx 8192" ;;
    synth64-* | moe64-* | hybrid64-*)
        f16=$WORK/${name%%-*}-f32.gguf vocab=../models/stories260K.gguf
        [ -d "$pack/models" ] && vocab=stories260K.gguf
        synth="--embd 64 --layers 3 --heads 4 --kv-heads 2 --ff 128 --seed 3 --type f32"
        # (a Qwen3-MoE of 16 experts, 4 used: the router, the choice and the experts on the device)
        # (hybrid64: a Qwen3.6-MoE, DeltaNet layers and gated attention: their products on the device)
        case $name in
        moe64-*) synth="--arch qwen3moe $synth --experts 16 --experts-used 4 --expert-ff 32" ;;
        hybrid64-*) synth="--arch qwen35moe $synth --layers 4 --experts 16 --experts-used 4 --expert-ff 32" ;;
        esac ;;
    *) die "unknown model $name (tinyllama-TYPE, llama8b-TYPE, synth64-TYPE, moe64-TYPE, hybrid64-TYPE or stories260K)" ;;
    esac
    out=$WORK/$name.gguf
    if [ ! -f "$out" ]; then
        if [ ! -f "$f16" ]; then
            # shellcheck disable=SC2086 # $synth is a list of options
            timeout "$MAKE_S" "$QUILL" synth $synth --vocab "$vocab_dir/$vocab" -o "$f16.part" >> "$log" 2>&1 ||
                die "synth $name failed or took over MAKE_S (log.txt)"
            mv "$f16.part" "$f16"
        fi
        timeout "$MAKE_S" "$QUILL" quantize "$f16" "$out.part" "${name#*-}" >> "$log" 2>&1 ||
            die "quantize $name failed or took over MAKE_S (log.txt)"
        mv "$out.part" "$out"
    fi
    echo "$out"
}

# The logits of 16 fixed tokens (ids valid in any vocabulary of 512 or more) on the CPU and on the
# device: the exact types' must be equal bit for bit, the float ones' within 1e-4 of the largest
# |logit| with the same greedy tokens.
check_logits() { # name path
    tokens=1,15,100,200,300,400,450,499,7,33,250,123,321,77,88,99
    # the prompt's logits come from one batch; the 16 greedy tokens after it from one token at a time
    # (on a GPU the exact products' other way: a workgroup per row)
    if ! timeout "$STEP_S" "$QUILL" run -m "$2" --tokens $tokens -n 16 --temp 0 --json --logits "$WORK/cpu.bin" \
        -t "$THREADS" > "$WORK/cpu.json" 2>> "$log" ||
        ! timeout "$STEP_S" "$QUILL" run -m "$2" --tokens $tokens -n 16 --temp 0 --json --logits "$WORK/gpu.bin" \
            -t "$THREADS" --backend vulkan --device "$DEVICE" > "$WORK/gpu.json" 2>> "$log"; then
        echo "$1: FAILED (quill run, or over STEP_S: log.txt)" >> "$OUT/logits.txt"
        return
    fi
    exact=1
    case $1 in stories260K | *-f32 | *-f16 | *-bf16) exact=0 ;; esac
    same=0
    cmp -s "$WORK/cpu.bin" "$WORK/gpu.bin" && same=1
    generated() { sed -n 's/.*"generated_tokens": \(\[[^]]*\]\).*/\1/p' "$1"; }
    gen_same=0
    [ -n "$(generated "$WORK/cpu.json")" ] && [ "$(generated "$WORK/cpu.json")" = "$(generated "$WORK/gpu.json")" ] && gen_same=1
    od -An -v -tf4 -w4 "$WORK/cpu.bin" > "$WORK/cpu.txt"
    od -An -v -tf4 -w4 "$WORK/gpu.bin" > "$WORK/gpu.txt"
    paste "$WORK/cpu.txt" "$WORK/gpu.txt" | awk -v name="$1" -v exact=$exact -v same=$same -v gen=$gen_same -v n=16 '
        { c[NR] = $1 + 0; g[NR] = $2 + 0; d = c[NR] - g[NR]; d = d < 0 ? -d : d; if (d > worst) worst = d
          a = c[NR] < 0 ? -c[NR] : c[NR]; if (a > top) top = a }
        END {
            if (NR == 0 || NR % n) { printf "%s: FAILED (%d logits)\n", name, NR; exit }
            nv = NR / n
            for (t = 0; t < n; t++) {
                bc = bg = t * nv + 1
                for (i = t * nv + 1; i <= (t + 1) * nv; i++) { if (c[i] > c[bc]) bc = i; if (g[i] > g[bg]) bg = i }
                greedy += bc != bg
            }
            ok = exact ? same && gen : worst <= 1e-4 * top && greedy == 0
            printf "%s: %s (%s): %s, max |gpu - cpu| %.3g of max |logit| %.3g, %d of %d greedy tokens differ; " \
                   "16 generated one at a time: %s\n", name, ok ? "ok" : "FAILED",
                   exact ? "bit for bit, the same generated tokens" : "within 1e-4 of max |logit|, same greedy tokens",
                   same ? "identical" : "not identical", worst, top, greedy, n, gen ? "the same" : "not the same"
        }' >> "$OUT/logits.txt"
}

# One `quill bench --json` (side cpu or vulkan) or llama-bench (ref): its raw output to bench.txt,
# and "model side pp tg" (tokens/s; "-" for none) to $WORK/speeds.
bench_one() { # name path side
    case $3 in
    cpu) set -- "$1" "$2" "$3" "$QUILL" bench -m "$2" -p "$PP" -n "$TG" -r "$REPS" -t "$THREADS" --bw-mib "$BW_MIB" --json ;;
    vulkan) set -- "$1" "$2" "$3" "$QUILL" bench -m "$2" -p "$PP" -n "$TG" -r "$REPS" -t "$THREADS" --bw-mib "$BW_MIB" \
        --json --backend vulkan --device "$DEVICE" ;;
    fma64) set -- "$1" "$2" "$3" env QUILL_VULKAN_FMA=float64 "$QUILL" bench -m "$2" -p "$PP" -n "$TG" -r "$REPS" \
        -t "$THREADS" --bw-mib "$BW_MIB" --json --backend vulkan --device "$DEVICE" ;;
    base) set -- "$1" "$2" "$3" "$pack/quill-base" bench -m "$2" -p "$PP" -n "$TG" -r "$REPS" -t "$THREADS" \
        --bw-mib "$BW_MIB" --json --backend vulkan --device "$DEVICE" ;;
    ref) set -- "$1" "$2" "$3" env LD_LIBRARY_PATH="$ref_dir" "$ref_dir/llama-bench" -m "$2" -p "$PP" -n "$TG" -r "$REPS" \
        -ngl 99 -o jsonl ;;
    esac
    name=$1 side=$3
    shift 3
    echo "== $name $side: $*" >> "$log"
    echo "== $name $side: $*" >> "$OUT/bench.txt"
    if timeout "$STEP_S" "$@" > "$WORK/bench.out" 2>> "$log"; then
        cat "$WORK/bench.out" >> "$OUT/bench.txt"
        if [ "$side" = ref ]; then
            # llama-bench's JSON lines: one object per test (n_prompt 0 for tg)
            awk -v m="$name" '
                function num(key,   v) { v = $0; if (!sub(".*\"" key "\": *", "", v)) return ""; sub(/[,}].*/, "", v); return v }
                num("n_prompt") + 0 > 0 { pp = num("avg_ts") } num("n_gen") + 0 > 0 { tg = num("avg_ts") }
                END { print m, "ref", pp == "" ? "-" : pp, tg == "" ? "-" : tg }' "$WORK/bench.out" >> "$WORK/speeds"
        else
            # quill bench --json keeps each key on its line: "pp": {"n": .., "mean": ..., ...}
            pp=$(sed -n 's/^  "pp": {.*"mean": \([^,]*\),.*/\1/p' "$WORK/bench.out")
            tg=$(sed -n 's/^  "tg": {.*"mean": \([^,]*\),.*/\1/p' "$WORK/bench.out")
            echo "$name $side ${pp:--} ${tg:--}" >> "$WORK/speeds"
        fi
    else
        echo "$name $side: FAILED or over STEP_S ($STEP_S s)" | tee -a "$OUT/bench.txt" >> "$log"
        cat "$WORK/bench.out" >> "$log"
    fi
}

# results.md: the machine and the checks (head.md), the table of the speeds so far and the logits'
# checks; written after every model, so that a run stopped by the device call's timeout still
# leaves its table.
write_results() {
    cp "$WORK/head.md" "$OUT/results.md"
    {
        echo
        echo "pp$PP and tg$TG in tokens/s (means of $REPS runs); the CPU path with $THREADS threads; base: another build of quill (.gpu/quill-base) on the device; ref: the reference's Vulkan llama-bench (-ngl 99)."
        echo
        echo "| model | pp$PP vulkan / base / cpu / ref | vulkan/base | vulkan/cpu | vulkan/ref | tg$TG vulkan / base / cpu / ref | vulkan/base | vulkan/cpu | vulkan/ref |"
        echo "| --- | --: | --: | --: | --: | --: | --: | --: | --: |"
        awk '{ pp[$1, $2] = $3; tg[$1, $2] = $4; if (!($1 in seen)) { seen[$1] = 1; order[++n] = $1 } }
            function v(x) { return x == "" || x == "-" ? "—" : sprintf("%.2f", x) }
            function r(a, b) { return a == "" || a == "-" || b == "" || b == "-" || b + 0 == 0 ? "—" : sprintf("%.3fx", a / b) }
            END {
                for (k = 1; k <= n; k++) {
                    m = order[k]
                    printf "| %s | %s / %s / %s / %s | %s | %s | %s | %s / %s / %s / %s | %s | %s | %s |\n", m,
                           v(pp[m, "vulkan"]), v(pp[m, "base"]), v(pp[m, "cpu"]), v(pp[m, "ref"]),
                           r(pp[m, "vulkan"], pp[m, "base"]), r(pp[m, "vulkan"], pp[m, "cpu"]), r(pp[m, "vulkan"], pp[m, "ref"]),
                           v(tg[m, "vulkan"]), v(tg[m, "base"]), v(tg[m, "cpu"]), v(tg[m, "ref"]),
                           r(tg[m, "vulkan"], tg[m, "base"]), r(tg[m, "vulkan"], tg[m, "cpu"]), r(tg[m, "vulkan"], tg[m, "ref"])
                }
            }' "$WORK/speeds"
        echo
        echo "After $(($(date +%s) - started)) s; load: $(uptime | sed 's/.*load average: //').${skipped:+ Not run (BUDGET_S reached):$skipped.}"
        echo
        echo "Logits against the CPU path (logits.txt):"
        echo
        sed 's/^/- /' "$OUT/logits.txt"
    } >> "$OUT/results.md"
}

: > "$OUT/logits.txt"
: > "$OUT/bench.txt"
: > "$WORK/speeds"
skipped=""
for name in $MODELS; do
    if [ $(($(date +%s) - started)) -ge "$BUDGET_S" ]; then
        skipped="$skipped $name"
        continue
    fi
    echo "gpu.sh: $name" >&2
    path=$(make_model "$name") || { echo "$name: FAILED (making the model: log.txt)" >> "$OUT/logits.txt"; continue; }
    check_logits "$name" "$path"
    for side in $SIDES; do
        case $side in
        base) [ -x "$pack/quill-base" ] && bench_one "$name" "$path" base ;;
        ref) [ -n "$ref_dir" ] && bench_one "$name" "$path" ref ;;
        vulkan | cpu | fma64) bench_one "$name" "$path" "$side" ;;
        *) die "SIDES: unknown side $side (vulkan, base, ref, fma64, cpu)" ;;
        esac
    done
    cp "$WORK/speeds" "$OUT/speeds.txt"
    if [ "$PROFILE" = 1 ]; then
        # where the device's time goes: the prompt's steps, then the generated tokens' (vulkan.c's
        # QUILL_VULKAN_PROFILE)
        for test in "-p $PP -n 0" "-p 0 -n $TG"; do
            echo "== $name $test" >> "$OUT/profile.txt"
            # shellcheck disable=SC2086 # $test is a list of options
            QUILL_VULKAN_PROFILE=1 QUILL_LOG=info timeout "$STEP_S" "$QUILL" bench -m "$path" $test -r 1 -t "$THREADS" \
                --backend vulkan --device "$DEVICE" 2>&1 | grep -E "profile|^(pp|tg)" >> "$OUT/profile.txt" || true
        done
    fi
    case $name in stories260K) ;; *) rm -f "$WORK/$name.gguf" ;; esac # (the disk holds a few at most)
    write_results
done

write_results
cat "$OUT/results.md"
# the exit status says whether the checks passed (the speeds are for reading)
[ "$selftest" = ok ] && ! grep -q FAILED "$OUT/logits.txt"
