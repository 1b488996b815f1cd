#include "transport/local/local_rounds.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/status.h"
#include "transport/communicator.h"

namespace bluefog {

// At the start of the segment; the two rounds' slots follow, each `size` slots long (rounds
// alternate between them, so a rank may fill the next round's slot while a slower rank still
// reads this one's).
struct LocalRounds::Header {
  uint64_t token;                                // written by rank 0, checked by the others
  alignas(64) std::atomic<uint32_t> arrived;     // ranks that have filled this round's slot
  alignas(64) std::atomic<uint32_t> generation;  // rounds completed: the futex word
  std::atomic<uint32_t> sleepers;                // ranks in (or entering) a futex wait
};

namespace {

constexpr size_t kHeaderBytes = 192;
constexpr size_t kPage = 4096;
constexpr auto kPollBeforeSleep = std::chrono::milliseconds(1);
static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t) &&
                  std::atomic<uint32_t>::is_always_lock_free,
              "the futex word must be a plain lock-free 32-bit word");

long Futex(std::atomic<uint32_t>* word, int op, uint32_t value, const timespec* timeout) {
  // Not FUTEX_PRIVATE_FLAG: the word is shared between processes.
  return syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), op, value, timeout, nullptr, 0);
}

}  // namespace

namespace {

// Where the data areas start: after the header and both rounds' slots, on a page boundary.
size_t DataOffset(int size, size_t slot_bytes) {
  const size_t end = kHeaderBytes + 2 * static_cast<size_t>(size) * slot_bytes;
  return (end + kPage - 1) / kPage * kPage;
}

}  // namespace

std::unique_ptr<LocalRounds> LocalRounds::Create(Communicator* comm, size_t slot_bytes,
                                                 size_t data_bytes, size_t heap_bytes) {
  const int rank = comm->rank();
  const int size = comm->size();
  static_assert(sizeof(Header) <= kHeaderBytes, "header too large");
  data_bytes = (data_bytes + 63) / 64 * 64;  // every area starts on a cache line
  heap_bytes = (heap_bytes + kPage - 1) / kPage * kPage;
  // The rounds' part (header, slots, data areas), then the heap's parts, on page boundaries.
  const size_t bytes =
      (DataOffset(size, slot_bytes) + static_cast<size_t>(size) * data_bytes + kPage - 1) / kPage *
      kPage;
  const size_t total = bytes + static_cast<size_t>(size) * heap_bytes;
  void* heap = MAP_FAILED;
  // What rank 0 offers: where to find its segment, what identifies it (device and inode, so
  // that no other file is ever mapped), and the token it wrote there. fd = -1: none.
  struct Offer {
    int64_t pid = 0, fd = -1;
    uint64_t dev = 0, ino = 0, token = 0;
  } offer;
  void* base = MAP_FAILED;
  int fd = -1;
  if (rank == 0) {
    fd = static_cast<int>(syscall(SYS_memfd_create, "bluefog-rounds", MFD_CLOEXEC));
    struct stat st{};
    if (fd >= 0 && ftruncate(fd, static_cast<off_t>(total)) == 0 && fstat(fd, &st) == 0)
      base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base != MAP_FAILED && heap_bytes > 0)
      heap = mmap(nullptr, total - bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd,
                  static_cast<off_t>(bytes));
    if (heap_bytes > 0 && heap == MAP_FAILED && base != MAP_FAILED) {
      munmap(base, bytes);
      base = MAP_FAILED;
    }
    if (base != MAP_FAILED) {
      std::random_device entropy;
      offer.token = (static_cast<uint64_t>(entropy()) << 32) ^ entropy();
      static_cast<Header*>(base)->token = offer.token;
      offer = {static_cast<int64_t>(getpid()), fd, static_cast<uint64_t>(st.st_dev),
               static_cast<uint64_t>(st.st_ino), offer.token};
    }
  }
  comm->Broadcast(&offer, sizeof(Offer), 0);
  int ok = offer.fd >= 0 ? 1 : 0;
  if (rank != 0 && ok) {
    ok = 0;
    const std::string path =
        "/proc/" + std::to_string(offer.pid) + "/fd/" + std::to_string(offer.fd);
    // O_NOFOLLOW does not apply to /proc's fd links; the device and inode check below does.
    const int theirs = open(path.c_str(), O_RDWR | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    struct stat st{};
    if (theirs >= 0 && fstat(theirs, &st) == 0 && S_ISREG(st.st_mode) &&
        static_cast<uint64_t>(st.st_dev) == offer.dev &&
        static_cast<uint64_t>(st.st_ino) == offer.ino && static_cast<size_t>(st.st_size) == total) {
      base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, theirs, 0);
      ok = base != MAP_FAILED && static_cast<Header*>(base)->token == offer.token;
      if (ok && heap_bytes > 0) {
        heap = mmap(nullptr, total - bytes, PROT_READ | PROT_WRITE, MAP_SHARED, theirs,
                    static_cast<off_t>(bytes));
        ok = heap != MAP_FAILED;
      }
    }
    if (theirs >= 0) close(theirs);
  }
  // Every rank's verdict, so that all of them keep the segment or none does.
  std::vector<int> oks(static_cast<size_t>(size));
  comm->Allgatherv(&ok, oks.data(), std::vector<int64_t>(static_cast<size_t>(size), sizeof(int)));
  for (int r : oks) ok = ok && r;
  if (fd >= 0) close(fd);  // every rank that could open it has; the mappings keep it alive
  if (!ok) {
    if (base != MAP_FAILED) munmap(base, bytes);
    if (heap != MAP_FAILED) munmap(heap, total - bytes);
    return nullptr;
  }
  std::unique_ptr<LocalRounds> rounds(
      new LocalRounds(base, bytes, rank, size, slot_bytes, data_bytes));
  const int64_t me = static_cast<int64_t>(getpid());
  rounds->pids_.resize(static_cast<size_t>(size));
  comm->Allgatherv(&me, rounds->pids_.data(),
                   std::vector<int64_t>(static_cast<size_t>(size), sizeof(int64_t)));
  if (heap != MAP_FAILED)
    rounds->heap_ = std::make_shared<SharedHeap>(heap, heap_bytes, rank, size);
  std::memset(rounds->data(rank), 0, data_bytes);
  return rounds;
}

LocalRounds::LocalRounds(void* base, size_t bytes, int rank, int size, size_t slot_bytes,
                         size_t data_bytes)
    : base_(base),
      bytes_(bytes),
      rank_(rank),
      size_(size),
      slot_bytes_(slot_bytes),
      data_bytes_(data_bytes),
      data_offset_(DataOffset(size, slot_bytes)) {}

LocalRounds::~LocalRounds() { munmap(base_, bytes_); }

char* LocalRounds::Slots(uint64_t parity) {
  return static_cast<char*>(base_) + kHeaderBytes +
         parity * static_cast<size_t>(size_) * slot_bytes_;
}

void LocalRounds::Arrive() {
  Header* h = static_cast<Header*>(base_);
  waiting_ = static_cast<uint32_t>(round_);
  parity_ = round_ % 2;
  ++round_;
  // The arrivals form one release sequence: the last rank to arrive sees every slot, and
  // publishes them all with the new generation.
  if (h->arrived.fetch_add(1, std::memory_order_acq_rel) == static_cast<uint32_t>(size_ - 1)) {
    h->arrived.store(0, std::memory_order_relaxed);
    h->generation.store(waiting_ + 1, std::memory_order_seq_cst);
    if (h->sleepers.load(std::memory_order_seq_cst) > 0)
      Futex(&h->generation, FUTEX_WAKE, INT_MAX, nullptr);
  }
}

const char* LocalRounds::Await(const std::function<void()>& on_wait,
                               std::chrono::microseconds limit) {
  Header* h = static_cast<Header*>(base_);
  const uint32_t round = waiting_;
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  const bool bounded = limit.count() >= 0;
  // Poll, yielding the core between polls, for up to kPollBeforeSleep: whatever else could run
  // there does (the ranks this one waits for when ranks outnumber cores, TensorFlow's threads
  // during a training step), and a peer about to arrive is caught without a wake-up's cost.
  // Measured at 4 ranks on 2 cores (4-byte eager allreduce, 2 launches each): 132-195 us so,
  // 205-255 us sleeping at once, 185-305 us over MPI; docs/benchmarks.md.
  while (h->generation.load(std::memory_order_acquire) == round) {
    const auto waited = Clock::now() - start;
    if (bounded && waited >= limit) return nullptr;
    if (waited >= kPollBeforeSleep) break;
    sched_yield();
  }
  // Then sleep until the last rank wakes us (a sleeper is counted before it checks the word,
  // and the waker reads the count after changing it, so no wake is missed).
  auto reported = start;
  auto checked = start;
  const timespec tick{0, 1000 * 1000};
  while (h->generation.load(std::memory_order_acquire) == round) {
    if (bounded && Clock::now() - start >= limit) return nullptr;
    h->sleepers.fetch_add(1, std::memory_order_seq_cst);
    if (h->generation.load(std::memory_order_seq_cst) == round)
      Futex(&h->generation, FUTEX_WAIT, round, &tick);
    h->sleepers.fetch_sub(1, std::memory_order_seq_cst);
    const auto now = Clock::now();
    if (on_wait && now - start >= std::chrono::milliseconds(5) &&
        now - reported >= std::chrono::milliseconds(1)) {
      reported = now;
      on_wait();
    }
    if (now - checked >= kPeerCheck && h->generation.load(std::memory_order_acquire) == round) {
      checked = now;
      CheckPeers();
    }
  }
  return Slots(parity_);
}

void LocalRounds::CheckPeers() const {
  std::string ranks, pids;
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    const int pid = static_cast<int>(pids_[static_cast<size_t>(r)]);
    bool gone = kill(pid, 0) != 0 && errno == ESRCH;
    if (!gone) {
      // A process that was killed but not yet reaped by its parent is a zombie: gone too.
      char state = 0;
      if (FILE* f = std::fopen(("/proc/" + std::to_string(pid) + "/stat").c_str(), "r")) {
        if (std::fscanf(f, "%*d (%*[^)]) %c", &state) != 1) state = 0;
        std::fclose(f);
      }
      gone = state == 'Z' || state == 'X';
    }
    if (!gone) continue;
    ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
    pids += (pids.empty() ? "" : ", ") + std::to_string(pid);
  }
  if (!ranks.empty())
    throw TransportError(
        StatusCode::kAborted,
        Concat("rank ", rank_, ": rank(s) ", ranks, " left the job (process(es) ", pids,
               " on this host exited while this rank waited for them in a "
               "round through shared memory)"));
}

}  // namespace bluefog
