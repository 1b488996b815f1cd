// The extern "C" surface loaded by Python through ctypes. No exception crosses it: functions
// that can fail return 0 on success and -1 on failure, with the message in bluefog_last_error().
#pragma once

#ifdef __cplusplus
extern "C" {
#endif

int bluefog_init(void);
int bluefog_shutdown(void);
int bluefog_is_initialized(void);
int bluefog_rank(void);  // -1 when not initialized
int bluefog_size(void);
int bluefog_local_rank(void);
int bluefog_local_size(void);
int bluefog_mpi_threads_supported(void);
const char* bluefog_last_error(void);  // thread-local; valid until the next failing call
// 1 when the op (OpType's value) accepts the dtype (DataType's value), 0 when not, -1 for values
// that name no op or dtype. Lets the Python layer check its own table against the core's.
int bluefog_op_accepts_dtype(int op_type, int dtype);

#ifdef __cplusplus
}
#endif
