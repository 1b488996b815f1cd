#include "core/wire.h"

#include <cstring>

#include "core/status.h"

namespace bluefog {
namespace {

constexpr uint32_t kFlagShutdown = 1u;
constexpr uint32_t kFlagWaits = 2u;
constexpr uint8_t kDataAnnouncement = 0;
constexpr uint8_t kDataCached = 1;

template <typename T>
void Put(std::string& out, T value) {
  out.append(reinterpret_cast<const char*>(&value), sizeof(T));
}

class Reader {
 public:
  Reader(const char* data, size_t size) : data_(data), size_(size) {}
  template <typename T>
  T Get() {
    Need(sizeof(T));
    T value;
    std::memcpy(&value, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return value;
  }
  std::string GetString(size_t n) {
    Need(n);
    std::string s(data_ + pos_, n);
    pos_ += n;
    return s;
  }
  bool done() const { return pos_ == size_; }

 private:
  void Need(size_t n) {
    BF_ENFORCE(size_ - pos_ >= n, StatusCode::kInternal,
               "malformed negotiation message: truncated at byte ", pos_, " of ", size_);
  }
  const char* data_;
  size_t size_;
  size_t pos_ = 0;
};

}  // namespace

std::string EncodeRound(const RoundMessage& message) {
  std::string out;
  Put<uint32_t>(out,
                (message.shutdown ? kFlagShutdown : 0u) | (message.has_waits ? kFlagWaits : 0u));
  if (message.has_waits) {
    Put<uint32_t>(out, message.agreed);
    Put<uint32_t>(out, message.wait_units);
  }
  // The cached slots as a bit set, as long as the highest slot needs.
  const uint32_t bits_bytes = message.cached.empty() ? 0 : message.cached.back() / 8 + 1;
  Put<uint32_t>(out, bits_bytes);
  const size_t bits_at = out.size();
  out.append(bits_bytes, '\0');
  for (uint32_t slot : message.cached)
    out[bits_at + slot / 8] |= static_cast<char>(1u << (slot % 8));
  Put<uint32_t>(out, static_cast<uint32_t>(message.announcements.size()));
  for (const TensorMeta& m : message.announcements) {
    Put<uint32_t>(out, static_cast<uint32_t>(m.name.size()));
    out.append(m.name);
    Put<uint8_t>(out, static_cast<uint8_t>(m.op));
    Put<uint8_t>(out, static_cast<uint8_t>(m.dtype));
    Put<int32_t>(out, m.root_rank);
    Put<uint8_t>(out, static_cast<uint8_t>(m.shape.size()));
    for (int64_t d : m.shape) Put<int64_t>(out, d);
    for (const auto* ranks : {&m.send_ranks, &m.recv_ranks}) {
      Put<uint32_t>(out, static_cast<uint32_t>(ranks->size()));
      for (int32_t r : *ranks) Put<int32_t>(out, r);
    }
    if (m.op == OpType::kNeighborAllgatherGrad) Put<int64_t>(out, m.input_rows);
    if (m.op == OpType::kAlltoall || m.op == OpType::kWinFree) {
      Put<uint32_t>(out, static_cast<uint32_t>(m.splits.size()));
      for (int64_t s : m.splits) Put<int64_t>(out, s);
    }
    if (m.op == OpType::kAllreduce || m.op == OpType::kReducescatter) {
      Put<uint8_t>(out, m.average ? 1 : 0);
      Put<double>(out, m.scale);
      Put<int32_t>(out, m.group_size);
    }
    if (m.op == OpType::kAllreduce) Put<uint8_t>(out, static_cast<uint8_t>(m.reduce_op));
  }
  // Data: (entry kind, index, length, bytes) for the entries that carry some.
  uint32_t with_data = 0;
  for (const auto* list : {&message.announcement_data, &message.cached_data})
    for (const std::string& d : *list) with_data += d.empty() ? 0 : 1;
  Put<uint32_t>(out, with_data);
  for (uint8_t kind : {kDataAnnouncement, kDataCached}) {
    const auto& list = kind == kDataAnnouncement ? message.announcement_data : message.cached_data;
    for (size_t i = 0; i < list.size(); ++i) {
      if (list[i].empty()) continue;
      Put<uint8_t>(out, kind);
      Put<uint32_t>(out, static_cast<uint32_t>(i));
      Put<uint32_t>(out, static_cast<uint32_t>(list[i].size()));
      out.append(list[i]);
    }
  }
  return out;
}

size_t DataCost(size_t bytes) { return sizeof(uint8_t) + 2 * sizeof(uint32_t) + bytes; }

RoundMessage DecodeRound(const char* data, size_t size) {
  Reader in(data, size);
  RoundMessage message;
  const uint32_t flags = in.Get<uint32_t>();
  message.shutdown = (flags & kFlagShutdown) != 0;
  message.has_waits = (flags & kFlagWaits) != 0;
  if (message.has_waits) {
    message.agreed = in.Get<uint32_t>();
    message.wait_units = in.Get<uint32_t>();
  }
  const std::string bits = in.GetString(in.Get<uint32_t>());
  for (uint32_t byte = 0; byte < bits.size(); ++byte)
    for (uint32_t bit = 0; bit < 8; ++bit)
      if (static_cast<uint8_t>(bits[byte]) & (1u << bit)) message.cached.push_back(byte * 8 + bit);
  uint32_t count = in.Get<uint32_t>();
  message.announcements.reserve(count);
  for (uint32_t i = 0; i < count; ++i) {
    TensorMeta m;
    m.name = in.GetString(in.Get<uint32_t>());
    int op = in.Get<uint8_t>();
    int dtype = in.Get<uint8_t>();
    BF_ENFORCE(IsValidOpType(op) && IsValidDataType(dtype), StatusCode::kInternal,
               "malformed negotiation message: op ", op, " dtype ", dtype);
    m.op = static_cast<OpType>(op);
    m.dtype = static_cast<DataType>(dtype);
    m.root_rank = in.Get<int32_t>();
    int ndim = in.Get<uint8_t>();
    m.shape.resize(ndim);
    for (int d = 0; d < ndim; ++d) m.shape[d] = in.Get<int64_t>();
    for (auto* ranks : {&m.send_ranks, &m.recv_ranks}) {
      uint32_t n = in.Get<uint32_t>();
      BF_ENFORCE(n <= size, StatusCode::kInternal, "malformed negotiation message: ", n, " ranks");
      ranks->resize(n);
      for (uint32_t k = 0; k < n; ++k) (*ranks)[k] = in.Get<int32_t>();
    }
    if (m.op == OpType::kNeighborAllgatherGrad) m.input_rows = in.Get<int64_t>();
    if (m.op == OpType::kAlltoall || m.op == OpType::kWinFree) {
      uint32_t n = in.Get<uint32_t>();
      BF_ENFORCE(n <= size, StatusCode::kInternal, "malformed negotiation message: ", n, " splits");
      m.splits.resize(n);
      for (uint32_t k = 0; k < n; ++k) m.splits[k] = in.Get<int64_t>();
    }
    if (m.op == OpType::kAllreduce || m.op == OpType::kReducescatter) {
      m.average = in.Get<uint8_t>() != 0;
      m.scale = in.Get<double>();
      m.group_size = in.Get<int32_t>();
      BF_ENFORCE(m.group_size >= 0, StatusCode::kInternal,
                 "malformed negotiation message: group size ", m.group_size);
    }
    if (m.op == OpType::kAllreduce) {
      const int reduce_op = in.Get<uint8_t>();
      BF_ENFORCE(IsValidReduceOp(reduce_op), StatusCode::kInternal,
                 "malformed negotiation message: reduce op ", reduce_op);
      m.reduce_op = static_cast<ReduceOp>(reduce_op);
    }
    message.announcements.push_back(std::move(m));
  }
  const uint32_t with_data = in.Get<uint32_t>();
  for (uint32_t k = 0; k < with_data; ++k) {
    const uint8_t kind = in.Get<uint8_t>();
    const uint32_t index = in.Get<uint32_t>();
    BF_ENFORCE(kind == kDataAnnouncement || kind == kDataCached, StatusCode::kInternal,
               "malformed negotiation message: data kind ", static_cast<int>(kind));
    auto& list = kind == kDataAnnouncement ? message.announcement_data : message.cached_data;
    const size_t entries =
        kind == kDataAnnouncement ? message.announcements.size() : message.cached.size();
    BF_ENFORCE(index < entries, StatusCode::kInternal,
               "malformed negotiation message: data for entry ", index, " of ", entries);
    list.resize(entries);
    BF_ENFORCE(list[index].empty(), StatusCode::kInternal,
               "malformed negotiation message: data for entry ", index, " twice");
    list[index] = in.GetString(in.Get<uint32_t>());
    BF_ENFORCE(!list[index].empty(), StatusCode::kInternal,
               "malformed negotiation message: empty data");
  }
  BF_ENFORCE(in.done(), StatusCode::kInternal, "malformed negotiation message: trailing bytes");
  return message;
}

}  // namespace bluefog
