// See remap_expert_ids.cuh.
#include "remap_expert_ids.cuh"

static __global__ void remap_expert_ids_kernel(const int32_t * __restrict__ ids, int32_t n,
                                               const int32_t * __restrict__ slot_of_expert, int32_t n_expert,
                                               int32_t * __restrict__ slots_out, int32_t * __restrict__ n_miss) {
    const int32_t i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) {
        return;
    }
    const int32_t id   = ids[i];
    const int32_t slot = (id >= 0 && id < n_expert) ? slot_of_expert[id] : -1;
    slots_out[i] = slot;
    if (slot < 0) {
        atomicAdd(n_miss, 1);
    }
}

extern "C" int pmoe_remap_expert_ids(const int32_t * ids, int32_t n, const int32_t * slot_of_expert, int32_t n_expert,
                                     int32_t * slots_out, int32_t * n_miss, cudaStream_t stream) {
    if (n <= 0) {
        return (int) cudaSuccess;
    }
    const int block = 256;
    const int grid  = (n + block - 1) / block;
    remap_expert_ids_kernel<<<grid, block, 0, stream>>>(ids, n, slot_of_expert, n_expert, slots_out, n_miss);
    return (int) cudaGetLastError();
}
