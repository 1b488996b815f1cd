#include "c_api.h"

#include <exception>
#include <string>

#include "core/op_rules.h"
#include "core/runtime.h"

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
  return rt.running() ? getter(rt.info()) : -1;
}

}  // namespace

extern "C" {

int bluefog_init(void) {
  return Guard([] { bluefog::Runtime::Get().Init(); });
}
int bluefog_shutdown(void) {
  return Guard([] { bluefog::Runtime::Get().Shutdown(); });
}
int bluefog_is_initialized(void) { return bluefog::Runtime::Get().running() ? 1 : 0; }
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
int bluefog_mpi_threads_supported(void) {
  return IfRunning([](const auto& i) { return i.threads_multiple ? 1 : 0; });
}
const char* bluefog_last_error(void) { return g_last_error.c_str(); }
int bluefog_op_accepts_dtype(int op_type, int dtype) {
  if (!bluefog::IsValidOpType(op_type) || !bluefog::IsValidDataType(dtype)) return -1;
  return bluefog::OpAcceptsDtype(static_cast<bluefog::OpType>(op_type),
                                 static_cast<bluefog::DataType>(dtype))
             ? 1
             : 0;
}

}  // extern "C"
