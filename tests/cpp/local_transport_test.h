// What the files of local_transport_tests share: the communicator that main() launched (either
// backend) and its rank and size.
#pragma once

#include "launched_transport.h"
#include "transport/communicator.h"

namespace bluefog {

extern Communicator* transport;
extern TransportInfo info;

}  // namespace bluefog
