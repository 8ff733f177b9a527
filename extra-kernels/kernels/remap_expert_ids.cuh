// remap_expert_ids: device-side lookup of routed experts in the GPU expert cache.
//
// For each selected expert id (the router's top-k, i32 [n_used, n_tokens] flattened to n), writes
// the cache slot that holds it (slot_of_expert[id], -1 when not resident) and counts the misses.
// This is the per-layer lookup that lets decode avoid a host round trip (issue: offload, item 7).
#pragma once
#include <cuda_runtime.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// ids:            [n] expert ids, device memory
// slot_of_expert: [n_expert] slot index per expert or -1, device memory
// slots_out:      [n] slot per id (-1 = miss or id out of range), device memory
// n_miss:         one int32 in device memory; incremented once per miss (caller zeroes it)
// Returns the cudaError_t of the launch.
int pmoe_remap_expert_ids(const int32_t * ids, int32_t n, const int32_t * slot_of_expert, int32_t n_expert,
                          int32_t * slots_out, int32_t * n_miss, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
