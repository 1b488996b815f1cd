// The negotiation round's slot format, without a backend: what every rank writes and reads.
#include "transport/exchange_slots.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace bluefog {
namespace {

TEST(ExchangeSlots, ShortMessagesNeedOneStep) {
  std::vector<char> slots(3 * kExchangeSlotTotal);
  const std::vector<std::string> sent = {"", "a",
                                         std::string(Communicator::kExchangeSlotBytes, 'x')};
  for (size_t r = 0; r < sent.size(); ++r)
    FillExchangeSlot(&slots[r * kExchangeSlotTotal], sent[r]);
  std::vector<std::string> got;
  std::vector<int64_t> rest;
  EXPECT_FALSE(ReadExchangeSlots(slots.data(), 3, &got, &rest));
  EXPECT_EQ(got, sent);
  EXPECT_EQ(rest, (std::vector<int64_t>{0, 0, 0}));
  EXPECT_EQ(ExchangeRest(sent[2]), nullptr);
}

TEST(ExchangeSlots, LongMessagesArriveWholeAfterTheSecondStep) {
  const size_t payload = Communicator::kExchangeSlotBytes;
  std::string long1(payload + 5, 'a'), long3(3 * payload, 'c');
  for (size_t i = 0; i < long3.size(); ++i) long3[i] = static_cast<char>('a' + i % 26);
  const std::vector<std::string> sent = {long1, "short", long3};
  std::vector<char> slots(3 * kExchangeSlotTotal);
  for (size_t r = 0; r < sent.size(); ++r)
    FillExchangeSlot(&slots[r * kExchangeSlotTotal], sent[r]);
  std::vector<std::string> got;
  std::vector<int64_t> rest;
  ASSERT_TRUE(ReadExchangeSlots(slots.data(), 3, &got, &rest));
  EXPECT_EQ(rest, (std::vector<int64_t>{5, 0, static_cast<int64_t>(2 * payload)}));
  // What the second step gathers: each rank's rest, in rank order.
  std::string gathered;
  for (const std::string& m : sent)
    if (ExchangeRest(m) != nullptr) gathered.append(ExchangeRest(m), m.size() - payload);
  AppendExchangeRests(gathered.data(), rest, &got);
  EXPECT_EQ(got, sent);
}

}  // namespace
}  // namespace bluefog
