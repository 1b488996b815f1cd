// The negotiation rounds' exchange (MpiCommunicator::ExchangeAll): every rank's message to every
// rank, through a fixed slot per rank, over shared memory on one host (LocalRounds) or an
// MPI_Iallgather, with an MPI_Allgatherv for what does not fit. See docs/design.md, "One host".
#include <mpi.h>
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstring>
#include <thread>

#include "core/status.h"
#include "transport/exchange_slots.h"
#include "transport/mpi/comm_handle.h"
#include "transport/mpi/mpi_communicator.h"

namespace bluefog {
namespace {

// How long a negotiation round's wait yields the core between tests before it starts sleeping.
constexpr auto kYieldWindow = std::chrono::milliseconds(5);

inline MPI_Request& AsRequest(void*& p) { return *reinterpret_cast<MPI_Request*>(&p); }
static_assert(sizeof(MPI_Request) <= sizeof(void*), "an MPI_Request must fit an opaque word");

}  // namespace

std::vector<std::string> MpiCommunicator::ExchangeAll(const std::string& mine,
                                                      const std::function<void()>& on_wait) {
  StartExchange(mine);
  std::vector<std::string> out;
  FinishExchange(&out, on_wait, std::chrono::microseconds(-1));
  return out;
}

void MpiCommunicator::StartExchange(const std::string& mine) {
  // What does not fit a slot goes in a second step, once every rank's slot showed its length.
  const char* rest = ExchangeRest(mine);
  exchange_rest_.assign(rest ? rest : "", rest ? mine.size() - kExchangeSlotBytes : 0);
  if (LocalRounds* rounds = local_ ? local_->rounds() : nullptr) {
    FillExchangeSlot(rounds->my_slot(), mine);
    rounds->Arrive();
  } else {
    FillExchangeSlot(exchange_send_.data(), mine);
    StartExchangeSlots();
  }
}

bool MpiCommunicator::FinishExchange(std::vector<std::string>* out,
                                     const std::function<void()>& on_wait,
                                     std::chrono::microseconds limit) {
  const char* slots = exchange_recv_.data();
  if (LocalRounds* rounds = local_ ? local_->rounds() : nullptr) {
    slots = rounds->Await(on_wait, limit);
    if (!slots) return false;
  } else if (!AwaitExchangeSlots(on_wait, limit)) {
    return false;
  }
  out->clear();
  if (!ReadExchangeSlots(slots, size_, out, &rest_)) return true;

  // Second step only when some rank had more to say than its slot holds.
  int64_t recv_total = 0;
  for (int r = 0; r < size_; ++r) {
    counts_[r] = static_cast<int>(rest_[r]);
    displs_[r] = static_cast<int>(recv_total);
    recv_total += rest_[r];
  }
  BF_ENFORCE(recv_total < INT_MAX, StatusCode::kInternal, "negotiation message too large");
  std::vector<char> recv(recv_total);
  Check(MPI_Allgatherv(exchange_rest_.data(), counts_[rank_], MPI_BYTE, recv.data(), counts_.data(),
                       displs_.data(), MPI_BYTE, AsComm(comm_)),
        "MPI_Allgatherv");
  AppendExchangeRests(recv.data(), rest_, out);
  return true;
}

void MpiCommunicator::StartExchangeSlots() {
  Check(MPI_Iallgather(exchange_send_.data(), static_cast<int>(kExchangeSlotTotal), MPI_BYTE,
                       exchange_recv_.data(), static_cast<int>(kExchangeSlotTotal), MPI_BYTE,
                       AsComm(comm_), &AsRequest(exchange_request_)),
        "MPI_Iallgather");
}

bool MpiCommunicator::AwaitExchangeSlots(const std::function<void()>& on_wait,
                                         std::chrono::microseconds limit) {
  // Poll rather than block, so a stalled peer can be reported. A round completes only as its
  // ranks make progress calls, so a rank asleep between tests holds up every other one: first
  // spin, then test and yield the core for up to kYieldWindow (when ranks outnumber cores, the
  // ones still to join get to run; measured at 4 ranks on 2 cores: 4-byte allreduce ~280 ->
  // ~180 us), and only then sleep with a growing pause, so a long wait leaves the core idle.
  int done = 0;
  auto sleep_for = std::chrono::microseconds(50);
  const auto start = std::chrono::steady_clock::now();
  for (int spins = 0;; ++spins) {
    Check(MPI_Test(&AsRequest(exchange_request_), &done, MPI_STATUS_IGNORE), "MPI_Test");
    if (done) return true;
    if (spins < 200) continue;
    const auto waited = std::chrono::steady_clock::now() - start;
    if (limit.count() >= 0 && waited >= limit) return false;
    if (waited < kYieldWindow) {
      sched_yield();
      continue;
    }
    std::this_thread::sleep_for(sleep_for);
    sleep_for = std::min(sleep_for * 2, std::chrono::microseconds(1000));
    if (on_wait) on_wait();
  }
}

}  // namespace bluefog
