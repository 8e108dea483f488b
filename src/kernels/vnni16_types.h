/* The types of the vnni16 load-time layout (pack_vnni16.h), one list for the three sets that read
 * it (vnni, avx2, avxvnni): each makes its functions and install tables from these. */
#ifndef QUILL_VNNI16_TYPES_H
#define QUILL_VNNI16_TYPES_H

/* The types of the layout as X-macro lists, M(sfx, ID) per type, from which each set's files make
 * their functions and install tables: a type joins the layout here. VNNI16_GRID_TYPES: the grid
 * i-quants, whose codes take 16 values at most (8 magnitudes, signed) and whose slot scales are 4
 * bits at most: packed as nibbles (grid_nibbles). VNNI16_UNPACKED_TYPES: the other types of the
 * unpacking kernels (exact_unpacked.h), mxfp4, iq4, q2_K and q3_K. VNNI16_TYPES: all those and the
 * specialised kernels' q4_0, q8_0, q4_K, q5_K, q6_K (packed_type). */
#define VNNI16_GRID_TYPES(M)                                                                                    \
    M(iq3_s, IQ3_S) M(iq3_xxs, IQ3_XXS) M(iq2_xxs, IQ2_XXS) M(iq2_xs, IQ2_XS) M(iq2_s, IQ2_S) M(iq1_s, IQ1_S) \
    M(iq1_m, IQ1_M)
#define VNNI16_UNPACKED_TYPES(M) \
    M(mxfp4, MXFP4) M(iq4_nl, IQ4_NL) M(iq4_xs, IQ4_XS) M(q2_K, Q2_K) M(q3_K, Q3_K) VNNI16_GRID_TYPES(M)
#define VNNI16_TYPES(M) \
    M(q4_0, Q4_0) M(q8_0, Q8_0) M(q4_K, Q4_K) M(q5_K, Q5_K) M(q6_K, Q6_K) VNNI16_UNPACKED_TYPES(M)

#endif
