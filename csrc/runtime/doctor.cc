#include "runtime/doctor.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>

#include "core/logging.h"
#include "core/timeline.h"
#include "runtime/runtime.h"

namespace bluefog {
namespace {

// A message: its type ('Q' question, 'A' answer), the consultation's number, the text's length,
// then the text.
constexpr size_t kTextOffset = 12;
constexpr size_t kTextLimit = Doctor::kMessageBytes - kTextOffset;
constexpr auto kTick = std::chrono::milliseconds(100);
constexpr size_t kMaxAsked = 4;  // a stall's oldest operations asked about

std::atomic<int (*)(char*, int)> g_frame_provider{nullptr};

// The provider's answer, or why there is none within a second: it takes Python's interpreter
// lock, which a thread computing in Python holds for up to its switch interval (5 ms) at a
// time, and which native code may hold longer. It runs on a thread of its own so that the
// doctor never blocks on it.
std::string PythonFrame() {
  int (*provider)(char*, int) = g_frame_provider.load();
  if (!provider) return "";
  struct Call {
    std::mutex mutex;
    std::condition_variable cv;
    bool done = false;
    std::string text;
  };
  auto call = std::make_shared<Call>();
  std::thread([call, provider] {
    char buf[256];
    const int n = provider(buf, static_cast<int>(sizeof(buf)));
    std::lock_guard<std::mutex> lock(call->mutex);
    call->text.assign(buf, static_cast<size_t>(std::clamp(n, 0, static_cast<int>(sizeof(buf)))));
    call->done = true;
    call->cv.notify_all();
  }).detach();
  std::unique_lock<std::mutex> lock(call->mutex);
  if (!call->cv.wait_for(lock, std::chrono::seconds(1), [&] { return call->done; }))
    return "unknown (Python's interpreter lock was not free within 1 s)";
  return call->text;
}

std::string HostName() {
  char buf[256] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "?";
  return buf;
}

}  // namespace

void SetFrameProvider(int (*provider)(char* buf, int size)) { g_frame_provider = provider; }

Doctor::Doctor(const Options& options, FlightRecorder* recorder, std::unique_ptr<WindowLink> link,
               std::function<std::vector<int>(int)> members)
    : options_(options),
      recorder_(recorder),
      link_(std::move(link)),
      members_(std::move(members)),
      watch_(options.stall_seconds, 0),
      host_(HostName()),
      pid_(static_cast<int>(getpid())),
      buffer_(kMessageBytes) {
  // A lost peer must not stop the doctor: it is what the doctor reports.
  link_->TolerateLostPeers();
  thread_ = std::thread(&Doctor::Loop, this);
}

Doctor::~Doctor() { Stop(false); }

std::string Doctor::Consult() {
  std::unique_lock<std::mutex> lock(mutex_);
  if (stop_ || !broken_.empty())
    return "the hang doctor is not running" + (broken_.empty() ? "" : ": " + broken_);
  const uint64_t target = answered_ + 1;
  ++demands_;
  cv_.notify_all();
  const auto wait = std::chrono::duration<double>(2 * options_.answer_seconds + 2);
  if (!cv_.wait_for(lock, wait, [&] { return answered_ >= target || stop_ || !broken_.empty(); }))
    return "the hang doctor did not finish its consultation in time";
  if (answered_ < target)
    return "the hang doctor stopped" + (broken_.empty() ? "" : ": " + broken_);
  return answer_;
}

std::string Doctor::last_diagnosis() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return last_diagnosis_;
}

void Doctor::Stop(bool release) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (freed_) return;
    freed_ = stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  for (Outgoing& out : sends_) {
    try {
      if (!out.send->Test()) out.send->Cancel();
    } catch (...) {
    }
  }
  sends_.clear();
  try {
    link_->Free(release);
  } catch (...) {
  }
}

void Doctor::Loop() {
  while (true) {
    bool demand = false;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait_for(lock, kTick, [this] { return stop_ || (demands_ > 0 && !current_); });
      if (stop_) return;
      if (!current_ && demands_ > 0) {
        demand = true;
        demands_ = 0;
      }
    }
    try {
      Receive();
      Reap();
      const double now = NowSeconds();
      if (demand) {
        Begin(true, {});
      } else if (!current_ && watch_.enabled() && watch_.Due(now)) {
        double oldest = now;
        recorder_->OldestPending(&oldest);
        if (watch_.Check(now, oldest) == StallWatch::Verdict::kWarn) {
          std::vector<OpBrief> stalled =
              StalledOps(recorder_->Snapshot(), now, options_.stall_seconds);
          if (stalled.size() > kMaxAsked) stalled.resize(kMaxAsked);
          if (!stalled.empty()) Begin(false, std::move(stalled));
        }
      }
      if (current_ && (current_->waiting == 0 || NowSeconds() >= current_->deadline)) Finish();
    } catch (const std::exception& e) {
      BF_LOG(LogLevel::kWarning, "the hang doctor stopped: ", e.what());
      std::lock_guard<std::mutex> lock(mutex_);
      broken_ = e.what();
      cv_.notify_all();
      return;
    }
  }
}

void Doctor::Receive() {
  int src = -1;
  while (link_->ProbeHeader(&src)) {
    link_->ReceiveHeader(src, buffer_.data());
    uint32_t seq = 0, length = 0;
    std::memcpy(&seq, buffer_.data() + 4, 4);
    std::memcpy(&length, buffer_.data() + 8, 4);
    const std::string text(buffer_.data() + kTextOffset, std::min<size_t>(length, kTextLimit));
    if (buffer_[0] == 'Q') {
      Send(src, 'A', seq, EncodeReport(Mine(DecodeQuestion(text)), kTextLimit));
    } else if (buffer_[0] == 'A' && current_ && seq == current_->seq && src >= 0 &&
               src < options_.size && current_->reports[src].status == RankReport::kSilent) {
      current_->reports[src] = DecodeReport(text);
      --current_->waiting;
    }
  }
  // Peers whose connection broke will not answer.
  for (int r : link_->TakeLostPeers()) {
    if (!current_ || r < 0 || r >= options_.size) continue;
    if (current_->reports[r].status == RankReport::kSilent) {
      current_->reports[r].status = RankReport::kLost;
      --current_->waiting;
    }
  }
}

void Doctor::Send(int dst, char type, uint32_t seq, const std::string& text) {
  Outgoing out;
  out.bytes.assign(kMessageBytes, 0);
  out.bytes[0] = type;
  const uint32_t length = static_cast<uint32_t>(std::min(text.size(), kTextLimit));
  std::memcpy(out.bytes.data() + 4, &seq, 4);
  std::memcpy(out.bytes.data() + 8, &length, 4);
  std::memcpy(out.bytes.data() + kTextOffset, text.data(), length);
  out.send = link_->SendHeader(dst, out.bytes.data());
  sends_.push_back(std::move(out));  // the vector's heap block stays where it is
}

void Doctor::Reap() {
  while (!sends_.empty()) {
    bool done = true;
    try {
      done = sends_.front().send->Test();
    } catch (const std::exception&) {
      // The peer is gone; Receive learns it from the link.
    }
    if (!done) break;
    sends_.pop_front();
  }
}

void Doctor::Begin(bool on_demand, std::vector<OpBrief> stalled) {
  auto c = std::make_unique<Consultation>();
  c->seq = next_seq_++;
  c->on_demand = on_demand;
  c->deadline = NowSeconds() + options_.answer_seconds;
  c->reports.resize(options_.size);
  c->reports[options_.rank] = Mine(stalled);
  c->stalled = std::move(stalled);
  try {
    link_->CheckPeers();  // in tolerant mode: marks the ranks known gone
  } catch (const std::exception&) {
  }
  const std::string question = EncodeQuestion(c->stalled, kTextLimit);
  for (int r = 0; r < options_.size; ++r) {
    if (r == options_.rank) continue;
    try {
      Send(r, 'Q', c->seq, question);
      ++c->waiting;
    } catch (const std::exception&) {
      c->reports[r].status = RankReport::kLost;
    }
  }
  current_ = std::move(c);
}

void Doctor::Finish() {
  std::unique_ptr<Consultation> c = std::move(current_);
  const std::string text =
      Diagnose(options_.rank, c->stalled, c->reports, options_.answer_seconds, members_);
  std::lock_guard<std::mutex> lock(mutex_);
  if (c->on_demand) {
    answer_ = text;
    ++answered_;
    cv_.notify_all();
    return;
  }
  last_diagnosis_ = text;
  recorder_->NoteStall(Concat("rank ", options_.rank, ": hang doctor: ", text), NowSeconds());
  BF_LOG(LogLevel::kWarning, "hang doctor: ", text,
         "\n(BLUEFOG_STALL_CHECK_TIME=", options_.stall_seconds, " s; bf.diagnose() asks again)");
}

RankReport Doctor::Mine(const std::vector<OpBrief>& asked) const {
  RankReport report = ReportFrom(recorder_->Snapshot(), NowSeconds(), asked, host_, pid_);
  report.frame = PythonFrame();
  return report;
}

// ---- The runtime's side ------------------------------------------------------------------------

void Runtime::StartDoctor() {
  if (!config_.hang_doctor || info_.size < 2 || !info_.threads_multiple) return;
  try {
    std::unique_ptr<WindowLink> link = transport_->CreateWindowLink(Doctor::kMessageBytes);
    if (!link) return;
    Doctor::Options options;
    options.rank = info_.rank;
    options.size = info_.size;
    options.stall_seconds = config_.stall_check_seconds;
    doctor_ = std::make_unique<Doctor>(options, &recorder_, std::move(link),
                                       [this](int set) { return SetRanks(set); });
  } catch (const std::exception& e) {
    BF_LOG(LogLevel::kWarning, "the hang doctor is off on this rank: ", e.what());
  }
}

std::string Runtime::Diagnose() {
  if (!started_) return "bluefog is not initialized; call bf.init() first";
  if (!doctor_)
    return info_.size < 2 ? "a job of one rank has no other rank to ask"
                          : "the hang doctor is off (BLUEFOG_HANG_DOCTOR=0, or this backend "
                            "cannot run it)";
  return doctor_->Consult();
}

}  // namespace bluefog
