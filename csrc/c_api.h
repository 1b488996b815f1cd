// The extern "C" surface loaded by Python through ctypes. No exception crosses it: functions
// that can fail return 0 on success and -1 on failure, with the message in bluefog_last_error().
#pragma once

#ifdef __cplusplus
extern "C" {
#endif

int bluefog_init(void);
int bluefog_shutdown(void);
int bluefog_is_initialized(void);
int bluefog_rank(void);        // -1 when not initialized
int bluefog_size(void);
int bluefog_local_rank(void);
int bluefog_local_size(void);
int bluefog_mpi_threads_supported(void);
const char* bluefog_last_error(void);  // thread-local; valid until the next failing call

#ifdef __cplusplus
}
#endif
