// Gloo's TCP pairs as a data plane over another backend's communicator (transport/data_plane.h):
// no store and no rendezvous of its own. Each rank announces its IPv4 interfaces through the
// communicator, listens on the one that shares a subnet with the most other ranks (or the one
// BLUEFOG_GLOO_IFACE names), and connects a pair to every other rank at the addresses gathered
// through the communicator's Allgatherv.
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>

#include <cstring>
#include <sstream>

#include <gloo/common/error.h>
#include <gloo/context.h>
#include <gloo/transport/context.h>
#include <gloo/transport/tcp/device.h>

#include "core/reduce_kernels.h"
#include "core/status.h"
#include "transport/communicator.h"
#include "transport/data_plane.h"
#include "transport/gloo/gloo_allreduce.h"

namespace bluefog {
namespace {

// Every rank's `mine`, in rank order, through two Allgatherv (lengths, then bytes).
std::vector<std::string> GatherStrings(Communicator& comm, const std::string& mine) {
  const int n = comm.size();
  std::vector<int64_t> lengths(n);
  const int64_t length = static_cast<int64_t>(mine.size());
  comm.Allgatherv(&length, lengths.data(), std::vector<int64_t>(n, sizeof(int64_t)));
  int64_t total = 0;
  for (int64_t l : lengths) total += l;
  std::string bytes(static_cast<size_t>(total), '\0');
  comm.Allgatherv(mine.data(), &bytes[0], lengths);
  std::vector<std::string> out;
  int64_t at = 0;
  for (int64_t l : lengths) {
    out.push_back(bytes.substr(static_cast<size_t>(at), static_cast<size_t>(l)));
    at += l;
  }
  return out;
}

// A Gloo context whose pairs were connected here (Connect below), not by a store's rendezvous.
class MeshContext : public gloo::Context {
 public:
  MeshContext(int rank, int size, std::shared_ptr<gloo::transport::Device> device,
              std::shared_ptr<gloo::transport::Context> pairs)
      : gloo::Context(rank, size) {
    device_ = std::move(device);
    transportContext_ = std::move(pairs);
  }
};

// Every pair of `comm`'s ranks connected over `device`: each rank makes a pair for every other
// rank, the pairs' addresses are gathered through `comm`, and each pair connects to the
// address its peer made for this rank.
std::shared_ptr<gloo::Context> Connect(Communicator& comm,
                                       const std::shared_ptr<gloo::transport::Device>& device,
                                       std::chrono::milliseconds timeout) {
  const int rank = comm.rank();
  const int size = comm.size();
  std::shared_ptr<gloo::transport::Context> pairs = device->createContext(rank, size);
  pairs->setTimeout(timeout);
  std::string mine;
  for (int i = 0; i < size; ++i) {
    if (i == rank) continue;
    const std::vector<char> address = pairs->createPair(i)->address().bytes();
    mine.append(address.data(), address.size());
  }
  const std::vector<std::string> all = GatherStrings(comm, mine);
  for (int i = 0; i < size; ++i) {
    if (i == rank) continue;
    const std::string& theirs = all[i];  // rank i's pairs, for every rank but i, in order
    const size_t each = theirs.size() / static_cast<size_t>(size - 1);
    const size_t at = static_cast<size_t>(rank < i ? rank : rank - 1) * each;
    pairs->getPair(i)->connect(std::vector<char>(theirs.begin() + at, theirs.begin() + at + each));
  }
  auto context = std::make_shared<MeshContext>(rank, size, device, std::move(pairs));
  context->setTimeout(timeout);
  return context;
}

struct Ipv4 {
  uint32_t addr;  // host byte order
  uint32_t mask;
  std::string text;
};

// This host's IPv4 interfaces that are up, loopback last.
std::vector<Ipv4> Interfaces() {
  std::vector<Ipv4> out, loopback;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return out;
  for (ifaddrs* a = list; a != nullptr; a = a->ifa_next) {
    if (a->ifa_addr == nullptr || a->ifa_netmask == nullptr || a->ifa_addr->sa_family != AF_INET ||
        !(a->ifa_flags & IFF_UP))
      continue;
    const auto* in = reinterpret_cast<const sockaddr_in*>(a->ifa_addr);
    const auto* mask = reinterpret_cast<const sockaddr_in*>(a->ifa_netmask);
    char text[INET_ADDRSTRLEN] = {};
    inet_ntop(AF_INET, &in->sin_addr, text, sizeof(text));
    Ipv4 ip{ntohl(in->sin_addr.s_addr), ntohl(mask->sin_addr.s_addr), text};
    ((a->ifa_flags & IFF_LOOPBACK) ? loopback : out).push_back(ip);
  }
  freeifaddrs(list);
  out.insert(out.end(), loopback.begin(), loopback.end());
  return out;
}

// The address of this rank's to listen on: of its interfaces (not loopback), the first that
// shares a subnet with an interface of the most other ranks; loopback when it has no other.
std::string ChooseAddress(Communicator& comm) {
  const std::vector<Ipv4> mine = Interfaces();
  std::ostringstream text;
  for (const Ipv4& ip : mine) text << ip.addr << ' ' << ip.mask << ' ';
  const std::vector<std::string> all = GatherStrings(comm, text.str());
  std::vector<std::vector<uint32_t>> theirs(all.size());
  for (size_t r = 0; r < all.size(); ++r) {
    std::istringstream in(all[r]);
    uint32_t addr, mask;
    while (in >> addr >> mask) theirs[r].push_back(addr);
  }
  std::string best = "127.0.0.1";
  int best_reach = -1;
  for (const Ipv4& ip : mine) {
    if ((ip.addr >> 24) == 127) continue;
    int reach = 0;
    for (size_t r = 0; r < theirs.size(); ++r) {
      if (static_cast<int>(r) == comm.rank()) continue;
      for (uint32_t a : theirs[r])
        if ((a & ip.mask) == (ip.addr & ip.mask)) {
          ++reach;
          break;
        }
    }
    if (reach > best_reach) {
      best_reach = reach;
      best = ip.text;
    }
  }
  return best;
}

class GlooDataPlane : public DataPlane {
 public:
  GlooDataPlane(Communicator& over, const DataPlaneOptions& options) : options_(options) {
    gloo::transport::tcp::attr attr;
    if (options.iface.empty()) {
      attr.hostname = ChooseAddress(over);
      address_ = attr.hostname;
    } else {
      attr.iface = options.iface;
      address_ = "interface " + options.iface;
    }
    // A device that cannot be made (no such interface) fails on its rank only: every rank
    // learns of it before any waits for that rank's pairs.
    std::string error;
    try {
      device_ = gloo::transport::tcp::CreateDevice(attr);
    } catch (const std::exception& e) {
      error = e.what();
    }
    const std::vector<std::string> errors = GatherStrings(over, error);
    for (size_t r = 0; r < errors.size(); ++r)
      BF_ENFORCE(errors[r].empty(), StatusCode::kAborted, "rank ", options.world_rank, ": rank ", r,
                 " of the ranks across hosts could not listen for Gloo's pairs (", errors[r],
                 "); name the interface the hosts share with BLUEFOG_GLOO_IFACE, or "
                 "keep MPI's transport across hosts with BLUEFOG_CROSS_HOST=mpi");
    Run("connect (the pairs across hosts)",
        [&] { context_ = Connect(over, device_, options.timeout); });
  }
  ~GlooDataPlane() override {
    context_.reset();
    device_.reset();
  }

  const char* name() const override { return "gloo"; }
  std::string address() const override { return address_; }

  void Allreduce(const AllreduceCall& call) override {
    const int64_t bytes = call.count * static_cast<int64_t>(ElementSize(call.dtype));
    if (call.in != call.out) std::memcpy(call.out, call.in, static_cast<size_t>(bytes));
    Run("allreduce across hosts",
        [&] { GlooAllreduce(context_, call.out, call.count, call.dtype, call.op); });
    if (call.divisor > 1) DivideBy(call.out, call.count, call.dtype, call.divisor);
  }

 private:
  template <typename F>
  void Run(const char* op, F&& body) {
    try {
      body();
    } catch (const BluefogError&) {
      throw;
    } catch (const std::exception& e) {
      throw TransportError(
          StatusCode::kAborted,
          Concat("rank ", options_.world_rank, ": Gloo ", op, " (listening on ", address_,
                 ") failed: ", e.what(),
                 ". A peer may have exited, or cannot reach this address: name the interface "
                 "the hosts share with BLUEFOG_GLOO_IFACE, or keep MPI's transport across "
                 "hosts with BLUEFOG_CROSS_HOST=mpi"));
    }
  }

  DataPlaneOptions options_;
  std::string address_;
  std::shared_ptr<gloo::transport::Device> device_;
  std::shared_ptr<gloo::Context> context_;
};

}  // namespace

std::unique_ptr<DataPlane> MakeGlooDataPlane(Communicator& over, const DataPlaneOptions& options) {
  return std::make_unique<GlooDataPlane>(over, options);
}

}  // namespace bluefog
