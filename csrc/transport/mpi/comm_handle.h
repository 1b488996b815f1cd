// MPI handles kept in opaque words (`void*` members), so that headers outside csrc/transport/mpi
// need not include mpi.h; and the MPI types and operations for bluefog's. Internal to the MPI
// backend.
#pragma once

#include <mpi.h>

#include "core/types.h"

namespace bluefog {

inline MPI_Comm& AsComm(void*& p) { return *reinterpret_cast<MPI_Comm*>(&p); }
inline MPI_Comm CommOf(void* p) { return *reinterpret_cast<MPI_Comm*>(&p); }
inline MPI_Op& AsOp(void*& p) { return *reinterpret_cast<MPI_Op*>(&p); }

MPI_Datatype ToMpi(DataType dtype);
// What MPI has no operation for (sums of the 16-bit floats; min, max and product, whose NaN
// handling must match bluefog's own algorithms) goes through bluefog's kernels as one MPI op,
// `ours` (made with MPI_Op_create(BluefogReduce, ...)). Returns MPI_SUM where MPI can sum the
// dtype itself, else `ours`, with the context its callback reads set for this thread (MPI calls
// it on the thread that called the collective).
MPI_Op MpiOpFor(void* ours, DataType dtype, ReduceOp op);
void BluefogReduce(void* in, void* inout, int* len, MPI_Datatype*);

}  // namespace bluefog
