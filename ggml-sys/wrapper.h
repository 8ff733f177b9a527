/* The ggml public headers that PocketMoE binds. */
#include <ggml.h>
#include <ggml-alloc.h>
#include <ggml-backend.h>
#include <ggml-cpu.h>
#include <gguf.h>
#ifdef POCKETMOE_CUDA
#include <ggml-cuda.h>
#endif
