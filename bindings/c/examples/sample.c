/* Lists every tensor of a checkpoint's dense form and decodes it:
 *   sample [CHECKPOINT] [BACKEND]   (defaults: assets/sample-w4a16, cpu)
 * prints NAME DTYPE SHAPE BYTES FNV-1a-64 of the decoded bytes. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "wgpu_dequant.h"

static uint64_t fnv1a(const unsigned char *p, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

int main(int argc, char **argv) {
    const char *path = argc > 1 ? argv[1] : "assets/sample-w4a16";
    const char *backend = argc > 2 ? argv[2] : "cpu";
    char err[512];
    WdqCheckpoint *ckpt = NULL;
    int rc = wdq_open(path, "auto", &ckpt, err, sizeof err);
    if (rc != 0) {
        fprintf(stderr, "error: %s\n", err);
        return rc;
    }
    for (size_t i = 0; i < wdq_tensor_count(ckpt); i++) {
        const char *name = wdq_tensor_name(ckpt, i);
        WdqTensorInfo info;
        rc = wdq_tensor_info(ckpt, name, &info, err, sizeof err);
        unsigned char *buf = rc ? NULL : malloc(info.nbytes ? info.nbytes : 1);
        if (rc == 0 && buf == NULL) rc = 1;
        if (rc == 0) rc = wdq_decode(ckpt, name, backend, buf, info.nbytes, err, sizeof err);
        if (rc != 0) {
            fprintf(stderr, "error: %s\n", err);
            free(buf);
            wdq_close(ckpt);
            return rc;
        }
        printf("%s %s [", name, info.dtype);
        for (size_t d = 0; d < info.ndim; d++) printf(d ? ", %zu" : "%zu", info.shape[d]);
        printf("] %zu %016llx\n", info.nbytes, (unsigned long long)fnv1a(buf, info.nbytes));
        free(buf);
    }
    wdq_close(ckpt);
    return 0;
}
