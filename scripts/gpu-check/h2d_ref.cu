// Reference copy bandwidth for scripts/gpu-check.sh, written independently of chd from the
// CUDA runtime API documentation: the measuring thread is bound to its CPU first, host buffers
// are allocated and touched after binding, and CUDA events on one non-blocking stream time
// `iterations` async copies after `warmup` untimed ones (synchronized before the first event).
// The timed region excludes the host's enqueue time, as nvbandwidth's does ("Measurement
// Details"): a host function (cudaLaunchHostFunc) holds the stream until the stop event is
// enqueued, so the start event completes only then and the copies run back to back. Pageable
// copies are not held (the runtime may synchronize the stream inside such an enqueue call to
// stage the memory) and neither is the two-rank p2p cell (chd's pair copy method is not).
//
// Reads cells from stdin, one per line (sizes in bytes):
//   h2d|d2h CPU DEVICE BYTES pinned|pageable ITERATIONS WARMUP
//   p2p CPU0 CPU1 DEVICE0 DEVICE1 BYTES ITERATIONS WARMUP
//   d2d CPU DEVICE BYTES ITERATIONS WARMUP
//   peer CPU SRC DST BYTES ITERATIONS WARMUP
// and prints one line per cell:
//   h2d|d2h CPU DEVICE BYTES MEMORY BYTES_PER_SECOND
//   p2p CPU0,CPU1 DEVICE0,DEVICE1 BYTES device BYTES_PER_SECOND peer|staged
//   d2d CPU DEVICE BYTES device BYTES_PER_SECOND
//   peer CPU SRC>DST BYTES device BYTES_PER_SECOND peer|staged
// d2d is a same-device copy (cudaMemcpyDeviceToDevice between two buffers of DEVICE): bytes
// of one copy over its time, as nvbandwidth's device-local copy counts them. peer is one
// ordered copy, SRC's buffer into DST's, issued on a stream of SRC after enabling peer access
// both ways where cudaDeviceCanAccessPeer allows it (what `chd probe p2p` measures).
// p2p is what chd's peer-copy pair probe measures: two threads, rank r bound to CPUr and
// using DEVICEr, each copying BYTES from its device into the other device's buffer at the
// same time (cudaMemcpyPeerAsync), after enabling peer access where
// cudaDeviceCanAccessPeer allows it (as nvbandwidth does: "peer"; else the runtime stages the
// copies through the host: "staged"); bandwidth = bytes x iterations / the slower rank's time.
// Prints the runtime and driver versions on stderr first. Any CUDA error ends the program
// (exit 2) with the failing call and the runtime's text; so does a latch that let go by
// itself (10 s without its release).
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <cuda_runtime.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CHECK(call)                                                                 \
  do {                                                                              \
    cudaError_t err_ = (call);                                                      \
    if (err_ != cudaSuccess) {                                                      \
      fprintf(stderr, "h2d_ref: %s failed: %s\n", #call, cudaGetErrorString(err_)); \
      exit(2);                                                                      \
    }                                                                               \
  } while (0)

static void bind_to(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  if (sched_setaffinity(0, sizeof(set), &set) != 0) {
    perror("h2d_ref: sched_setaffinity");
    exit(2);
  }
}

// A latch: a host function that holds its stream until `released` is set (or 10 s passed).
// It makes no CUDA call, as cudaLaunchHostFunc requires.
struct latch {
  volatile int released, let_go;
};

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec / 1e9;
}

static void CUDART_CB wait_for_release(void *arg) {
  struct latch *l = (struct latch *)arg;
  double until = now_s() + 10;
  while (!__atomic_load_n(&l->released, __ATOMIC_ACQUIRE)) {
    if (now_s() > until) {
      l->let_go = 1;
      return;
    }
  }
}

// Milliseconds of the `iterations` copies `enqueue` issues on `stream` after `warmup` untimed
// ones; `held`: a latch holds the stream until everything is enqueued.
typedef void (*enqueue_fn)(void *ctx, cudaStream_t stream);
static float time_enqueued(enqueue_fn enqueue, void *ctx, cudaStream_t stream, int iterations,
                           int warmup, int held) {
  cudaEvent_t start, stop;
  struct latch latch = {0, 0};
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));
  for (int i = 0; i < warmup; i++) enqueue(ctx, stream);
  CHECK(cudaStreamSynchronize(stream));
  if (held) CHECK(cudaLaunchHostFunc(stream, wait_for_release, &latch));
  CHECK(cudaEventRecord(start, stream));
  for (int i = 0; i < iterations; i++) enqueue(ctx, stream);
  CHECK(cudaEventRecord(stop, stream));
  __atomic_store_n(&latch.released, 1, __ATOMIC_RELEASE);
  CHECK(cudaEventSynchronize(stop));
  if (latch.let_go) {
    fprintf(stderr, "h2d_ref: the latch let the stream go before the copies were enqueued\n");
    exit(2);
  }
  float ms = 0;
  CHECK(cudaEventElapsedTime(&ms, start, stop));
  CHECK(cudaEventDestroy(start));
  CHECK(cudaEventDestroy(stop));
  return ms;
}

struct memcpy_args {
  void *dst;
  const void *src;
  size_t bytes;
  cudaMemcpyKind kind;
};

static void enqueue_memcpy(void *ctx, cudaStream_t stream) {
  struct memcpy_args *a = (struct memcpy_args *)ctx;
  CHECK(cudaMemcpyAsync(a->dst, a->src, a->bytes, a->kind, stream));
}

// Milliseconds of `iterations` copies on `stream` after `warmup` untimed ones.
static float time_copies(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind,
                         cudaStream_t stream, int iterations, int warmup, int held) {
  struct memcpy_args a = {dst, src, bytes, kind};
  return time_enqueued(enqueue_memcpy, &a, stream, iterations, warmup, held);
}

static void host_copy(const char *direction, int cpu, int device, size_t bytes,
                      const char *memory, int iterations, int warmup) {
  bind_to(cpu);
  int pinned = strcmp(memory, "pinned") == 0;
  int h2d = strcmp(direction, "h2d") == 0;
  CHECK(cudaSetDevice(device));
  void *host = NULL, *dev = NULL;
  if (pinned) {
    CHECK(cudaHostAlloc(&host, bytes, cudaHostAllocDefault));
  } else if (!(host = malloc(bytes))) {
    fprintf(stderr, "h2d_ref: malloc(%zu) failed\n", bytes);
    exit(2);
  }
  memset(host, 1, bytes);
  CHECK(cudaMalloc(&dev, bytes));
  cudaStream_t stream;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  float ms = h2d ? time_copies(dev, host, bytes, cudaMemcpyHostToDevice, stream, iterations, warmup, pinned)
                 : time_copies(host, dev, bytes, cudaMemcpyDeviceToHost, stream, iterations, warmup, pinned);
  printf("%s %d %d %zu %s %.0f\n", direction, cpu, device, bytes, memory,
         (double)bytes * iterations / (ms / 1e3));
  fflush(stdout);
  CHECK(cudaStreamDestroy(stream));
  CHECK(cudaFree(dev));
  if (pinned) CHECK(cudaFreeHost(host)); else free(host);
}

static void device_copy(int cpu, int device, size_t bytes, int iterations, int warmup) {
  bind_to(cpu);
  CHECK(cudaSetDevice(device));
  void *src = NULL, *dst = NULL;
  CHECK(cudaMalloc(&src, bytes));
  CHECK(cudaMalloc(&dst, bytes));
  cudaStream_t stream;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  float ms = time_copies(dst, src, bytes, cudaMemcpyDeviceToDevice, stream, iterations, warmup, 1);
  printf("d2d %d %d %zu device %.0f\n", cpu, device, bytes, (double)bytes * iterations / (ms / 1e3));
  fflush(stdout);
  CHECK(cudaStreamDestroy(stream));
  CHECK(cudaFree(src));
  CHECK(cudaFree(dst));
}

// Enable `device`'s access to `peer` where the runtime allows it; whether it does.
static int enable_peer(int device, int peer) {
  int can = 0;
  CHECK(cudaDeviceCanAccessPeer(&can, device, peer));
  if (can) {
    CHECK(cudaSetDevice(device));
    cudaError_t e = cudaDeviceEnablePeerAccess(peer, 0);
    if (e == cudaErrorPeerAccessAlreadyEnabled) (void)cudaGetLastError();
    else CHECK(e);
  }
  return can;
}

struct peer_args {
  void *dst;
  const void *src;
  int dst_device, src_device;
  size_t bytes;
};

static void enqueue_peer(void *ctx, cudaStream_t stream) {
  struct peer_args *a = (struct peer_args *)ctx;
  CHECK(cudaMemcpyPeerAsync(a->dst, a->dst_device, a->src, a->src_device, a->bytes, stream));
}

static void ordered_peer_copy(int cpu, int src_device, int dst_device, size_t bytes,
                              int iterations, int warmup) {
  bind_to(cpu);
  int peer = enable_peer(src_device, dst_device) & enable_peer(dst_device, src_device);
  void *src = NULL, *dst = NULL;
  CHECK(cudaSetDevice(dst_device));
  CHECK(cudaMalloc(&dst, bytes));
  CHECK(cudaSetDevice(src_device));
  CHECK(cudaMalloc(&src, bytes));
  cudaStream_t stream;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  struct peer_args a = {dst, src, dst_device, src_device, bytes};
  float ms = time_enqueued(enqueue_peer, &a, stream, iterations, warmup, 1);
  printf("peer %d %d>%d %zu device %.0f %s\n", cpu, src_device, dst_device, bytes,
         (double)bytes * iterations / (ms / 1e3), peer ? "peer" : "staged");
  fflush(stdout);
  CHECK(cudaStreamDestroy(stream));
  CHECK(cudaFree(src));
  CHECK(cudaSetDevice(dst_device));
  CHECK(cudaFree(dst));
}

// One rank of a p2p cell.
struct rank {
  int cpu, device, peer_device, iterations, warmup, rank, peer_access;
  size_t bytes;
  void *recv;               // this rank's receive buffer (2 x bytes), for the peer
  struct rank *peer;
  pthread_barrier_t *meet;
  float ms;
};

static void *run_rank(void *arg) {
  struct rank *r = (struct rank *)arg;
  bind_to(r->cpu);
  CHECK(cudaSetDevice(r->device));
  int can = 0;
  CHECK(cudaDeviceCanAccessPeer(&can, r->device, r->peer_device));
  if (can) {
    cudaError_t e = cudaDeviceEnablePeerAccess(r->peer_device, 0);
    if (e == cudaErrorPeerAccessAlreadyEnabled) (void)cudaGetLastError();
    else CHECK(e);
  }
  r->peer_access = can;
  void *send = NULL;
  CHECK(cudaMalloc(&send, r->bytes));
  CHECK(cudaMalloc(&r->recv, 2 * r->bytes));
  cudaStream_t stream;
  cudaEvent_t start, stop;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));
  pthread_barrier_wait(r->meet);  // both receive buffers exist
  char *dst = (char *)r->peer->recv + r->rank * r->bytes;
  for (int i = 0; i < r->warmup; i++)
    CHECK(cudaMemcpyPeerAsync(dst, r->peer_device, send, r->device, r->bytes, stream));
  CHECK(cudaStreamSynchronize(stream));
  pthread_barrier_wait(r->meet);  // both warmed up: start together
  CHECK(cudaEventRecord(start, stream));
  for (int i = 0; i < r->iterations; i++)
    CHECK(cudaMemcpyPeerAsync(dst, r->peer_device, send, r->device, r->bytes, stream));
  CHECK(cudaEventRecord(stop, stream));
  CHECK(cudaEventSynchronize(stop));
  CHECK(cudaEventElapsedTime(&r->ms, start, stop));
  pthread_barrier_wait(r->meet);  // both done before either frees what the other writes into
  CHECK(cudaEventDestroy(start));
  CHECK(cudaEventDestroy(stop));
  CHECK(cudaStreamDestroy(stream));
  CHECK(cudaFree(send));
  CHECK(cudaFree(r->recv));
  return NULL;
}

static void peer_copy(const int cpus[2], const int devices[2], size_t bytes, int iterations,
                      int warmup) {
  pthread_barrier_t meet;
  pthread_barrier_init(&meet, NULL, 2);
  struct rank ranks[2];
  pthread_t threads[2];
  for (int i = 0; i < 2; i++) {
    ranks[i] = (struct rank){.cpu = cpus[i], .device = devices[i], .peer_device = devices[1 - i],
                             .iterations = iterations, .warmup = warmup, .rank = i,
                             .bytes = bytes, .peer = &ranks[1 - i], .meet = &meet};
  }
  for (int i = 0; i < 2; i++) pthread_create(&threads[i], NULL, run_rank, &ranks[i]);
  for (int i = 0; i < 2; i++) pthread_join(threads[i], NULL);
  pthread_barrier_destroy(&meet);
  float ms = ranks[0].ms > ranks[1].ms ? ranks[0].ms : ranks[1].ms;
  printf("p2p %d,%d %d,%d %zu device %.0f %s\n", cpus[0], cpus[1], devices[0], devices[1], bytes,
         (double)bytes * iterations / (ms / 1e3),
         ranks[0].peer_access && ranks[1].peer_access ? "peer" : "staged");
  fflush(stdout);
}

int main(void) {
  int runtime = 0, driver = 0, count = 0;
  CHECK(cudaRuntimeGetVersion(&runtime));
  CHECK(cudaDriverGetVersion(&driver));
  CHECK(cudaGetDeviceCount(&count));
  fprintf(stderr, "h2d_ref: CUDA runtime %d.%d, driver %d.%d, %d device(s)\n", runtime / 1000,
          runtime % 1000 / 10, driver / 1000, driver % 1000 / 10, count);
  char line[256], path[8], memory[16];
  while (fgets(line, sizeof line, stdin)) {
    int cpu[2], device[2], iterations, warmup;
    size_t bytes;
    if (sscanf(line, "%7s", path) != 1) continue;
    if ((!strcmp(path, "h2d") || !strcmp(path, "d2h")) &&
        sscanf(line, "%*s %d %d %zu %15s %d %d", &cpu[0], &device[0], &bytes, memory,
               &iterations, &warmup) == 6) {
      host_copy(path, cpu[0], device[0], bytes, memory, iterations, warmup);
    } else if (!strcmp(path, "p2p") &&
               sscanf(line, "%*s %d %d %d %d %zu %d %d", &cpu[0], &cpu[1], &device[0], &device[1],
                      &bytes, &iterations, &warmup) == 7) {
      peer_copy(cpu, device, bytes, iterations, warmup);
    } else if (!strcmp(path, "d2d") &&
               sscanf(line, "%*s %d %d %zu %d %d", &cpu[0], &device[0], &bytes, &iterations,
                      &warmup) == 5) {
      device_copy(cpu[0], device[0], bytes, iterations, warmup);
    } else if (!strcmp(path, "peer") &&
               sscanf(line, "%*s %d %d %d %zu %d %d", &cpu[0], &device[0], &device[1], &bytes,
                      &iterations, &warmup) == 6) {
      ordered_peer_copy(cpu[0], device[0], device[1], bytes, iterations, warmup);
    } else {
      fprintf(stderr, "h2d_ref: cannot read the cell %s", line);
      return 2;
    }
  }
  return 0;
}
