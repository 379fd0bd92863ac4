/* A stand-in for the few CUDA runtime calls kernels/cudart.py binds, built by
 * tests/kernels/test_cudart_binding.py to check the ctypes signatures on machines without CUDA.
 * Copies run at once on the CPU; the last stream and attributes seen are kept for the test. */
#include <stddef.h>
#include <string.h>

typedef struct { int type; int id; } MemLocation;
typedef struct { int srcAccessOrder; MemLocation srcLocHint; MemLocation dstLocHint; unsigned int flags; } MemcpyAttributes;

void *last_stream = 0;
int last_access_order = -1;
unsigned int last_flags = 0xffffffffu;
size_t last_num_attrs = 0;

int cudaRuntimeGetVersion(int *version) { *version = FAKE_VERSION; return 0; }
int cudaDriverGetVersion(int *version) { *version = FAKE_DRIVER; return 0; }
const char *cudaGetErrorString(int status) { return status == 1 ? "invalid argument" : "unknown error"; }
/* Streams: handles 0x5000, 0x5001, ...; priorities [-5, 0] as on the H200; a priority outside
 * the range is refused, so the binding must clamp (the real runtime clamps silently). */
unsigned int last_stream_flags = 0xffffffffu;
int last_stream_priority = 99;
static size_t streams_made = 0;
int cudaStreamCreateWithPriority(void **stream, unsigned int flags, int priority) {
    if (priority < -5 || priority > 0) return 1;
    last_stream_flags = flags; last_stream_priority = priority;
    *stream = (void *)(0x5000 + streams_made++); return 0;
}
int cudaDeviceGetStreamPriorityRange(int *least, int *greatest) { *least = 0; *greatest = -5; return 0; }
int cudaMemcpyAsync(void *dst, const void *src, size_t n, int kind, void *stream) {
    (void)kind; memcpy(dst, src, n); last_stream = stream; return 0;
}
int cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t height,
                      int kind, void *stream) {
    (void)kind;
    for (size_t r = 0; r < height; r++) memcpy((char *)dst + r * dpitch, (const char *)src + r * spitch, width);
    last_stream = stream; return 0;
}

static int batch(void **dsts, void **srcs, size_t *sizes, size_t count, MemcpyAttributes *attrs, size_t *idxs,
                 size_t num_attrs, size_t *fail_idx, void *stream) {
    last_stream = stream; last_num_attrs = num_attrs;
    last_access_order = attrs[0].srcAccessOrder; last_flags = attrs[0].flags;
    if (num_attrs < 1 || idxs[0] != 0) return 1;
    for (size_t i = 0; i < count; i++) {
        if (sizes[i] == 0) { if (fail_idx) *fail_idx = i; return 1; }
        memcpy(dsts[i], srcs[i], sizes[i]);
    }
    return 0;
}

#if FAKE_VERSION >= 13000  /* CUDA 13: no failIdx */
int cudaMemcpyBatchAsync(void **dsts, void **srcs, size_t *sizes, size_t count, MemcpyAttributes *attrs,
                         size_t *idxs, size_t num_attrs, void *stream) {
    return batch(dsts, srcs, sizes, count, attrs, idxs, num_attrs, 0, stream);
}
#elif FAKE_VERSION >= 12080  /* CUDA 12.8-12.9; before 12.8 the symbol does not exist */
int cudaMemcpyBatchAsync(void **dsts, void **srcs, size_t *sizes, size_t count, MemcpyAttributes *attrs,
                         size_t *idxs, size_t num_attrs, size_t *fail_idx, void *stream) {
    return batch(dsts, srcs, sizes, count, attrs, idxs, num_attrs, fail_idx, stream);
}
#endif

