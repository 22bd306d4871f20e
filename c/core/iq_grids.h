/* The codebooks of the ggml IQ1 / IQ2 / IQ3 block formats (docs/reference/gguf.md §2), defined
 * in iq_grids.c, which tools/gen_iq_grids.py writes from the gguf package's tables.  Each entry
 * is a run of 8 (IQ2, IQ1) or 4 (IQ3) values in element order; a block's codes index them and
 * its sign bits flip them.  These are data of the file format, not tuning. */
#ifndef MG_IQ_GRIDS_H
#define MG_IQ_GRIDS_H

#include <stdint.h>

extern const uint8_t mg_iq2xxs_grid[256][8];  /* IQ2_XXS: magnitudes 8, 25, 43 */
extern const uint8_t mg_iq2xs_grid[512][8];   /* IQ2_XS: the same three magnitudes */
extern const uint8_t mg_iq2s_grid[1024][8];   /* IQ2_S */
extern const uint8_t mg_iq3xxs_grid[256][4];  /* IQ3_XXS: magnitudes 4 .. 62 */
extern const uint8_t mg_iq3s_grid[512][4];    /* IQ3_S: odd magnitudes 1 .. 15 */
extern const int8_t mg_iq1s_grid[2048][8];    /* IQ1_S and IQ1_M: -1, 0, +1 */
/* IQ2_XXS / IQ2_XS / IQ3_XXS: 7 stored sign bits -> 8 (bit 7 makes the count of set bits even);
 * bit j set flips element j. */
extern const uint8_t mg_iq2_ksigns[128];

#endif
