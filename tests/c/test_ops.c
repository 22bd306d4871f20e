/* mg_topk against a sort: both paths (insertion for k <= 32, the heap above) must give the k
 * largest values, largest first, ties in index order, on odd sizes and heavily tied inputs. */
#include <stdlib.h>
#include "check.h"
#include "core/ops.h"

static const float *g_x;

static int by_rank(const void *pa, const void *pb) {
    int a = *(const int *)pa, b = *(const int *)pb;
    if (g_x[a] != g_x[b]) return g_x[a] > g_x[b] ? -1 : 1;
    return a < b ? -1 : 1;
}

static unsigned g_seed = 12345u;
static float next_value(int levels) {
    g_seed = g_seed * 1103515245u + 12345u;
    unsigned r = (g_seed >> 8) & 0xffffu;
    return levels ? (float)(r % (unsigned)levels) : (float)r / 65536.0f - 0.5f;
}

static void check_case(int n, int k, int levels) {
    float *x = malloc(sizeof(float) * (size_t)n);
    int *got = malloc(sizeof(int) * (size_t)k), *want = malloc(sizeof(int) * (size_t)n);
    for (int i = 0; i < n; i++) {
        x[i] = next_value(levels);
        want[i] = i;
    }
    g_x = x;
    qsort(want, (size_t)n, sizeof(int), by_rank);
    mg_topk(x, n, k, got);
    int same = 1;
    for (int i = 0; i < k; i++) same &= got[i] == want[i];
    CHECK(same, "n=%d k=%d levels=%d", n, k, levels);
    free(x);
    free(got);
    free(want);
}

int main(void) {
    const int sizes[] = {1, 7, 33, 100, 1001, 4099};
    const int ks[] = {1, 4, 8, 32, 33, 64, 511, 512};
    const int levels[] = {0, 3, 50};  /* 0: distinct values; otherwise many ties */
    for (size_t a = 0; a < sizeof sizes / sizeof *sizes; a++)
        for (size_t b = 0; b < sizeof ks / sizeof *ks; b++)
            for (size_t c = 0; c < sizeof levels / sizeof *levels; c++)
                if (ks[b] <= sizes[a]) check_case(sizes[a], ks[b], levels[c]);
    /* ascending input: the insertion path's worst case, the heap's replace-every-time case */
    float up[3000];
    int got[600];
    for (int i = 0; i < 3000; i++) up[i] = (float)i;
    mg_topk(up, 3000, 600, got);
    int ok = 1;
    for (int i = 0; i < 600; i++) ok &= got[i] == 2999 - i;
    CHECK(ok, "ascending input");
    printf("%d passed, %d failed\n", g_pass, g_fail);
    return g_fail ? 1 : 0;
}
