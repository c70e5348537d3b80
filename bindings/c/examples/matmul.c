/* Multiplies rows of x by every quantized weight of a checkpoint straight
 * from its packs (the dense weight is never made), and checks each product
 * against the weight decoded whole:
 *   matmul [CHECKPOINT] [BACKEND]   (defaults: assets/sample-w4a16, auto)
 * CHECKPOINT may be a GGUF file: its quantized tensors are its Linears.
 * Every output must be within K·2^-24·Σ|w·x| (plus half an ulp for the
 * bias) of the product in double precision (docs/apps.md). Prints
 * NAME N K BACKEND MAX-ERROR per weight. A 3-D stack of experts is
 * multiplied one expert at a time (an expert index instead of -1), as
 * tests/linears.c does for GPT-OSS's; here it is named and skipped. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wgpu_dequant.h"

static char err[1024];

static double magnitude(double v) { return v < 0 ? -v : v; }

/* The f32 values of tensor `name` of `c` (opened with dtype "f32"), or NULL. */
static float *decode_f32(const WdqCheckpoint *c, const char *name, size_t *count) {
    WdqTensorInfo info;
    if (wdq_tensor_info(c, name, &info, err, sizeof err) != 0 || strcmp(info.dtype, "F32") != 0) return NULL;
    float *v = malloc(info.nbytes ? info.nbytes : 1);
    if (v && wdq_decode(c, name, "cpu", v, info.nbytes, err, sizeof err) != 0) {
        free(v);
        return NULL;
    }
    *count = info.nbytes / sizeof(float);
    return v;
}

/* Multiplies m rows of x by weight `name` and checks y; returns the
   number of outputs outside the bound, or -1 on an error (in err). */
static long check(const WdqLinears *lin, const WdqCheckpoint *dense, const char *name, size_t m) {
    size_t n, k, count, bias_count = 0;
    if (wdq_linears_dims(lin, name, -1, &n, &k, err, sizeof err) != 0) return -1;
    float *w = decode_f32(dense, name, &count);
    if (w == NULL || count != n * k) {
        free(w);
        return -1;
    }
    /* The Linear's bias, when the checkpoint has one: <module>.bias. */
    char bias_name[1024];
    size_t len = strlen(name);
    float *bias = NULL;
    if (len > 7 && strcmp(name + len - 7, ".weight") == 0) {
        snprintf(bias_name, sizeof bias_name, "%.*s.bias", (int)(len - 7), name);
        bias = decode_f32(dense, bias_name, &bias_count);
    }
    float *x = malloc(m * k * sizeof *x), *y = malloc(m * n * sizeof *y);
    for (size_t i = 0; i < m * k; i++) x[i] = (float)((i * 7919) % 1000) / 500.0f - 1.0f;
    long outside = -1;
    if (wdq_linears_matmul(lin, name, -1, x, m, k, y, n, err, sizeof err) == 0) {
        double worst = 0;
        outside = 0;
        for (size_t r = 0; r < m; r++) {
            for (size_t j = 0; j < n; j++) {
                double exact = bias && bias_count == n ? bias[j] : 0, sum_abs = 0;
                for (size_t i = 0; i < k; i++) {
                    double p = (double)w[j * k + i] * x[r * k + i];
                    exact += p;
                    sum_abs += magnitude(p);
                }
                double diff = magnitude(y[r * n + j] - exact);
                outside += diff > k * sum_abs * 0x1p-24 + magnitude(exact) * 0x1p-24;
                worst = diff > worst ? diff : worst;
            }
        }
        printf("%s %zu %zu %s %.3e\n", name, n, k, wdq_linears_backend(lin), worst);
    }
    free(w);
    free(bias);
    free(x);
    free(y);
    return outside;
}

int main(int argc, char **argv) {
    const char *path = argc > 1 ? argv[1] : "assets/sample-w4a16";
    const char *backend = argc > 2 ? argv[2] : "auto";
    WdqLinears *lin = NULL;
    WdqCheckpoint *dense = NULL;
    /* W in f32 on both sides: the product's W is the dense weight in the dtype opened. */
    if (wdq_linears_open(path, "f32", backend, &lin, err, sizeof err) != 0 ||
        wdq_open(path, "f32", &dense, err, sizeof err) != 0) {
        fprintf(stderr, "error: %s\n", err);
        wdq_linears_close(lin);
        return 1;
    }
    long outside = 0;
    for (size_t i = 0; i < wdq_linears_count(lin); i++) {
        const char *name = wdq_linears_name(lin, i);
        WdqTensorInfo info;
        if (wdq_tensor_info(dense, name, &info, err, sizeof err) == 0 && info.ndim == 3) {
            printf("%s: a stack of %zu experts, skipped\n", name, info.shape[0]);
            continue;
        }
        long bad = check(lin, dense, name, 3);
        if (bad < 0) {
            fprintf(stderr, "error: %s: %s\n", name, err);
            outside = -1;
            break;
        }
        outside += bad;
    }
    wdq_linears_close(lin);
    wdq_close(dense);
    if (outside > 0) fprintf(stderr, "%ld outputs outside the bound\n", outside);
    return outside != 0;
}
