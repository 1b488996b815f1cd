// The negotiation rounds' exchange (MpiCommunicator::ExchangeAll): every rank's message to every
// rank, through a fixed slot per rank, over shared memory on one host (LocalRounds) or an
// MPI_Iallgather, with an MPI_Allgatherv for what does not fit; and the small allgathers the
// direct allreduce synchronizes with. See docs/design.md, "Rounds on one host".
#include <mpi.h>
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstring>
#include <thread>

#include "core/status.h"
#include "transport/mpi/comm_handle.h"
#include "transport/mpi/mpi_communicator.h"

namespace bluefog {
namespace {

constexpr size_t kSlotHeader = Communicator::kExchangeSlotHeader;
constexpr size_t kSlotPayload = Communicator::kExchangeSlotBytes;
constexpr size_t kSlotBytes = kSlotHeader + kSlotPayload;
// How long a negotiation round's wait yields the core between tests before it starts sleeping.
constexpr auto kYieldWindow = std::chrono::milliseconds(5);

// A slot: the message's whole length, then as much of it as fits.
void FillSlot(char* slot, const std::string& mine) {
  const uint64_t total = mine.size();
  std::memcpy(slot, &total, sizeof(total));
  std::memcpy(slot + kSlotHeader, mine.data(), std::min(mine.size(), kSlotPayload));
}

}  // namespace

std::vector<std::string> MpiCommunicator::ExchangeAll(const std::string& mine,
                                                      const std::function<void()>& on_wait) {
  const char* slots = exchange_recv_.data();
  if (local_rounds_) {
    FillSlot(local_rounds_->my_slot(), mine);
    slots = local_rounds_->Exchange(on_wait);
  } else {
    FillSlot(exchange_send_.data(), mine);
    ExchangeSlots(on_wait);
  }

  std::vector<std::string> out(size_);
  bool overflow = false;
  for (int r = 0; r < size_; ++r) {
    const char* slot = slots + static_cast<size_t>(r) * kSlotBytes;
    uint64_t len;
    std::memcpy(&len, slot, sizeof(len));
    out[r].assign(slot + kSlotHeader, std::min<uint64_t>(len, kSlotPayload));
    out[r].resize(len);
    counts_[r] = static_cast<int>(len > kSlotPayload ? len - kSlotPayload : 0);
    overflow |= counts_[r] > 0;
  }
  if (!overflow) return out;

  // Second step only when some rank had more to say than its slot holds.
  int64_t recv_total = 0;
  for (int r = 0; r < size_; ++r) {
    displs_[r] = static_cast<int>(recv_total);
    recv_total += counts_[r];
  }
  BF_ENFORCE(recv_total < INT_MAX, StatusCode::kInternal, "negotiation message too large");
  std::vector<char> recv(recv_total);
  const char* extra = mine.size() > kSlotPayload ? mine.data() + kSlotPayload : nullptr;
  Check(MPI_Allgatherv(extra, counts_[rank_], MPI_BYTE, recv.data(), counts_.data(), displs_.data(),
                       MPI_BYTE, AsComm(comm_)),
        "MPI_Allgatherv");
  for (int r = 0; r < size_; ++r)
    if (counts_[r] > 0) std::memcpy(&out[r][kSlotPayload], recv.data() + displs_[r], counts_[r]);
  return out;
}

// exchange_send_ (filled) from every rank into exchange_recv_, over MPI.
void MpiCommunicator::ExchangeSlots(const std::function<void()>& on_wait) {
  MPI_Request request;
  Check(MPI_Iallgather(exchange_send_.data(), static_cast<int>(kSlotBytes), MPI_BYTE,
                       exchange_recv_.data(), static_cast<int>(kSlotBytes), MPI_BYTE, AsComm(comm_),
                       &request),
        "MPI_Iallgather");
  // Poll rather than block, so a stalled peer can be reported. A round completes only as its
  // ranks make progress calls, so a rank asleep between tests holds up every other one: first
  // spin, then test and yield the core for up to kYieldWindow (when ranks outnumber cores, the
  // ones still to join get to run; measured at 4 ranks on 2 cores: 4-byte allreduce ~280 ->
  // ~180 us), and only then sleep with a growing pause, so a long wait leaves the core idle.
  int done = 0;
  auto sleep_for = std::chrono::microseconds(50);
  const auto start = std::chrono::steady_clock::now();
  for (int spins = 0;; ++spins) {
    Check(MPI_Test(&request, &done, MPI_STATUS_IGNORE), "MPI_Test");
    if (done) break;
    if (spins < 200) continue;
    if (std::chrono::steady_clock::now() - start < kYieldWindow) {
      sched_yield();
      continue;
    }
    std::this_thread::sleep_for(sleep_for);
    sleep_for = std::min(sleep_for * 2, std::chrono::microseconds(1000));
    if (on_wait) on_wait();
  }
}

void MpiCommunicator::SmallAllgather(const void* mine, size_t bytes, void* all) {
  if (local_rounds_ && bytes <= kSlotBytes) {
    std::memcpy(local_rounds_->my_slot(), mine, bytes);
    const char* slots = local_rounds_->Exchange(nullptr);
    for (int r = 0; r < size_; ++r)
      std::memcpy(static_cast<char*>(all) + static_cast<size_t>(r) * bytes,
                  slots + static_cast<size_t>(r) * kSlotBytes, bytes);
    return;
  }
  Check(MPI_Allgather(mine, static_cast<int>(bytes), MPI_BYTE, all, static_cast<int>(bytes),
                      MPI_BYTE, AsComm(comm_)),
        "MPI_Allgather");
}

}  // namespace bluefog
