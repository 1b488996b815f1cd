// One window (bf.win_create): this rank's published value and one receive buffer per
// in-neighbour, with the bookkeeping of Bluefog's window API (versions, push-sum weights). Pure
// logic, no MPI: the window service (runtime/window_service.h) moves the bytes and calls these
// methods when a neighbour's put, accumulate or get reply arrives. Every method takes the
// window's own lock, so a write and an update never see half of each other.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/types.h"

namespace bluefog {

struct WindowSpec {
  std::string name;
  DataType dtype = DataType::kFloat32;
  std::vector<int64_t> shape;
  std::vector<int32_t> in_ranks;   // who writes into this rank's buffers (ascending)
  std::vector<int32_t> out_ranks;  // whose buffers this rank writes into (ascending)

  int64_t NumElements() const;
  size_t NumBytes() const { return static_cast<size_t>(NumElements()) * ElementSize(dtype); }
};

// "bluefog win_put of window 'NAME': what": what every window error starts with.
Status WinError(StatusCode code, const char* op, const std::string& name, const std::string& what);

class Window {
 public:
  // `initial` holds spec.NumBytes() bytes: this rank's value, and the receive buffers' start
  // unless `zero_init` (then they start at zero, with associated weight 0).
  Window(int id, WindowSpec spec, const void* initial, bool zero_init);
  Window(const Window&) = delete;
  Window& operator=(const Window&) = delete;

  int id() const { return id_; }
  const WindowSpec& spec() const { return spec_; }
  size_t bytes() const { return spec_.NumBytes(); }
  // Index of `rank` among the in-neighbours / out-neighbours, or -1.
  int InIndex(int rank) const;
  int OutIndex(int rank) const;

  // A neighbour's write into its buffer: buffer = weight * data (put, get reply) or
  // buffer += weight * data (accumulate); its associated weight likewise with `p`. Counts one
  // version. `src` must be an in-neighbour.
  void Write(int src, const void* data, double weight, double p, bool accumulate);
  // The value neighbours read with win_get, and its associated weight.
  void ReadSelf(void* out, double* p) const;
  // Replaces the published value (win_put publishes what it sends, scaled by its self_weight)
  // and multiplies the associated weight by `p_factor`.
  void Publish(const void* data, double self_weight, double p_factor);

  // out = self_weight * self + sum_k weights[k] * buffer(ranks[k]); the associated weight is
  // combined the same way. Versions of the buffers read go back to 0; with `reset` those buffers
  // (and their weights) become 0. With `publish` the result becomes the published value.
  // `self` and `out` may be the same memory. Ranks must be in-neighbours (checked by callers).
  void Update(const void* self, void* out, double self_weight, const std::vector<int32_t>& ranks,
              const std::vector<double>& weights, bool reset, bool publish, bool with_p);
  // A put or accumulate to a lost neighbour (fault-tolerant mode): `weight * data` and
  // associated weight `p` were meant for it and never arrived, so they stay with this rank: the
  // next publishing Update adds them to its result (with weight 1), which keeps push-sum's
  // total mass exact among the ranks left.
  void GiveBack(const void* data, double weight, double p);

  // Writes into each in-neighbour's buffer since it was last read by an update, in in_ranks order.
  std::vector<int64_t> Versions() const;
  double associated_p() const;

 private:
  const int id_;
  const WindowSpec spec_;
  const int64_t count_;
  mutable std::mutex mutex_;
  std::vector<char> self_;
  double self_p_ = 1.0;
  std::vector<std::vector<char>> buffers_;  // one per in-neighbour
  std::vector<double> buffer_p_;
  std::vector<int64_t> versions_;
  std::vector<char> returned_;  // GiveBack's sum since the last publishing Update (or empty)
  double returned_p_ = 0.0;
};

}  // namespace bluefog
