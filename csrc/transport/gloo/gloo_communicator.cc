#include "transport/gloo/gloo_communicator.h"

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <map>
#include <thread>

#include <gloo/allgather.h>
#include <gloo/allgatherv.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>

#include "core/logging.h"
#include "core/reduce_kernels.h"
#include "core/status.h"
#include "transport/deterministic_allreduce.h"
#include "transport/exchange_slots.h"
#include "transport/gloo/gloo_allreduce.h"
#include "transport/gloo/tcp_store.h"
#include "transport/shared_heap.h"

namespace bluefog {
namespace {

// Gloo's collectives use slot prefixes 0x01-0x08; the neighbour exchange takes one of its own
// (the reduce-scatter another: reduce_scatter.cc).
constexpr uint64_t kNeighborSlot = uint64_t{0x20} << 56;

std::string RanksText(const std::vector<int>& ranks) {
  std::string s;
  for (size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s;
}

// This host's address on the route to addr:port (a UDP socket's source address after
// connect(), which sends nothing): the interface the other ranks reach rank 0 by is the one
// they can reach this rank by. Empty when there is no route.
std::string LocalAddressToward(const std::string& addr, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(addr.c_str(), std::to_string(port).c_str(), &hints, &res) != 0) return "";
  std::string out;
  for (addrinfo* a = res; a != nullptr && out.empty(); a = a->ai_next) {
    int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    sockaddr_storage local{};
    socklen_t len = sizeof(local);
    char host[NI_MAXHOST];
    if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0 &&
        getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0 &&
        getnameinfo(reinterpret_cast<sockaddr*>(&local), len, host, sizeof(host), nullptr, 0,
                    NI_NUMERICHOST) == 0)
      out = host;
    ::close(fd);
  }
  freeaddrinfo(res);
  return out;
}

std::string HostName() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "localhost";
  return name;
}

// Gloo's own allreduce (a ring over its TCP pairs): whatever the one-host algorithms do not
// take, so the last of the list.
class GlooRingAllreduce : public AllreduceAlgorithm {
 public:
  explicit GlooRingAllreduce(std::function<void(const AllreduceCall&)> run)
      : run_(std::move(run)) {}
  const char* name() const override { return "gloo"; }
  bool AppliesTo(const AllreduceCall&) const override { return true; }
  void Run(const AllreduceCall& call) override { run_(call); }

 private:
  std::function<void(const AllreduceCall&)> run_;
};

}  // namespace

GlooCommunicator::GlooCommunicator(GlooSetup setup, const TransportOptions& options)
    : setup_(std::move(setup)),
      options_(options),
      tuning_(std::make_shared<Tuning>(options)),
      rank_(setup_.rank),
      size_(setup_.size) {}

GlooCommunicator::GlooCommunicator(const GlooCommunicator& parent, int rank, int size)
    : setup_(parent.setup_),
      options_(parent.options_),
      tuning_(parent.tuning_),
      store_(parent.store_),
      device_(parent.device_),
      rank_(rank),
      size_(size) {}

GlooCommunicator::~GlooCommunicator() { Shutdown(); }

int GlooCommunicator::refused_connections() const { return server_ ? server_->refused() : 0; }

TransportInfo GlooCommunicator::Init() {
  BF_ENFORCE(setup_.size >= 1 && setup_.rank >= 0 && setup_.rank < setup_.size,
             StatusCode::kInvalidArgument, "RANK=", setup_.rank, " and WORLD_SIZE=", setup_.size,
             ": RANK must be at least 0 and below WORLD_SIZE");
  if (setup_.rank == 0 && !setup_.external_store)
    server_ = std::make_shared<TcpStoreServer>(setup_.master_addr, setup_.master_port, setup_.token,
                                               setup_.timeout);
  store_ = std::make_shared<TcpStore>(setup_.master_addr, setup_.master_port, setup_.token,
                                      setup_.rank, setup_.timeout, setup_.prefix);

  // Every rank announces its host; a rank that never comes is named, not waited on forever.
  const std::string host = HostName();
  store_->set(Concat("bluefog/arrived/", rank_), std::vector<char>(host.begin(), host.end()));
  std::vector<std::string> keys;
  for (int r = 0; r < size_; ++r) keys.push_back(Concat("bluefog/arrived/", r));
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + setup_.timeout;
  // Every few seconds each waiting rank says whom it waits for, so that a log (kubectl logs, a
  // scheduler's output) shows a stuck rendezvous long before BLUEFOG_GLOO_TIMEOUT ends it.
  constexpr std::chrono::seconds kProgressEvery(5);
  auto next_progress = start + kProgressEvery;
  auto pause = std::chrono::milliseconds(1);
  for (std::vector<std::string> missing = keys;;) {
    missing = store_->Missing(missing);
    if (missing.empty()) break;
    BF_ENFORCE(!setup_.external_store || !store_->Missing({kAbortKey}).empty(),
               StatusCode::kAborted, "rank ", rank_, ": the elastic driver gave up this round (",
               setup_.prefix, ") of the Gloo rendezvous: a rank of it is gone");
    std::vector<int> ranks;
    for (const std::string& k : missing) ranks.push_back(std::stoi(k.substr(16)));
    const auto now = std::chrono::steady_clock::now();
    if (now >= next_progress && now < deadline) {
      next_progress = now + kProgressEvery;
      if (LogEnabled(LogLevel::kWarning))
        LogLine(LogLevel::kWarning, rank_,
                Concat("Gloo rendezvous at ", setup_.master_addr, ":", setup_.master_port,
                       ": waiting for rank(s) ", RanksText(ranks), " of ", size_, " (",
                       std::chrono::duration_cast<std::chrono::seconds>(now - start).count(),
                       " s of ", setup_.timeout.count() / 1000, ")"));
    }
    if (now >= deadline) {
      throw BluefogError(
          StatusCode::kAborted,
          Concat("rank ", rank_, ": Gloo rendezvous at ", setup_.master_addr, ":",
                 setup_.master_port, " timed out after ", setup_.timeout.count() / 1000,
                 " s (BLUEFOG_GLOO_TIMEOUT): rank(s) ", RanksText(ranks), " of ", size_,
                 " never arrived. Start every rank with the same MASTER_ADDR, MASTER_PORT and "
                 "WORLD_SIZE, and RANK from 0 to WORLD_SIZE-1"));
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(50));
  }
  std::vector<std::string>& hosts = hosts_;
  hosts.resize(size_);
  for (int r = 0; r < size_; ++r) {
    std::vector<char> v = store_->get(keys[r]);
    hosts[r].assign(v.begin(), v.end());
  }

  TransportInfo info;
  info.rank = rank_;
  info.size = size_;
  info.threads_multiple = true;  // one gloo::Context per communicator, each on its own thread
  // Local rank: this rank's index among the ranks on its host, unless the launcher said.
  std::map<std::string, int> per_host;
  std::vector<int> local_rank(size_);
  for (int r = 0; r < size_; ++r) local_rank[r] = per_host[hosts[r]]++;
  info.local_rank = setup_.local_rank >= 0 ? setup_.local_rank : local_rank[rank_];
  info.local_size = setup_.local_size > 0 ? setup_.local_size : per_host[hosts[rank_]];
  info.cross_size = 0;
  for (int r = 0; r < size_; ++r) {
    if (local_rank[r] != local_rank[rank_]) continue;
    if (r == rank_) info.cross_rank = info.cross_size;
    ++info.cross_size;
  }
  // Homogeneous: the same count on every host, host h holding ranks h*L .. h*L+L-1.
  const int L = per_host[hosts[0]];
  info.homogeneous = size_ % L == 0;
  for (int r = 0; r < size_ && info.homogeneous; ++r)
    info.homogeneous = hosts[r] == hosts[r - r % L] && local_rank[r] == r % L;

  gloo::transport::tcp::attr attr;
  attr.iface = setup_.iface;
  attr.hostname = setup_.host;
  if (attr.hostname.empty() && attr.iface.empty())
    attr.hostname = LocalAddressToward(setup_.master_addr, setup_.master_port);
  if (attr.hostname.empty() && attr.iface.empty()) attr.hostname = host;
  Run("device creation", [&] { device_ = gloo::transport::tcp::CreateDevice(attr); });
  world_ranks_.resize(size_);
  for (int r = 0; r < size_; ++r) world_ranks_[r] = r;
  Connect("bluefog/world", hosts_);
  return info;
}

void GlooCommunicator::Connect(const std::string& prefix, const std::vector<std::string>& hosts) {
  auto context = std::make_shared<gloo::rendezvous::Context>(rank_, size_);
  context->setTimeout(setup_.timeout);
  gloo::rendezvous::PrefixStore store(prefix, *store_);
  Run("connect (rendezvous of the pairs)", [&] { context->connectFullMesh(store, device_); });
  context_ = std::move(context);
  exchange_send_.assign(kExchangeSlotTotal, 0);
  exchange_recv_.assign(kExchangeSlotTotal * static_cast<size_t>(size_), 0);
  initialized_ = true;
  // Every rank has the same host names, so every rank decides alike whether to set up the host.
  const bool one_host =
      size_ > 1 &&
      std::all_of(hosts.begin(), hosts.end(), [&](const std::string& h) { return h == hosts[0]; });
  // Gloo's ring over TCP loopback loses to the data areas at every size (2 ranks, 4 KiB: 3.6 ms
  // against 58 us), so they take every call with an element per rank.
  if (one_host) local_ = LocalHost::Create(this, tuning_, options_, /*every_size=*/true);
  ring_ = std::make_unique<GlooRingAllreduce>(
      [this](const AllreduceCall& call) { RingAllreduce(call); });
  allreduce_.clear();
  if (local_) allreduce_ = local_->algorithms();
  if (const int L = prefix == "bluefog/world" ? HomogeneousLocalSize(hosts) : 0) {
    hierarchical_ = MakeGlooHierarchical(this, L);
    allreduce_.push_back(hierarchical_.get());
  }
  allreduce_.push_back(ring_.get());
  allreduce_ = ForceAllreduce(allreduce_, options_.allreduce_algorithm,
                              /*must=*/prefix == "bluefog/world", world_ranks_[rank_], backend());
  if (options_.deterministic) {
    deterministic_ = MakeDeterministicAllreduce(this);
    PutDeterministicFirst(&allreduce_, deterministic_.get(),
                          local_ ? local_->rank_ordered() : nullptr);
  }
}

std::unique_ptr<Communicator> GlooCommunicator::CreateSubset(const std::vector<int>& ranks,
                                                             int tag) {
  auto me = std::find(ranks.begin(), ranks.end(), rank_);
  BF_ENFORCE(me != ranks.end(), StatusCode::kInternal, "rank ", rank_,
             " is not in the process set it creates (ranks ", RanksText(ranks), ")");
  std::unique_ptr<GlooCommunicator> subset(new GlooCommunicator(
      *this, static_cast<int>(me - ranks.begin()), static_cast<int>(ranks.size())));
  for (int r : ranks) subset->world_ranks_.push_back(world_ranks_[r]);
  // Sets are numbered alike on every rank, the key names the job-wide ranks, and every member
  // counts its creations over these ranks alike (a removed set registered again gets its old
  // id), so the keys of two creations never meet.
  const std::string members = RanksText(subset->world_ranks_);
  const int creation = subset_creations_[members]++;
  std::vector<std::string> hosts;
  for (int r : ranks) hosts.push_back(hosts_[r]);
  subset->hosts_ = hosts;
  subset->Connect(Concat("bluefog/set/", tag, "/", members, "/", creation), hosts);
  return subset;
}

std::unique_ptr<WindowLink> GlooCommunicator::CreateWindowLink(size_t header_bytes) {
  BF_ENFORCE(initialized_, StatusCode::kInternal, "the Gloo communicator is not initialized");
  auto context = std::make_shared<gloo::rendezvous::Context>(rank_, size_);
  context->setTimeout(setup_.timeout);
  gloo::rendezvous::PrefixStore store(Concat("bluefog/windows/", window_links_++), *store_);
  Run("connect (the window service's pairs)", [&] { context->connectFullMesh(store, device_); });
  return MakeGlooWindowLink(std::move(context), store_, rank_, size_, header_bytes, setup_.timeout);
}

std::string GlooCommunicator::GoneNote() {
  if (!store_) return "";
  // Rank 0's server marks a rank gone when that rank's connection to it ends; it may learn a
  // moment after this rank's Gloo connection broke.
  try {
    std::vector<std::string> keys;
    for (int r : world_ranks_) keys.push_back(GoneKey(r));
    for (int attempt = 0; attempt < 20; ++attempt) {
      std::vector<std::string> missing = store_->Missing(keys);
      std::vector<int> gone;
      for (size_t k = 0; k < keys.size(); ++k)
        if (std::find(missing.begin(), missing.end(), keys[k]) == missing.end())
          gone.push_back(world_ranks_[k]);
      if (!gone.empty()) return Concat(" (rank(s) ", RanksText(gone), " left the job)");
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  } catch (const std::exception&) {
    return " (rank 0's rendezvous server is gone too: has rank 0 exited?)";
  }
  return "";
}

void GlooCommunicator::Shutdown() {
  if (!initialized_) return;
  initialized_ = false;
  if (const std::shared_ptr<SharedHeap> heap = shared_heap()) {
    heap->Retire();  // blocks still out stay mapped until TensorFlow frees them
  }
  allreduce_.clear();
  hierarchical_.reset();  // its subsets first: they share this communicator's store
  local_.reset();
  context_.reset();
  store_.reset();
  device_.reset();
  server_.reset();
}

std::vector<std::string> GlooCommunicator::ExchangeAll(const std::string& mine,
                                                       const std::function<void()>& on_wait) {
  if (rounds()) {
    StartExchange(mine);
    std::vector<std::string> out;
    FinishExchange(&out, on_wait, std::chrono::microseconds(-1));
    return out;
  }
  // Gloo's allgather blocks until every rank joined or the timeout passed, so `on_wait` (the
  // stall report) does not run while waiting: a missing rank ends in the timeout's error.
  FillExchangeSlot(exchange_send_.data(), mine);
  Run("allgather (negotiation round)", [&] {
    gloo::AllgatherOptions opts(context_);
    opts.setInput(exchange_send_.data(), kExchangeSlotTotal);
    opts.setOutput(exchange_recv_.data(), kExchangeSlotTotal * static_cast<size_t>(size_));
    gloo::allgather(opts);
  });
  std::vector<std::string> out;
  ExchangeRests(exchange_recv_.data(), mine, &out);
  return out;
}

// One host: each rank's slot in the rounds' shared memory, the last to arrive waking the others
// (LocalRounds), so a negotiation round costs no message and reports a stalled peer.
void GlooCommunicator::StartExchange(const std::string& mine) {
  if (!rounds()) {
    Communicator::StartExchange(mine);
    return;
  }
  exchange_mine_ = mine;
  FillExchangeSlot(rounds()->my_slot(), mine);
  rounds()->Arrive();
}

bool GlooCommunicator::FinishExchange(std::vector<std::string>* out,
                                      const std::function<void()>& on_wait,
                                      std::chrono::microseconds limit) {
  if (!rounds()) return Communicator::FinishExchange(out, on_wait, limit);
  const char* slots = rounds()->Await(on_wait, limit);
  if (!slots) return false;
  ExchangeRests(slots, exchange_mine_, out);
  return true;
}

void GlooCommunicator::ExchangeRests(const char* slots, const std::string& mine,
                                     std::vector<std::string>* out) {
  out->clear();
  std::vector<int64_t> rest;
  if (!ReadExchangeSlots(slots, size_, out, &rest)) return;
  // Second step only when some rank had more to say than its slot holds.
  int64_t recv_total = 0;
  for (int64_t n : rest) recv_total += n;
  std::vector<char> recv(static_cast<size_t>(recv_total));
  Allgatherv(ExchangeRest(mine), recv.data(), rest);
  AppendExchangeRests(recv.data(), rest, out);
}

void GlooCommunicator::Allreduce(const void* in, void* out, int64_t count, DataType dtype,
                                 ReduceOp op, int64_t divisor) {
  if (count <= 0) return;
  RunAllreduce(allreduce_, in, out, count, dtype, op, divisor);
}

void GlooCommunicator::RingAllreduce(const AllreduceCall& call) {
  const void* in = call.in;
  void* out = call.out;
  const int64_t count = call.count;
  const DataType dtype = call.dtype;
  const ReduceOp op = call.op;
  const int64_t divisor = call.divisor;
  const size_t element = ElementSize(dtype);
  if (in != out) std::memcpy(out, in, static_cast<size_t>(count) * element);
  if (size_ > 1) {
    Run("allreduce", [&] { GlooAllreduce(context_, out, count, dtype, op); });
  }
  if (divisor > 1) DivideBy(out, count, dtype, divisor);
}

void GlooCommunicator::Allgatherv(const void* in, void* out,
                                  const std::vector<int64_t>& bytes_per_rank) {
  int64_t total = 0;
  for (int r = 0; r < size_; ++r) total += bytes_per_rank[r];
  if (total == 0) return;
  if (size_ == 1) {
    if (in != out) std::memcpy(out, in, static_cast<size_t>(bytes_per_rank[0]));
    return;
  }
  std::vector<size_t> elements(bytes_per_rank.begin(), bytes_per_rank.end());
  Run("allgatherv", [&] {
    gloo::AllgathervOptions opts(context_);
    if (bytes_per_rank[rank_] > 0)
      opts.setInput(static_cast<char*>(const_cast<void*>(in)),
                    static_cast<size_t>(bytes_per_rank[rank_]));
    else
      opts.setInput(static_cast<char*>(out), 0);
    opts.setOutput(static_cast<char*>(out), elements);
    gloo::allgatherv(opts);
  });
}

void GlooCommunicator::Broadcast(void* buffer, int64_t bytes, int root) {
  if (bytes <= 0 || size_ == 1) return;
  Run("broadcast", [&] {
    gloo::BroadcastOptions opts(context_);
    opts.setOutput(static_cast<char*>(buffer), static_cast<size_t>(bytes));
    opts.setRoot(root);
    gloo::broadcast(opts);
  });
}

void GlooCommunicator::NeighborExchange(const std::vector<PeerBuffer>& sends,
                                        const std::vector<PeerBuffer>& recvs) {
  Run("neighbor exchange", [&] {
    std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>> posted_recvs, posted_sends;
    for (const PeerBuffer& r : recvs) {
      if (r.bytes <= 0) continue;
      posted_recvs.push_back(context_->createUnboundBuffer(r.data, static_cast<size_t>(r.bytes)));
      posted_recvs.back()->recv(r.rank, kNeighborSlot);
    }
    for (const PeerBuffer& s : sends) {
      if (s.bytes <= 0) continue;
      posted_sends.push_back(context_->createUnboundBuffer(s.data, static_cast<size_t>(s.bytes)));
      posted_sends.back()->send(s.rank, kNeighborSlot);
    }
    for (auto& b : posted_recvs)
      BF_ENFORCE(b->waitRecv(setup_.timeout), StatusCode::kAborted, "rank ", rank_,
                 ": Gloo neighbor exchange: a receive was aborted");
    for (auto& b : posted_sends)
      BF_ENFORCE(b->waitSend(setup_.timeout), StatusCode::kAborted, "rank ", rank_,
                 ": Gloo neighbor exchange: a send was aborted");
  });
}

}  // namespace bluefog
