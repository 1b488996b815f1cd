// Data types, op kinds and tensor metadata shared by every layer of the core.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace bluefog {

enum class DataType : uint8_t {
  kUInt8 = 0,
  kInt8,
  kUInt16,
  kInt16,
  kInt32,
  kInt64,
  kFloat16,
  kBFloat16,
  kFloat32,
  kFloat64,
  kBool,
};
constexpr int kNumDataTypes = 11;

enum class OpType : uint8_t {
  kAllreduce = 0,
  kAllgather,
  kBroadcast,
  kNeighborAllreduce,
  kNeighborAllgather,
  // The transpose of neighbor_allgather (its gradient): the input is the concatenation of one
  // block per send rank, block k sized like send_ranks[k]'s output; each rank sums the blocks
  // addressed to it by its recv ranks.
  kNeighborAllgatherGrad,
  // Rank r sends rows [offset_j, offset_j + splits[j]) of its tensor to rank j and receives the
  // concatenation, in rank order, of what every rank sends it.
  kAlltoall,
  // The sum (or average) over ranks, of which rank r keeps its slice of dimension 0
  // (ReducescatterRows).
  kReducescatter,
  // bf.join(): this rank has no more data. Until every rank has joined, it takes part in the
  // other ranks' allreduces (with the identity of the reduction) and allgathers (with no rows).
  kJoin,
  // Registering and removing a process set (send_ranks: its ranks, or {id} to remove). Agreed
  // on the global channel like a collective, so every rank does it at the same point.
  kAddProcessSet,
  kRemoveProcessSet,
  // Creating and freeing a window (bf.win_create, bf.win_free): agreed on the global channel so
  // every rank makes (and drops) its buffers at the same point. win_create's send_ranks and
  // recv_ranks are the window's out- and in-neighbours; win_free's splits hold one number, how
  // many of this rank's operations on the window have not finished.
  kWinCreate,
  kWinFree,
};
constexpr int kNumOpTypes = 13;
bool IsNeighborOp(OpType op);

// How allreduce combines the ranks' values (elementwise). Averaging is a sum divided by the
// number of ranks.
enum class ReduceOp : uint8_t {
  kSum = 0,
  kMin,
  kMax,
  kProduct,
};
constexpr int kNumReduceOps = 4;
const char* ReduceOpName(ReduceOp op);
bool IsValidReduceOp(int value);

size_t ElementSize(DataType dtype);
const char* DataTypeName(DataType dtype);
const char* OpTypeName(OpType op);
bool IsValidDataType(int value);
bool IsValidOpType(int value);

// What a rank announces about one request; every rank must agree on it (up to the rules of the op).
struct TensorMeta {
  std::string name;
  OpType op = OpType::kAllreduce;
  DataType dtype = DataType::kFloat32;
  int32_t root_rank = -1;               // broadcast only; -1 otherwise
  ReduceOp reduce_op = ReduceOp::kSum;  // allreduce only
  std::vector<int64_t> shape;
  // Neighbor ops: the ranks this rank sends to and receives from in this call, ascending.
  std::vector<int32_t> send_ranks;
  std::vector<int32_t> recv_ranks;
  // neighbor_allgather_grad only: dimension 0 of the input (shape holds the output's shape).
  int64_t input_rows = -1;
  // alltoall only: the rows of dimension 0 this rank sends to each rank (one entry per rank).
  std::vector<int64_t> splits;
  // allreduce and reducescatter: whether the sum is divided by the number of ranks, and (floats
  // only) the factor it is multiplied by: Horovod's prescale_factor times its postscale_factor,
  // applied once, after the sum. Agreed, because they decide how the collective divides (the
  // ring divides each rank's segment before sending it on).
  bool average = false;
  double scale = 1.0;
  // allreduce and reducescatter of a grouped op (grouped_allreduce, grouped_reducescatter): how
  // many tensors this rank's op holds, named BASE.0 .. BASE.(n-1) (GroupBase); 0 outside a
  // group. Agreed, so that ranks passing different numbers of tensors fail instead of waiting
  // for tensors that never come.
  int32_t group_size = 0;

  int64_t NumElements() const;
  size_t NumBytes() const { return static_cast<size_t>(NumElements()) * ElementSize(dtype); }
};

std::string ShapeString(const std::vector<int64_t>& shape);
// The BASE of a grouped request's name BASE.i, and i in *index; false when `name` has no such
// form.
bool GroupBase(const std::string& name, std::string* base, int64_t* index);

}  // namespace bluefog
