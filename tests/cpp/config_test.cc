#include "core/config.h"

#include <gtest/gtest.h>

#include <map>
#include <string>

#include "core/status.h"

namespace bluefog {
namespace {

Config FromMap(const std::map<std::string, std::string>& vars) {
  return Config::FromLookup([&](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  });
}

TEST(Config, Defaults) {
  Config c = FromMap({});
  EXPECT_EQ(c.fusion_threshold_bytes, 64 * 1024 * 1024);
  EXPECT_EQ(c.cache_capacity, 1024);
  EXPECT_EQ(c.cycle_time_ms, 0.0);
  EXPECT_EQ(c.stall_check_seconds, 60.0);
  EXPECT_EQ(c.log_level, LogLevel::kWarning);
  EXPECT_TRUE(c.timeline_prefix.empty());
  EXPECT_TRUE(c.hierarchical_allreduce);
  EXPECT_TRUE(c.direct_allreduce);
  EXPECT_TRUE(c.eager_inline);
}

TEST(Config, PathCacheDirectoryAndSwitches) {
  EXPECT_EQ(FromMap({}).path_cache_dir, "");  // nowhere to keep it
  EXPECT_EQ(FromMap({{"HOME", "/h"}}).path_cache_dir, "/h/.cache/bluefog");
  EXPECT_EQ(FromMap({{"HOME", "/h"}, {"XDG_CACHE_HOME", "/x"}}).path_cache_dir, "/x/bluefog");
  EXPECT_EQ(FromMap({{"HOME", "/h"}, {"BLUEFOG_CACHE_DIR", "/c"}}).path_cache_dir, "/c");
  EXPECT_EQ(FromMap({{"BLUEFOG_CACHE_DIR", "/c"}, {"BLUEFOG_PATH_CACHE", "0"}}).path_cache_dir, "");
  EXPECT_EQ(FromMap({{"BLUEFOG_CACHE_DIR", "/c"}, {"BLUEFOG_PATH_CACHE", "1"}}).path_cache_dir,
            "/c");
  EXPECT_FALSE(FromMap({}).path_relearn);
  EXPECT_TRUE(FromMap({{"BLUEFOG_PATH_RELEARN", "1"}}).path_relearn);
  EXPECT_THROW(FromMap({{"BLUEFOG_PATH_CACHE", "maybe"}}), BluefogError);
}

TEST(Config, OpenMpiLaunchVariables) {
  EXPECT_EQ(FromMap({}).launcher_local_size, 0);
  EXPECT_FALSE(FromMap({}).mpi_yield_chosen);
  EXPECT_EQ(FromMap({{"OMPI_COMM_WORLD_LOCAL_SIZE", "4"}}).launcher_local_size, 4);
  EXPECT_TRUE(FromMap({{"OMPI_MCA_mpi_yield_when_idle", "0"}}).mpi_yield_chosen);
}

TEST(Config, BackendChoice) {
  const std::map<std::string, std::string> rendezvous = {
      {"MASTER_ADDR", "10.0.0.1"}, {"MASTER_PORT", "29500"}, {"RANK", "1"}, {"WORLD_SIZE", "2"}};
  auto with = [&](std::map<std::string, std::string> extra) {
    extra.insert(rendezvous.begin(), rendezvous.end());
    return FromMap(extra);
  };
  EXPECT_FALSE(FromMap({}).UseGloo());  // plain process: MPI (a singleton)
  Config gloo = with({});
  EXPECT_TRUE(gloo.UseGloo());  // the four variables, no MPI launcher
  EXPECT_EQ(gloo.master_addr, "10.0.0.1");
  EXPECT_EQ(gloo.env_rank, 1);
  EXPECT_EQ(gloo.gloo_timeout_seconds, 300.0);
  EXPECT_FALSE(with({{"OMPI_COMM_WORLD_SIZE", "2"}}).UseGloo());  // mpirun wins
  EXPECT_FALSE(with({{"PMI_SIZE", "2"}}).UseGloo());
  EXPECT_FALSE(with({{"PMIX_RANK", "0"}}).UseGloo());
  EXPECT_FALSE(with({{"BLUEFOG_BACKEND", "mpi"}}).UseGloo());
  EXPECT_TRUE(with({{"BLUEFOG_BACKEND", "gloo"}, {"OMPI_COMM_WORLD_SIZE", "2"}}).UseGloo());
  EXPECT_EQ(with({{"BLUEFOG_GLOO_TIMEOUT", "2.5"}}).gloo_timeout_seconds, 2.5);
  EXPECT_EQ(with({{"BLUEFOG_GLOO_TIMEOUT", "1e6"}}).gloo_timeout_seconds, 1e6);
  // Values a timer cannot hold (inf, 1e10 s wrapped to negative timeouts) or not positive are
  // refused at once, naming the variable and the range.
  for (const char* bad : {"inf", "-inf", "nan", "1e10", "9.3e15", "1000000.5", "0", "-1", "5s"}) {
    try {
      with({{"BLUEFOG_GLOO_TIMEOUT", bad}});
      ADD_FAILURE() << bad << " accepted";
    } catch (const BluefogError& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("BLUEFOG_GLOO_TIMEOUT='") + bad +
                                           "' is not a number of seconds from 0.001 to 1000000"),
                std::string::npos)
          << e.what();
    }
  }
  // Fault-tolerant windows: off by default; a deadline must be a positive number of seconds.
  EXPECT_FALSE(with({}).fault_tolerant);
  EXPECT_EQ(with({}).neighbor_deadline_seconds, 2.0);
  EXPECT_TRUE(with({{"BLUEFOG_FAULT_TOLERANT", "1"}}).fault_tolerant);
  EXPECT_EQ(with({{"BLUEFOG_NEIGHBOR_DEADLINE", "0.25"}}).neighbor_deadline_seconds, 0.25);
  for (const char* bad : {"0", "-1", "nan", "inf", "2s", ""}) {
    try {
      with({{"BLUEFOG_NEIGHBOR_DEADLINE", bad}});
      ADD_FAILURE() << bad << " accepted";
    } catch (const BluefogError& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("BLUEFOG_NEIGHBOR_DEADLINE='") + bad +
                                           "' is not a number of seconds > 0"),
                std::string::npos)
          << e.what();
    }
  }
  // Asked for Gloo without a rendezvous, or with a rank outside the job: named.
  try {
    FromMap({{"BLUEFOG_BACKEND", "gloo"}, {"MASTER_ADDR", "h"}}).UseGloo();
    FAIL() << "no error";
  } catch (const BluefogError& e) {
    EXPECT_NE(std::string(e.what()).find("MASTER_PORT, RANK and WORLD_SIZE are not set"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(with({{"RANK", "2"}}).UseGloo(), BluefogError);
}

// Any of torchrun's variables without the rest is an error naming what is missing, never a job
// of one; an MPI launcher or BLUEFOG_BACKEND=mpi still ignores them.
TEST(Config, PartialRendezvousIsNamed) {
  auto message = [](const std::map<std::string, std::string>& vars) -> std::string {
    try {
      FromMap(vars).UseGloo();
    } catch (const BluefogError& e) {
      return e.what();
    }
    return "no error";
  };
  EXPECT_EQ(message({{"RANK", "1"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "29500"}}),
            "rank 1: MASTER_ADDR, MASTER_PORT and RANK are set, so this process was started to "
            "join a job without mpirun, which needs MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE "
            "(torchrun's variables); WORLD_SIZE is not set. Set it on every process, or unset the "
            "others to run without a rendezvous (one process, or under mpirun), or set "
            "BLUEFOG_BACKEND=mpi to ignore them");
  EXPECT_NE(
      message({{"LOCAL_RANK", "0"}})
          .find("this process (no RANK): LOCAL_RANK is set, so this process was started to join"),
      std::string::npos);
  EXPECT_NE(message({{"LOCAL_RANK", "0"}})
                .find("MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE are not set"),
            std::string::npos);
  EXPECT_NE(message({{"WORLD_SIZE", "2"}}).find("MASTER_ADDR, MASTER_PORT and RANK are not set"),
            std::string::npos);
  EXPECT_FALSE(FromMap({{"RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"}}).UseGloo());
  EXPECT_FALSE(FromMap({{"RANK", "1"}, {"BLUEFOG_BACKEND", "mpi"}}).UseGloo());
  EXPECT_FALSE(FromMap({{"RANK", ""}}).UseGloo());  // empty: unset
}

// A value past an int is refused naming the variable, not wrapped (4294967297 -> 1).
TEST(Config, RendezvousValuesDoNotWrap) {
  for (auto [var, value] :
       std::map<std::string, std::string>{{"RANK", "4294967297"},
                                          {"MASTER_PORT", "4294996796"},
                                          {"WORLD_SIZE", "4294967298"},
                                          {"LOCAL_RANK", "4294967296"},
                                          {"LOCAL_WORLD_SIZE", "99999999999999999999999"}}) {
    try {
      FromMap({{var, value}});
      ADD_FAILURE() << var << "=" << value << " accepted";
    } catch (const BluefogError& e) {
      EXPECT_NE(std::string(e.what()).find(var + "='" + value + "' is"), std::string::npos)
          << e.what();
    }
  }
  EXPECT_EQ(FromMap({{"RANK", "2147483647"}}).env_rank, 2147483647);
  EXPECT_THROW(FromMap({{"BLUEFOG_BACKEND", "nccl"}}), BluefogError);
}

TEST(Config, MpiLauncherReadFromTheStartingEnvironment) {
  // MPI initialised inside the process as a singleton (mpi4py imported first) sets PMIX_RANK
  // in the live environment; the environment the process started with decides.
  const std::map<std::string, std::string> live = {
      {"MASTER_ADDR", "10.0.0.1"}, {"MASTER_PORT", "29500"}, {"RANK", "1"},
      {"WORLD_SIZE", "2"},         {"PMIX_RANK", "0"},       {"OMPI_MCA_ess", "singleton"}};
  auto from = [&](std::map<std::string, std::string> initial) {
    return Config::FromLookup(
        [&](const char* name) -> const char* {
          auto it = live.find(name);
          return it == live.end() ? nullptr : it->second.c_str();
        },
        [initial](const char* name) -> const char* {
          auto it = initial.find(name);
          return it == initial.end() ? nullptr : it->second.c_str();
        });
  };
  EXPECT_TRUE(from({}).UseGloo());
  EXPECT_FALSE(from({{"PMIX_RANK", "1"}}).UseGloo());  // srun --mpi=pmix, say
  EXPECT_FALSE(from({{"OMPI_COMM_WORLD_SIZE", "2"}}).UseGloo());
  // The child of a singleton inherits its variables, the marker included.
  EXPECT_TRUE(from({{"PMIX_RANK", "0"}, {"OMPI_MCA_ess", "singleton"}}).UseGloo());
  // Without a separate starting environment, the one lookup decides (as in FromMap).
  EXPECT_TRUE(FromMap(live).UseGloo());
}

TEST(Config, LauncherSizeIsReadForTheMpiJobToMatch) {
  EXPECT_EQ(FromMap({{"OMPI_COMM_WORLD_SIZE", "3"}}).launcher_size, 3);
  EXPECT_EQ(FromMap({{"OMPI_COMM_WORLD_SIZE", "3"}}).launcher_size_var, "OMPI_COMM_WORLD_SIZE");
  EXPECT_EQ(FromMap({{"PMI_SIZE", "2"}}).launcher_size, 2);
  EXPECT_EQ(FromMap({{"PMIX_RANK", "0"}}).launcher_size, -1);  // says no size
  EXPECT_EQ(FromMap({{"OMPI_COMM_WORLD_SIZE", "x"}}).launcher_size, -1);
  EXPECT_EQ(FromMap({{"OMPI_COMM_WORLD_SIZE", "2"}, {"OMPI_MCA_ess", "singleton"}}).launcher_size,
            -1);  // a singleton's child: no launcher
}

TEST(Config, EagerInlineSwitch) {
  EXPECT_FALSE(FromMap({{"BLUEFOG_EAGER_INLINE", "0"}}).eager_inline);
  EXPECT_THROW(FromMap({{"BLUEFOG_EAGER_INLINE", "sometimes"}}), BluefogError);
  EXPECT_TRUE(FromMap({}).eager_c_api);
  EXPECT_FALSE(FromMap({{"BLUEFOG_EAGER_C_API", "0"}}).eager_c_api);
  EXPECT_THROW(FromMap({{"BLUEFOG_EAGER_C_API", "maybe"}}), BluefogError);
}

TEST(Config, HierarchicalAllreduceSwitch) {
  EXPECT_FALSE(FromMap({{"BLUEFOG_HIERARCHICAL_ALLREDUCE", "0"}}).hierarchical_allreduce);
  EXPECT_TRUE(FromMap({{"BLUEFOG_HIERARCHICAL_ALLREDUCE", "on"}}).hierarchical_allreduce);
  EXPECT_THROW(FromMap({{"BLUEFOG_HIERARCHICAL_ALLREDUCE", "maybe"}}), BluefogError);
  EXPECT_FALSE(FromMap({{"BLUEFOG_DIRECT_ALLREDUCE", "0"}}).direct_allreduce);
  EXPECT_THROW(FromMap({{"BLUEFOG_DIRECT_ALLREDUCE", "sometimes"}}), BluefogError);
  EXPECT_EQ(FromMap({}).staged_allreduce_bytes, 1048576);
  EXPECT_EQ(FromMap({{"BLUEFOG_STAGED_ALLREDUCE", "0"}}).staged_allreduce_bytes, 0);
  EXPECT_EQ(FromMap({{"BLUEFOG_STAGED_ALLREDUCE", "1048576"}}).staged_allreduce_bytes, 1048576);
  EXPECT_THROW(FromMap({{"BLUEFOG_STAGED_ALLREDUCE", "1M"}}), BluefogError);
  EXPECT_EQ(FromMap({}).streaming_store_bytes, 8 << 20);
  EXPECT_EQ(FromMap({{"BLUEFOG_STREAMING_STORES", "0"}}).streaming_store_bytes, 0);
  EXPECT_EQ(FromMap({{"BLUEFOG_STREAMING_STORES", "4194304"}}).streaming_store_bytes, 4194304);
  EXPECT_THROW(FromMap({{"BLUEFOG_STREAMING_STORES", "-1"}}), BluefogError);
}

TEST(Config, ParsesValues) {
  Config c = FromMap({{"BLUEFOG_FUSION_THRESHOLD", "1024"},
                      {"BLUEFOG_CYCLE_TIME", "2.5"},
                      {"BLUEFOG_RING_THRESHOLD", "0"},
                      {"BLUEFOG_CACHE_CAPACITY", "7"},
                      {"BLUEFOG_STALL_CHECK_TIME", "5"},
                      {"BLUEFOG_STALL_SHUTDOWN_TIME", "10"},
                      {"BLUEFOG_LOG_LEVEL", "debug"},
                      {"BLUEFOG_TIMELINE", "/tmp/tl"}});
  EXPECT_EQ(c.fusion_threshold_bytes, 1024);
  EXPECT_EQ(c.cycle_time_ms, 2.5);
  EXPECT_EQ(c.ring_threshold_bytes, 0);
  EXPECT_EQ(c.cache_capacity, 7);
  EXPECT_EQ(c.stall_check_seconds, 5.0);
  EXPECT_EQ(c.stall_shutdown_seconds, 10.0);
  EXPECT_EQ(c.log_level, LogLevel::kDebug);
  EXPECT_EQ(c.timeline_prefix, "/tmp/tl");
}

TEST(Config, LogLevelInAnyCaseAndFatal) {
  EXPECT_EQ(FromMap({{"BLUEFOG_LOG_LEVEL", "INFO"}}).log_level, LogLevel::kInfo);
  EXPECT_EQ(FromMap({{"BLUEFOG_LOG_LEVEL", "Warning"}}).log_level, LogLevel::kWarning);
  EXPECT_EQ(FromMap({{"BLUEFOG_LOG_LEVEL", "fatal"}}).log_level, LogLevel::kError);
}

TEST(Config, RejectsMalformedValuesNamingTheVariable) {
  for (auto [var, value] : std::map<std::string, std::string>{{"BLUEFOG_FUSION_THRESHOLD", "lots"},
                                                              {"BLUEFOG_FUSION_THRESHOLD", "-1"},
                                                              {"BLUEFOG_CYCLE_TIME", "1ms"},
                                                              {"BLUEFOG_LOG_LEVEL", "loud"}}) {
    try {
      FromMap({{var, value}});
      ADD_FAILURE() << var << "=" << value << " was accepted";
    } catch (const BluefogError& e) {
      EXPECT_EQ(e.code(), StatusCode::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find(var), std::string::npos) << e.what();
    }
  }
}

TEST(Config, FlightRecorderSize) {
  EXPECT_EQ(FromMap({}).flight_recorder_size, 256);
  EXPECT_EQ(FromMap({{"BLUEFOG_FLIGHT_RECORDER_SIZE", "0"}}).flight_recorder_size, 0);
  EXPECT_EQ(FromMap({{"BLUEFOG_FLIGHT_RECORDER_SIZE", "65536"}}).flight_recorder_size, 65536);
  for (const char* bad : {"-1", "65537", "many"}) {
    try {
      FromMap({{"BLUEFOG_FLIGHT_RECORDER_SIZE", bad}});
      ADD_FAILURE() << bad << " was accepted";
    } catch (const BluefogError& e) {
      EXPECT_EQ(e.code(), StatusCode::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find("BLUEFOG_FLIGHT_RECORDER_SIZE"), std::string::npos);
    }
  }
}

}  // namespace
}  // namespace bluefog
