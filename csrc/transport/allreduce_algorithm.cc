#include "transport/allreduce_algorithm.h"

#include "core/status.h"

namespace bluefog {

void RunAllreduce(const std::vector<AllreduceAlgorithm*>& list, const void* in, void* out,
                  int64_t count, DataType dtype, ReduceOp op, int64_t divisor) {
  BF_ENFORCE(op == ReduceOp::kSum || divisor == 1, StatusCode::kInternal,
             "only a sum can be averaged (PlanAverage decides who divides)");
  const AllreduceCall call{
      in, out, count, dtype, op, divisor, count * static_cast<int64_t>(ElementSize(dtype))};
  for (AllreduceAlgorithm* algorithm : list) {
    if (algorithm->AppliesTo(call)) {
      algorithm->Run(call);
      return;
    }
  }
}

std::vector<AllreduceAlgorithm*> ForceAllreduce(std::vector<AllreduceAlgorithm*> list,
                                                const std::string& forced, bool must, int rank,
                                                const char* backend) {
  if (forced.empty() || list.empty()) return list;
  std::string names;
  for (AllreduceAlgorithm* a : list) {
    if (forced == a->name()) {
      if (a == list.back()) return {a};
      return {a, list.back()};
    }
    names += (names.empty() ? "" : ", ") + std::string(a->name());
  }
  if (!must) return list;
  const bool one_host = forced == "one-host" || forced == "direct";
  const bool known = one_host || forced == "hierarchical" || forced == "ring" || forced == "mpi" ||
                     forced == "gloo";
  const std::string why =
      one_host ? "the one-host algorithms (one-host, direct) need every rank on one host, and "
                 "this job's ranks are on several"
      : forced == "hierarchical"
          ? "the hierarchical allreduce needs several hosts with the same number of ranks on "
            "each, at least two per host"
      : known ? Concat("it is not the ", backend, " backend's")
              : "no allreduce algorithm is called so";
  throw BluefogError(StatusCode::kInvalidArgument,
                     Concat("rank ", rank, ": BLUEFOG_ALLREDUCE_ALGORITHM=", forced,
                            " cannot run in this job: ", why,
                            ". This job's allreduce "
                            "algorithms (",
                            backend, " backend): ", names,
                            ". Set it to one of those, or unset it to let each call take the "
                            "first that applies"));
}

}  // namespace bluefog
