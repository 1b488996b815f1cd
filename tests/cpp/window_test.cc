// The window's bookkeeping (core/window.h) without MPI: writes, updates, versions and push-sum
// weights against values worked out by hand.
#include "core/window.h"

#include <gtest/gtest.h>

#include <vector>

namespace bluefog {
namespace {

WindowSpec Spec() {
  WindowSpec spec;
  spec.name = "w";
  spec.dtype = DataType::kFloat32;
  spec.shape = {3};
  spec.in_ranks = {1, 3};
  spec.out_ranks = {2};
  return spec;
}

TEST(WindowTest, BuffersStartAsTheValueOrZero) {
  const std::vector<float> x = {1, 2, 3};
  Window w(0, Spec(), x.data(), false);
  std::vector<float> out(3);
  w.Update(x.data(), out.data(), 0.0, {1}, {1.0}, false, false, false);
  EXPECT_EQ(out, x);
  Window z(1, Spec(), x.data(), true);
  z.Update(x.data(), out.data(), 0.0, {1, 3}, {1.0, 1.0}, false, false, true);
  EXPECT_EQ(out, std::vector<float>({0, 0, 0}));
  EXPECT_EQ(z.associated_p(), 0.0);  // zero-initialised buffers carry no weight
}

TEST(WindowTest, PutReplacesAccumulateAddsAndVersionsCount) {
  const std::vector<float> x = {1, 1, 1};
  Window w(0, Spec(), x.data(), true);
  const std::vector<float> a = {1, 2, 3};
  w.Write(1, a.data(), 2.0, 0.5, false);  // buffer(1) = 2a
  w.Write(1, a.data(), 1.0, 0.5, true);   // buffer(1) = 3a
  w.Write(3, a.data(), -1.0, 0.25, false);
  EXPECT_EQ(w.Versions(), std::vector<int64_t>({2, 1}));
  std::vector<float> out(3);
  w.Update(x.data(), out.data(), 0.5, {1, 3}, {1.0, 2.0}, false, true, true);
  // 0.5 * 1 + 3a - 2a = 0.5 + a
  EXPECT_EQ(out, std::vector<float>({1.5f, 2.5f, 3.5f}));
  EXPECT_EQ(w.Versions(), std::vector<int64_t>({0, 0}));
  EXPECT_DOUBLE_EQ(w.associated_p(), 0.5 * 1.0 + 1.0 * 1.0 + 2.0 * 0.25);
  // Published: what a neighbour's get reads now.
  std::vector<float> self(3);
  double p = 0;
  w.ReadSelf(self.data(), &p);
  EXPECT_EQ(self, out);
}

TEST(WindowTest, ResetZeroesOnlyTheBuffersRead) {
  const std::vector<float> x = {1, 1, 1};
  Window w(0, Spec(), x.data(), false);
  std::vector<float> out(3);
  w.Update(x.data(), out.data(), 1.0, {1}, {1.0}, true, false, false);
  EXPECT_EQ(out, std::vector<float>({2, 2, 2}));
  w.Update(x.data(), out.data(), 0.0, {1, 3}, {1.0, 1.0}, false, false, false);
  EXPECT_EQ(out, std::vector<float>({1, 1, 1}));  // buffer(1) is 0, buffer(3) still x
}

TEST(WindowTest, PublishScalesTheValueAndWeight) {
  const std::vector<float> x = {2, 4, 6};
  Window w(0, Spec(), x.data(), false);
  w.Publish(x.data(), 0.5, 0.5);
  std::vector<float> self(3);
  double p = 0;
  w.ReadSelf(self.data(), &p);
  EXPECT_EQ(self, std::vector<float>({1, 2, 3}));
  EXPECT_DOUBLE_EQ(p, 0.5);
}

TEST(WindowTest, GivenBackShareJoinsTheNextPublishingUpdateOnce) {
  const std::vector<float> x = {2, 4, 6};
  Window w(0, Spec(), x.data(), true);
  w.Publish(x.data(), 0.5, 0.5);     // kept 1/2 of x and of p = 1
  w.GiveBack(x.data(), 0.25, 0.25);  // the share meant for a lost out-neighbour
  std::vector<float> out(3);
  // A clone (publish false, and so without the weight, as win_update(clone=True) calls it)
  // leaves the given-back share for later.
  w.Update(x.data(), out.data(), 0.5, {1, 3}, {1.0, 1.0}, false, false, false);
  EXPECT_EQ(out, std::vector<float>({1, 2, 3}));
  w.Update(x.data(), out.data(), 0.5, {1, 3}, {1.0, 1.0}, false, true, true);
  EXPECT_EQ(out, std::vector<float>({1.5f, 3, 4.5f}));  // 0.5 x + 0.25 x
  EXPECT_DOUBLE_EQ(w.associated_p(), 0.5 * 0.5 + 0.25);
  std::vector<float> again(3);
  w.Update(out.data(), again.data(), 1.0, {}, {}, false, true, true);
  EXPECT_EQ(again, out);  // added once only
}

TEST(WindowTest, NeighbourIndexes) {
  const std::vector<float> x = {0, 0, 0};
  Window w(0, Spec(), x.data(), false);
  EXPECT_EQ(w.InIndex(3), 1);
  EXPECT_EQ(w.InIndex(2), -1);
  EXPECT_EQ(w.OutIndex(2), 0);
  EXPECT_THROW(w.Write(2, x.data(), 1.0, 1.0, false), BluefogError);
}

}  // namespace
}  // namespace bluefog
