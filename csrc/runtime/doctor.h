// The hang doctor: when an operation of this rank has waited past the stall time
// (BLUEFOG_STALL_CHECK_TIME), it asks every other rank what it is doing and prints one
// diagnosis naming the culprit ("rank 3 never called allreduce 'grad.7'; it is in broadcast 'w'
// since 41.0 s", "rank 2 holds the mutex of window 'w' since 30.0 s", "rank 1 did not answer").
// It asks over a point-to-point link of its own (the backend's WindowLink, made at init), served
// by a thread of its own, so that it works while the collectives' data path is the stuck part
// and while the rank's Python thread sleeps. bf.diagnose() asks the same way on demand. The
// reasoning itself is core/diagnosis.h.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/diagnosis.h"
#include "core/flight_recorder.h"
#include "core/stall_report.h"
#include "transport/window_link.h"

namespace bluefog {

// Where the main thread's Python code is ("train.py:88 in step"): the Python layer's callback
// (bluefog/common/python_frames.py), asked only while answering a question, with a time limit.
void SetFrameProvider(int (*provider)(char* buf, int size));

class Doctor {
 public:
  // The fixed size of the link's messages (a question or an answer, text included).
  static constexpr size_t kMessageBytes = 2048;

  struct Options {
    int rank = 0;
    int size = 1;
    double stall_seconds = 60;  // 0: only on demand
    double answer_seconds = 3;  // how long a consultation waits for the answers
  };
  // `members(set)`: the job-wide ranks of a process set. Starts the doctor's thread.
  Doctor(const Options& options, FlightRecorder* recorder, std::unique_ptr<WindowLink> link,
         std::function<std::vector<int>(int)> members);
  ~Doctor();

  // Asks every rank now and returns what each is doing (waits at most answer_seconds for the
  // answers, plus a tick). Any thread.
  std::string Consult();
  // The last diagnosis printed after a stall (empty: none yet).
  std::string last_diagnosis() const;
  // Stops the thread and frees the link (`release` false: leaves its connections as they are,
  // after a failure). Idempotent.
  void Stop(bool release);

 private:
  struct Outgoing {
    std::vector<char> bytes;
    std::unique_ptr<WindowLink::Send> send;
  };
  struct Consultation {
    uint32_t seq = 0;
    bool on_demand = false;
    double deadline = 0;
    std::vector<OpBrief> stalled;
    std::vector<RankReport> reports;
    int waiting = 0;  // answers still to come
  };

  void Loop();
  void Receive();  // answers questions, collects answers
  void Send(int dst, char type, uint32_t seq, const std::string& text);
  void Reap();
  void Begin(bool on_demand, std::vector<OpBrief> stalled);
  void Finish();
  RankReport Mine(const std::vector<OpBrief>& asked) const;

  const Options options_;
  FlightRecorder* recorder_;
  std::unique_ptr<WindowLink> link_;
  std::function<std::vector<int>(int)> members_;
  StallWatch watch_;  // when a pending operation deserves a consultation
  std::string host_;
  int pid_ = 0;
  std::thread thread_;
  std::deque<Outgoing> sends_;
  std::vector<char> buffer_;
  std::unique_ptr<Consultation> current_;  // the doctor's thread's
  uint32_t next_seq_ = 1;

  mutable std::mutex mutex_;  // guards what follows
  std::condition_variable cv_;
  bool stop_ = false;
  bool freed_ = false;
  std::string broken_;  // why the doctor stopped on its own
  int demands_ = 0;     // consultations asked for and not begun
  uint64_t answered_ = 0, begun_ = 0;
  std::string answer_;  // the last on-demand consultation's
  std::string last_diagnosis_;
};

}  // namespace bluefog
