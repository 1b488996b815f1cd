#include "c_api.h"

#include <exception>
#include <string>
#include <vector>

#include "core/op_rules.h"
#include "runtime/flight_dump.h"
#include "runtime/runtime.h"
#include "transport/registry.h"

namespace {

thread_local std::string g_last_error;

template <typename F>
int Guard(F&& body) {
  try {
    body();
    return 0;
  } catch (const std::exception& e) {
    g_last_error = e.what();
  } catch (...) {
    g_last_error = "unknown error";
  }
  return -1;
}

template <typename F>
int IfRunning(F&& getter) {
  const bluefog::Runtime& rt = bluefog::Runtime::Get();
  // Known while the windows are open too (fault-tolerant mode: after a failed collective).
  return rt.running() || rt.windows_open() ? getter(rt.info()) : -1;
}

}  // namespace

extern "C" {

int bluefog_init(void) {
  return Guard([] { bluefog::Runtime::Get().Init(); });
}
int bluefog_init_with(const char* const* keys, const char* const* values, int count) {
  return Guard([&] {
    bluefog::Config::Settings settings;
    for (int i = 0; i < count; ++i) settings[keys[i]] = values[i];
    bluefog::Runtime::Get().Init(settings);
  });
}
int bluefog_shutdown(void) {
  return Guard([] { bluefog::Runtime::Get().Shutdown(); });
}
int bluefog_is_initialized(void) { return bluefog::Runtime::Get().running() ? 1 : 0; }

int bluefog_windows_open(void) { return bluefog::Runtime::Get().windows_open() ? 1 : 0; }
int bluefog_rank(void) {
  return IfRunning([](const auto& i) { return i.rank; });
}
int bluefog_size(void) {
  return IfRunning([](const auto& i) { return i.size; });
}
int bluefog_local_rank(void) {
  return IfRunning([](const auto& i) { return i.local_rank; });
}
int bluefog_local_size(void) {
  return IfRunning([](const auto& i) { return i.local_size; });
}
int bluefog_is_homogeneous(void) {
  return IfRunning([](const auto& i) { return i.homogeneous ? 1 : 0; });
}
int bluefog_mpi_threads_supported(void) {
  return IfRunning([](const auto& i) { return i.threads_multiple ? 1 : 0; });
}
int bluefog_cross_rank(void) {
  return IfRunning([](const auto& i) { return i.cross_rank; });
}
int bluefog_cross_size(void) {
  return IfRunning([](const auto& i) { return i.cross_size; });
}
const char* bluefog_backend(void) {
  const bluefog::Runtime& rt = bluefog::Runtime::Get();
  return rt.running() ? rt.backend() : nullptr;
}
int bluefog_gloo_built(void) { return bluefog::FindBackend("gloo") != nullptr ? 1 : 0; }
const char* bluefog_last_error(void) { return g_last_error.c_str(); }
const char* bluefog_flight_recorder(void) {
  thread_local std::string json;
  try {
    json = bluefog::Runtime::Get().recorder().Json(bluefog::NowSeconds());
  } catch (...) {
    json = "[]";
  }
  return json.c_str();
}
const char* bluefog_straggler_report(void) {
  thread_local std::string json;
  try {
    json = bluefog::Runtime::Get().stragglers().Report(bluefog::NowSeconds()).Json();
  } catch (...) {
    json = "{}";
  }
  return json.c_str();
}
void bluefog_set_frame_provider(int (*provider)(char* buf, int size)) {
  bluefog::SetFrameProvider(provider);
}
const char* bluefog_diagnose(void) {
  thread_local std::string text;
  try {
    text = bluefog::Runtime::Get().Diagnose();
  } catch (const std::exception& e) {
    text = e.what();
  }
  return text.c_str();
}
const char* bluefog_last_stall(double* seconds_ago) {
  thread_local std::string message;
  double at = 0;
  message = bluefog::Runtime::Get().recorder().LastStall(&at);
  if (seconds_ago != nullptr) *seconds_ago = at > 0 ? bluefog::NowSeconds() - at : 0;
  return message.c_str();
}
int bluefog_op_totals(long long* operations, long long* bytes, double* waiting_seconds) {
  const bluefog::FlightRecorder::Totals t = bluefog::Runtime::Get().recorder().totals();
  if (operations != nullptr) *operations = static_cast<long long>(t.operations);
  if (bytes != nullptr) *bytes = static_cast<long long>(t.bytes);
  if (waiting_seconds != nullptr) *waiting_seconds = t.waiting_seconds;
  return 0;
}
int bluefog_flight_dump_installed(void) { return bluefog::FlightDumpInstalled() ? 1 : 0; }

int bluefog_start_timeline(const char* path) {
  return Guard([&] {
    BF_ENFORCE(bluefog::Runtime::Get().running(), bluefog::StatusCode::kPrecondition,
               "start_timeline: bluefog is not initialized; call bf.init() first");
    bluefog::Runtime::Get().StartTimeline(path);
  });
}
int bluefog_timeline_enabled(void) {
  bluefog::Runtime& rt = bluefog::Runtime::Get();
  return rt.running() ? (rt.timeline_enabled() ? 1 : 0) : -1;
}
int bluefog_tuning_get(const char* knob, long long* value) {
  return Guard([&] {
    BF_ENFORCE(bluefog::Runtime::Get().running(), bluefog::StatusCode::kPrecondition,
               "tuning: bluefog is not initialized; call bf.init() first");
    *value = bluefog::Runtime::Get().GetTuning(knob);
  });
}
int bluefog_tuning_set(const char* knob, long long value, long long* before) {
  return Guard([&] {
    BF_ENFORCE(bluefog::Runtime::Get().running(), bluefog::StatusCode::kPrecondition,
               "tuning: bluefog is not initialized; call bf.init() first");
    const long long was = bluefog::Runtime::Get().SetTuning(knob, value);
    if (before) *before = was;
  });
}
int bluefog_timeline_activity(const char* tensor, const char* activity, double start, double end) {
  bluefog::Runtime& rt = bluefog::Runtime::Get();
  if (!rt.running()) return -1;
  return rt.TimelineActivity(tensor, activity, start, end) ? 1 : 0;
}
int bluefog_stop_timeline(void) {
  return Guard([] {
    if (bluefog::Runtime::Get().running()) bluefog::Runtime::Get().StopTimeline();
  });
}
int bluefog_add_process_set(const int* ranks, int count) {
  int id = -1;
  if (Guard([&] {
        id = bluefog::Runtime::Get().AddProcessSet(std::vector<int>(ranks, ranks + count));
      }) != 0)
    return -1;
  return id;
}
int bluefog_remove_process_set(int id) {
  return Guard([id] { bluefog::Runtime::Get().RemoveProcessSet(id); });
}
int bluefog_process_set_rank(int id) {
  int rank, size;
  bluefog::Runtime& rt = bluefog::Runtime::Get();
  return rt.running() && rt.SetLayout(id, &rank, &size) ? rank : -1;
}
int bluefog_process_set_size(int id) {
  int rank, size;
  bluefog::Runtime& rt = bluefog::Runtime::Get();
  return rt.running() && rt.SetLayout(id, &rank, &size) ? size : -1;
}
int bluefog_process_set_ranks(int id, int* out, int capacity) {
  if (!bluefog::Runtime::Get().running()) return -1;
  std::vector<int> ranks = bluefog::Runtime::Get().SetRanks(id);
  if (ranks.empty()) return -1;
  for (int k = 0; k < capacity && k < static_cast<int>(ranks.size()); ++k) out[k] = ranks[k];
  return static_cast<int>(ranks.size());
}
int bluefog_op_accepts_dtype(int op_type, int dtype) {
  if (!bluefog::IsValidOpType(op_type) || !bluefog::IsValidDataType(dtype)) return -1;
  return bluefog::OpAcceptsDtype(static_cast<bluefog::OpType>(op_type),
                                 static_cast<bluefog::DataType>(dtype))
             ? 1
             : 0;
}

}  // extern "C"
