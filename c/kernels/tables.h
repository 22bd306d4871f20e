/* How the dispatch tables are built (c/kernels/tables.c), the one inheritance mechanism of the
 * kernels: every instruction set's table starts as a copy of its parent's table and overrides
 * the entries it implements; everything else is inherited.  The tree:
 *
 *     scalar -> avx2 -> avx512 -> avx512bf16
 *     scalar -> neon
 *
 * Each instruction set has one override function below (in its table_<isa>.c), which writes
 * that set's entries into the table being built and returns 1, or returns 0 when this build
 * does not contain it (the file compiled as its stub: another architecture, or a compiler
 * without the flags); the table and its descendants then do not exist.  The scalar table is
 * the root: its function writes every entry.
 *
 * An overriding entry that takes only some of its cases (the AVX-512 decode loops take whole
 * cache lines of certain scale kinds; avx512bf16 takes fp4 whose x splits into bf16 parts)
 * hands the others to the same entry of its table's parent (mg_kernels.parent), so a case
 * always runs the most specialised code that accepts it.  Include only from c/kernels. */
#ifndef MG_KERNELS_TABLES_H
#define MG_KERNELS_TABLES_H

#include "core/kernels.h"

int mg_kernels_override_scalar(mg_kernels *k);
int mg_kernels_override_avx2(mg_kernels *k);
int mg_kernels_override_avx512(mg_kernels *k);
int mg_kernels_override_avx512bf16(mg_kernels *k);
int mg_kernels_override_neon(mg_kernels *k);

#endif
