// The extern "C" surface loaded by Python through ctypes. No exception crosses it: functions
// that can fail return 0 on success and -1 on failure, with the message in bluefog_last_error().
#pragma once

#ifdef __cplusplus
extern "C" {
#endif

int bluefog_init(void);
// bluefog_init with `count` settings (keys[i] = values[i], variable names as in the
// environment) that take precedence over the process's environment: how the Python layer hands
// over what it merged, without writing the environment.
int bluefog_init_with(const char* const* keys, const char* const* values, int count);
int bluefog_shutdown(void);
int bluefog_is_initialized(void);
// Whether this rank's windows still take operations: while initialized, and in fault-tolerant
// mode also after a lost rank failed the collectives, until shutdown.
int bluefog_windows_open(void);
int bluefog_rank(void);  // -1 when not initialized
int bluefog_size(void);
int bluefog_local_rank(void);
int bluefog_local_size(void);
int bluefog_is_homogeneous(void);
int bluefog_mpi_threads_supported(void);
int bluefog_cross_rank(void);  // among the ranks with this local rank (one per host)
int bluefog_cross_size(void);
// The backend running the job: "mpi" or "gloo"; NULL when not initialized.
const char* bluefog_backend(void);
// 1 when this build has the Gloo backend, else 0 (needs no init).
int bluefog_gloo_built(void);
// Records this rank's timeline into `path` (Chrome trace), replacing any open one; stops it.
int bluefog_start_timeline(const char* path);
int bluefog_stop_timeline(void);
// 1 when a timeline is recording, 0 when not, -1 when bluefog is not running.
int bluefog_timeline_enabled(void);
// The run-time switches of benches and tests, by name (transport/options.h's Tuning:
// ring_threshold, one_host_threshold, hierarchical, two_host_split, phased_exchange, direct,
// staged, shared, streaming_stores, recheck_calls, worse_percent, direct_fault_rank, and the
// counts shared_calls, one_host_calls and learning_calls, read-only; and inline_threshold,
// BLUEFOG_INLINE_THRESHOLD of every channel). get: the value into *value; set: from now on on
// this rank, the value before into *before (may be NULL). 0, or -1 when not initialized or for
// an unknown knob (bluefog_last_error names those that exist).
int bluefog_tuning_get(const char* knob, long long* value);
int bluefog_tuning_set(const char* knob, long long value, long long* before);
// Records a user's activity on `tensor`'s track (times: the steady clock, in seconds); returns
// like bluefog_timeline_enabled.
int bluefog_timeline_activity(const char* tensor, const char* activity, double start, double end);
// This rank's flight recorder (its last operations, core/flight_recorder.h) as a JSON array,
// valid until this thread's next call; before init an empty array. Never fails.
const char* bluefog_flight_recorder(void);
// How far behind the first rank each rank's requests arrived at the negotiation over the last
// minute, and the rank consistently last (core/straggler.h), as a JSON object. Never fails.
const char* bluefog_straggler_report(void);
// What every rank of the job is doing, asked now over the hang doctor's link (runtime/doctor.h;
// waits a few seconds at most), or why it cannot be asked; valid until this thread's next call.
// Never fails.
const char* bluefog_diagnose(void);
// The hang doctor's source of the main thread's Python frame: writes at most `size` bytes of
// "file.py:LINE in FUNCTION" into `buf` and returns their number (bluefog/common/python_frames.py;
// called from the doctor's thread, only while answering).
void bluefog_set_frame_provider(int (*provider)(char* buf, int size));
// Operations this process has begun (every kind the flight recorder records, also while it is
// off) and the bytes of their tensors, and the seconds it waited with an operation queued for
// the other ranks (core/flight_recorder.h's Totals), since the process started. Never fails.
int bluefog_op_totals(long long* operations, long long* bytes, double* waiting_seconds);
// This rank's last stall report (BLUEFOG_STALL_CHECK_TIME: the hang doctor's diagnosis, or the
// waiting tensors and the ranks that have not submitted them), valid until this thread's next call,
// with how long ago it was given in *seconds_ago; "" (and 0) before any. Never fails.
const char* bluefog_last_stall(double* seconds_ago);
// 1 when SIGUSR1 prints the flight recorder (bluefog installed the handler at init), else 0.
int bluefog_flight_dump_installed(void);
const char* bluefog_last_error(void);  // thread-local; valid until the next failing call
// 1 when the op (OpType's value) accepts the dtype (DataType's value), 0 when not, -1 for values
// that name no op or dtype. Lets the Python layer check its own table against the core's.
int bluefog_op_accepts_dtype(int op_type, int dtype);

// Process sets. add: every rank passes the same ranks, in the same order of calls; returns the
// new set's id (>= 1) or -1. remove: 0 or -1. rank/size: this rank's index in set `id` and its
// size, -1 when this rank is not in it. ranks: writes up to `capacity` job-wide ranks of the set
// to `out` and returns how many it has (-1: no such set).
int bluefog_add_process_set(const int* ranks, int count);
int bluefog_remove_process_set(int id);
int bluefog_process_set_rank(int id);
int bluefog_process_set_size(int id);
int bluefog_process_set_ranks(int id, int* out, int capacity);

#ifdef __cplusplus
}
#endif
