# Sourced by grammar.sh and coldstart.sh (which define die, QUILL and DIR): a random-weight model
# synthesized with quill and quantized by quill, made once.
make_quantized() { # path type vocab synth-options...
    out=$1 type=$2 vocab=$3
    shift 3
    [ -f "$out" ] && return 0
    [ -f "$vocab" ] || die "$vocab is missing (the shared reference data)"
    echo "synthesizing $out" >&2
    # written under temporary names, so that an interrupted run leaves no half file to reuse
    "$QUILL" synth "$@" --vocab "$vocab" -o "$out.f16.part" > "$DIR/synth.log" 2>&1 ||
        { cat "$DIR/synth.log" >&2; die "quill synth failed"; }
    "$QUILL" quantize "$out.f16.part" "$out.part" "$type" > "$DIR/quantize.log" 2>&1 ||
        { cat "$DIR/quantize.log" >&2; die "quill quantize failed"; }
    rm -f "$out.f16.part"
    mv "$out.part" "$out"
}
