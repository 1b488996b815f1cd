// The Gloo backend's entry in the registry (transport/registry.h): the communicator over the
// job's rendezvous variables (Config::UseGloo), and its TCP pairs as a data plane over another
// backend's communicator (data_plane.cc).
#include "transport/gloo/gloo_communicator.h"
#include "transport/gloo/tcp_store.h"
#include "transport/registry.h"

namespace bluefog {
namespace {

std::unique_ptr<Communicator> MakeGloo(const Config& config, TransportInfo* info) {
  GlooSetup setup;
  setup.master_addr = config.master_addr;
  setup.master_port = config.master_port;
  setup.rank = config.env_rank;
  setup.size = config.env_world_size;
  setup.local_rank = config.env_local_rank;
  setup.local_size = config.env_local_size;
  setup.token =
      JobToken(config.job_token, config.master_addr, config.master_port, config.env_world_size);
  setup.timeout =
      std::chrono::milliseconds(static_cast<int64_t>(config.gloo_timeout_seconds * 1000.0));
  setup.prefix = config.gloo_prefix;
  setup.iface = config.gloo_iface;
  setup.external_store = config.gloo_external_store;
  auto gloo = std::make_unique<GlooCommunicator>(setup, TransportOptions::FromConfig(config));
  *info = gloo->Init();
  return gloo;
}

const BackendRegistration kGloo({"gloo", MakeGloo, MakeGlooDataPlane});

}  // namespace
}  // namespace bluefog
