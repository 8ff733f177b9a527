// Probe for the stop-free decode design: where do cudaMalloc / cudaMallocHost / registered
// host memory land in the unified address space, and how fast does a kernel read pinned host
// memory directly (zero-copy) compared with a copy? nvcc -O3 -arch=sm_90 zerocopy.cu
#include <cstdio>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <sys/mman.h>
#include <cuda_runtime.h>
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e)); exit(1);} } while (0)

// Each block reads `bytes` from expert ids[blockIdx.y] (16-byte loads, coalesced), sums.
__global__ void read_experts(const int4 *base, const int *ids, size_t expert_bytes, int *sink) {
  const int4 *p = (const int4 *)((const char *)base + (size_t)ids[blockIdx.y] * expert_bytes);
  size_t n = expert_bytes / 16;
  int acc = 0;
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    int4 v = p[i]; acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x12345678) sink[0] = acc;
}
// q4_K-like: thread t of a warp reads 4 bytes at block (t/4)*144 + (t%4)*4 (partly coalesced).
__global__ void read_experts_q4k(const char *base, const int *ids, size_t expert_bytes, int *sink) {
  const char *p = base + (size_t)ids[blockIdx.y] * expert_bytes;
  size_t nblk = expert_bytes / 144;
  int acc = 0;
  int lane = threadIdx.x % 32, warp = (blockIdx.x * blockDim.x + threadIdx.x) / 32;
  int nwarps = gridDim.x * blockDim.x / 32;
  for (size_t b = (size_t)warp * 8 + lane / 4; b < nblk; b += (size_t)nwarps * 8) {
    const int *q = (const int *)(p + b * 144 + 16 + (lane % 4) * 32);
    acc ^= q[0] ^ q[1] ^ q[2] ^ q[3] ^ q[4] ^ q[5] ^ q[6] ^ q[7];
  }
  if (acc == 0x12345678) sink[0] = acc;
}

int main() {
  const size_t eb = 3 * 1024 * 1024 / 144 * 144; // ~3 MiB, like a Qwen3-30B q4_k_m expert
  const int n_expert = 128 * 8;                   // 3 GiB of host store
  size_t host_bytes = eb * n_expert;
  char *dev = nullptr, *host = nullptr;
  CK(cudaMalloc(&dev, (size_t)2 << 30));
  CK(cudaMallocHost(&host, host_bytes));
  char *dev2 = nullptr; CK(cudaMalloc(&dev2, (size_t)1 << 30));
  printf("cudaMalloc %p, second %p, cudaMallocHost %p, host-dev %.1f GiB\n", dev, dev2, host,
         ((double)(intptr_t)host - (double)(intptr_t)dev) / (1 << 30));
  void *m = malloc(1 << 20);
  printf("malloc %p, stack %p\n", m, (void *)&m);
  // mmap near the device buffer, then register it.
  for (long off = 4; off <= 512; off *= 2) {
    for (int sgn = -1; sgn <= 1; sgn += 2) {
      char *want = dev + sgn * (off << 30);
      void *p = mmap(want, 1 << 30, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
      if (p == MAP_FAILED || p != want) { printf("mmap at dev%+ld GiB: refused\n", sgn * off); if (p != MAP_FAILED) munmap(p, 1 << 30); continue; }
      cudaError_t e = cudaHostRegister(p, 1 << 30, cudaHostRegisterMapped);
      void *dp = nullptr;
      if (e == cudaSuccess) cudaHostGetDevicePointer(&dp, p, 0);
      printf("mmap at dev%+ld GiB: ok, register %s, device ptr %s\n", sgn * off, cudaGetErrorString(e), dp == p ? "== host ptr" : "differs");
      if (e == cudaSuccess) cudaHostUnregister(p);
      munmap(p, 1 << 30);
      goto done_mmap;
    }
  }
done_mmap:;
  int attr = 0; cudaDeviceGetAttribute(&attr, cudaDevAttrCanUseHostPointerForRegisteredMem, 0);
  printf("CanUseHostPointerForRegisteredMem %d\n", attr);
  for (size_t i = 0; i < host_bytes; i += 4096) host[i] = (char)i;
  int *ids, *sink; CK(cudaMalloc(&ids, 4096 * 4)); CK(cudaMalloc(&sink, 4));
  int hid[4096]; srand(1); for (int i = 0; i < 4096; i++) hid[i] = rand() % n_expert;
  CK(cudaMemcpy(ids, hid, sizeof hid, cudaMemcpyHostToDevice));
  cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
  float ms;
  for (int nexp : {1, 8, 50}) {
    for (int grid : {16, 66, 132, 264}) {
      for (int kind = 0; kind < 2; kind++) {
        cudaEventRecord(a);
        for (int r = 0; r < 10; r++) {
          if (kind == 0) read_experts<<<dim3(grid, nexp), 256>>>((const int4 *)host, ids + r * 64, eb, sink);
          else read_experts_q4k<<<dim3(grid, nexp), 256>>>(host, ids + r * 64, eb, sink);
        }
        cudaEventRecord(b); CK(cudaEventSynchronize(b)); cudaEventElapsedTime(&ms, a, b);
        printf("zero-copy %-8s %2d experts grid %3d: %.1f us/launch, %.1f GB/s\n", kind ? "q4k-like" : "int4", nexp, grid,
               ms * 100, nexp * eb * 10 / (ms * 1e6));
      }
    }
  }
  // copy engine, same bytes
  for (int nexp : {1, 8, 50}) {
    cudaEventRecord(a);
    for (int r = 0; r < 10; r++)
      for (int j = 0; j < nexp; j++) CK(cudaMemcpyAsync(dev + (size_t)j * eb, host + (size_t)hid[r * 64 + j] * eb, eb, cudaMemcpyHostToDevice));
    cudaEventRecord(b); CK(cudaEventSynchronize(b)); cudaEventElapsedTime(&ms, a, b);
    printf("memcpy %2d experts: %.1f us, %.1f GB/s\n", nexp, ms * 100, nexp * eb * 10 / (ms * 1e6));
  }
  // VRAM read, same kernel
  for (int nexp : {8}) {
    cudaEventRecord(a);
    for (int r = 0; r < 10; r++) read_experts<<<dim3(132, nexp), 256>>>((const int4 *)dev, ids + r * 64, eb / 4, sink);
    cudaEventRecord(b); CK(cudaEventSynchronize(b)); cudaEventElapsedTime(&ms, a, b);
    printf("vram %d experts (eb/4 stride): %.1f us\n", nexp, ms * 100);
  }
  // round trip: tiny kernel + 64 B D2H + sync
  cudaStream_t s; cudaStreamCreate(&s);
  int h[16];
  auto t0 = std::chrono::steady_clock::now();
  for (int r = 0; r < 1000; r++) { read_experts<<<1, 32, 0, s>>>((const int4 *)dev, ids, 16, sink); cudaMemcpyAsync(h, sink, 64, cudaMemcpyDeviceToHost, s); cudaStreamSynchronize(s); }
  printf("launch + D2H + sync round trip: %.1f us\n", std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() * 1e3);
  return 0;
}
