// The data areas of the rounds' shared-memory segment (DataAreas), and the staged allreduce
// through them: each rank copies in what its peers reduce and copies out what they reduced,
// with plain loads and stores; large out-of-place outputs are written with streaming stores
// (BLUEFOG_STREAMING_STORES).
#include <algorithm>
#include <cstring>

#include "core/op_rules.h"
#include "core/reduce_kernels.h"
#include "transport/local/algorithms.h"
#include "transport/local/local_host.h"

namespace bluefog {

int DataAreas::host_size() const { return host_->size(); }
int DataAreas::host_rank() const { return host_->rank(); }
char* DataAreas::Scratch(int64_t bytes) { return host_->Scratch(bytes); }

void DataAreas::Put(bool stream, void* dst, const void* src, size_t bytes) {
  if (stream) {
    StreamCopy(dst, src, bytes);
  } else {
    std::memcpy(dst, src, bytes);
  }
}

bool DataAreas::enabled() const {
  const LocalRounds* rounds = host_->rounds();
  return host_->tuning().staged.load(std::memory_order_relaxed) && rounds != nullptr &&
         rounds->data_bytes() > 0;
}

int64_t DataAreas::StepElements(int64_t elem) const {
  return std::max<int64_t>(host_->size(),
                           static_cast<int64_t>(host_->rounds()->data_bytes()) / elem);
}

bool DataAreas::Streams(const void* in, const void* out, int64_t bytes) const {
  const int64_t from = host_->tuning().streaming_store_bytes.load(std::memory_order_relaxed);
  return in != out && from > 0 && bytes >= from;
}

void DataAreas::StageSegments(const char* src, int64_t m, int64_t elem) {
  const int n = host_->size();
  const int rank = host_->rank();
  char* mine = host_->rounds()->data(rank);
  for (int k = 1; k < n; ++k) {
    const int s = (rank + k) % n;
    const int64_t lo = m * s / n, hi = m * (s + 1) / n;
    std::memcpy(mine + lo * elem, src + lo * elem, static_cast<size_t>((hi - lo) * elem));
  }
}

void DataAreas::ReduceWithAreas(const char* own, char* out, int64_t at, int64_t len, DataType dtype,
                                ReduceOp op, int64_t divisor) {
  const int n = host_->size();
  const int rank = host_->rank();
  const int64_t elem = static_cast<int64_t>(ElementSize(dtype));
  LocalRounds* rounds = host_->rounds();
  if (rank_order_ && IsFloat(dtype)) {
    // Out is written from the first step on: in place, this rank's part (needed at its turn)
    // is set aside first, unless it is rank 0's or rank 1's (read at or before that write).
    if (out == own && rank >= 2) {
      aside_.resize(static_cast<size_t>(len * elem));
      std::memcpy(aside_.data(), own, aside_.size());
      own = aside_.data();
    }
    auto part = [&](int r) { return r == rank ? own : rounds->data(r) + at * elem; };
    for (int r = 1; r < n; ++r) {
      const char* acc = r == 1 ? part(0) : out;
      ReduceStep(out, acc, part(r), len, dtype, op, r == n - 1 ? divisor : 1);
    }
    return;
  }
  for (int k = 1; k < n; ++k) {
    const char* theirs = rounds->data((rank + k) % n) + at * elem;
    const char* acc = k == 1 ? own : out;
    ReduceStep(out, acc, theirs, len, dtype, op, k == n - 1 ? divisor : 1);
  }
}

// The buffer goes in steps of at most data_bytes(); each step's elements are split into n
// segments, segment r being rank r's. A step:
//  1. a sync (a shared-memory round): every rank is done with the areas' previous step (on the
//     first step, `synced`: the caller's gather of the buffers was one);
//  2. every rank copies its input's segments s != r into its own area, at their offsets;
//  3. a sync;
//  4. rank r sums its own input's segment r with segment r of every peer's area into its output
//     and copies the result into segment r of its own area;
//  5. a sync;
//  6. rank r copies segment s of rank s's area into its output, for every s != r.
// No sync after the last step: no peer ever touches this rank's own buffers, and the next step
// (of this call or a later one) starts with one. Per rank that reads its input once and writes
// its output once in main memory, and the areas (n data_bytes() in all, one set: a second set
// would save the first sync but double what must stay in cache) are written once and read once.
// Each segment is reduced by one rank only, so every rank gets the same bits; in place is safe,
// as a rank overwrites a segment of its buffer only after copying it in.
void StagedAllreduce(DataAreas* areas, const AllreduceCall& call, bool synced) {
  LocalHost* host = areas->host();
  LocalRounds* rounds = host->rounds();
  const int64_t elem = static_cast<int64_t>(ElementSize(call.dtype));
  const int n = host->size();
  const int rank = host->rank();
  const int64_t step = areas->StepElements(elem);
  const char* src = static_cast<const char*>(call.in);
  char* dst = static_cast<char*>(call.out);
  const bool stream = areas->Streams(call.in, call.out, call.bytes);
  char* mine = rounds->data(rank);
  for (int64_t lo = 0; lo < call.count; lo += step) {
    const int64_t m = std::min(step, call.count - lo);
    auto begin = [&](int k) { return m * k / n; };
    if (lo > 0 || !synced) rounds->Exchange(nullptr);
    areas->StageSegments(src + lo * elem, m, elem);
    rounds->Exchange(nullptr);
    areas->ReduceOwnSegment(call, lo, m, stream, [&](int64_t i, const char* sum, size_t bytes) {
      std::memcpy(mine + i * elem, sum, bytes);
    });
    rounds->Exchange(nullptr);
    for (int k = 1; k < n; ++k) {
      const int s = (rank + k) % n;
      DataAreas::Put(stream, dst + (lo + begin(s)) * elem, rounds->data(s) + begin(s) * elem,
                     static_cast<size_t>((begin(s + 1) - begin(s)) * elem));
    }
  }
  areas->free = false;  // peers may still be copying out of this rank's area
}

}  // namespace bluefog
