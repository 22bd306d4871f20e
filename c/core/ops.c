/* Small scalar ops (see ops.h).  RoPE angles follow transformers' fp32 arithmetic so that
 * logits match the oracle bit for bit as far as possible. */
#include <math.h>
#include "core/ops.h"

void mg_rope_inv_freq(float *inv_freq, int rot_dim, double theta) {
    for (int j = 0; j < rot_dim / 2; j++) {
        /* transformers: 1.0 / (base ** (arange(0, dim, 2).float() / dim)), all in fp32 */
        float expo = (float)(2 * j) / (float)rot_dim;
        inv_freq[j] = 1.0f / powf((float)theta, expo);
    }
}

void mg_rope_cos_sin(float *cos_out, float *sin_out, const float *inv_freq, int half, int64_t pos) {
    for (int j = 0; j < half; j++) {
        float angle = (float)pos * inv_freq[j];
        cos_out[j] = cosf(angle);
        sin_out[j] = sinf(angle);
    }
}

void mg_rope_apply(float *x, int n_heads, int head_stride, int rot_off, int half,
                   const float *cos_v, const float *sin_v, int interleaved, int inverse) {
    for (int h = 0; h < n_heads; h++) {
        float *v = x + (int64_t)h * head_stride + rot_off;
        for (int j = 0; j < half; j++) {
            int i0 = interleaved ? 2 * j : j, i1 = interleaved ? 2 * j + 1 : j + half;
            float c = cos_v[j], s = inverse ? -sin_v[j] : sin_v[j];
            float a = v[i0], b = v[i1];
            v[i0] = a * c - b * s;
            v[i1] = b * c + a * s;
        }
    }
}

float mg_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

/* Insertion into a sorted list of k: the fastest for expert routing (k <= 16 of a few hundred).
 * Its cost grows as k * k * log(n / k), so the indexer's selection (k = 512 of tens of
 * thousands of compressed rows at long context) takes the heap below instead. */
static void topk_insertion(const float *x, int n, int k, int *idx) {
    int m = 0;
    for (int i = 0; i < n; i++) {
        if (m == k && !(x[i] > x[idx[m - 1]])) continue;
        int p = m < k ? m++ : k - 1;
        while (p > 0 && x[i] > x[idx[p - 1]]) { idx[p] = idx[p - 1]; p--; }
        idx[p] = i;
    }
}

/* a ranks below b: a smaller value, or an equal one at a later index (ties keep the lower index). */
static inline int ranks_below(const float *x, int a, int b) { return x[a] < x[b] || (x[a] == x[b] && a > b); }

static void sift_down(const float *x, int *h, int k, int p) {
    for (;;) {
        int c = 2 * p + 1;
        if (c >= k) return;
        if (c + 1 < k && ranks_below(x, h[c + 1], h[c])) c++;
        if (!ranks_below(x, h[c], h[p])) return;
        int t = h[p]; h[p] = h[c]; h[c] = t;
        p = c;
    }
}

/* A min-heap of the k best so far (the root ranks lowest), then heapsort into rank order:
 * O(n + k log k log n) on typical scores, the same indices in the same order as insertion.
 * Values that do not compare (NaN) are never chosen over numbers. */
static void topk_heap(const float *x, int n, int k, int *idx) {
    int m = 0;
    for (int i = 0; i < n; i++) {
        if (x[i] != x[i]) continue;
        if (m < k) {
            int p = m++;
            idx[p] = i;
            while (p > 0 && ranks_below(x, idx[p], idx[(p - 1) / 2])) {
                int q = (p - 1) / 2, t = idx[p];
                idx[p] = idx[q]; idx[q] = t;
                p = q;
            }
        } else if (x[i] > x[idx[0]]) {  /* equal values come later: they rank below the root */
            idx[0] = i;
            sift_down(x, idx, k, 0);
        }
    }
    for (int end = m - 1; end > 0; end--) {  /* the lowest-ranked goes to the back each time */
        int t = idx[0]; idx[0] = idx[end]; idx[end] = t;
        sift_down(x, idx, end, 0);
    }
}

void mg_topk(const float *x, int n, int k, int *idx) {
    if (k > n) k = n;
    if (k <= 32) topk_insertion(x, n, k, idx);
    else topk_heap(x, n, k, idx);
}
