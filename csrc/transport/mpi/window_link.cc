// The window service's link on MPI: two duplicates of the world communicator (one for the
// messages, one for the barriers of create and free), a tag for headers and one for data, so
// that MPI's non-overtaking order per sender, communicator and tag keeps each header before its
// data.
#include <mpi.h>

#include "core/status.h"
#include "transport/mpi/comm_handle.h"
#include "transport/mpi/mpi_communicator.h"

namespace bluefog {
namespace {

constexpr int kHeaderTag = 71;
constexpr int kDataTag = 72;

void CheckMpi(int code, const char* call) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, text, &len);
  throw BluefogError(StatusCode::kInternal, Concat(call, " failed: ", std::string(text, len)));
}

class MpiSend : public WindowLink::Send {
 public:
  MPI_Request request = MPI_REQUEST_NULL;
  ~MpiSend() override {
    if (request != MPI_REQUEST_NULL) MPI_Request_free(&request);
  }
  bool Test() override {
    int done = 0;
    CheckMpi(MPI_Test(&request, &done, MPI_STATUS_IGNORE), "MPI_Test");
    return done != 0;
  }
  void Cancel() override {
    if (request == MPI_REQUEST_NULL) return;
    MPI_Cancel(&request);
    MPI_Request_free(&request);
  }
};

class MpiWindowLink : public WindowLink {
 public:
  MpiWindowLink(MPI_Comm world, size_t header_bytes) : header_bytes_(header_bytes) {
    CheckMpi(MPI_Comm_dup(world, &comm_), "MPI_Comm_dup");
    CheckMpi(MPI_Comm_dup(world, &ctl_comm_), "MPI_Comm_dup");
  }
  ~MpiWindowLink() override = default;  // Free releases the communicators, or leaves them

  void Barrier() override { CheckMpi(MPI_Barrier(ctl_comm_), "MPI_Barrier"); }

  std::unique_ptr<Send> SendHeader(int dst, const void* header) override {
    return Isend(dst, kHeaderTag, header, header_bytes_);
  }
  std::unique_ptr<Send> SendData(int dst, const void* data, size_t bytes) override {
    return Isend(dst, kDataTag, data, bytes);
  }

  bool ProbeHeader(int* src) override {
    int flag = 0;
    MPI_Status st;
    CheckMpi(MPI_Iprobe(MPI_ANY_SOURCE, kHeaderTag, comm_, &flag, &st), "MPI_Iprobe");
    if (flag) *src = st.MPI_SOURCE;
    return flag != 0;
  }
  void ReceiveHeader(int src, void* header) override {
    CheckMpi(MPI_Recv(header, static_cast<int>(header_bytes_), MPI_BYTE, src, kHeaderTag, comm_,
                      MPI_STATUS_IGNORE),
             "MPI_Recv");
  }
  void ReceiveData(int src, void* data, size_t bytes) override {
    CheckMpi(
        MPI_Recv(data, static_cast<int>(bytes), MPI_BYTE, src, kDataTag, comm_, MPI_STATUS_IGNORE),
        "MPI_Recv");
  }

  void Free(bool release) override {
    if (freed_) return;
    freed_ = true;
    if (!release) return;
    MPI_Comm_free(&comm_);
    MPI_Comm_free(&ctl_comm_);
  }

 private:
  std::unique_ptr<Send> Isend(int dst, int tag, const void* data, size_t bytes) {
    auto send = std::make_unique<MpiSend>();
    CheckMpi(MPI_Isend(data, static_cast<int>(bytes), MPI_BYTE, dst, tag, comm_, &send->request),
             "MPI_Isend");
    return send;
  }

  size_t header_bytes_;
  MPI_Comm comm_ = MPI_COMM_NULL;      // the messages
  MPI_Comm ctl_comm_ = MPI_COMM_NULL;  // the barriers of create and free
  bool freed_ = false;
};

}  // namespace

std::unique_ptr<WindowLink> MpiCommunicator::CreateWindowLink(size_t header_bytes) {
  return std::make_unique<MpiWindowLink>(CommOf(comm_), header_bytes);
}

}  // namespace bluefog
