// SIGUSR1 prints this rank's flight recorder: what it has pending and its last operations, on
// stderr, from a thread of its own (a signal handler may only write to a pipe), so that a rank
// stuck inside a collective still answers.
#pragma once

namespace bluefog {

class FlightRecorder;

// Installs the handler once per process, unless SIGUSR1 already has a handler other than the
// default (the user's own, or one installed before bluefog's; Python's faulthandler chains to
// ours when registered after it). `recorder` must outlive the process; `rank` is read at each
// dump through the callback the runtime passes.
void InstallFlightDump(FlightRecorder* recorder, int (*rank)());
// Whether SIGUSR1 is the flight recorder's (the Python layer then chains every thread's stack).
bool FlightDumpInstalled();

}  // namespace bluefog
