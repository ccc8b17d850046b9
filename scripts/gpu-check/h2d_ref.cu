// Reference host<->device copy bandwidth for scripts/gpu-check.sh, written independently of
// chd: the calling thread is bound to a CPU, the host buffer is allocated and touched after
// binding, and CUDA events time `iterations` cudaMemcpyAsync calls after `warmup` ones.
//
// Reads cells from stdin, one per line: CPU DEVICE SIZE_MIB DIRECTION(h2d|d2h)
// MEMORY(pinned|pageable) ITERATIONS WARMUP
// Prints one line per cell: CPU DEVICE SIZE_BYTES DIRECTION MEMORY BYTES_PER_SECOND
#define _GNU_SOURCE
#include <cuda_runtime.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(call)                                                              \
  do {                                                                           \
    cudaError_t err_ = (call);                                                   \
    if (err_ != cudaSuccess) {                                                   \
      fprintf(stderr, "h2d_ref: %s failed: %s\n", #call, cudaGetErrorString(err_)); \
      exit(2);                                                                   \
    }                                                                            \
  } while (0)

int main(void) {
  int cpu, device, iterations, warmup;
  unsigned long size_mib;
  char direction[8], memory[16];
  while (scanf("%d %d %lu %7s %15s %d %d", &cpu, &device, &size_mib, direction, memory,
               &iterations, &warmup) == 7) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    if (sched_setaffinity(0, sizeof(set), &set) != 0) {
      perror("h2d_ref: sched_setaffinity");
      return 2;
    }
    size_t bytes = size_mib << 20;
    int pinned = strcmp(memory, "pinned") == 0;
    int h2d = strcmp(direction, "h2d") == 0;
    CHECK(cudaSetDevice(device));
    void *host = NULL, *dev = NULL;
    if (pinned) {
      CHECK(cudaHostAlloc(&host, bytes, cudaHostAllocDefault));
    } else {
      host = malloc(bytes);
      if (!host) return 2;
    }
    memset(host, 1, bytes);
    CHECK(cudaMalloc(&dev, bytes));
    cudaStream_t stream;
    cudaEvent_t start, stop;
    CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    CHECK(cudaEventCreate(&start));
    CHECK(cudaEventCreate(&stop));
    void *dst = h2d ? dev : host;
    void *src = h2d ? host : dev;
    cudaMemcpyKind kind = h2d ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost;
    for (int i = 0; i < warmup; i++) CHECK(cudaMemcpyAsync(dst, src, bytes, kind, stream));
    CHECK(cudaStreamSynchronize(stream));
    CHECK(cudaEventRecord(start, stream));
    for (int i = 0; i < iterations; i++) CHECK(cudaMemcpyAsync(dst, src, bytes, kind, stream));
    CHECK(cudaEventRecord(stop, stream));
    CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, start, stop));
    printf("%d %d %zu %s %s %.0f\n", cpu, device, bytes, direction, memory,
           (double)bytes * iterations / (ms / 1e3));
    fflush(stdout);
    CHECK(cudaEventDestroy(start));
    CHECK(cudaEventDestroy(stop));
    CHECK(cudaStreamDestroy(stream));
    CHECK(cudaFree(dev));
    if (pinned) CHECK(cudaFreeHost(host)); else free(host);
  }
  return 0;
}
