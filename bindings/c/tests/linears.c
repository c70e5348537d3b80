/* Products with packed weights through the C ABI (wdq_linears_*), on the
 * CPU and on the GPU:
 *   linears SAMPLE_DIR GPT_OSS_DIR
 * Every product is within K·2^-24·Σ|w·x| (plus half an ulp for the bias)
 * of the double-precision product of the weight wdq_decode gives in f32
 * (docs/apps.md). Without a GPU adapter the GPU half is skipped, unless
 * WGPU_DEQUANT_REQUIRE_GPU=1 makes that a failure. GPT-OSS's stacks with
 * rows routed to mixed experts give each row its expert's own bits. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wgpu_dequant.h"

static int failures = 0;
#define CHECK(cond, ...)                                  \
    do {                                                  \
        if (!(cond)) {                                    \
            failures++;                                   \
            printf("FAIL %s:%d: ", __FILE__, __LINE__);   \
            printf(__VA_ARGS__);                          \
            printf("\n");                                 \
        }                                                 \
    } while (0)

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

/* m rows of k values, the same from run to run. */
static float *inputs(size_t m, size_t k, unsigned seed) {
    float *x = malloc((m * k + 1) * sizeof *x);
    for (size_t i = 0; i < m * k; i++) x[i] = (float)(((i + seed) * 7919) % 1000) / 500.0f - 1.0f;
    return x;
}

/* y = x·Wᵀ + bias for weight `name` (expert `expert`, -1 for none) is
   within the bound, for `w` the n × k matrix whose element (j, i) is
   w[j * wj + i * wi], and `bias` NULL or n values. */
static void product_ok(const WdqLinears *lin, const char *name, long expert, size_t m, size_t n, size_t k,
                       const float *w, size_t wj, size_t wi, const float *bias) {
    float *x = inputs(m, k, (unsigned)(m + 3 * expert + 4)), *y = malloc(m * n * sizeof *y);
    int rc = wdq_linears_matmul(lin, name, expert, x, m, k, y, n, err, sizeof err);
    CHECK(rc == 0, "%s[%ld] m=%zu on %s: %d %s", name, expert, m, wdq_linears_backend(lin), rc, err);
    long outside = 0;
    for (size_t r = 0; rc == 0 && r < m; r++) {
        for (size_t j = 0; j < n; j++) {
            double exact = bias ? bias[j] : 0, sum_abs = 0;
            for (size_t i = 0; i < k; i++) {
                double p = (double)w[j * wj + i * wi] * x[r * k + i];
                exact += p;
                sum_abs += magnitude(p);
            }
            outside += magnitude(y[r * n + j] - exact) > k * sum_abs * 0x1p-24 + magnitude(exact) * 0x1p-24;
        }
    }
    CHECK(outside == 0, "%s[%ld] m=%zu on %s: %ld outputs outside the bound", name, expert, m,
          wdq_linears_backend(lin), outside);
    free(x);
    free(y);
}

/* wdq_linears_open on `backend`, or NULL: the GPU is skipped without an
   adapter, unless WGPU_DEQUANT_REQUIRE_GPU=1. */
static WdqLinears *open_on(const char *path, const char *backend) {
    WdqLinears *lin = NULL;
    int rc = wdq_linears_open(path, "f32", backend, &lin, err, sizeof err);
    const char *require = getenv("WGPU_DEQUANT_REQUIRE_GPU");
    if (rc == 1 && strstr(err, "[GPU-001]") && !(require && strcmp(require, "1") == 0)) {
        printf("skipped on %s: %s\n", backend, err);
        return NULL;
    }
    CHECK(rc == 0 && lin != NULL, "open %s on %s: %d %s", path, backend, rc, err);
    CHECK(lin == NULL || strcmp(wdq_linears_backend(lin), backend) == 0, "%s runs on %s", backend,
          lin ? wdq_linears_backend(lin) : "-");
    return lin;
}

/* Every quantized weight of the sample, m = 1 and 5; wrong sizes and
   names refused with ARG-001 and the weight's name. */
static void sample(const char *path, const char *backend, const WdqCheckpoint *dense) {
    WdqLinears *lin = open_on(path, backend);
    if (lin == NULL) return;
    size_t count = wdq_linears_count(lin);
    CHECK(count > 0 && wdq_linears_name(lin, count) == NULL, "count %zu", count);
    for (size_t q = 0; q < count; q++) {
        const char *name = wdq_linears_name(lin, q);
        CHECK(q == 0 || strcmp(wdq_linears_name(lin, q - 1), name) < 0, "names sorted: %s", name);
        size_t n = 0, k = 0, len = 0;
        int rc = wdq_linears_dims(lin, name, -1, &n, &k, err, sizeof err);
        float *w = decode_f32(dense, name, &len);
        CHECK(rc == 0 && w != NULL && len == n * k, "%s: dims %zu x %zu: %s", name, n, k, err);
        if (rc != 0 || w == NULL) { free(w); continue; }
        product_ok(lin, name, -1, 1, n, k, w, k, 1, NULL);
        product_ok(lin, name, -1, 5, n, k, w, k, 1, NULL);
        free(w);
    }

    const char *name = wdq_linears_name(lin, 0);
    size_t n = 0, k = 0;
    wdq_linears_dims(lin, name, -1, &n, &k, err, sizeof err);
    float *x = inputs(3, k + 1, 0), *y = malloc(3 * (n + 1) * sizeof *y);
    char k_text[64];
    snprintf(k_text, sizeof k_text, "rows of %zu", k);
    int rc = wdq_linears_matmul(lin, name, -1, x, 3, k - 1, y, n, err, sizeof err);
    CHECK(rc == 2 && strstr(err, "[ARG-001]") && strstr(err, name) && strstr(err, k_text), "short rows: %d %s", rc, err);
    rc = wdq_linears_matmul(lin, name, -1, x, 3, k, y, n + 1, err, sizeof err);
    CHECK(rc == 2 && strstr(err, "[ARG-001]") && strstr(err, name), "long y rows: %d %s", rc, err);
    rc = wdq_linears_matmul(lin, name, -1, x, 0, k, y, n, err, sizeof err);
    CHECK(rc == 0, "no rows: %d %s", rc, err);
    rc = wdq_linears_matmul(lin, name, -1, x, 0, k + 1, y, n, err, sizeof err);
    CHECK(rc == 2 && strstr(err, name), "no rows of the wrong width: %d %s", rc, err);
    rc = wdq_linears_matmul(lin, name, 0, x, 1, k, y, n, err, sizeof err);
    CHECK(rc == 2 && strstr(err, "not a stack of experts"), "an expert of a 2-D weight: %d %s", rc, err);
    rc = wdq_linears_matmul(lin, name, -2, x, 1, k, y, n, err, sizeof err);
    CHECK(rc == 2 && strstr(err, "expert -2"), "expert -2: %d %s", rc, err);
    rc = wdq_linears_matmul(lin, "model.norm.weight", -1, x, 1, k, y, n, err, sizeof err);
    CHECK(rc == 2 && strstr(err, "model.norm.weight") && strstr(err, "not a quantized weight"), "norm: %d %s", rc, err);
    rc = wdq_linears_matmul(lin, "no.such.weight", -1, x, 1, k, y, n, err, sizeof err);
    CHECK(rc == 2 && strstr(err, "no.such.weight"), "unknown weight: %d %s", rc, err);
    rc = wdq_linears_matmul(lin, name, -1, NULL, 1, k, y, n, err, sizeof err);
    CHECK(rc == 2 && strstr(err, "NULL"), "NULL x: %d %s", rc, err);
    rc = wdq_linears_matmul(lin, name, -1, x, 1, k, NULL, n, err, sizeof err);
    CHECK(rc == 2 && strstr(err, "NULL"), "NULL y: %d %s", rc, err);
    rc = wdq_linears_matmul(NULL, name, -1, x, 1, k, y, n, err, sizeof err);
    CHECK(rc == 2 && strstr(err, "NULL"), "NULL linears: %d %s", rc, err);
    rc = wdq_linears_dims(lin, name, -1, NULL, &k, err, sizeof err);
    CHECK(rc == 2 && strstr(err, "NULL"), "NULL n: %d %s", rc, err);
    free(x);
    free(y);
    wdq_linears_close(lin);
}

/* Rows of x routed to mixed experts of each stack in one call: each row
   the bits its expert's own wdq_linears_matmul gives it; an id past the
   last expert, or too few ids, is refused naming the stack. */
static void routed(const WdqLinears *lin) {
    const unsigned ids[8] = {3, 1, 3, 0, 1, 2, 3, 0};
    size_t stacks = wdq_linears_stack_count(lin);
    CHECK(stacks > 0 && wdq_linears_stack_name(lin, stacks) == NULL && wdq_linears_stack_experts(lin, stacks) == 0,
          "stacks: %zu", stacks);
    for (size_t s = 0; s < stacks; s++) {
        const char *stack = wdq_linears_stack_name(lin, s);
        size_t experts = wdq_linears_stack_experts(lin, s), n = 0, k = 0, m = 8;
        int rc = wdq_linears_dims(lin, stack, 0, &n, &k, err, sizeof err);
        CHECK(rc == 0 && experts > 3, "%s: %zu experts, dims: %d %s", stack, experts, rc, err);
        if (rc != 0 || experts <= 3) continue;
        float *x = inputs(m, k, (unsigned)s), *y = malloc(m * n * sizeof *y), *alone = malloc(n * sizeof *alone);
        rc = wdq_linears_matmul_experts(lin, stack, x, m, k, ids, y, n, err, sizeof err);
        CHECK(rc == 0, "%s on %s: %d %s", stack, wdq_linears_backend(lin), rc, err);
        for (size_t r = 0; rc == 0 && r < m; r++) {
            int one = wdq_linears_matmul(lin, stack, ids[r], x + r * k, 1, k, alone, n, err, sizeof err);
            CHECK(one == 0 && memcmp(alone, y + r * n, n * sizeof *y) == 0,
                  "%s row %zu expert %u on %s: not its own product's bits (%s)", stack, r, ids[r],
                  wdq_linears_backend(lin), one ? err : "");
        }
        unsigned past[8] = {0, 0, 0, 0, 0, 0, 0, (unsigned)experts};
        rc = wdq_linears_matmul_experts(lin, stack, x, m, k, past, y, n, err, sizeof err);
        CHECK(rc == 2 && strstr(err, stack) && strstr(err, "experts, not"), "an id past the last: %d %s", rc, err);
        rc = wdq_linears_matmul_experts(lin, stack, x, m, k + 1, ids, y, n, err, sizeof err);
        CHECK(rc == 2 && strstr(err, stack), "another width: %d %s", rc, err);
        rc = wdq_linears_matmul_experts(lin, stack, x, m, k, NULL, y, n, err, sizeof err);
        CHECK(rc == 2 && strstr(err, "NULL"), "NULL ids: %d %s", rc, err);
        free(x);
        free(y);
        free(alone);
    }
}

/* Every expert of GPT-OSS's stacks (dense [E, in, out]: y = x·W[e] +
   bias[e]), m = 1 and 5; a stack without an expert, or past its last, is
   refused. */
static void gpt_oss(const char *path, const char *backend) {
    WdqLinears *lin = open_on(path, backend);
    WdqCheckpoint *dense = NULL;
    if (lin == NULL) return;
    int rc = wdq_open(path, "f32", &dense, err, sizeof err);
    CHECK(rc == 0, "open %s: %s", path, err);
    for (size_t q = 0; dense && q < wdq_linears_count(lin); q++) {
        const char *name = wdq_linears_name(lin, q);
        WdqTensorInfo info;
        wdq_tensor_info(dense, name, &info, err, sizeof err);
        CHECK(info.ndim == 3, "%s: ndim %zu", name, info.ndim);
        size_t experts = info.shape[0], k = info.shape[1], n = info.shape[2], len = 0, bias_len = 0;
        char bias_name[512];
        snprintf(bias_name, sizeof bias_name, "%s_bias", name);
        float *w = decode_f32(dense, name, &len), *bias = decode_f32(dense, bias_name, &bias_len);
        CHECK(w && bias && len == experts * k * n && bias_len == experts * n, "%s: %s", name, err);
        for (size_t e = 0; w && bias && e < experts; e++) {
            size_t dn = 0, dk = 0;
            rc = wdq_linears_dims(lin, name, (long)e, &dn, &dk, err, sizeof err);
            CHECK(rc == 0 && dn == n && dk == k, "%s[%zu]: dims %zu x %zu: %s", name, e, dn, dk, err);
            /* Element (j, i) of W[e]ᵀ is W[e][i][j]. */
            product_ok(lin, name, (long)e, 1, n, k, w + e * k * n, 1, n, bias + e * n);
            product_ok(lin, name, (long)e, 5, n, k, w + e * k * n, 1, n, bias + e * n);
        }
        float *x = inputs(1, k, 0), *y = malloc(n * sizeof *y);
        rc = wdq_linears_matmul(lin, name, -1, x, 1, k, y, n, err, sizeof err);
        CHECK(rc == 2 && strstr(err, name) && strstr(err, "stack of"), "a whole stack: %d %s", rc, err);
        rc = wdq_linears_matmul(lin, name, (long)experts, x, 1, k, y, n, err, sizeof err);
        CHECK(rc == 2 && strstr(err, "experts, not"), "an expert past the last: %d %s", rc, err);
        free(x);
        free(y);
        free(w);
        free(bias);
    }
    wdq_close(dense);
    routed(lin);
    wdq_linears_close(lin);
}

int main(int argc, char **argv) {
    if (argc != 3) { fprintf(stderr, "usage: linears SAMPLE_DIR GPT_OSS_DIR\n"); return 2; }
    /* What docs/cli.md ("Backends") asks of a headless app that probes GPU adapters. */
    setenv("NODEVICE_SELECT", "1", 0);
    WdqCheckpoint *dense = NULL;
    int rc = wdq_open(argv[1], "f32", &dense, err, sizeof err);
    CHECK(rc == 0, "open %s: %s", argv[1], err);
    if (dense == NULL) return 1;
    const char *backends[] = {"cpu", "gpu"};
    for (size_t b = 0; b < 2; b++) {
        sample(argv[1], backends[b], dense);
        gpt_oss(argv[2], backends[b]);
    }
    wdq_close(dense);

    WdqLinears *lin = (WdqLinears *)&rc;
    rc = wdq_linears_open(argv[1], "auto", "tpu", &lin, err, sizeof err);
    CHECK(rc == 2 && strstr(err, "auto, gpu, cpu") && lin == NULL, "backend tpu: %d %s", rc, err);
    rc = wdq_linears_open(argv[1], "auto", "auto", NULL, err, sizeof err);
    CHECK(rc == 2 && strstr(err, "out is NULL"), "NULL out: %d %s", rc, err);
    rc = wdq_linears_open("/no/such/checkpoint", "auto", "cpu", &lin, err, sizeof err);
    CHECK(rc == 1 && strstr(err, "/no/such/checkpoint"), "missing path: %d %s", rc, err);
    CHECK(wdq_linears_count(NULL) == 0 && wdq_linears_name(NULL, 0) == NULL && wdq_linears_backend(NULL) == NULL &&
              wdq_linears_stack_count(NULL) == 0 && wdq_linears_stack_name(NULL, 0) == NULL &&
              wdq_linears_stack_experts(NULL, 0) == 0,
          "NULL linears");
    wdq_linears_close(NULL);
    printf(failures ? "%d failed\n" : "all passed\n", failures);
    return failures ? 1 : 0;
}
