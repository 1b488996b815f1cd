#include "transport/options.h"

namespace bluefog {
namespace {

// A switch or a number, read and written as int64 by name.
template <typename T>
int64_t Load(const std::atomic<T>& a) {
  return static_cast<int64_t>(a.load(std::memory_order_relaxed));
}

}  // namespace

bool Tuning::Get(const std::string& knob, int64_t* value) const {
  if (knob == "ring_threshold")
    *value = Load(ring_threshold_bytes);
  else if (knob == "one_host_threshold")
    *value = Load(one_host_threshold_bytes);
  else if (knob == "hierarchical")
    *value = Load(hierarchical);
  else if (knob == "two_host_split")
    *value = Load(two_host_split);
  else if (knob == "phased_exchange")
    *value = Load(phased_exchange);
  else if (knob == "direct")
    *value = Load(direct);
  else if (knob == "staged")
    *value = Load(staged);
  else if (knob == "shared")
    *value = Load(shared);
  else if (knob == "streaming_stores")
    *value = Load(streaming_store_bytes);
  else if (knob == "recheck_calls")
    *value = Load(recheck_calls);
  else if (knob == "worse_percent")
    *value = static_cast<int64_t>(worse.load() * 100 + 0.5);
  else if (knob == "direct_fault_rank")
    *value = Load(direct_fault_rank);
  else if (knob == "graph_join_us")
    *value = Load(graph_join_us);
  else if (knob == "shared_calls")
    *value = Load(shared_calls);
  else if (knob == "one_host_calls")
    *value = Load(one_host_calls);
  else if (knob == "learning_calls")
    *value = Load(learning_calls);
  else if (knob == "cross_host")
    *value = Load(cross_host);
  else if (knob == "cross_host_calls")
    *value = Load(cross_host_calls);
  else
    return false;
  return true;
}

bool Tuning::Set(const std::string& knob, int64_t value, int64_t* before) {
  if (knob == "shared_calls" || knob == "one_host_calls" || knob == "learning_calls" ||
      knob == "cross_host_calls" || !Get(knob, before))
    return false;
  const bool on = value != 0;
  if (knob == "ring_threshold")
    ring_threshold_bytes = value;
  else if (knob == "one_host_threshold")
    one_host_threshold_bytes = value;
  else if (knob == "hierarchical")
    hierarchical = on;
  else if (knob == "two_host_split")
    two_host_split = on;
  else if (knob == "phased_exchange")
    phased_exchange = on;
  else if (knob == "direct")
    direct = on;
  else if (knob == "staged")
    staged = on;
  else if (knob == "shared")
    shared = on;
  else if (knob == "streaming_stores")
    streaming_store_bytes = value;
  else if (knob == "recheck_calls")
    recheck_calls = value;
  else if (knob == "worse_percent")
    worse = static_cast<double>(value) / 100.0;
  else if (knob == "direct_fault_rank")
    direct_fault_rank = value;
  else if (knob == "graph_join_us")
    graph_join_us = value;
  else if (knob == "cross_host")
    cross_host = on;
  return true;
}

}  // namespace bluefog
