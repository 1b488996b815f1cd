// The backends this build has. Each registers itself from its own folder (a static
// BackendRegistration in csrc/transport/<name>/), and CMake decides which folders are built, so
// the runtime includes no backend: it asks for one by name (Config::BackendName) and, once it
// runs, asks the communicator's Capabilities, never its name. A new backend is one folder and
// one CMake line.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/config.h"
#include "transport/communicator.h"

namespace bluefog {

struct BackendEntry {
  std::string name;  // what BLUEFOG_BACKEND calls it
  // Connects this process to the job `config` describes (collective over the job's ranks);
  // fills `info` with where this rank sits. Throws BluefogError.
  std::function<std::unique_ptr<Communicator>(const Config& config, TransportInfo* info)> make;
};

// Registers `entry` (at static initialization, from the backend's own file).
class BackendRegistration {
 public:
  explicit BackendRegistration(BackendEntry entry);
};

// The backend registered as `name`, or nullptr.
const BackendEntry* FindBackend(const std::string& name);
// The registered names, in registration order ("mpi, gloo").
std::string BackendNames();
// The backend `config` asks for; a clear error naming what this build lacks and what to do
// when it is not built.
const BackendEntry& RequireBackend(const Config& config);

}  // namespace bluefog
