// Plain-MPI MPI_Allreduce baseline: the lower bound any framework-level
// allreduce (bluefog, tf.distribute) should be compared against.
//
// Build: mpicxx -O2 -std=c++17 bench/mpi_allreduce.cc -o build/mpi_allreduce
// Run:   mpirun --allow-run-as-root --oversubscribe --bind-to none -np 2
//            build/mpi_allreduce [--json] [--reps R] [--max-bytes N]
//            [--budget SECONDS] [--mode all|sizes|small]
//
// Output (rank 0 only, with --json), one JSON object per line:
//   {"impl":"mpi","ranks":n,"bytes":b,"median_s":t}
//   {"impl":"mpi_100x1KiB","ranks":n,"median_s":t}
// median_s is the median over R repetitions of (batch time / batch iters),
// where the batch time is the slowest rank's, since a collective is only
// finished when every rank is.

// Built a second time with -DBENCH_LIBRARY -shared, the same file is a library whose one
// function bench/bf_allreduce.py calls from inside the bluefog benchmark process, so the MPI
// floor is measured interleaved with bluefog's calls (these VMs drift by 2-4x within minutes;
// only measurements taken side by side in time can be compared).
//
// Only the C API is used; skipping the deprecated C++ bindings avoids their
// warnings under -Wextra.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

// MPI_ERRORS_RETURN is set on MPI_COMM_WORLD below, so failures come back
// here as codes instead of the default abort-without-context.
#define MPI_CHECK(call)                                                                \
  do {                                                                                 \
    int rc_ = (call);                                                                  \
    if (rc_ != MPI_SUCCESS) {                                                          \
      char msg_[MPI_MAX_ERROR_STRING];                                                 \
      int len_ = 0;                                                                    \
      MPI_Error_string(rc_, msg_, &len_);                                              \
      std::fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #call, msg_); \
      MPI_Abort(MPI_COMM_WORLD, 1);                                                    \
    }                                                                                  \
  } while (0)

struct Options {
  bool json = false;
  int reps = 11;  // odd, so the median is an actual sample
  long long max_bytes = 64LL << 20;
  double budget_s = 0.5;     // timed seconds per size (excl. warmup)
  std::string mode = "all";  // all | sizes | small
};

[[noreturn]] void Usage(const char* argv0, int rank) {
  if (rank == 0)
    std::fprintf(stderr,
                 "usage: %s [--json] [--reps R] [--max-bytes N] "
                 "[--budget SECONDS] [--mode all|sizes|small]\n",
                 argv0);
  MPI_Finalize();
  std::exit(2);
}

Options Parse(int argc, char** argv, int rank) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) Usage(argv[0], rank);
      return argv[++i];
    };
    if (a == "--json")
      o.json = true;
    else if (a == "--reps")
      o.reps = std::atoi(next());
    else if (a == "--max-bytes")
      o.max_bytes = std::atoll(next());
    else if (a == "--budget")
      o.budget_s = std::atof(next());
    else if (a == "--mode")
      o.mode = next();
    else
      Usage(argv[0], rank);
  }
  if (o.reps < 1 || o.max_bytes < 4 || o.budget_s <= 0 ||
      (o.mode != "all" && o.mode != "sizes" && o.mode != "small"))
    Usage(argv[0], rank);
  return o;
}

// Powers of 4 from 4 B; 1 KiB (= 4^5) is in that series, but it is the size
// the "many small" comparison is about, so make sure it is never dropped.
std::vector<long long> Sizes(long long max_bytes) {
  std::vector<long long> s;
  for (long long b = 4; b <= max_bytes; b *= 4) s.push_back(b);
  if (max_bytes >= 1024 && std::find(s.begin(), s.end(), 1024) == s.end()) s.push_back(1024);
  std::sort(s.begin(), s.end());
  return s;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Times `iters` calls of `body` between barriers and returns the slowest
// rank's elapsed time, identical on all ranks (so every rank derives the
// same iteration counts from it and the collectives stay matched).
template <typename F>
double TimedBatch(int iters, F&& body) {
  MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
  double t0 = MPI_Wtime();
  for (int i = 0; i < iters; ++i) body();
  double local = MPI_Wtime() - t0, global = 0;
  MPI_CHECK(MPI_Allreduce(&local, &global, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD));
  return global;
}

// Warm up, estimate one call's cost, then pick a batch size so that all reps
// together take about budget_s: small sizes need many calls per batch to rise
// above timer/barrier noise, big ones need few to keep the run short.
template <typename F>
double MeasureMedian(const Options& o, F&& body) {
  TimedBatch(3, body);  // connection setup, cache warmup
  double est = TimedBatch(2, body) / 2;
  long long iters = (long long)(o.budget_s / (o.reps * std::max(est, 1e-7)));
  iters = std::clamp(iters, 1LL, 20000LL);
  std::vector<double> per_call;
  per_call.reserve(o.reps);
  for (int r = 0; r < o.reps; ++r) per_call.push_back(TimedBatch((int)iters, body) / iters);
  return Median(per_call);
}

// Sanity check that the collective actually reduced across ranks before we
// trust its timings: each rank contributes rank+1, so the sum is n(n+1)/2.
void Verify(float* buf, long long count, int rank, int nranks) {
  std::fill(buf, buf + count, float(rank + 1));
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, buf, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD));
  const float want = float(nranks) * (nranks + 1) / 2;
  for (long long i = 0; i < count; ++i) {
    if (buf[i] != want) {
      std::fprintf(stderr, "rank %d: verify failed at %lld: %g != %g\n", rank, i, buf[i], want);
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
  }
}

}  // namespace

#ifdef BENCH_LIBRARY
// `iters` repetitions of `calls` MPI_Allreduce(SUM, float32) of `bytes` each, on distinct
// slices of buffers that are allocated and touched once and only ever grown: in place, like the
// program, or with `out_of_place` from one buffer into another, as a framework must when the
// caller keeps its input (twice the memory touched, which costs once it outgrows the caches).
// MPI_COMM_WORLD, no barrier: the caller synchronizes ranks and takes the slowest time.
// Returns this rank's elapsed seconds, or -1 on an MPI error. Needs MPI initialized with
// MPI_THREAD_MULTIPLE (bluefog does) and no bluefog collective in flight.
extern "C" double bench_mpi_allreduce(long long bytes, long long calls, long long iters,
                                      int out_of_place) {
  static std::vector<float> buf, out;
  const long long count = bytes / 4;
  if ((long long)buf.size() < count * calls) buf.assign(count * calls, 0.0f);
  if (out_of_place && (long long)out.size() < count * calls) out.assign(count * calls, 0.0f);
  const double t0 = MPI_Wtime();
  for (long long it = 0; it < iters; ++it)
    for (long long i = 0; i < calls; ++i)
      if (MPI_Allreduce(out_of_place ? buf.data() + i * count : MPI_IN_PLACE,
                        (out_of_place ? out.data() : buf.data()) + i * count, (int)count, MPI_FLOAT,
                        MPI_SUM, MPI_COMM_WORLD) != MPI_SUCCESS)
        return -1;
  return MPI_Wtime() - t0;
}
#else
int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  int rank = 0, nranks = 0;
  MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
  MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &nranks));
  const Options o = Parse(argc, argv, rank);

  // 100 x 1 KiB needs 100*256 floats; make sure the single buffer covers it.
  const long long kSmallFloats = 256, kSmallCalls = 100;
  const long long count_max = std::max(o.max_bytes / 4, kSmallFloats * kSmallCalls);
  // One allocation, touched up front: page faults are expensive here and
  // must not be charged to whichever size happens to touch a page first.
  std::vector<float> buf(count_max, 0.0f);

  if (rank == 0 && !o.json)
    std::printf(
        "# MPI_Allreduce(MPI_IN_PLACE, SUM, float32), ranks=%d, "
        "reps=%d\n%12s %14s %12s\n",
        nranks, o.reps, "bytes", "median_us", "algbw_MB/s");

  if (o.mode != "small") {
    for (long long bytes : Sizes(o.max_bytes)) {
      const int count = (int)(bytes / 4);
      Verify(buf.data(), count, rank, nranks);
      // Zeros keep repeated in-place sums finite (values doubling each call
      // would reach inf) without any denormal slow paths.
      std::fill(buf.begin(), buf.begin() + count, 0.0f);
      double t = MeasureMedian(o, [&] {
        MPI_CHECK(
            MPI_Allreduce(MPI_IN_PLACE, buf.data(), count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD));
      });
      if (rank == 0) {
        if (o.json)
          std::printf(
              "{\"impl\":\"mpi\",\"ranks\":%d,\"bytes\":%lld,"
              "\"median_s\":%.9g}\n",
              nranks, bytes, t);
        else
          std::printf("%12lld %14.2f %12.1f\n", bytes, t * 1e6, bytes / t / 1e6);
        std::fflush(stdout);
      }
    }
  }

  if (o.mode != "sizes") {
    // Models a step with 100 small gradients, each reduced on its own (what
    // an unfused framework does): distinct slices, one collective per slice.
    Verify(buf.data(), kSmallFloats * kSmallCalls, rank, nranks);
    std::fill(buf.begin(), buf.begin() + kSmallFloats * kSmallCalls, 0.0f);
    double t = MeasureMedian(o, [&] {
      for (long long i = 0; i < kSmallCalls; ++i)
        MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, buf.data() + i * kSmallFloats, (int)kSmallFloats,
                                MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD));
    });
    if (rank == 0) {
      if (o.json)
        std::printf(
            "{\"impl\":\"mpi_100x1KiB\",\"ranks\":%d,"
            "\"median_s\":%.9g}\n",
            nranks, t);
      else
        std::printf(
            "# 100 x 1 KiB separate allreduces: median step %.2f us "
            "(%.2f us/call)\n",
            t * 1e6, t * 1e6 / kSmallCalls);
      std::fflush(stdout);
    }
  }

  MPI_Finalize();
  return 0;
}
#endif  // BENCH_LIBRARY
