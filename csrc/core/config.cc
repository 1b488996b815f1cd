#include "core/config.h"

#include <algorithm>
#include <cctype>
#include <cmath>

#include <cstdlib>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/path_cache.h"
#include "core/status.h"

namespace bluefog {
namespace {

double ParseDouble(const char* var, const char* text, double min_value) {
  char* end = nullptr;
  double value = std::strtod(text, &end);
  BF_ENFORCE(end != text && *end == '\0' && value >= min_value, StatusCode::kInvalidArgument,
             "environment variable ", var, "='", text, "' is not a number >= ", min_value);
  return value;
}

// A duration that timers hold as whole milliseconds, microseconds and nanoseconds: finite, and
// small enough for all of them (int64 nanoseconds end at ~292 years; inf or 1e10 s would wrap
// to a negative timeout).
double ParseSeconds(const char* var, const char* text, double min_value, double max_value) {
  char* end = nullptr;
  double value = std::strtod(text, &end);
  BF_ENFORCE(end != text && *end == '\0' && std::isfinite(value) && value >= min_value &&
                 value <= max_value,
             StatusCode::kInvalidArgument, "environment variable ", var, "='", text,
             "' is not a number of seconds from ", min_value, " to ",
             static_cast<int64_t>(max_value));
  return value;
}

int64_t ParseBytes(const char* var, const char* text) {
  char* end = nullptr;
  long long value = std::strtoll(text, &end, 10);
  BF_ENFORCE(end != text && *end == '\0' && value >= 0, StatusCode::kInvalidArgument,
             "environment variable ", var, "='", text, "' is not a whole number >= 0");
  return value;
}

bool ParseBool(const char* var, const char* text) {
  const std::string s(text);
  if (s == "1" || s == "true" || s == "on") return true;
  if (s == "0" || s == "false" || s == "off") return false;
  throw BluefogError(StatusCode::kInvalidArgument,
                     Concat("environment variable ", var, "='", text,
                            "' is not one of 1, 0, true, false, on, off"));
}

LogLevel ParseLogLevel(const char* text) {
  std::string s(text);
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (s == "trace") return LogLevel::kTrace;
  if (s == "debug") return LogLevel::kDebug;
  if (s == "info") return LogLevel::kInfo;
  if (s == "warning") return LogLevel::kWarning;
  if (s == "error" || s == "fatal") return LogLevel::kError;  // fatal: Horovod's quietest
  throw BluefogError(
      StatusCode::kInvalidArgument,
      Concat("environment variable BLUEFOG_LOG_LEVEL='", text,
             "' is not one of trace, debug, info, warning, error, fatal (any case)"));
}

// "A", "A and B", "A, B and C".
std::string Join(const std::vector<std::string>& names) {
  std::string out;
  for (size_t i = 0; i < names.size(); ++i) {
    if (i > 0) out += i + 1 == names.size() ? " and " : ", ";
    out += names[i];
  }
  return out;
}

}  // namespace

Config Config::FromLookup(const Lookup& lookup, const Lookup& launcher_lookup) {
  Config config;
  if (const char* v = lookup("BLUEFOG_FUSION_THRESHOLD"))
    config.fusion_threshold_bytes = ParseBytes("BLUEFOG_FUSION_THRESHOLD", v);
  if (const char* v = lookup("BLUEFOG_RING_THRESHOLD"))
    config.ring_threshold_bytes = ParseBytes("BLUEFOG_RING_THRESHOLD", v);
  if (const char* v = lookup("BLUEFOG_ONE_HOST_THRESHOLD"))
    config.one_host_threshold_bytes = ParseBytes("BLUEFOG_ONE_HOST_THRESHOLD", v);
  if (const char* v = lookup("BLUEFOG_HIERARCHICAL_ALLREDUCE"))
    config.hierarchical_allreduce = ParseBool("BLUEFOG_HIERARCHICAL_ALLREDUCE", v);
  if (const char* v = lookup("BLUEFOG_DIRECT_ALLREDUCE"))
    config.direct_allreduce = ParseBool("BLUEFOG_DIRECT_ALLREDUCE", v);
  if (const char* v = lookup("BLUEFOG_LOCAL_ROUNDS"))
    config.local_rounds = ParseBool("BLUEFOG_LOCAL_ROUNDS", v);
  if (const char* v = lookup("BLUEFOG_STAGED_ALLREDUCE"))
    config.staged_allreduce_bytes = ParseBytes("BLUEFOG_STAGED_ALLREDUCE", v);
  if (const char* v = lookup("BLUEFOG_SHARED_OUTPUTS"))
    config.shared_outputs_bytes = ParseBytes("BLUEFOG_SHARED_OUTPUTS", v);
  if (const char* v = lookup("BLUEFOG_STREAMING_STORES"))
    config.streaming_store_bytes = ParseBytes("BLUEFOG_STREAMING_STORES", v);
  if (const char* v = lookup("BLUEFOG_EAGER_INLINE"))
    config.eager_inline = ParseBool("BLUEFOG_EAGER_INLINE", v);
  if (const char* v = lookup("BLUEFOG_GRAPH_JOIN_WAIT"))
    config.graph_join_us = ParseBytes("BLUEFOG_GRAPH_JOIN_WAIT", v);
  if (const char* v = lookup("BLUEFOG_EAGER_C_API"))
    config.eager_c_api = ParseBool("BLUEFOG_EAGER_C_API", v);
  if (const char* v = lookup("BLUEFOG_INLINE_THRESHOLD"))
    config.inline_threshold_bytes = ParseBytes("BLUEFOG_INLINE_THRESHOLD", v);
  if (const char* v = lookup("BLUEFOG_CACHE_CAPACITY"))
    config.cache_capacity = ParseBytes("BLUEFOG_CACHE_CAPACITY", v);
  if (const char* v = lookup("BLUEFOG_CYCLE_TIME"))
    config.cycle_time_ms = ParseDouble("BLUEFOG_CYCLE_TIME", v, 0.0);
  if (const char* v = lookup("BLUEFOG_STALL_CHECK_TIME"))
    config.stall_check_seconds = ParseDouble("BLUEFOG_STALL_CHECK_TIME", v, 0.0);
  if (const char* v = lookup("BLUEFOG_STALL_SHUTDOWN_TIME"))
    config.stall_shutdown_seconds = ParseDouble("BLUEFOG_STALL_SHUTDOWN_TIME", v, 0.0);
  if (const char* v = lookup("BLUEFOG_HANG_DOCTOR"))
    config.hang_doctor = ParseBool("BLUEFOG_HANG_DOCTOR", v);
  if (const char* v = lookup("BLUEFOG_STRAGGLER_REPORT"))
    config.straggler_report_seconds = ParseDouble("BLUEFOG_STRAGGLER_REPORT", v, 0.0);
  if (const char* v = lookup("BLUEFOG_FLIGHT_RECORDER_SIZE")) {
    config.flight_recorder_size = ParseBytes("BLUEFOG_FLIGHT_RECORDER_SIZE", v);
    BF_ENFORCE(config.flight_recorder_size <= 65536, StatusCode::kInvalidArgument,
               "environment variable BLUEFOG_FLIGHT_RECORDER_SIZE='", v,
               "' is over 65536 operations; the recorder keeps the last N (0 turns it off)");
  }
  if (const char* v = lookup("BLUEFOG_LOG_LEVEL")) config.log_level = ParseLogLevel(v);
  if (const char* v = lookup("BLUEFOG_TIMELINE")) config.timeline_prefix = v;
  if (const char* v = lookup("BLUEFOG_ALLREDUCE_ALGORITHM")) config.allreduce_algorithm = v;
  if (const char* v = lookup("BLUEFOG_DETERMINISTIC"))
    config.deterministic = ParseBool("BLUEFOG_DETERMINISTIC", v);
  if (const char* v = lookup("BLUEFOG_CROSS_HOST")) config.cross_host = *v ? v : "auto";
  if (const char* v = lookup("BLUEFOG_GLOO_IFACE")) config.gloo_iface = v;
  {
    const char* v = lookup("BLUEFOG_PATH_CACHE");
    if (!v || ParseBool("BLUEFOG_PATH_CACHE", v))
      config.path_cache_dir = PathCache::DefaultDir(lookup("BLUEFOG_CACHE_DIR"),
                                                    lookup("XDG_CACHE_HOME"), lookup("HOME"));
  }
  if (const char* v = lookup("BLUEFOG_PATH_RELEARN"))
    config.path_relearn = ParseBool("BLUEFOG_PATH_RELEARN", v);
  // Open MPI's own: never an error here (a value it would refuse is its to report).
  if (const char* v = lookup("OMPI_COMM_WORLD_LOCAL_SIZE"))
    config.launcher_local_size = std::max(0, std::atoi(v));
  config.mpi_yield_chosen = lookup("OMPI_MCA_mpi_yield_when_idle") != nullptr;

  if (const char* v = lookup("BLUEFOG_BACKEND")) {
    config.backend = v;
    BF_ENFORCE(config.backend == "mpi" || config.backend == "gloo" || config.backend.empty(),
               StatusCode::kInvalidArgument, "environment variable BLUEFOG_BACKEND='", v,
               "' is not one of mpi, gloo");
  }
  // Refused, not wrapped, when an int cannot hold it: RANK=4294967297 must not become rank 1.
  auto whole = [&](const char* var, int* out, const char* meaning) {
    if (const char* v = lookup(var)) {
      if (*v == '\0') return;
      const int64_t value = ParseBytes(var, v);
      BF_ENFORCE(value <= std::numeric_limits<int>::max(), StatusCode::kInvalidArgument,
                 "environment variable ", var, "='", v, "' is out of range (at most ",
                 std::numeric_limits<int>::max(), "); ", var, " is ", meaning);
      *out = static_cast<int>(value);
    }
  };
  if (const char* v = lookup("MASTER_ADDR")) config.master_addr = v;
  whole("MASTER_PORT", &config.master_port, "rank 0's TCP port for the rendezvous (1-65535)");
  whole("RANK", &config.env_rank, "this process's rank, from 0 to WORLD_SIZE-1");
  whole("WORLD_SIZE", &config.env_world_size, "the number of processes in the job");
  whole("LOCAL_RANK", &config.env_local_rank, "this process's rank among those on its host");
  whole("LOCAL_WORLD_SIZE", &config.env_local_size,
        "the number of the job's processes on its host");
  if (const char* v = lookup("BLUEFOG_JOB_TOKEN")) config.job_token = v;
  if (const char* v = lookup("BLUEFOG_GLOO_TIMEOUT"))
    config.gloo_timeout_seconds =
        ParseSeconds("BLUEFOG_GLOO_TIMEOUT", v, 0.001, kMaxGlooTimeoutSeconds);
  if (const char* v = lookup("BLUEFOG_GLOO_PREFIX")) config.gloo_prefix = v;
  if (const char* v = lookup("BLUEFOG_FAULT_TOLERANT"))
    config.fault_tolerant = ParseBool("BLUEFOG_FAULT_TOLERANT", v);
  if (const char* v = lookup("BLUEFOG_NEIGHBOR_DEADLINE")) {
    char* end = nullptr;
    const double value = std::strtod(v, &end);
    BF_ENFORCE(end != v && *end == '\0' && std::isfinite(value) && value > 0 &&
                   value <= kMaxGlooTimeoutSeconds,
               StatusCode::kInvalidArgument, "environment variable BLUEFOG_NEIGHBOR_DEADLINE='", v,
               "' is not a number of seconds > 0: it is how long a window operation waits for a "
               "neighbour's answer before dropping that neighbour (fault-tolerant mode); unset "
               "it for the default of 2 s");
    config.neighbor_deadline_seconds = value;
  }
  if (const char* v = lookup("BLUEFOG_GLOO_EXTERNAL_STORE"))
    config.gloo_external_store = std::string(v) == "1";
  const Lookup& launcher = launcher_lookup ? launcher_lookup : lookup;
  const char* ess = launcher("OMPI_MCA_ess");
  // A singleton's variables inherited by a child of it are not a launcher's either.
  const bool singleton = ess != nullptr && std::string(ess) == "singleton";
  config.mpi_launched =
      !singleton && (launcher("OMPI_COMM_WORLD_SIZE") != nullptr ||
                     launcher("PMI_SIZE") != nullptr || launcher("PMIX_RANK") != nullptr);
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"}) {
    const char* v = config.mpi_launched ? launcher(var) : nullptr;
    if (v == nullptr) continue;
    char* end = nullptr;
    const long size = std::strtol(v, &end, 10);
    if (end != v && *end == '\0' && size > 0 && size <= std::numeric_limits<int>::max()) {
      config.launcher_size = static_cast<int>(size);
      config.launcher_size_var = var;
    }
    break;
  }
  return config;
}

bool Config::UseGloo() const {
  if (backend == "mpi") return false;
  if (backend != "gloo") {
    // Any of torchrun's variables means a launcher meant this process to join a job: with one
    // of the four missing it is an error, never a job of one (N such processes would train N
    // unrelated models).
    const bool rendezvous = !master_addr.empty() || master_port >= 0 || env_rank >= 0 ||
                            env_world_size >= 0 || env_local_rank >= 0;
    if (mpi_launched || !rendezvous) return false;
  }
  std::vector<std::string> missing, set;
  for (const auto& [var, is_set] :
       {std::pair<const char*, bool>{"MASTER_ADDR", !master_addr.empty()},
        {"MASTER_PORT", master_port >= 0},
        {"RANK", env_rank >= 0},
        {"WORLD_SIZE", env_world_size >= 0},
        {"LOCAL_RANK", env_local_rank >= 0}}) {
    if (is_set) {
      set.push_back(var);
    } else if (std::string(var) != "LOCAL_RANK") {
      missing.push_back(var);
    }
  }
  if (!missing.empty()) {
    const std::string who = env_rank >= 0 ? Concat("rank ", env_rank) : "this process (no RANK)";
    const std::string why =
        backend == "gloo"
            ? std::string(
                  "BLUEFOG_BACKEND=gloo needs MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE")
            : Concat(Join(set), set.size() == 1 ? " is" : " are",
                     " set, so this process was started to join a job without mpirun, which "
                     "needs MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE (torchrun's variables)");
    throw BluefogError(
        StatusCode::kInvalidArgument,
        Concat(who, ": ", why, "; ", Join(missing), missing.size() == 1 ? " is" : " are",
               " not set. Set ", missing.size() == 1 ? "it" : "them",
               " on every process, or unset the others to run without a rendezvous (one process, "
               "or under mpirun), or set BLUEFOG_BACKEND=mpi to ignore them"));
  }
  BF_ENFORCE(
      env_world_size >= 1 && env_rank < env_world_size && master_port > 0 && master_port < 65536,
      StatusCode::kInvalidArgument, "RANK=", env_rank, " WORLD_SIZE=", env_world_size,
      " MASTER_PORT=", master_port,
      ": RANK must be below WORLD_SIZE and MASTER_PORT a TCP port (1-65535); or set "
      "BLUEFOG_BACKEND=mpi to ignore these variables");
  return true;
}

Config Config::FromEnvironment(const Settings& settings) {
  const auto live = [&settings](const char* name) -> const char* {
    const auto it = settings.find(name);
    return it != settings.end() ? it->second.c_str() : std::getenv(name);
  };
  // /proc/self/environ keeps the environment the process was exec'd with, whatever setenv did
  // since; where it cannot be read (no /proc), the live environment is all there is.
  static const std::optional<std::map<std::string, std::string>> initial = [] {
    std::optional<std::map<std::string, std::string>> vars;
    std::ifstream in("/proc/self/environ", std::ios::binary);
    if (!in) return vars;
    vars.emplace();
    std::string entry;
    while (std::getline(in, entry, '\0')) {
      const auto eq = entry.find('=');
      if (eq != std::string::npos) vars->emplace(entry.substr(0, eq), entry.substr(eq + 1));
    }
    return vars;
  }();
  if (!initial) return FromLookup(live);
  return FromLookup(live, [](const char* name) -> const char* {
    const auto it = initial->find(name);
    return it == initial->end() ? nullptr : it->second.c_str();
  });
}

}  // namespace bluefog
