// The runtime survives an exception that is not the library's own on its background thread:
// the pending requests fail with the reason, later ones are refused, and the process lives on.
// One process, no mpirun (MPI starts as a singleton): after such a failure the runtime leaves
// MPI unfinalized on purpose, which mpirun would report as a failed job.
#include <gtest/gtest.h>

#include <cstdint>
#include <future>
#include <vector>

#include "runtime/runtime.h"

namespace bluefog {
namespace {

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitized = true;  // their allocators abort on impossible sizes instead of throwing
#else
constexpr bool kSanitized = false;
#endif

TEST(RuntimeFault, BadAllocOnTheBackgroundThreadFailsRequestsInsteadOfAborting) {
  if (kSanitized) GTEST_SKIP() << "sanitizer allocators abort on a 4 TiB request";
  Runtime::Get().Init();
  // Two allreduces that fuse (the test sets a 16 TiB fusion threshold) but whose fused buffer (2 x
  // 4 TiB) cannot be allocated: the executor's std::bad_alloc reaches the background loop before
  // any byte of the inputs is read, so the inputs need not exist. The test also sets a 500 ms
  // cycle time, so that both are in one round (one at a time, size 1 would need no buffer).
  const int64_t huge = int64_t{1} << 40;
  std::vector<std::promise<Status>> results(2);
  for (int k = 0; k < 2; ++k) {
    Request req;
    req.meta.name = "huge." + std::to_string(k);
    req.meta.op = OpType::kAllreduce;
    req.meta.dtype = DataType::kFloat32;
    req.meta.shape = {huge};
    static float fake = 0;
    req.input = &fake;
    req.output = &fake;
    std::promise<Status>* result = &results[k];
    req.done = [result](const Status& s) { result->set_value(s); };
    ASSERT_TRUE(Runtime::Get().Enqueue(std::move(req)).ok());
  }
  for (auto& r : results) {
    Status s = r.get_future().get();
    EXPECT_EQ(s.code(), StatusCode::kAborted);
    EXPECT_NE(s.message().find("internal error on the background thread"), std::string::npos)
        << s.message();
    EXPECT_NE(s.message().find("rank 0: bluefog allreduce of tensor 'huge."), std::string::npos)
        << s.message();
  }
  // The runtime has stopped on this rank; later requests are refused with the reason.
  Request late;
  late.meta.name = "late";
  late.meta.shape = {1};
  late.done = [](const Status&) {};
  Status s = Runtime::Get().Enqueue(std::move(late));
  EXPECT_EQ(s.code(), StatusCode::kAborted);
  EXPECT_NE(s.message().find("bad_alloc"), std::string::npos) << s.message();
  EXPECT_FALSE(Runtime::Get().running());
}

}  // namespace
}  // namespace bluefog
