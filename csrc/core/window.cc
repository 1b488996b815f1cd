#include "core/window.h"

#include <algorithm>
#include <cstring>

#include "core/reduce_kernels.h"

namespace bluefog {
namespace {

int IndexOf(const std::vector<int32_t>& ranks, int rank) {
  auto it = std::lower_bound(ranks.begin(), ranks.end(), rank);
  return it != ranks.end() && *it == rank ? static_cast<int>(it - ranks.begin()) : -1;
}

}  // namespace

int64_t WindowSpec::NumElements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

Status WinError(StatusCode code, const char* op, const std::string& name, const std::string& what) {
  return Status(code, Concat("bluefog ", op, " of window '", name, "': ", what));
}

Window::Window(int id, WindowSpec spec, const void* initial, bool zero_init)
    : id_(id), spec_(std::move(spec)), count_(spec_.NumElements()) {
  const size_t n = spec_.NumBytes();
  self_.assign(static_cast<const char*>(initial), static_cast<const char*>(initial) + n);
  buffers_.resize(spec_.in_ranks.size());
  for (auto& b : buffers_) {
    if (zero_init) {
      b.assign(n, 0);  // zero bits are 0.0 in every float format
    } else {
      b = self_;
    }
  }
  buffer_p_.assign(spec_.in_ranks.size(), zero_init ? 0.0 : 1.0);
  versions_.assign(spec_.in_ranks.size(), 0);
}

int Window::InIndex(int rank) const { return IndexOf(spec_.in_ranks, rank); }
int Window::OutIndex(int rank) const { return IndexOf(spec_.out_ranks, rank); }

void Window::Write(int src, const void* data, double weight, double p, bool accumulate) {
  const int k = InIndex(src);
  BF_ENFORCE(k >= 0, StatusCode::kInternal, "rank ", src, " is not an in-neighbour of window '",
             spec_.name, "'");
  std::lock_guard<std::mutex> lock(mutex_);
  ScaleAdd(buffers_[k].data(), data, count_, spec_.dtype, weight, accumulate);
  buffer_p_[k] = accumulate ? buffer_p_[k] + p : p;
  ++versions_[k];
}

void Window::ReadSelf(void* out, double* p) const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::memcpy(out, self_.data(), self_.size());
  *p = self_p_;
}

void Window::Publish(const void* data, double self_weight, double p_factor) {
  std::lock_guard<std::mutex> lock(mutex_);
  ScaleAdd(self_.data(), data, count_, spec_.dtype, self_weight, false);
  self_p_ *= p_factor;
}

void Window::Update(const void* self, void* out, double self_weight,
                    const std::vector<int32_t>& ranks, const std::vector<double>& weights,
                    bool reset, bool publish, bool with_p) {
  std::lock_guard<std::mutex> lock(mutex_);
  ScaleAdd(out, self, count_, spec_.dtype, self_weight, false);
  double p = self_weight * self_p_;
  for (size_t j = 0; j < ranks.size(); ++j) {
    const int k = InIndex(ranks[j]);
    BF_ENFORCE(k >= 0, StatusCode::kInternal, "rank ", ranks[j],
               " is not an in-neighbour of window '", spec_.name, "'");
    ScaleAdd(out, buffers_[k].data(), count_, spec_.dtype, weights[j], true);
    p += weights[j] * buffer_p_[k];
    versions_[k] = 0;
    if (reset) {
      std::fill(buffers_[k].begin(), buffers_[k].end(), 0);
      buffer_p_[k] = 0.0;
    }
  }
  if (publish && !returned_.empty()) {
    ScaleAdd(out, returned_.data(), count_, spec_.dtype, 1.0, true);
    p += returned_p_;
    returned_.clear();
    returned_p_ = 0.0;
  }
  if (with_p) self_p_ = p;
  if (publish) std::memcpy(self_.data(), out, self_.size());
}

void Window::GiveBack(const void* data, double weight, double p) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (returned_.empty()) returned_.assign(self_.size(), 0);
  ScaleAdd(returned_.data(), data, count_, spec_.dtype, weight, true);
  returned_p_ += p;
}

std::vector<int64_t> Window::Versions() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return versions_;
}

double Window::associated_p() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return self_p_;
}

}  // namespace bluefog
