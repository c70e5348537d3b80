/* Every function of the C ABI, on the sample checkpoint, on a GGUF file
 * and on bad input:
 *   test SAMPLE_DIR GGUF_FILE SCRATCH_DIR
 * Decoded tensors must equal the bytes of the dense checkpoint that
 * wdq_dequantize writes (read back through wdq_open: it decodes nothing). */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

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

/* Bytes of tensor `name` of `c` on `backend`, or NULL. */
static unsigned char *decode(const WdqCheckpoint *c, const char *name, const char *backend, size_t *len) {
    WdqTensorInfo info;
    if (wdq_tensor_info(c, name, &info, err, sizeof err) != 0) return NULL;
    unsigned char *buf = malloc(info.nbytes + 1);
    if (buf == NULL) return NULL;
    if (wdq_decode(c, name, backend, buf, info.nbytes, err, sizeof err) != 0) {
        free(buf);
        return NULL;
    }
    *len = info.nbytes;
    return buf;
}

/* `q` decodes, on the CPU and on any backend, to the bytes `d` holds,
   tensor by tensor, names and infos alike. */
static void same_tensors(const WdqCheckpoint *q, const WdqCheckpoint *d) {
    size_t n = wdq_tensor_count(q);
    CHECK(n > 0 && n == wdq_tensor_count(d), "tensor counts %zu and %zu", n, wdq_tensor_count(d));
    CHECK(wdq_tensor_name(q, n) == NULL, "a name past the end");
    for (size_t i = 0; i < n; i++) {
        const char *name = wdq_tensor_name(q, i);
        CHECK(name && strcmp(name, wdq_tensor_name(d, i)) == 0, "name %zu", i);
        WdqTensorInfo a, b;
        CHECK(wdq_tensor_info(q, name, &a, err, sizeof err) == 0, "info: %s", err);
        CHECK(wdq_tensor_info(d, name, &b, err, sizeof err) == 0, "info: %s", err);
        CHECK(strcmp(a.dtype, b.dtype) == 0 && a.ndim == b.ndim && a.nbytes == b.nbytes
              && memcmp(a.shape, b.shape, sizeof a.shape) == 0, "%s: info differs", name);
        size_t la = 0, lb = 0, lg = 0;
        unsigned char *want = decode(d, name, "cpu", &lb);
        unsigned char *cpu = decode(q, name, "cpu", &la);
        unsigned char *any = decode(q, name, "auto", &lg);
        CHECK(want && cpu && la == lb && memcmp(cpu, want, la) == 0, "%s: cpu bytes differ (%s)", name, err);
        CHECK(want && any && lg == lb && memcmp(any, want, lg) == 0, "%s: auto bytes differ (%s)", name, err);
        free(want);
        free(cpu);
        free(any);
    }
}

/* Counts the warnings a run hands over, keeping the last rule id. */
struct heard { int count; char rule[16]; };
static void on_warning(const char *message, const char *rule, void *user) {
    struct heard *h = user;
    h->count += message != NULL && strstr(message, rule) != NULL;
    snprintf(h->rule, sizeof h->rule, "%s", rule);
}

static void copy_file(const char *from, const char *to, long cut) {
    FILE *in = fopen(from, "rb"), *out = fopen(to, "wb");
    if (!in || !out) { printf("FAIL cannot copy %s\n", from); exit(1); }
    fseek(in, 0, SEEK_END);
    long n = ftell(in) - cut;
    fseek(in, 0, SEEK_SET);
    for (long i = 0; i < n; i++) fputc(fgetc(in), out);
    fclose(in);
    fclose(out);
}

int main(int argc, char **argv) {
    if (argc != 4) { fprintf(stderr, "usage: test SAMPLE_DIR GGUF_FILE SCRATCH_DIR\n"); return 2; }
    /* What docs/cli.md ("Backends") asks of a headless app that probes GPU adapters: keep
       Mesa's device-select layer from looking for a window system. */
    setenv("NODEVICE_SELECT", "1", 0);
    const char *sample = argv[1], *gguf = argv[2];
    char dense[4096], broken[4096];
    snprintf(dense, sizeof dense, "%s/dense", argv[3]);
    snprintf(broken, sizeof broken, "%s/broken", argv[3]);

    /* wdq_dequantize: writes the dense checkpoint; refuses a second time. */
    int rc = wdq_dequantize(sample, dense, "auto", "cpu", err, sizeof err);
    CHECK(rc == 0 && err[0] == 0, "dequantize: %d %s", rc, err);
    rc = wdq_dequantize(sample, dense, "auto", "cpu", err, sizeof err);
    CHECK(rc == 1 && strstr(err, "[OUT-001]"), "dequantize into a full directory: %d %s", rc, err);
    rc = wdq_dequantize(sample, dense, "f64", "cpu", err, sizeof err);
    CHECK(rc == 2 && strstr(err, "[ARG-001]") && strstr(err, "f64"), "bad dtype: %d %s", rc, err);
    rc = wdq_dequantize(sample, dense, "auto", "tpu", err, sizeof err);
    CHECK(rc == 2 && strstr(err, "[ARG-001]"), "bad backend: %d %s", rc, err);
    rc = wdq_dequantize(NULL, dense, "auto", "cpu", err, sizeof err);
    CHECK(rc == 2 && strstr(err, "input is NULL"), "NULL input: %d %s", rc, err);

    /* wdq_dequantize_run: --resume finds the finished output and has nothing
       to do; --part 1/2 of the one-shard sample writes nothing, 0/2 all of
       it; a part not below its count is refused. */
    WdqRun run = {0};
    run.resume = 1;
    rc = wdq_dequantize_run(sample, dense, "auto", "cpu", &run, err, sizeof err);
    CHECK(rc == 0 && err[0] == 0, "resume of a finished output: %d %s", rc, err);
    char parted[4096];
    snprintf(parted, sizeof parted, "%s/parted", argv[3]);
    WdqRun part = {0};
    part.part_index = 2;
    part.part_count = 2;
    rc = wdq_dequantize_run(sample, parted, "auto", "cpu", &part, err, sizeof err);
    CHECK(rc == 2 && strstr(err, "[ARG-001]"), "part 2/2: %d %s", rc, err);
    for (size_t i = 2; i-- > 0;) {
        part.part_index = i;
        rc = wdq_dequantize_run(sample, parted, "auto", "cpu", &part, err, sizeof err);
        CHECK(rc == 0, "part %zu/2: %d %s", i, rc, err);
    }

    /* wdq_open, count, name, info, decode: the dense checkpoint's bytes. */
    WdqCheckpoint *q = NULL, *d = NULL;
    rc = wdq_open(sample, "auto", &q, err, sizeof err);
    CHECK(rc == 0 && q != NULL, "open sample: %d %s", rc, err);
    rc = wdq_open(dense, "auto", &d, err, sizeof err);
    CHECK(rc == 0 && d != NULL, "open dense: %d %s", rc, err);
    WdqCheckpoint *p = NULL;
    rc = wdq_open(parted, "auto", &p, err, sizeof err);
    CHECK(rc == 0 && p != NULL && wdq_tensor_count(p) == wdq_tensor_count(d), "open parted: %d %s", rc, err);
    wdq_close(p);
    if (!q || !d) return 1;
    same_tensors(q, d);

    /* A GGUF file opens too, its tensors under transformers' names. */
    char gguf_dense[4096];
    snprintf(gguf_dense, sizeof gguf_dense, "%s/gguf-dense", argv[3]);
    rc = wdq_dequantize(gguf, gguf_dense, "bf16", "cpu", err, sizeof err);
    CHECK(rc == 0, "dequantize %s: %d %s", gguf, rc, err);
    WdqCheckpoint *g = NULL, *gd = NULL;
    rc = wdq_open(gguf, "bf16", &g, err, sizeof err);
    CHECK(rc == 0 && g != NULL, "open %s: %d %s", gguf, rc, err);
    rc = wdq_open(gguf_dense, "auto", &gd, err, sizeof err);
    CHECK(rc == 0 && gd != NULL, "open %s: %d %s", gguf_dense, rc, err);
    if (!g || !gd) return 1;
    CHECK(strncmp(wdq_tensor_name(g, 0), "lm_head.", 8) == 0 || strncmp(wdq_tensor_name(g, 0), "model.", 6) == 0,
          "GGUF names: %s", wdq_tensor_name(g, 0));
    same_tensors(g, gd);
    wdq_close(g);
    wdq_close(gd);

    /* wdq_dequantize_warned: the GGUF file's rope_freqs are no llama3
       scaling (HF-002), told through the callback; strict refuses the run
       with status 3 and writes nothing. */
    char warned[4096], strict[4096];
    snprintf(warned, sizeof warned, "%s/gguf-warned", argv[3]);
    snprintf(strict, sizeof strict, "%s/gguf-strict", argv[3]);
    struct heard h = {0, ""};
    rc = wdq_dequantize_warned(gguf, warned, "bf16", "cpu", NULL, 0, on_warning, &h, err, sizeof err);
    CHECK(rc == 0 && h.count == 1 && strcmp(h.rule, "HF-002") == 0, "warned: %d %d %s %s", rc, h.count, h.rule, err);
    struct stat st;
    rc = wdq_dequantize_warned(gguf, strict, "bf16", "cpu", NULL, 1, NULL, NULL, err, sizeof err);
    CHECK(rc == 3 && strstr(err, "[HF-002]") && strstr(err, "--strict") && stat(strict, &st) != 0,
          "strict: %d %s", rc, err);

    /* Short buffers, NULL pointers, unknown names. */
    const char *first = wdq_tensor_name(q, 0);
    WdqTensorInfo info;
    wdq_tensor_info(q, first, &info, err, sizeof err);
    unsigned char *buf = malloc(info.nbytes);
    rc = wdq_decode(q, first, "cpu", buf, info.nbytes - 1, err, sizeof err);
    CHECK(rc == 2 && strstr(err, "bytes"), "short dst: %d %s", rc, err);
    rc = wdq_decode(q, first, "cpu", NULL, info.nbytes, err, sizeof err);
    CHECK(rc == 2 && strstr(err, "dst is NULL"), "NULL dst: %d %s", rc, err);
    rc = wdq_decode(NULL, first, "cpu", buf, info.nbytes, err, sizeof err);
    CHECK(rc == 2 && strstr(err, "NULL"), "NULL checkpoint: %d %s", rc, err);
    rc = wdq_decode(q, "no.such.tensor", "cpu", buf, info.nbytes, err, sizeof err);
    CHECK(rc == 2 && strstr(err, "no.such.tensor"), "unknown tensor: %d %s", rc, err);
    rc = wdq_decode(q, first, "cpu", buf, info.nbytes, NULL, 0);
    CHECK(rc == 0, "err may be NULL: %d", rc);
    rc = wdq_tensor_info(q, NULL, &info, err, sizeof err);
    CHECK(rc == 2 && strstr(err, "name is NULL"), "NULL name: %d %s", rc, err);
    rc = wdq_tensor_info(q, first, NULL, err, sizeof err);
    CHECK(rc == 2 && strstr(err, "out is NULL"), "NULL info: %d %s", rc, err);
    CHECK(wdq_tensor_count(NULL) == 0, "count of NULL");
    CHECK(wdq_tensor_name(NULL, 0) == NULL, "name of NULL");
    free(buf);

    /* Messages are cut to err_len, NUL included. */
    char small[5];
    memset(small, 'x', sizeof small);
    rc = wdq_decode(q, "no.such.tensor", "cpu", small, 1, small, sizeof small);
    CHECK(rc == 2 && strlen(small) == 4, "a short err: %d %zu", rc, strlen(small));

    /* Invalid input: a truncated shard is ST-001 (status 3); a missing path is IO (1). */
    CHECK(mkdir(broken, 0755) == 0, "mkdir %s", broken);
    char from[8192], to[8192];
    snprintf(from, sizeof from, "%s/model.safetensors", sample);
    snprintf(to, sizeof to, "%s/model.safetensors", broken);
    copy_file(from, to, 1);
    WdqCheckpoint *bad = (WdqCheckpoint *)&rc;
    rc = wdq_open(broken, "auto", &bad, err, sizeof err);
    CHECK(rc == 3 && strstr(err, "[ST-001]") && bad == NULL, "truncated shard: %d %s", rc, err);
    rc = wdq_open("/no/such/checkpoint", "auto", &bad, err, sizeof err);
    CHECK(rc == 1 && strstr(err, "/no/such/checkpoint"), "missing path: %d %s", rc, err);
    rc = wdq_open(sample, "auto", NULL, err, sizeof err);
    CHECK(rc == 2 && strstr(err, "out is NULL"), "NULL out: %d %s", rc, err);
    rc = wdq_open(sample, "int3", &bad, err, sizeof err);
    CHECK(rc == 2 && strstr(err, "[ARG-001]"), "bad dtype: %d %s", rc, err);

    wdq_close(q);
    wdq_close(d);
    wdq_close(NULL);
    printf(failures ? "%d failed\n" : "all passed\n", failures);
    return failures ? 1 : 0;
}
