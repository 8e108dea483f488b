# Sourced by bench.sh and vs_ref.sh (which define die, QUILL, VOCAB and DIR, and may define SYNTH):
# the TinyLlama-1.1B-shaped f16 model (or SYNTH's shape) with random weights and the real Llama SPM
# vocabulary, made once.
make_f16() { # path
    [ -f "$1" ] && return 0
    [ -f "$VOCAB" ] || die "$VOCAB is missing (the shared reference data)"
    echo "synthesizing $1" >&2
    # written under a temporary name, so that an interrupted run leaves no half file to reuse
    # shellcheck disable=SC2086 # $SYNTH is a list of options
    "$QUILL" synth ${SYNTH:---like tinyllama-1.1b} --vocab "$VOCAB" -o "$1.part" > "$DIR/synth.log" 2>&1 ||
        { cat "$DIR/synth.log" >&2; die "quill synth failed"; }
    mv "$1.part" "$1"
}
