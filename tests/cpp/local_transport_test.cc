// The one-host transport (transport/local/: the direct, staged and shared allreduces, the path
// chooser, the shared heap) over either backend's communicator on one host, without the
// runtime: under mpirun (the MPI backend) or tests/cpp/gloo_launch.sh (the Gloo backend), at 2
// and 3 ranks. Expected values are closed-form functions of (rank, size, index).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/path_chooser.h"
#include "core/status.h"
#include "launched_transport.h"
#include "local_transport_test.h"
#include "transport/allreduce_algorithm.h"
#include "transport/local/algorithms.h"
#include "transport/local/local_host.h"
#include "transport/shared_heap.h"

namespace bluefog {

Communicator* transport = nullptr;
TransportInfo info;

namespace {

// The path the one-host allreduces of `bytes` of `kind` take (0 through the areas, 1 direct, -1
// still timing both).
int Choice(int64_t bytes, int kind = OneHostAllreduce::kOutOfPlace) {
  return transport->local_host()->choice(bytes, kind);
}

// Sum over ranks r of (i % 17 + r): n * (i % 17) + n (n - 1) / 2, exact in float32.
float Expected(int64_t i) {
  const int n = info.size;
  return static_cast<float>(n * (i % 17) + n * (n - 1) / 2);
}

// A size class's choice, checked to be a path (0 or 1) and the same on every rank.
void ExpectChosenAlike(int choice) {
  EXPECT_TRUE(choice == 0 || choice == 1) << choice;
  int lowest = choice, highest = choice;
  transport->Allreduce(&choice, &lowest, 1, DataType::kInt32, ReduceOp::kMin);
  transport->Allreduce(&choice, &highest, 1, DataType::kInt32, ReduceOp::kMax);
  EXPECT_EQ(lowest, highest);
}

std::vector<float> Input(int64_t count) {
  std::vector<float> in(count);
  for (int64_t i = 0; i < count; ++i) in[i] = static_cast<float>(i % 17 + info.rank);
  return in;
}

// A buffer of `count` floats from the shared heap, given back at the end of its scope.
struct HeapBlock {
  explicit HeapBlock(int64_t count)
      : bytes((static_cast<size_t>(count) * 4 + 4095) / 4096 * 4096),
        data(static_cast<float*>(transport->shared_heap()->Take(bytes))) {}
  ~HeapBlock() {
    if (data) transport->shared_heap()->Give(data, bytes);
  }
  size_t bytes;
  float* data;
};

TEST(TransportDirect, OnWithinOneHost) {
  EXPECT_EQ(transport->paths().direct, info.size > 1);
  EXPECT_EQ(transport->paths().staged, info.size > 1);
}

// Both paths (the staged one through the shared segment, and the direct one):
// one step and several (the segment holds 1 MiB per rank, so 4 MiB + 7 floats take five steps
// alternating between the two area sets, the last one shorter than n segments of equal size).
TEST(TransportDirect, ExactInPlaceAndOutOfPlaceOverUnevenSegments) {
  for (bool staged : {true, false}) {
    transport->tuning().staged = staged;
    for (int64_t count : {int64_t{1} << 18, (int64_t{1} << 20) + 2 * info.size + 1}) {
      std::vector<float> in = Input(count), out(count, -1.0f), buf = Input(count);
      transport->AllreduceSum(in.data(), out.data(), count, DataType::kFloat32);
      transport->AllreduceSum(buf.data(), buf.data(), count, DataType::kFloat32);
      for (int64_t i = 0; i < count; ++i) {
        ASSERT_EQ(out[i], Expected(i)) << staged << " " << count << " " << i;
        ASSERT_EQ(buf[i], Expected(i)) << staged << " " << count << " " << i;
      }
      EXPECT_EQ(in, Input(count)) << staged;  // out of place leaves the input alone
    }
  }
  transport->tuning().staged = true;
}

// The staged path's other reductions and its average: the max over ranks of (i % 17 + r) and
// the truncated integer mean of (i % 5) * 3 + r, over a buffer of several steps.
TEST(TransportDirect, StagedMaxAndIntegerAverage) {
  ASSERT_TRUE(transport->paths().staged);
  const int n = info.size;
  const int64_t count = (int64_t{1} << 19) + 3;
  std::vector<float> in = Input(count), out(count, 0.0f);
  transport->Allreduce(in.data(), out.data(), count, DataType::kFloat32, ReduceOp::kMax, 1);
  for (int64_t i = 0; i < count; ++i) ASSERT_EQ(out[i], static_cast<float>(i % 17 + n - 1)) << i;
  std::vector<int32_t> ints(count);
  for (int64_t i = 0; i < count; ++i) ints[i] = static_cast<int32_t>((i % 5) * 3 + info.rank);
  transport->Allreduce(ints.data(), ints.data(), count, DataType::kInt32, ReduceOp::kSum, n);
  for (int64_t i = 0; i < count; ++i)
    ASSERT_EQ(ints[i], static_cast<int32_t>((n * (i % 5) * 3 + n * (n - 1) / 2) / n)) << i;
}

// With both paths on, a size class's first PathChooser::kChooseCalls calls (16 untimed, then both
// in turns) are exact all along; then every rank has chosen the same one.
TEST(TransportDirect, EveryRankChoosesTheSamePath) {
  ASSERT_TRUE(transport->paths().staged && transport->paths().direct);
  const int64_t count = (int64_t{1} << 21) + 5;  // 8 MiB + 20 bytes: no other test uses this class
  std::vector<float> in = Input(count), out(count, 0.0f);
  for (int call = 0; call < PathChooser::kChooseCalls; ++call) {
    EXPECT_EQ(Choice(count * 4), -1) << call;
    transport->AllreduceSum(in.data(), out.data(), count, DataType::kFloat32);
    for (int64_t i = 0; i < count; i += 97) ASSERT_EQ(out[i], Expected(i)) << call << " " << i;
  }
  ExpectChosenAlike(Choice(count * 4));
  transport->AllreduceSum(in.data(), out.data(), count, DataType::kFloat32);
  for (int64_t i = 0; i < count; ++i) ASSERT_EQ(out[i], Expected(i)) << i;
  // Decided again after set calls (2048 outside tests), again alike on every rank.
  transport->tuning().recheck_calls = 4;
  for (int call = 0; call < 3; ++call)
    transport->AllreduceSum(in.data(), out.data(), count, DataType::kFloat32);
  EXPECT_EQ(Choice(count * 4), -1);
  for (int call = 0; call < 4 * PathChooser::kBlock; ++call)
    transport->AllreduceSum(in.data(), out.data(), count, DataType::kFloat32);
  for (int64_t i = 0; i < count; i += 97) ASSERT_EQ(out[i], Expected(i)) << i;
  ExpectChosenAlike(Choice(count * 4));
  transport->tuning().recheck_calls = 2048;
  // Every output in the heap: the class is timed apart (shared path against direct), and every
  // rank again takes the same.
  HeapBlock block(count);
  const uint64_t shared_before = transport->tuning().shared_calls.load();
  for (int call = 0; call < PathChooser::kChooseCalls; ++call) {
    // The untimed start goes through the areas: here the shared path.
    if (call == PathChooser::kStartCalls) {
      EXPECT_EQ(transport->tuning().shared_calls.load() - shared_before,
                uint64_t{PathChooser::kStartCalls});
    }
    EXPECT_EQ(Choice(count * 4, OneHostAllreduce::kShared), -1) << call;
    transport->AllreduceSum(in.data(), block.data, count, DataType::kFloat32);
    for (int64_t i = 0; i < count; i += 97)
      ASSERT_EQ(block.data[i], Expected(i)) << call << " " << i;
  }
  ExpectChosenAlike(Choice(count * 4, OneHostAllreduce::kShared));
}

// After a choice, a watch every PathChooser::kWatchCalls calls: when the path taken has become
// slower than the other one was on any rank (here forced on the last rank only), every rank decides
// again at once, and again alike.
TEST(TransportDirect, AChoiceThatGotSlowerIsMadeAgainOnEveryRank) {
  ASSERT_TRUE(transport->paths().staged && transport->paths().direct);
  const int64_t count = (int64_t{3} << 18) + 3;  // 3 MiB + 12 bytes: no other test uses this class
  std::vector<float> in = Input(count), out(count, 0.0f);
  for (int call = 0; call < PathChooser::kChooseCalls; ++call)
    transport->AllreduceSum(in.data(), out.data(), count, DataType::kFloat32);
  ASSERT_NE(Choice(count * 4), -1);
  // The slowest rank's medians decide the watch's reference, so an unforced watch may fire too
  // on a noisy machine; forcing it on one rank must make every rank start the trials again.
  if (info.rank == info.size - 1) transport->tuning().worse = 0.0;
  for (int call = 0; call < PathChooser::kWatchCalls; ++call)
    transport->AllreduceSum(in.data(), out.data(), count, DataType::kFloat32);
  transport->tuning().worse = PathChooser::kWorse;
  EXPECT_EQ(Choice(count * 4), -1);
  for (int64_t i = 0; i < count; i += 97) ASSERT_EQ(out[i], Expected(i)) << i;
  for (int call = 0; call < 4 * PathChooser::kBlock; ++call)
    transport->AllreduceSum(in.data(), out.data(), count, DataType::kFloat32);
  ExpectChosenAlike(Choice(count * 4));
  for (int64_t i = 0; i < count; ++i) ASSERT_EQ(out[i], Expected(i)) << i;
}

TEST(TransportShared, HeapHandsOutBlocksOfThisRanksPart) {
  const std::shared_ptr<SharedHeap> heap = transport->shared_heap();
  ASSERT_NE(heap, nullptr);
  HeapBlock a(1 << 18), b(1 << 18);
  ASSERT_NE(a.data, nullptr);
  ASSERT_NE(b.data, nullptr);
  EXPECT_NE(a.data, b.data);
  EXPECT_GE(heap->OffsetOf(a.data, a.bytes), 0);
  EXPECT_EQ(heap->OffsetOf(a.data, a.bytes),
            reinterpret_cast<char*>(a.data) - heap->part(info.rank));
  int on_stack = 0;
  EXPECT_EQ(heap->OffsetOf(&on_stack, sizeof(on_stack)), -1);
  // More than the part holds: no block (the output pool then allocates one of its own).
  EXPECT_EQ(heap->Take(size_t{1} << 40), nullptr);
  // A freed block of the same capacity comes back.
  void* first = a.data;
  heap->Give(a.data, a.bytes);
  a.data = static_cast<float*>(heap->Take(a.bytes));
  EXPECT_EQ(a.data, first);
}

// Every output in the heap: the shared path, out of place and in place (the input a block too),
// over one step and several of uneven segments; exact, and the input left alone.
TEST(TransportShared, ExactInPlaceAndOutOfPlaceOverUnevenSegments) {
  for (int64_t count : {int64_t{1} << 18, (int64_t{1} << 20) + 2 * info.size + 1}) {
    const std::vector<float> in = Input(count);
    HeapBlock out(count), buf(count);
    ASSERT_TRUE(out.data && buf.data);
    std::copy(in.begin(), in.end(), buf.data);
    const uint64_t before = transport->tuning().shared_calls.load();
    transport->AllreduceSum(in.data(), out.data, count, DataType::kFloat32);
    transport->AllreduceSum(buf.data, buf.data, count, DataType::kFloat32);
    EXPECT_EQ(transport->tuning().shared_calls.load() - before, 2u);
    for (int64_t i = 0; i < count; ++i) {
      ASSERT_EQ(out.data[i], Expected(i)) << count << " " << i;
      ASSERT_EQ(buf.data[i], Expected(i)) << count << " " << i;
    }
    EXPECT_EQ(in, Input(count));
  }
}

TEST(TransportShared, MaxAndIntegerAverage) {
  const int n = info.size;
  const int64_t count = (int64_t{1} << 19) + 3;
  const std::vector<float> in = Input(count);
  HeapBlock out(count), ints(count);
  transport->Allreduce(in.data(), out.data, count, DataType::kFloat32, ReduceOp::kMax, 1);
  for (int64_t i = 0; i < count; ++i)
    ASSERT_EQ(out.data[i], static_cast<float>(i % 17 + n - 1)) << i;
  int32_t* v = reinterpret_cast<int32_t*>(ints.data);
  for (int64_t i = 0; i < count; ++i) v[i] = static_cast<int32_t>((i % 5) * 3 + info.rank);
  transport->Allreduce(v, v, count, DataType::kInt32, ReduceOp::kSum, n);
  for (int64_t i = 0; i < count; ++i)
    ASSERT_EQ(v[i], static_cast<int32_t>((n * (i % 5) * 3 + n * (n - 1) / 2) / n)) << i;
}

// One rank's output outside the heap: every rank takes another path (a peer cannot push into
// that output), with the same results.
TEST(TransportShared, OneOutputOutsideTheHeapTurnsItOffForThatCall) {
  const int64_t count = (int64_t{1} << 18) + 1;
  const std::vector<float> in = Input(count);
  HeapBlock block(count);
  std::vector<float> own(count, -1.0f);
  float* out = info.rank == 1 ? own.data() : block.data;
  const uint64_t before = transport->tuning().shared_calls.load();
  for (int call = 0; call < 3; ++call) {
    transport->AllreduceSum(in.data(), out, count, DataType::kFloat32);
    for (int64_t i = 0; i < count; ++i) ASSERT_EQ(out[i], Expected(i)) << call << " " << i;
  }
  EXPECT_EQ(transport->tuning().shared_calls.load(), before);
  // Then every output in the heap again (the areas were left to the staged path's readers, so
  // this call stages after the gather, the next one before it): the shared path, exact.
  for (int call = 0; call < 2; ++call) {
    transport->AllreduceSum(in.data(), block.data, count, DataType::kFloat32);
    for (int64_t i = 0; i < count; ++i) ASSERT_EQ(block.data[i], Expected(i)) << call << " " << i;
  }
  EXPECT_EQ(transport->tuning().shared_calls.load(), before + 2);
}

// In-place calls are timed apart from out-of-place ones, whose best path differs (at 8 MiB and
// 2 ranks: in place direct 0.96-1.63x MPI against 0.80-0.94x through the areas; out of place
// 0.62-0.76x and 0.67-0.76x): a class's in-place calls choose for in place only, alike on every
// rank. A call in place on some ranks only is an out-of-place one. Exact all along.
TEST(TransportDirect, InPlaceCallsAreTimedApart) {
  ASSERT_TRUE(transport->paths().staged && transport->paths().direct);
  // 16 MiB: no other test uses this class, and no larger size is timed
  // (OneHostAllreduce::kAreasMaxBytes).
  const int64_t count = int64_t{1} << 22;
  std::vector<float> buf(count), in = Input(count), out(count);
  for (int call = 0; call < PathChooser::kChooseCalls; ++call) {
    EXPECT_EQ(Choice(count * 4, OneHostAllreduce::kInPlace), -1) << call;
    std::copy(in.begin(), in.end(), buf.begin());
    transport->AllreduceSum(buf.data(), buf.data(), count, DataType::kFloat32);
    for (int64_t i = 0; i < count; i += 97) ASSERT_EQ(buf[i], Expected(i)) << call << " " << i;
  }
  ExpectChosenAlike(Choice(count * 4, OneHostAllreduce::kInPlace));
  EXPECT_EQ(Choice(count * 4), -1);
  EXPECT_EQ(Choice(count * 4, OneHostAllreduce::kShared), -1);
  // In place on rank 0 only.
  std::copy(in.begin(), in.end(), buf.begin());
  float* result = info.rank == 0 ? buf.data() : out.data();
  transport->AllreduceSum(buf.data(), result, count, DataType::kFloat32);
  for (int64_t i = 0; i < count; ++i) ASSERT_EQ(result[i], Expected(i)) << i;
}

// Outputs written with streaming stores (set for every size here) and with plain ones: the same
// exact results on every one-host path (through the areas, direct, shared), in place and out of
// place, with outputs that start one element past a line (the streamed lines begin mid-piece),
// and nothing written outside the output.
TEST(TransportDirect, StreamingStoresGiveTheSameResults) {
  const int64_t saved = transport->tuning().streaming_store_bytes.load();
  const int n = info.size;
  for (int64_t from : {int64_t{1}, int64_t{0}}) {
    transport->tuning().streaming_store_bytes = from;
    for (bool staged : {true, false}) {
      transport->tuning().staged = staged;
      for (int64_t count : {(int64_t{1} << 18) + 1, (int64_t{1} << 20) + 2 * n + 1}) {
        std::vector<float> in = Input(count), out(count + 2, -1.0f), buf = Input(count);
        float* o = out.data() + 1;
        transport->AllreduceSum(in.data(), o, count, DataType::kFloat32);
        transport->AllreduceSum(buf.data(), buf.data(), count, DataType::kFloat32);
        for (int64_t i = 0; i < count; ++i) {
          ASSERT_EQ(o[i], Expected(i)) << from << " " << staged << " " << count << " " << i;
          ASSERT_EQ(buf[i], Expected(i)) << from << " " << staged << " " << count << " " << i;
        }
        EXPECT_EQ(out.front(), -1.0f);
        EXPECT_EQ(out.back(), -1.0f);
      }
    }
    transport->tuning().staged = true;
    const int64_t count = (int64_t{1} << 19) + 3;
    const std::vector<float> in = Input(count);
    HeapBlock out(count), ints(count);
    transport->AllreduceSum(in.data(), out.data, count, DataType::kFloat32);
    for (int64_t i = 0; i < count; ++i) ASSERT_EQ(out.data[i], Expected(i)) << from << " " << i;
    int32_t* v = reinterpret_cast<int32_t*>(ints.data);
    for (int64_t i = 0; i < count; ++i) v[i] = static_cast<int32_t>((i % 5) * 3 + info.rank);
    transport->Allreduce(v, v, count, DataType::kInt32, ReduceOp::kSum, n);
    for (int64_t i = 0; i < count; ++i)
      ASSERT_EQ(v[i], static_cast<int32_t>((n * (i % 5) * 3 + n * (n - 1) / 2) / n)) << from << i;
  }
  transport->tuning().streaming_store_bytes = saved;
}

// Every algorithm in the backend's list (the one-host ones first, then the backend's own: ring
// and mpi for MPI, gloo for Gloo), reached by name and run on its own rather than through the
// list's choice: a sum out of place and in place, a max and an integer average, over one step
// of the areas and several with uneven segments; exact on every rank.
TEST(AlgorithmByName, EveryAlgorithmOfTheListExact) {
  const std::vector<AllreduceAlgorithm*> list = transport->allreduce_algorithms();
  std::vector<std::string> names;
  for (AllreduceAlgorithm* a : list) names.push_back(a->name());
  ASSERT_GE(names.size(), 3u);
  EXPECT_EQ(names[0], "one-host");
  EXPECT_EQ(names[1], "direct");
  EXPECT_EQ(names.back(), transport->backend());  // the backend's own, which takes every call
  const int n = info.size;
  for (AllreduceAlgorithm* algorithm : list) {
    const std::string name = algorithm->name();
    if (name == "hierarchical") continue;  // several hosts only
    for (int64_t count : {(int64_t{1} << 18) + 1, (int64_t{1} << 20) + 2 * n + 1}) {
      std::vector<float> in = Input(count), out(count, -1.0f), buf = Input(count);
      const int64_t bytes = count * 4;
      const AllreduceCall sum{in.data(),      out.data(), count, DataType::kFloat32,
                              ReduceOp::kSum, 1,          bytes};
      ASSERT_TRUE(algorithm->AppliesTo(sum)) << name << " " << count;
      algorithm->Run(sum);
      algorithm->Run({buf.data(), buf.data(), count, DataType::kFloat32, ReduceOp::kSum, 1, bytes});
      for (int64_t i = 0; i < count; ++i) {
        ASSERT_EQ(out[i], Expected(i)) << name << " " << count << " " << i;
        ASSERT_EQ(buf[i], Expected(i)) << name << " " << count << " " << i;
      }
      EXPECT_EQ(in, Input(count)) << name;
      algorithm->Run({in.data(), out.data(), count, DataType::kFloat32, ReduceOp::kMax, 1, bytes});
      for (int64_t i = 0; i < count; ++i)
        ASSERT_EQ(out[i], static_cast<float>(i % 17 + n - 1)) << name << " " << i;
      std::vector<int32_t> ints(count);
      for (int64_t i = 0; i < count; ++i) ints[i] = static_cast<int32_t>((i % 5) * 3 + info.rank);
      algorithm->Run({ints.data(), ints.data(), count, DataType::kInt32, ReduceOp::kSum, n, bytes});
      for (int64_t i = 0; i < count; ++i)
        ASSERT_EQ(ints[i], static_cast<int32_t>((n * (i % 5) * 3 + n * (n - 1) / 2) / n))
            << name << " " << i;
    }
  }
}

// Last (it turns the direct path off for good): a rank whose reads fail on the direct path (here:
// a bad address) fails the allreduce on every rank, naming itself, without hanging; the
// transport then passes messages, with the same results.
TEST(TransportDirectLast, FailedReadFailsEveryRankThenTheRingRuns) {
  const int64_t count = int64_t{1} << 19;
  std::vector<float> in = Input(count), out(count, 0.0f);
  transport->tuning().staged = false;
  transport->tuning().direct_fault_rank = 1;
  std::string error;
  try {
    transport->AllreduceSum(in.data(), out.data(), count, DataType::kFloat32);
  } catch (const BluefogError& e) {
    error = e.what();
  }
  transport->tuning().direct_fault_rank = -1;
  ASSERT_FALSE(error.empty()) << "the allreduce should have failed on rank " << info.rank;
  EXPECT_NE(error.find("direct allreduce failed"), std::string::npos) << error;
  EXPECT_NE(error.find("BLUEFOG_DIRECT_ALLREDUCE=0"), std::string::npos) << error;
  // Reads from rank 1 fail, so ranks 0 and 2 fail; every rank names the lowest of them.
  EXPECT_NE(error.find("rank 0"), std::string::npos) << error;
  EXPECT_FALSE(transport->paths().direct);
  transport->AllreduceSum(in.data(), out.data(), count, DataType::kFloat32);
  for (int64_t i = 0; i < count; i += 101) ASSERT_EQ(out[i], Expected(i)) << i;
  transport->tuning().staged = true;  // the shared path's tests below need the areas, not this path
}

}  // namespace
}  // namespace bluefog

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  bluefog::TransportOptions options;
  options.shared_heap_bytes = int64_t{64} << 20;
  std::unique_ptr<bluefog::Communicator> t = bluefog::LaunchedTransport(options, &bluefog::info);
  bluefog::transport = t.get();
  // Only rank 0 prints the per-test lines.
  if (bluefog::info.rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  const int result = RUN_ALL_TESTS();
  int worst = result;
  // Every rank's verdict decides the exit status of each.
  t->Allreduce(&result, &worst, 1, bluefog::DataType::kInt32, bluefog::ReduceOp::kMax);
  // A block still out when the transport shuts down (a tensor TensorFlow still holds) stays
  // mapped and writable; the retired heap hands out no more.
  std::shared_ptr<bluefog::SharedHeap> heap = t->shared_heap();
  void* kept = heap ? heap->Take(4096) : nullptr;
  t->Shutdown();
  if (kept == nullptr) {
    std::fprintf(stderr, "no shared heap block before shutdown\n");
    return 1;
  }
  std::memset(kept, 1, 4096);
  if (heap->Take(4096) != nullptr) {
    std::fprintf(stderr, "the shared heap still hands out blocks after shutdown\n");
    worst = 1;
  }
  heap->Give(kept, 4096);
  return worst;
}
