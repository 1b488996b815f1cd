#include "transport/registry.h"

#include <cctype>

#include "core/status.h"

namespace bluefog {
namespace {

std::vector<BackendEntry>& Entries() {
  static std::vector<BackendEntry> entries;
  return entries;
}

// What a build needs for the backends bluefog knows of, for the error when one is missing.
const char* InstallHint(const std::string& name) {
  if (name == "mpi") return "Install Open MPI (apt-get install libopenmpi-dev openmpi-bin)";
  if (name == "gloo") return "Install Gloo (apt-get install libgloo-dev)";
  return "Install its development files";
}

}  // namespace

BackendRegistration::BackendRegistration(BackendEntry entry) {
  Entries().push_back(std::move(entry));
}

const BackendEntry* FindBackend(const std::string& name) {
  for (const BackendEntry& e : Entries())
    if (e.name == name) return &e;
  return nullptr;
}

const BackendEntry* FindDataPlane(const std::string& name) {
  const BackendEntry* e = FindBackend(name);
  return e != nullptr && e->data_plane ? e : nullptr;
}

std::string DataPlaneNames() {
  std::string names;
  for (const BackendEntry& e : Entries())
    if (e.data_plane) names += (names.empty() ? "" : ", ") + e.name;
  return names.empty() ? "none" : names;
}

std::string BackendNames() {
  std::string names;
  for (const BackendEntry& e : Entries()) names += (names.empty() ? "" : ", ") + e.name;
  return names.empty() ? "none" : names;
}

const BackendEntry& RequireBackend(const Config& config) {
  const std::string name = config.BackendName();
  if (const BackendEntry* entry = FindBackend(name)) return *entry;
  const std::string how = name == "mpi"
                              ? "or start the job without an MPI launcher on Gloo (MASTER_ADDR, "
                                "MASTER_PORT, RANK, WORLD_SIZE; BLUEFOG_BACKEND=gloo)"
                              : "or start the job with mpirun (BLUEFOG_BACKEND=mpi)";
  std::string upper = name;
  for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  throw BluefogError(
      StatusCode::kPrecondition,
      Concat(name == "gloo" ? Concat("rank ", config.env_rank, ": ") : std::string(),
             "this process was started for the ", upper,
             " backend (BLUEFOG_BACKEND=", config.backend.empty() ? "unset" : config.backend,
             name == "gloo" ? ", MASTER_ADDR/MASTER_PORT/RANK/WORLD_SIZE set, no MPI launcher"
                            : ", or an MPI launcher's variables",
             "), but bluefog was built without ", upper == "GLOO" ? "Gloo" : upper,
             " (this build has: ", BackendNames(), "). ", InstallHint(name),
             " and reinstall bluefog, ", how));
}

}  // namespace bluefog
