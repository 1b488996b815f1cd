// The direct allreduce among ranks of one host: each rank reads its peers' buffers with Linux
// cross-memory attach (process_vm_readv) instead of passing messages. See docs/design.md.
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/op_rules.h"
#include "core/reduce_kernels.h"
#include "core/status.h"
#include "transport/local/algorithms.h"
#include "transport/local/local_host.h"

namespace bluefog {
namespace {

// A peer's part is read this much at a time into a scratch chunk that stays in cache while it
// is summed.
constexpr int64_t kDirectChunkBytes = int64_t{256} << 10;

// Copies `bytes` between `local` and `remote` in process `pid` (write: local to remote,
// else remote to local), one copy by the kernel, no message. Short copies continue where they
// stopped. Returns what went wrong, or an empty string.
std::string CopyPeer(bool write, int pid, uint64_t remote, void* local, int64_t bytes) {
  char* here = static_cast<char*>(local);
  while (bytes > 0) {
    iovec mine{here, static_cast<size_t>(bytes)};
    iovec theirs{reinterpret_cast<void*>(remote), static_cast<size_t>(bytes)};
    const ssize_t moved = write ? process_vm_writev(pid, &mine, 1, &theirs, 1, 0)
                                : process_vm_readv(pid, &mine, 1, &theirs, 1, 0);
    if (moved < 0 && errno == EINTR) continue;
    if (moved <= 0) return moved < 0 ? std::strerror(errno) : "no progress";
    here += moved;
    remote += static_cast<uint64_t>(moved);
    bytes -= moved;
  }
  return "";
}

}  // namespace

// Every rank tries to read a known value from every other; the direct path is on only if all
// of them could (a kernel may forbid it: Yama's ptrace scope, containers without
// CAP_SYS_PTRACE across users), so no rank ever takes it alone.
//
// The value is a random token of this transport, so a process id that means another process
// here (ranks in different PID namespaces of one host) cannot pass: not even this process
// reading itself, which would otherwise sum its own buffer twice.
void DirectAllreduce::Probe() {
  std::random_device entropy;
  const int rank = host_->rank();
  const int size = host_->size();
  token_ =
      (static_cast<uint64_t>(entropy()) << 32) ^ entropy() ^ (static_cast<uint64_t>(rank) << 48);
  struct Who {
    uint64_t pid;
    uint64_t address;
    uint64_t token;
  } mine{static_cast<uint64_t>(getpid()), reinterpret_cast<uint64_t>(&token_), token_};
  std::vector<Who> all(size);
  host_->SmallAllgather(&mine, sizeof(Who), all.data());
  int ok = 1;
  pids_.resize(size);
  for (int r = 0; r < size; ++r) {
    pids_[r] = static_cast<int>(all[r].pid);
    if (r == rank) continue;
    uint64_t value = 0;
    // Writing the value back (unchanged) checks that the kernel lets this rank write there too.
    if (!CopyPeer(false, pids_[r], all[r].address, &value, sizeof(value)).empty() ||
        value != all[r].token || all[r].token == token_ ||
        !CopyPeer(true, pids_[r], all[r].address, &value, sizeof(value)).empty())
      ok = 0;
  }
  std::vector<int> oks(static_cast<size_t>(size));
  host_->SmallAllgather(&ok, sizeof(ok), oks.data());
  ok_ = *std::min_element(oks.begin(), oks.end()) == 1;
}

bool DirectAllreduce::enabled() const {
  return ok_ && host_->tuning().direct.load(std::memory_order_relaxed);
}

bool DirectAllreduce::AppliesTo(const AllreduceCall& call) const {
  return LargeCall(host_->tuning(), call) && enabled() && call.count >= host_->size();
}

// All ranks on one host. Rank r owns segment r: it reads segment r of every peer's input
// straight from the peer's memory (a scratch chunk at a time, summed while in cache), writes
// the reduced chunk into its own output and, while that chunk is still in cache, into every
// peer's output (process_vm_writev); one last sync tells every rank that its output is
// complete and that no peer reads its input any more. Per rank that reads S bytes in main
// memory (its own segment, the peers' share of theirs) and writes S (its segment, pushed into
// n - 1 outputs), where pulling the other segments after a barrier (as this did until
// 2026-12-01) read them once more: S + (n-1)S/n, and the ring forwards partial sums.
// Each segment is reduced by one rank only, so every rank gets the same bits. In place is
// safe: segment r of every buffer is read and written by rank r only, each chunk read from
// every peer before it is written back.
// In rank order (floats, when made so), a chunk's sum starts from rank 0's part and adds those of
// ranks 1 to n-1 in turn, this rank's own among them.
void DirectAllreduce::Run(const AllreduceCall& call, const uint64_t* gathered) {
  const int64_t count = call.count;
  const DataType dtype = call.dtype;
  const ReduceOp op = call.op;
  const int64_t elem = static_cast<int64_t>(ElementSize(dtype));
  const int n = host_->size();
  const int rank = host_->rank();
  if (gathered == nullptr) {  // else OneHostAllreduce just did, into the same layout
    const uint64_t mine[3] = {reinterpret_cast<uint64_t>(call.in),
                              reinterpret_cast<uint64_t>(call.out), ~uint64_t{0}};
    buffers_.resize(3 * static_cast<size_t>(n));
    host_->SmallAllgather(mine, sizeof(mine), buffers_.data());
    gathered = buffers_.data();
  }
  auto begin = [&](int k) { return count * k / n; };
  const int64_t chunk = std::max<int64_t>(1, kDirectChunkBytes / elem);
  const bool rank_order = rank_order_ && IsFloat(dtype);
  const bool in_place = call.in == call.out;
  // In rank order, two more chunks of scratch: rank 0's part, and this rank's own set aside.
  char* scratch = host_->Scratch((rank_order ? 3 : 1) * chunk * elem);
  char* first_part = scratch + chunk * elem;
  char* own_copy = first_part + chunk * elem;
  const char* src = static_cast<const char*>(call.in);
  char* dst = static_cast<char*>(call.out);
  const int64_t end = begin(rank + 1);
  const int64_t fault = host_->tuning().direct_fault_rank.load(std::memory_order_relaxed);
  std::string failure;
  // A read from (or write into) a peer's memory; on failure `failure` says which and why.
  auto reach = [&](bool write, int peer, uint64_t remote, char* local, int64_t bytes) {
    if (peer == fault && rank != peer) remote = 0;
    const std::string error = CopyPeer(write, pids_[peer], remote, local, bytes);
    if (error.empty()) return true;
    failure = Concat(write ? "write into" : "read", " the buffer of rank ", peer, " (process ",
                     pids_[peer], "): ", error);
    return false;
  };
  for (int64_t lo = begin(rank); lo < end && failure.empty(); lo += chunk) {
    const int64_t m = std::min(chunk, end - lo);
    const int64_t offset = lo * elem;
    if (rank_order) {
      // The output chunk is written from rank 1's turn on: in place, a rank from 2 up sets its
      // own part aside first.
      const char* own = src + offset;
      if (in_place && rank >= 2) {
        std::memcpy(own_copy, own, m * elem);
        own = own_copy;
      }
      const char* acc = own;  // rank 0's part
      if (rank != 0) {
        if (!reach(false, 0, gathered[0] + offset, first_part, m * elem)) break;
        acc = first_part;
      }
      for (int peer = 1; peer < n && failure.empty(); ++peer) {
        const char* part = own;
        if (peer != rank) {
          if (!reach(false, peer, gathered[3 * peer] + offset, scratch, m * elem)) break;
          part = scratch;
        }
        ReduceStep(dst + offset, acc, part, m, dtype, op, peer == n - 1 ? call.divisor : 1);
        acc = dst + offset;
      }
    }
    for (int k = 1; k < n && failure.empty() && !rank_order; ++k) {
      const int peer = (rank + k) % n;
      if (!reach(false, peer, gathered[3 * peer] + offset, scratch, m * elem)) break;
      const char* acc = k == 1 ? src + offset : dst + offset;
      ReduceStep(dst + offset, acc, scratch, m, dtype, op, k == n - 1 ? call.divisor : 1);
    }
    // Pushed while still in cache: the peers' copies of this chunk cost no second read of it.
    for (int k = 1; k < n && failure.empty(); ++k) {
      const int peer = (rank + k) % n;
      reach(true, peer, gathered[3 * peer + 1] + offset, dst + offset, m * elem);
    }
  }
  // One sync: every rank's segments are in every output and no peer reads any input still.
  Agree(failure);
}

// A barrier that also finds the lowest rank whose reads or writes failed, if any; then every rank
// turns the direct path off (later allreduces take the ring) and fails this allreduce.
void DirectAllreduce::Agree(const std::string& failure) {
  const int rank = host_->rank();
  const int mine = failure.empty() ? INT_MAX : rank;
  agree_.resize(host_->size());
  host_->SmallAllgather(&mine, sizeof(mine), agree_.data());
  const int first = *std::min_element(agree_.begin(), agree_.end());
  if (first == INT_MAX) return;
  ok_ = false;
  const std::string what =
      first == rank
          ? Concat("rank ", rank, " could not ", failure)
          : Concat("rank ", first, " could not reach a peer's buffer (its error says why)");
  throw BluefogError(StatusCode::kInternal,
                     Concat("direct allreduce failed: ", what,
                            "; later allreduces pass messages instead (set "
                            "BLUEFOG_DIRECT_ALLREDUCE=0 to do so from the start)"));
}

}  // namespace bluefog
