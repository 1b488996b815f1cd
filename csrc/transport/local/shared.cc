// The shared allreduce: every output in the shared heap (transport/shared_heap.h), each rank
// pushes the segment it reduced straight into every peer's output.
#include <algorithm>
#include <cstring>
#include <vector>

#include "core/reduce_kernels.h"
#include "transport/local/algorithms.h"
#include "transport/local/local_host.h"
#include "transport/shared_heap.h"

namespace bluefog {

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
  LocalHost* host = areas->host();
  LocalRounds* rounds = host->rounds();
  const int64_t elem = static_cast<int64_t>(ElementSize(call.dtype));
  const int n = host->size();
  const int rank = host->rank();
  const int64_t step = areas->StepElements(elem);
  const SharedHeap& heap = *rounds->heap();
  std::vector<char*>& outputs = areas->peer_outputs;  // every rank's output, in this mapping
  outputs.resize(n);
  for (int r = 0; r < n; ++r) outputs[r] = heap.part(r) + static_cast<int64_t>(gathered[3 * r + 2]);
  const char* src = static_cast<const char*>(call.in);
  // Streaming: each piece is summed into the scratch (in cache) and streamed into every output.
  const bool stream = areas->Streams(call.in, call.out, call.bytes);
  for (int64_t lo = 0; lo < call.count; lo += step) {
    const int64_t m = std::min(step, call.count - lo);
    if (lo > 0) rounds->Exchange(nullptr);
    if (lo > 0 || !staged_first) {
      areas->StageSegments(src + lo * elem, m, elem);
      rounds->Exchange(nullptr);
    }
    areas->ReduceOwnSegment(call, lo, m, stream, [&](int64_t i, const char* sum, size_t bytes) {
      for (int k = 1; k < n; ++k)
        DataAreas::Put(stream, outputs[(rank + k) % n] + (lo + i) * elem, sum, bytes);
    });
  }
  rounds->Exchange(nullptr);
  areas->free = true;  // every peer's reads of the areas came before this sync
}

}  // namespace bluefog
