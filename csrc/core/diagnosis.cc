#include "core/diagnosis.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <sstream>

namespace bluefog {
namespace {

constexpr size_t kMaxListed = 16;  // ranks named per operation before "... and N more"

bool Pending(const FlightEntry& e) {
  return e.state == FlightEntry::kQueued || e.state == FlightEntry::kRunning;
}

OpBrief BriefOf(const FlightEntry& e, double age) {
  static const char kStates[] = {'Q', 'R', 'D', 'F'};
  OpBrief b;
  b.kind = e.kind;
  b.name = e.name;
  b.process_set = e.process_set;
  b.state = kStates[e.state];
  b.age = age;
  return b;
}

bool Same(const OpBrief& a, const FlightEntry& e) {
  return a.kind == e.kind && a.name == e.name && a.process_set == e.process_set;
}

bool Same(const OpBrief& a, const OpBrief& b) {
  return a.kind == b.kind && a.name == b.name && a.process_set == b.process_set;
}

// Tabs and line ends would break the wire's fields; nothing else needs escaping.
std::string Clean(const std::string& s, size_t max) {
  std::string out = s.substr(0, max);
  for (char& c : out)
    if (c == '\t' || c == '\n' || c == '\r') c = ' ';
  return out;
}

std::string Line(char tag, const OpBrief& b) {
  char head[64];
  std::snprintf(head, sizeof(head), "%c\t%d\t%c\t%.1f\t", tag, b.process_set, b.state, b.age);
  return head + Clean(b.kind, 24) + "\t" + Clean(b.name, 96) + "\n";
}

bool ParseLine(const std::string& line, char* tag, OpBrief* b) {
  std::vector<std::string> f;
  std::stringstream in(line);
  for (std::string field; std::getline(in, field, '\t');) f.push_back(field);
  if (f.size() < 5 || f[0].size() != 1) return false;
  *tag = f[0][0];
  b->process_set = std::atoi(f[1].c_str());
  b->state = f[2].empty() ? 'N' : f[2][0];
  b->age = std::atof(f[3].c_str());
  b->kind = f[4];
  b->name = f.size() > 5 ? f[5] : "";
  return true;
}

std::string Seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f s", s);
  return buf;
}

std::string Op(const OpBrief& b) { return b.kind + " '" + b.name + "'"; }

// What an answering rank is doing, as the end of a sentence.
std::string Doing(const RankReport& r, const OpBrief* besides, const std::string* said = nullptr) {
  std::string out;
  size_t shown = 0, more = 0;
  for (const OpBrief& p : r.pending) {
    if (besides && Same(*besides, p)) continue;
    if (shown++ == 0) {
      out = "it is in " + Op(p) +
            (p.process_set ? " (process set " + std::to_string(p.process_set) + ")" : "") +
            (p.state == 'R' ? ", exchanging," : "") + " since " + Seconds(p.age);
    } else {
      ++more;
    }
  }
  if (more) out += " (and " + std::to_string(more) + " more pending)";
  if (out.empty()) {
    out = r.last_done.state == 'N'
              ? "it is in no bluefog operation and has finished none it remembers"
              : "it is in no bluefog operation: its last, " + Op(r.last_done) + ", ended " +
                    Seconds(r.last_done.age) +
                    " ago (it computes, reads input, sleeps or waits in Python)";
  }
  if (!r.frame.empty()) out += "; its main thread is at " + r.frame;
  for (const OpBrief& m : r.mutexes)
    if (!said || m.name != *said)
      out += "; it holds the mutex of window '" + m.name + "' since " + Seconds(m.age);
  return out;
}

std::string Unreachable(int rank, const RankReport& r, double wait) {
  if (r.status == RankReport::kLost)
    return "rank " + std::to_string(rank) + " is gone: its connection to this rank broke";
  return "rank " + std::to_string(rank) + " did not answer within " + Seconds(wait) +
         ": it is stopped (SIGSTOP), dead, or its process is frozen";
}

}  // namespace

std::vector<OpBrief> StalledOps(const std::vector<FlightEntry>& entries, double now,
                                double min_age) {
  std::vector<OpBrief> out;
  for (const FlightEntry& e : entries)
    if (Pending(e) && now - e.queued_at >= min_age) out.push_back(BriefOf(e, now - e.queued_at));
  return out;
}

RankReport ReportFrom(const std::vector<FlightEntry>& entries, double now,
                      const std::vector<OpBrief>& asked, const std::string& host, int pid) {
  RankReport r;
  r.status = RankReport::kAnswered;
  r.host = host;
  r.pid = pid;
  std::map<std::string, double> held;  // window -> acquired at
  const FlightEntry* last = nullptr;
  for (const FlightEntry& e : entries) {  // oldest first
    if (Pending(e)) {
      if (r.pending.size() < RankReport::kMaxPending)
        r.pending.push_back(BriefOf(e, now - e.queued_at));
    } else if (!last || e.ended_at >= last->ended_at) {
      last = &e;
    }
    if (!std::strcmp(e.kind, "win_mutex_acquire") && e.state == FlightEntry::kDone)
      held[e.name] = e.ended_at;
    if (!std::strcmp(e.kind, "win_mutex_release")) held.erase(e.name);
  }
  if (last) r.last_done = BriefOf(*last, now - last->ended_at);
  for (const auto& [window, since] : held) {
    OpBrief m;
    m.kind = "win_mutex";
    m.name = window;
    m.state = 'D';
    m.age = now - since;
    r.mutexes.push_back(m);
  }
  for (OpBrief a : asked) {
    a.state = 'N';
    a.age = 0;
    for (const FlightEntry& e : entries) {  // the latest entry of that name decides
      if (!Same(a, e)) continue;
      a.state = Pending(e) ? 'P' : 'D';
      a.age = Pending(e) ? now - e.queued_at : now - e.ended_at;
    }
    r.asked.push_back(a);
  }
  return r;
}

std::string EncodeQuestion(const std::vector<OpBrief>& ops, size_t limit) {
  std::string out;
  for (const OpBrief& op : ops) {
    std::string line = Line('Q', op);
    if (out.size() + line.size() > limit) break;
    out += line;
  }
  return out;
}

std::vector<OpBrief> DecodeQuestion(const std::string& text) {
  std::vector<OpBrief> out;
  std::stringstream in(text);
  for (std::string line; std::getline(in, line);) {
    char tag;
    OpBrief b;
    if (ParseLine(line, &tag, &b) && tag == 'Q') out.push_back(b);
  }
  return out;
}

std::string EncodeReport(const RankReport& report, size_t limit) {
  // In order of what the asker needs most; what does not fit is left out.
  std::string out = "H\t" + std::to_string(report.pid) + "\t" + Clean(report.host, 64) + "\n";
  auto add = [&](const std::string& line) {
    if (out.size() + line.size() <= limit) out += line;
  };
  for (const OpBrief& a : report.asked) add(Line('A', a));
  if (!report.frame.empty()) add("F\t" + Clean(report.frame, 160) + "\n");
  if (report.last_done.state != 'N') add(Line('L', report.last_done));
  for (const OpBrief& m : report.mutexes) add(Line('M', m));
  for (const OpBrief& p : report.pending) add(Line('P', p));
  return out.size() <= limit ? out : std::string();
}

RankReport DecodeReport(const std::string& text) {
  RankReport r;
  r.status = RankReport::kAnswered;
  std::stringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("H\t", 0) == 0) {
      const size_t tab = line.find('\t', 2);
      r.pid = std::atoi(line.substr(2, tab - 2).c_str());
      if (tab != std::string::npos) r.host = line.substr(tab + 1);
      continue;
    }
    if (line.rfind("F\t", 0) == 0) {
      r.frame = line.substr(2);
      continue;
    }
    char tag;
    OpBrief b;
    if (!ParseLine(line, &tag, &b)) continue;
    if (tag == 'A') r.asked.push_back(b);
    if (tag == 'L') r.last_done = b;
    if (tag == 'M') r.mutexes.push_back(b);
    if (tag == 'P') r.pending.push_back(b);
  }
  return r;
}

std::string Diagnose(int me, const std::vector<OpBrief>& stalled,
                     const std::vector<RankReport>& reports, double answer_wait,
                     const std::function<std::vector<int>(int)>& members) {
  std::ostringstream out;
  const int size = static_cast<int>(reports.size());
  if (stalled.empty()) {
    out << "what every rank is doing:";
    for (int r = 0; r < size; ++r) {
      const RankReport& rep = reports[r];
      out << "\n  ";
      if (rep.status != RankReport::kAnswered) {
        out << Unreachable(r, rep, answer_wait);
        continue;
      }
      out << "rank " << r << " (" << rep.host << ", pid " << rep.pid
          << "): " << Doing(rep, nullptr);
    }
    return out.str();
  }
  for (size_t s = 0; s < stalled.size(); ++s) {
    const OpBrief& op = stalled[s];
    const bool mutex = op.kind == "win_mutex_acquire";
    if (s) out << "\n";
    out << Op(op);
    if (op.process_set) out << " (process set " << op.process_set << ")";
    out << " has waited " << Seconds(op.age) << " on rank " << me << ".";
    std::vector<int> waiting_too;
    size_t named = 0, unnamed = 0, holders = 0;
    auto say = [&](const std::string& sentence) {
      if (named++ < kMaxListed)
        out << "\n  " << sentence << ".";
      else
        ++unnamed;
    };
    for (int r : members(op.process_set)) {
      if (r == me || r < 0 || r >= size) continue;
      const RankReport& rep = reports[r];
      if (rep.status != RankReport::kAnswered) {
        say(Unreachable(r, rep, answer_wait));
        continue;
      }
      if (mutex) {
        for (const OpBrief& m : rep.mutexes) {
          if (m.name != op.name) continue;
          ++holders;
          say("rank " + std::to_string(r) + " holds the mutex of window '" + m.name + "' since " +
              Seconds(m.age) + "; " + Doing(rep, nullptr, &op.name));
        }
        continue;
      }
      const OpBrief* theirs = nullptr;
      for (const OpBrief& a : rep.asked)
        if (Same(a, op)) theirs = &a;
      const char state = theirs ? theirs->state : 'N';
      const std::string who = "rank " + std::to_string(r);
      if (state == 'P') {
        waiting_too.push_back(r);
      } else if (state == 'D' && theirs->age > op.age) {
        // It finished that name before this rank submitted it: an earlier step's.
        say(who + " has not called " + Op(op) + " again; " + Doing(rep, &op));
      } else if (state == 'D') {
        say(who + " already finished " + Op(op) + " " + Seconds(theirs->age) + " ago (it ran it " +
            "more often than this rank, or under another process set); " + Doing(rep, &op));
      } else if (op.kind.rfind("win_", 0) != 0) {
        say(who + " never called " + Op(op) + "; " + Doing(rep, &op));
      }
    }
    if (unnamed) out << "\n  ... and " << unnamed << " more ranks.";
    if (mutex && holders == 0) out << "\n  No rank that answered holds that mutex.";
    if (!waiting_too.empty() && named == 0)
      out << "\n  Every other rank has it pending too: the transfer itself is stuck or slow.";
  }
  return out.str();
}

}  // namespace bluefog
