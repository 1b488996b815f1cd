// BLUEFOG_DETERMINISTIC on one host (part of local_transport_tests, launched by
// local_transport_test.cc's main on either backend): the one-host paths in rank order.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "local_transport_test.h"
#include "transport/allreduce_algorithm.h"
#include "transport/deterministic_allreduce.h"
#include "transport/local/local_host.h"
#include "transport/local/local_rounds.h"
#include "transport/options.h"
#include "transport/shared_heap.h"

namespace bluefog {
namespace {

// The inputs of the rank-order test: values spanning nine orders of magnitude, so that adding
// them in another order rounds differently (from 3 ranks on).
template <typename T>
void SpreadInput(T* x, int64_t count) {
  for (int64_t i = 0; i < count; ++i) {
    const uint64_t h = (static_cast<uint64_t>(i) * 2654435761u) ^ (info.rank * 40503u + 17);
    x[i] = static_cast<T>((static_cast<double>(h % 2001) - 1000.0) *
                          std::pow(10.0, static_cast<int>(h % 9) - 4));
  }
}

// BLUEFOG_DETERMINISTIC on one host: each one-host path (direct, staged, shared) reduces in rank
// order and gives, bit for bit, what the deterministic algorithm gives (each element summed
// x0 + x1 + x2 ... in turn): out of place and in place, over several chunks and steps with
// uneven segments, float32 and float64 sums, averages and a product. At 3 ranks the paths'
// own order (each rank starting from its part) gives other bits on some elements: the test can
// tell. Integers are not taken (exact in any order, they keep their paths).
TEST(RankOrder, EveryOneHostPathGivesTheDeterministicAlgorithmsBits) {
  const int n = info.size;
  TransportOptions options;
  options.shared_heap_bytes = int64_t{64} << 20;
  options.path_cache_dir.clear();
  options.deterministic = true;
  auto tuning = std::make_shared<Tuning>(options);
  std::unique_ptr<LocalHost> host = LocalHost::Create(transport, tuning, options, true);
  AllreduceAlgorithm* ordered = host->rank_ordered();
  ASSERT_NE(ordered, nullptr);
  ASSERT_NE(host->rounds(), nullptr);
  SharedHeap& heap = *host->rounds()->heap();
  std::unique_ptr<AllreduceAlgorithm> reference = MakeDeterministicAllreduce(transport);
  AllreduceAlgorithm* unordered = nullptr;  // the test transport's own direct path
  for (AllreduceAlgorithm* a : transport->local_host()->algorithms())
    if (std::string(a->name()) == "direct") unordered = a;
  ASSERT_NE(unordered, nullptr);
  const int64_t count = int64_t{3} * 65536 * n + 2 * n + 1;  // 3+ direct chunks per rank
  int64_t reordered = 0;
  for (const std::string path : {"direct", "staged", "shared"}) {
    tuning->direct = path == "direct";
    tuning->staged = path != "direct";
    for (DataType dtype : {DataType::kFloat32, DataType::kFloat64}) {
      const int64_t elem = static_cast<int64_t>(ElementSize(dtype));
      const int64_t bytes = count * elem;
      const size_t capacity = (static_cast<size_t>(bytes) + 4095) / 4096 * 4096;
      std::vector<char> in(bytes), want(bytes), plain_out(bytes), plain_buf(bytes);
      char* out = plain_out.data();
      char* buf = plain_buf.data();
      if (path == "shared") {
        out = static_cast<char*>(heap.Take(capacity));
        buf = static_cast<char*>(heap.Take(capacity));
        ASSERT_TRUE(out != nullptr && buf != nullptr);
      }
      if (dtype == DataType::kFloat32) {
        SpreadInput(reinterpret_cast<float*>(in.data()), count);
      } else {
        SpreadInput(reinterpret_cast<double*>(in.data()), count);
      }
      for (const auto& [op, divisor] : {std::pair<ReduceOp, int64_t>{ReduceOp::kSum, 1},
                                        {ReduceOp::kSum, n},
                                        {ReduceOp::kProduct, 1}}) {
        const std::string what = path + " " + DataTypeName(dtype) + " " + ReduceOpName(op) + " / " +
                                 std::to_string(divisor);
        reference->Run({in.data(), want.data(), count, dtype, op, divisor, bytes});
        const AllreduceCall call{in.data(), out, count, dtype, op, divisor, bytes};
        ASSERT_TRUE(ordered->AppliesTo(call)) << what;
        ordered->Run(call);
        EXPECT_EQ(std::memcmp(out, want.data(), bytes), 0) << what << ", out of place";
        std::memcpy(buf, in.data(), bytes);
        ordered->Run({buf, buf, count, dtype, op, divisor, bytes});
        EXPECT_EQ(std::memcmp(buf, want.data(), bytes), 0) << what << ", in place";
        if (path != "direct") continue;
        unordered->Run({in.data(), out, count, dtype, op, divisor, bytes});
        for (int64_t i = 0; i < count; ++i)
          reordered += std::memcmp(out + i * elem, want.data() + i * elem, elem) != 0;
      }
      if (path == "shared") {
        heap.Give(out, capacity);
        heap.Give(buf, capacity);
      }
    }
  }
  if (n >= 3) {
    EXPECT_GT(reordered, 0) << "the inputs do not show the order of summation";
  }
  std::vector<int32_t> ints(count, 1);
  EXPECT_FALSE(ordered->AppliesTo(
      {ints.data(), ints.data(), count, DataType::kInt32, ReduceOp::kSum, 1, count * 4}));
}

}  // namespace
}  // namespace bluefog
