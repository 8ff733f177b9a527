// Table form's lookup in one kernel (docs/design.md §4.4b): a routing stop's picks gathered from
// the layer's expert table (slot id and residency per expert) and the hit flag written, what the
// graph does with five small nodes (two get_rows, sum_rows, add, cpy).
//
// One block of up to 1024 threads, one pick a thread (decode: k picks per token, up to 8 tokens).
// Residency is read before the slot id: a prefetch's table copy lands slot ids first and
// residency after, so a pick read resident has its slot id in place. The flag is base plus the
// resident picks: integers below 2^24, so the sum is exact in any order and equals the graph's.
#include <cuda_runtime.h>
#include <stdint.h>

#define PMOE_LOOKUP_THREADS 1024

static __global__ void table_lookup_kernel(const int32_t * picks, int n, int n_expert,
                                           const int32_t * tab, const float * on, int32_t * ids,
                                           float * mask, const float * base, float * flag) {
    __shared__ float part[PMOE_LOOKUP_THREADS / 32];
    const int i = threadIdx.x;
    float r = 0.0f;
    if (i < n) {
        const int e = picks[i];
        int32_t s = 0;
        if (e >= 0 && e < n_expert) {
            r = *(volatile const float *) (on + e);
            // The residency's load before the slot id's.
            __threadfence();
            s = *(volatile const int32_t *) (tab + e);
        }
        ids[i]  = s;
        mask[i] = r;
    }
    float v = r;
    for (int o = 16; o > 0; o >>= 1) {
        v += __shfl_down_sync(0xffffffffu, v, o);
    }
    if ((i & 31) == 0) {
        part[i >> 5] = v;
    }
    __syncthreads();
    if (i == 0) {
        float sum = 0.0f;
        for (int w = 0; w < (int) ((blockDim.x + 31) / 32); ++w) {
            sum += part[w];
        }
        *flag = *base + sum;
    }
}

// Queues the lookup on `stream`; returns the launch's cudaError_t (0: queued). `n` picks at
// `picks` (i32), expert ids below `n_expert`; `tab` (i32) and `on` (f32) the table's columns;
// `ids` (i32), `mask` (f32) n each; `base` and `flag` one f32 each. All device addresses.
extern "C" int pmoe_table_lookup(const void * picks, int n, int n_expert, const void * tab,
                                 const void * on, void * ids, void * mask, const void * base,
                                 void * flag, void * stream) {
    if (n < 1 || n > PMOE_LOOKUP_THREADS) {
        return (int) cudaErrorInvalidValue;
    }
    const int threads = ((n + 31) / 32) * 32;
    table_lookup_kernel<<<1, threads, 0, (cudaStream_t) stream>>>(
        (const int32_t *) picks, n, n_expert, (const int32_t *) tab, (const float *) on,
        (int32_t *) ids, (float *) mask, (const float *) base, (float *) flag);
    return (int) cudaGetLastError();
}
