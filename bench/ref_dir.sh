# Sourced by the bench scripts: `REF=$(ref_usable "$REF")`.
#
# ref_usable DIR prints DIR when its programs can run. Some copies of the reference's folders hold
# their library links as small text files naming the link's target ("../bin/libggml-base.so.0";
# seen with ../shared/ref/bin-avx2/, the AVX2-only variant), and every program there then stops
# with "file too short". For such a folder it prints a working copy beside the bench models
# ($QUILL_BENCH_DIR/ref-NAME): the programs copied (they find their libraries next to their real
# path), each text link made a real link to its target, and nothing else, so the CPU variants the
# folder offers are the only ones the reference loads.
ref_usable() {
    src=$1
    broken=0
    for f in "$src"/lib*.so*; do
        [ -f "$f" ] && [ ! -L "$f" ] || continue
        [ "$(wc -c < "$f")" -lt 256 ] && head -c 256 "$f" | grep -q '^[./A-Za-z0-9_+-]*\.so[.0-9]*$' && broken=1
    done
    if [ "$broken" = 0 ]; then
        echo "$src"
        return
    fi
    fixed=${QUILL_BENCH_DIR:-$(cd "$src" && pwd)/../../../quill-bench-models}/ref-$(basename "$src")
    mkdir -p "$fixed" || return 1
    for f in "$src"/*; do
        name=$(basename "$f")
        if [ "$(wc -c < "$f")" -lt 256 ] && head -c 256 "$f" | grep -q '^[./A-Za-z0-9_+-]*\.so[.0-9]*$'; then
            target=$(cat "$f")
            case $target in /*) ;; *) target=$(cd "$src" && cd "$(dirname "$target")" && pwd)/$(basename "$target") ;; esac
            ln -sfn "$target" "$fixed/$name"
        else
            cp -f "$f" "$fixed/$name"
        fi
    done
    echo "$fixed"
}
