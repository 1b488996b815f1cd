// Every BLUEFOG_* environment variable is read here, once, at init. See docs/env.md.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>

namespace bluefog {

enum class LogLevel { kTrace = 0, kDebug, kInfo, kWarning, kError };

struct Config {
  // Allreduces ready together with one dtype are packed into one buffer of at most this size.
  int64_t fusion_threshold_bytes = 64 * 1024 * 1024;
  // Allreduces of at least this many bytes use bluefog's ring algorithm (0: always MPI_Allreduce).
  int64_t ring_threshold_bytes = 1024 * 1024;
  // On one host with the rounds' data areas, allreduces from this many bytes (when below the
  // ring threshold) already take the one-host paths: through shared memory they beat
  // MPI_Allreduce from a few KiB (0: only from the ring threshold).
  int64_t one_host_threshold_bytes = 16 * 1024;
  // Large allreduces across hosts go hierarchically (within hosts, then across) when possible.
  bool hierarchical_allreduce = true;
  // Large allreduces among ranks of one host read the peers' buffers directly (cross-memory
  // attach) when the kernel lets every rank do so; false: the ring over MPI messages.
  bool direct_allreduce = true;
  // Negotiation rounds among ranks of one host go through a shared-memory segment, a waiting
  // rank sleeping on a futex until the last one arrives; false: MPI_Iallgather.
  bool local_rounds = true;
  // Large allreduces (up to 16 MiB) among ranks of one host whose rounds go through shared
  // memory may be staged through data areas of that segment, this many bytes of a call at a
  // time (each rank's area: ranks x this in all): each size class takes whichever of that and
  // the direct path measured faster on its first calls (every size when the direct path is
  // off). 0: the direct path only.
  int64_t staged_allreduce_bytes = 1024 * 1024;
  // With those data areas: this many bytes per rank of the same segment hold large allreduce
  // outputs, so that every rank can push its reduced part into its peers' outputs (0: none).
  int64_t shared_outputs_bytes = int64_t{256} << 20;
  // One-host allreduces of at least this many bytes through the data areas (staged and shared
  // paths), out of place, write their outputs with non-temporal stores, which neither read each
  // output line's old contents first nor fill the cache with the output (0: never).
  int64_t streaming_store_bytes = int64_t{8} << 20;
  // Eager collectives (which wait for their result anyway) run their rounds on the calling
  // thread when nothing else is pending, instead of handing off to the background thread.
  bool eager_inline = true;
  // A graph kernel submitting the only pending request joins its negotiation round itself and
  // waits this many microseconds for the other ranks to join, running the round and its
  // collective when they do, handing the round to the background thread when they do not (0:
  // graph kernels always hand off).
  int64_t graph_join_us = 200;
  // Eager allreduces of the Python layer are one call into the core's extension module instead
  // of the TensorFlow op (csrc/tensorflow/eager_calls.cc); off: through the op.
  bool eager_c_api = true;
  // Allreduces, allgathers and broadcasts of at most this many bytes send their data with their
  // announcement in the negotiation round, as far as a rank's slot of the round has room, and
  // complete without a collective of their own (0: never).
  int64_t inline_threshold_bytes = 1024;
  // Extra time the background thread waits after the first new request, to batch more of them.
  double cycle_time_ms = 0.0;
  // Agreed requests remembered so that repeating one costs a bit per round (0: no cache).
  int64_t cache_capacity = 1024;
  // A request some ranks submitted and others did not is reported after this long (0: never).
  double stall_check_seconds = 60.0;
  // With a value > 0, such a request fails after this long instead of waiting forever.
  double stall_shutdown_seconds = 0.0;
  // BLUEFOG_HANG_DOCTOR: a stall makes this rank ask the others what they do and print a
  // diagnosis (runtime/doctor.h); bf.diagnose() asks on demand.
  bool hang_doctor = true;
  // BLUEFOG_STRAGGLER_REPORT: every this many seconds rank 0 logs the rank the others waited
  // for over the last minute, when one was consistently last (core/straggler.h; 0: never).
  double straggler_report_seconds = 60.0;
  // Operations the flight recorder keeps (core/flight_recorder.h; 0: off), at most 65536.
  int64_t flight_recorder_size = 256;
  LogLevel log_level = LogLevel::kWarning;
  // Read from Open MPI's variables, not bluefog's: the ranks mpirun started on this host
  // (OMPI_COMM_WORLD_LOCAL_SIZE; 0 when unknown), and whether the user chose how waiting ranks
  // poll (OMPI_MCA_mpi_yield_when_idle is set). The runtime makes them yield when the host is
  // oversubscribed and the user has not chosen.
  int launcher_local_size = 0;
  bool mpi_yield_chosen = false;
  std::string timeline_prefix;  // empty: no timeline
  // BLUEFOG_ALLREDUCE_ALGORITHM: the allreduce algorithm every call it applies to takes
  // (transport/allreduce_algorithm.h); empty: each call the first of the backend's list that
  // applies.
  std::string allreduce_algorithm;
  // BLUEFOG_DETERMINISTIC: every floating-point allreduce reduces each element in rank order
  // (transport/deterministic_allreduce.h), so that results do not depend on fusion or path.
  bool deterministic = false;
  // BLUEFOG_CROSS_HOST: which transport an MPI job's allreduces across hosts take: "auto" (a
  // probe at init picks the faster of MPI's and Gloo's TCP pairs), "mpi", or "gloo".
  std::string cross_host = "auto";
  // Where the one-host path choices of earlier runs are kept (core/path_cache.h):
  // BLUEFOG_CACHE_DIR, else $XDG_CACHE_HOME/bluefog, else $HOME/.cache/bluefog; empty (none
  // read or written) with BLUEFOG_PATH_CACHE=0, in Config() and when none of those is set.
  // BLUEFOG_PATH_RELEARN=1: time every size class again, ignoring the file, and overwrite it.
  std::string path_cache_dir;
  bool path_relearn = false;
  // BLUEFOG_GLOO_IFACE: the network interface Gloo's connections listen on (empty: chosen).
  std::string gloo_iface;

  // The backend (BLUEFOG_BACKEND): "mpi", "gloo", or empty to choose by the launcher (see
  // UseGloo). Gloo's rendezvous is read from the variables torchrun and most schedulers set:
  // MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE, and LOCAL_RANK/LOCAL_WORLD_SIZE when known.
  std::string backend;
  std::string master_addr;
  int master_port = -1;
  int env_rank = -1;
  int env_world_size = -1;
  int env_local_rank = -1;
  int env_local_size = -1;
  std::string job_token;  // BLUEFOG_JOB_TOKEN; empty: derived from the rendezvous address
  double gloo_timeout_seconds = 300.0;  // BLUEFOG_GLOO_TIMEOUT, 0.001 to kMaxGlooTimeoutSeconds
  // About 11.6 days: longer than any wait a job means, far below where a timer overflows.
  static constexpr double kMaxGlooTimeoutSeconds = 1e6;
  // Set by an elastic `bfrun --gloo` for each round of the job: the prefix of every key this
  // rank writes in the store (BLUEFOG_GLOO_PREFIX), so that rounds never read each other's
  // keys; and whether the store's server runs outside the ranks (BLUEFOG_GLOO_EXTERNAL_STORE=1:
  // in bfrun, which outlives every rank) instead of in rank 0.
  std::string gloo_prefix;
  bool gloo_external_store = false;
  // Windows that survive a lost neighbour (BLUEFOG_FAULT_TOLERANT, or bf.init(fault_tolerant=
  // True); docs/windows.md): a neighbour whose connection broke, or that left a window message
  // unanswered for neighbor_deadline_seconds (BLUEFOG_NEIGHBOR_DEADLINE, > 0), is dropped.
  // The default: a few step times of a typical window step (0.05-0.5 s), so that a loaded host
  // does not drop live neighbours, yet a hung one stalls its neighbours for only a few steps.
  bool fault_tolerant = false;
  double neighbor_deadline_seconds = 2.0;
  // OMPI_COMM_WORLD_SIZE, PMI_SIZE or PMIX_RANK was set when this process started (and
  // OMPI_MCA_ess is not "singleton"): an MPI launcher started it. Read from the environment the
  // process was started with, because MPI initialised inside the process without a launcher (a
  // singleton: `import mpi4py` before bf.init()) sets PMIX_RANK=0 itself.
  bool mpi_launched = false;
  // The number of processes the MPI launcher says it started (OMPI_COMM_WORLD_SIZE, else
  // PMI_SIZE, as the process started; -1: none, or not a number) and the variable that says
  // so. A job MPI forms of another size was not started by that launcher: its variables were
  // left in the environment, and each such process would run alone.
  int launcher_size = -1;
  std::string launcher_size_var;

  // Whether the runtime runs on Gloo: BLUEFOG_BACKEND=gloo, or no BLUEFOG_BACKEND, no MPI
  // launcher and the four rendezvous variables set. Throws BluefogError naming the missing
  // variables when BLUEFOG_BACKEND=gloo lacks one of them, or when, without BLUEFOG_BACKEND and
  // an MPI launcher, some of them (or LOCAL_RANK) are set and others not.
  bool UseGloo() const;
  // The backend this job asks for: "gloo" when UseGloo(), else "mpi" (transport/registry.h
  // finds it among those built).
  std::string BackendName() const { return UseGloo() ? "gloo" : "mpi"; }

  // Reads the variables through `lookup` (getenv in production, a map in tests), and the MPI
  // launcher's through `launcher_lookup` (the environment as the process started; `lookup`
  // when null). Throws BluefogError(kInvalidArgument) naming the variable on a malformed value.
  using Lookup = std::function<const char*(const char*)>;
  static Config FromLookup(const Lookup& lookup, const Lookup& launcher_lookup = nullptr);
  // The process's environment, with `settings` (variable name to value) taking precedence over
  // it: what the Python layer merged (TF_CONFIG's rendezvous, HOROVOD_* aliases, an elastic
  // round's variables) arrives as values, never written into the environment.
  using Settings = std::map<std::string, std::string>;
  static Config FromEnvironment(const Settings& settings = {});
};

}  // namespace bluefog
