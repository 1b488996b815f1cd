#include "runtime/flight_dump.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>

#include "core/flight_recorder.h"
#include "core/timeline.h"

namespace bluefog {
namespace {

int g_pipe[2] = {-1, -1};
std::atomic<bool> g_installed{false};

void OnSignal(int) {
  const int saved = errno;
  const char byte = 1;
  [[maybe_unused]] ssize_t n = ::write(g_pipe[1], &byte, 1);  // a full pipe: a dump is due anyway
  errno = saved;
}

std::string Dump(const FlightRecorder& recorder, int rank) {
  const double now = NowSeconds();
  std::string pending = recorder.Pending(now, 50);
  std::string out = "bluefog rank " + std::to_string(rank) + " flight recorder (SIGUSR1): ";
  out += pending.empty() ? "nothing pending" : "pending:" + pending;
  std::string last;
  size_t shown = 0;
  const auto entries = recorder.Snapshot();
  for (size_t k = entries.size() > 10 ? entries.size() - 10 : 0; k < entries.size(); ++k) {
    const FlightEntry& e = entries[k];
    char line[256];
    static const char* const kStates[] = {"queued", "running", "done", "failed"};
    std::snprintf(line, sizeof(line), "\n  #%llu %s '%s' %s, queued %.3f s ago",
                  static_cast<unsigned long long>(e.id), e.kind, e.name, kStates[e.state],
                  now - e.queued_at);
    last += line;
    ++shown;
  }
  out += "\n last " + std::to_string(shown) + " operations:" + (shown ? last : " none") + "\n";
  return out;
}

}  // namespace

void InstallFlightDump(FlightRecorder* recorder, int (*rank)()) {
  static std::once_flag once;
  std::call_once(once, [recorder, rank] {
    struct sigaction current = {};
    if (sigaction(SIGUSR1, nullptr, &current) != 0 || current.sa_handler != SIG_DFL ||
        (current.sa_flags & SA_SIGINFO))
      return;  // someone else's: leave it
    if (pipe2(g_pipe, O_CLOEXEC | O_NONBLOCK) != 0) return;
    const int fl = fcntl(g_pipe[0], F_GETFL);
    fcntl(g_pipe[0], F_SETFL, fl & ~O_NONBLOCK);  // the dumper blocks in read
    std::thread([recorder, rank] {
      char byte;
      for (;;) {
        const ssize_t n = ::read(g_pipe[0], &byte, 1);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return;
        const std::string text = Dump(*recorder, rank());
        std::fwrite(text.data(), 1, text.size(), stderr);
        std::fflush(stderr);
      }
    }).detach();
    struct sigaction action = {};
    action.sa_handler = OnSignal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;
    g_installed = sigaction(SIGUSR1, &action, nullptr) == 0;
  });
}

bool FlightDumpInstalled() { return g_installed.load(); }

}  // namespace bluefog
