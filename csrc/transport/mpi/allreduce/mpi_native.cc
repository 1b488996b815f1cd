// MPI_Allreduce: the lowest latency for small buffers, and every call no other algorithm takes.
#include <mpi.h>

#include <algorithm>

#include "core/reduce_kernels.h"
#include "transport/mpi/allreduce/algorithms.h"
#include "transport/mpi/comm_handle.h"
#include "transport/mpi/mpi_communicator.h"

namespace bluefog {
namespace {

// Large transfers are split so each MPI count fits in an int.
constexpr int64_t kMaxChunkBytes = int64_t{1} << 30;

}  // namespace

void MpiNativeAllreduce::Run(const AllreduceCall& call) {
  const MPI_Op op = MpiOpFor(comm_->reduce_op(), call.dtype, call.op);
  const int64_t elem = static_cast<int64_t>(ElementSize(call.dtype));
  const int64_t chunk = kMaxChunkBytes / elem;
  const char* src = static_cast<const char*>(call.in);
  char* dst = static_cast<char*>(call.out);
  for (int64_t done = 0; done < call.count; done += chunk) {
    int len = static_cast<int>(std::min(chunk, call.count - done));
    const void* send = src == dst ? MPI_IN_PLACE : src + done * elem;
    comm_->Check(
        MPI_Allreduce(send, dst + done * elem, len, ToMpi(call.dtype), op, CommOf(comm_->comm())),
        "MPI_Allreduce");
  }
  if (call.divisor > 1) DivideBy(call.out, call.count, call.dtype, call.divisor);
}

}  // namespace bluefog
