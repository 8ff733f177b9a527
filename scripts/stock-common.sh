# Sourced by scripts/stock-llama-tarball.sh and stock-llama-server-tarball.sh: packs a trimmed llama.cpp tree.
# pack_trimmed SRC OUT: removes the ggml GPU backends other than CUDA from the llama.cpp tree SRC
# (the device builds CUDA only, and what is carried there is limited to 64 MiB), then packs the
# tree as OUT (tar.xz, top folder `llama.cpp`).
pack_trimmed() {
  local src=$1 out=$2 d
  for d in cann et hexagon hip metal musa opencl openvino sycl virtgpu vulkan webgpu zdnn zendnn; do
    rm -rf "$src/ggml/src/ggml-$d"
  done
  mkdir -p "$(dirname "$out")"
  tar -C "$(dirname "$src")" -cJf "$out" "$(basename "$src")"
}
