// MPI handles kept in opaque words (`void*` members), so that headers outside csrc/transport/mpi
// need not include mpi.h. Not part of any interface.
#pragma once

#include <mpi.h>

namespace bluefog {

inline MPI_Comm& AsComm(void*& p) { return *reinterpret_cast<MPI_Comm*>(&p); }

}  // namespace bluefog
