/* The avxvnni set's exact products: kernels_avx2_exact.c built again with VEX vpdpbusd (AVX-VNNI,
 * 256-bit: Intel's client chips from Alder Lake on, which lack AVX-512, and AMD's Zen 4 and 5).
 * One vpdpbusd adds four products of unsigned weight codes and signed activation bytes into a
 * 32-bit lane without saturating, where AVX2 takes vpmaddubsw's saturating 16-bit pair sums, a
 * vpmaddwd to widen them, and for q8_0 two 4-bit digits of each code. The integer sums are the
 * same exact integers, so the results are the avx2 set's bits (and the model's). */
#define QUILL_AVXVNNI 1
#include "kernels_avx2_exact.c"
