// bluefog's large-buffer allreduce (MpiCommunicator::AllreduceSum) by path, against
// MPI_Allreduce, both from C++ on buffers allocated once, their batches interleaved repetition
// by repetition so all see the same machine. No TensorFlow, no negotiation: this isolates the
// algorithms from bluefog's per-call cost. Built by `make bench` (target transport_bench), run
// by bench/run.py under mpirun; rank 0 prints one JSON line per size with the median seconds
// per call of each variant: the ring, the direct path (peers' memory through the kernel), the
// staged path (through the rounds' shared segment), the default for buffers of the caller's
// (whichever of the two measured faster on the size's first calls, up to 16 MiB; the direct one
// above), the shared path (outputs in the shared heap, as TensorFlow outputs of 1 MiB and up
// are) and the default for such outputs (whichever of it and the direct path measured faster),
// out of place and in place ("_in_place"), and raw in-place MPI_Allreduce ("mpi_s"); and the
// out-of-place staged and shared paths with outputs always written with streaming stores
// ("_streamed") and always with plain ones ("_plain"), BLUEFOG_STREAMING_STORES deciding for
// the others. And the memory-traffic bound ("copy_s"): every rank copying a buffer of the
// size into another at once, which moves what any allreduce must at least move (each rank
// reads its input and writes its output once), interleaved with the rest.
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/config.h"
#include "transport/mpi/mpi_communicator.h"
#include "transport/shared_heap.h"

namespace {

// How a variant's outputs are stored: as BLUEFOG_STREAMING_STORES says (8 MiB and up by
// default), always with streaming stores, or always with plain ones.
enum Stores { kConfigured, kStreamed, kPlain };

struct Variant {
  const char* name;
  bool direct, staged, in_place, shared;
  Stores stores;
};

constexpr Variant kVariants[] = {
    {"ring", false, false, false, false, kConfigured},
    {"direct", true, false, false, false, kConfigured},
    {"direct_in_place", true, false, true, false, kConfigured},
    {"staged", false, true, false, false, kConfigured},
    {"staged_in_place", false, true, true, false, kConfigured},
    {"default", true, true, false, false, kConfigured},
    {"default_in_place", true, true, true, false, kConfigured},
    {"shared", false, true, false, true, kConfigured},
    {"shared_in_place", false, true, true, true, kConfigured},
    {"default_shared", true, true, false, true, kConfigured},
    {"staged_streamed", false, true, false, false, kStreamed},
    {"staged_plain", false, true, false, false, kPlain},
    {"shared_streamed", false, true, false, true, kStreamed},
    {"shared_plain", false, true, false, true, kPlain},
};
constexpr int kNumVariants = sizeof(kVariants) / sizeof(kVariants[0]);
constexpr long long kSizes[] = {1LL << 20,  4LL << 20,  8LL << 20,
                                16LL << 20, 32LL << 20, 64LL << 20};

}  // namespace

int main() {
  // The runtime's variables that shape the transport (BLUEFOG_LOCAL_ROUNDS,
  // BLUEFOG_STAGED_ALLREDUCE, BLUEFOG_STREAMING_STORES), as the runtime applies them.
  const bluefog::Config config = bluefog::Config::FromEnvironment();
  bluefog::TransportOptions options = bluefog::TransportOptions::FromConfig(config);
  // The heap must hold a block of every size for each shared variant (its blocks are never
  // merged, so a size's freed blocks do not make room for a larger one): more than the default
  // BLUEFOG_SHARED_OUTPUTS.
  int64_t all_sizes = 0;
  for (long long bytes : kSizes) all_sizes += bytes;
  int shared_variants = 0;
  for (const Variant& v : kVariants) shared_variants += v.shared ? 1 : 0;
  options.shared_heap_bytes =
      std::max<int64_t>(config.shared_outputs_bytes, shared_variants * all_sizes + (1 << 20));
  bluefog::MpiCommunicator transport(options);
  const bluefog::TransportInfo info = transport.Init();
  bluefog::Tuning& tuning = transport.tuning();
  const int64_t configured_stores = config.streaming_store_bytes;
  const std::shared_ptr<bluefog::SharedHeap> heap = transport.shared_heap();
  constexpr int kReps = 9;
  const bool direct_possible = transport.paths().direct;
  const bool staged_possible = transport.paths().staged;
  for (long long bytes : kSizes) {
    const long long count = bytes / 4;
    // Every variant has buffers of its own: a batch runs slower on buffers another variant
    // touched last, so sharing would favour some pairs.
    std::vector<std::vector<float>> ins, outs;
    std::vector<float*> blocks(kNumVariants, nullptr);  // the shared variants' buffers
    for (int v = 0; v < kNumVariants; ++v) {
      ins.emplace_back(count, static_cast<float>(info.rank + 1));
      outs.emplace_back(kVariants[v].in_place ? 0 : count, 0.0f);
      if (kVariants[v].shared && heap) {
        blocks[v] = static_cast<float*>(heap->Take(static_cast<size_t>(bytes)));
        if (blocks[v] == nullptr) {
          std::fprintf(stderr, "rank %d: no room in the shared heap (BLUEFOG_SHARED_OUTPUTS)\n",
                       info.rank);
          return 1;
        }
        std::fill(blocks[v], blocks[v] + count, static_cast<float>(info.rank + 1));
      }
    }
    std::vector<float> mpi_buf(count, 0.0f);
    const int kCopy = kNumVariants + 1;  // the bound's batch
    std::vector<float> copy_in(count, 1.0f), copy_out(count, 0.0f);
    const int iters = static_cast<int>(std::clamp(200e6 / bytes, 3.0, 200.0));
    std::vector<std::vector<double>> times(kNumVariants + 2);
    for (int rep = 0; rep < kReps + 1; ++rep) {  // rep 0 warms up all
      // A fresh order each repetition (the same on every rank): a batch runs slower after
      // some others (their dirty buffers in cache), so no variant always follows the same one.
      std::vector<int> order(kNumVariants + 2);
      for (int v = 0; v <= kCopy; ++v) order[v] = v;
      std::shuffle(order.begin(), order.end(), std::mt19937(rep));
      for (int which : order) {
        MPI_Barrier(MPI_COMM_WORLD);
        const double t0 = MPI_Wtime();
        if (which == kCopy) {
          for (int i = 0; i < iters; ++i)
            std::copy(copy_in.begin(), copy_in.end(), copy_out.begin());
        } else if (which == kNumVariants) {
          for (int i = 0; i < iters; ++i)
            MPI_Allreduce(MPI_IN_PLACE, mpi_buf.data(), static_cast<int>(count), MPI_FLOAT, MPI_SUM,
                          MPI_COMM_WORLD);
        } else {
          const Variant& v = kVariants[which];
          tuning.direct = v.direct;
          tuning.staged = v.staged;
          tuning.shared = v.shared;
          tuning.streaming_store_bytes = v.stores == kStreamed ? 1
                                         : v.stores == kPlain  ? 0
                                                               : configured_stores;
          float* in = v.shared && v.in_place && blocks[which] ? blocks[which] : ins[which].data();
          float* out = v.in_place                  ? in
                       : v.shared && blocks[which] ? blocks[which]
                                                   : outs[which].data();
          for (int i = 0; i < iters; ++i)
            transport.AllreduceSum(in, out, count, bluefog::DataType::kFloat32);
        }
        double t = (MPI_Wtime() - t0) / iters;
        MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        if (rep > 0) times[which].push_back(t);
      }
    }
    const float want = info.size * (info.size + 1) / 2.0f;
    for (int v = 0; v < kNumVariants; ++v) {
      if (kVariants[v].in_place) continue;  // summed again on every call
      const float* out = blocks[v] ? blocks[v] : outs[v].data();
      if (out[0] != want || out[count / 3] != want || out[count - 1] != want) {
        std::fprintf(stderr, "rank %d: wrong sum at %lld bytes (%s)\n", info.rank, bytes,
                     kVariants[v].name);
        return 1;
      }
    }
    for (int v = 0; v < kNumVariants; ++v)
      if (blocks[v]) heap->Give(blocks[v], static_cast<size_t>(bytes));
    if (info.rank != 0) continue;
    std::string line = "{\"impl\":\"transport\",\"ranks\":" + std::to_string(info.size) +
                       ",\"bytes\":" + std::to_string(bytes);
    for (int v = 0; v <= kCopy; ++v) {
      std::sort(times[v].begin(), times[v].end());
      char field[96];
      std::snprintf(field, sizeof(field), ",\"%s_s\":%.9g",
                    v == kCopy          ? "copy"
                    : v == kNumVariants ? "mpi"
                                        : kVariants[v].name,
                    times[v][kReps / 2]);
      line += field;
    }
    line += std::string(",\"direct\":") + (direct_possible ? "true" : "false") +
            ",\"staged\":" + (staged_possible ? "true" : "false") +
            ",\"shared\":" + (heap ? "true" : "false") + "}";

    std::printf("%s\n", line.c_str());
  }
  transport.Shutdown();
  return 0;
}
