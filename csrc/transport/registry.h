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
#include "transport/data_plane.h"

namespace bluefog {

struct BackendEntry {
  std::string name;  // what BLUEFOG_BACKEND calls it
  // Connects this process to the job `config` describes (collective over the job's ranks);
  // fills `info` with where this rank sits. Throws BluefogError.
  std::function<std::unique_ptr<Communicator>(const Config& config, TransportInfo* info)> make;
  // Optional: this backend's transport as a data plane over `over`'s ranks (data_plane.h),
  // connected through `over` (collective over its ranks). Throws BluefogError.
  std::function<std::unique_ptr<DataPlane>(Communicator& over, const DataPlaneOptions& options)>
      data_plane;
};

// Registers `entry` (at static initialization, from the backend's own file).
class BackendRegistration {
 public:
  explicit BackendRegistration(BackendEntry entry);
};

// The backend registered as `name`, or nullptr.
const BackendEntry* FindBackend(const std::string& name);
// The backend registered as `name` when it offers a data plane, or nullptr.
const BackendEntry* FindDataPlane(const std::string& name);
// The names of the backends that offer a data plane ("gloo"), or "none".
std::string DataPlaneNames();
// The registered names, in registration order ("mpi, gloo").
std::string BackendNames();
// The backend `config` asks for; a clear error naming what this build lacks and what to do
// when it is not built.
const BackendEntry& RequireBackend(const Config& config);

}  // namespace bluefog
