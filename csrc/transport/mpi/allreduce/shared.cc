// The shared allreduce: every output in the shared heap (transport/shared_heap.h), each rank
// pushes the segment it reduced straight into every peer's output.
#include <algorithm>
#include <cstring>
#include <vector>

#include "core/reduce_kernels.h"
#include "transport/mpi/allreduce/algorithms.h"
#include "transport/mpi/mpi_communicator.h"
#include "transport/shared_heap.h"

namespace bluefog {
namespace {

using CopyFn = void (*)(void*, const void*, size_t);
void PlainCopy(void* dst, const void* src, size_t bytes) { std::memcpy(dst, src, bytes); }

}  // namespace

// The staged allreduce, but each rank writes the segment it reduced straight into every peer's
// output (a plain store into the peer's part of the heap, while the chunk is still in cache)
// instead of through its area, so nobody copies anything out. A step:
//  1. a sync (on the first step the caller's gather of the buffers): the areas are free;
//  2. every rank copies its input's segments s != r into its own area, at their offsets;
//  3. a sync (on the first step, when `staged_first`, 1 and 2 came before the caller's gather,
//     which was this sync);
//  4. rank r sums its own input's segment r with segment r of every peer's area into its output,
//     a piece at a time, and copies each summed piece into every peer's output.
// A last sync: every output is complete (and the areas free for the next call). Per rank that
// reads its input once and writes its own segment once plus the peers' copies of it ((n-1)S/n,
// what they would otherwise copy out), and its area is written once and read by the peers once:
// two passes over the data fewer than the staged path, with one sync fewer per step after the
// first. In place is safe for the same reason as there: rank r writes segment r of a peer's
// buffer only after the sync that follows the peer's copy of it into its area.
void SharedAllreduce(DataAreas* areas, const AllreduceCall& call, const uint64_t* gathered,
                     bool staged_first) {
  MpiCommunicator* comm = areas->comm();
  LocalRounds* rounds = comm->local_rounds();
  const int64_t elem = static_cast<int64_t>(ElementSize(call.dtype));
  const int n = comm->size();
  const int rank = comm->rank();
  const int64_t step = areas->StepElements(elem);
  const int64_t publish_bytes = DataAreas::kPublishBytes;
  const int64_t publish = std::max<int64_t>(1, publish_bytes / elem);
  const SharedHeap& heap = *rounds->heap();
  std::vector<char*>& outputs = areas->peer_outputs;
  outputs.resize(n);
  for (int r = 0; r < n; ++r) outputs[r] = heap.part(r) + static_cast<int64_t>(gathered[3 * r + 2]);
  const char* src = static_cast<const char*>(call.in);
  char* dst = static_cast<char*>(call.out);
  // Streaming: each piece is summed into the scratch (in cache) and streamed into every output.
  const bool stream = areas->Streams(call.in, call.out, call.bytes);
  char* piece = stream ? comm->Scratch(publish_bytes) : nullptr;
  const CopyFn put = stream ? StreamCopy : PlainCopy;
  for (int64_t lo = 0; lo < call.count; lo += step) {
    const int64_t m = std::min(step, call.count - lo);
    auto begin = [&](int k) { return m * k / n; };
    if (lo > 0) rounds->Exchange(nullptr);
    if (lo > 0 || !staged_first) {
      areas->StageSegments(src + lo * elem, m, elem);
      rounds->Exchange(nullptr);
    }
    for (int64_t i = begin(rank); i < begin(rank + 1); i += publish) {
      const int64_t len = std::min(publish, begin(rank + 1) - i);
      const size_t bytes = static_cast<size_t>(len * elem);
      char* d = dst + (lo + i) * elem;
      char* sum = stream ? piece : d;
      areas->ReduceWithAreas(src + (lo + i) * elem, sum, i, len, call.dtype, call.op, call.divisor);
      if (stream) StreamCopy(d, sum, bytes);
      for (int k = 1; k < n; ++k) put(outputs[(rank + k) % n] + (lo + i) * elem, sum, bytes);
    }
  }
  rounds->Exchange(nullptr);
  areas->free = true;  // every peer's reads of the areas came before this sync
}

}  // namespace bluefog
