// The rules of each op that do not depend on other ranks, stated once: which dtypes it accepts,
// and how its errors are worded. The TensorFlow registrations, the Python layer (through the C
// API, in a test) and the runtime's validation all read this table.
#pragma once

#include <string>

#include "core/status.h"
#include "core/types.h"

namespace bluefog {

// float16, bfloat16, float32, float64: what weighted and scaled reductions accept.
bool IsFloat(DataType dtype);
// Whether `op` accepts tensors of `dtype`.
bool OpAcceptsDtype(OpType op, DataType dtype);
// Why `op` refuses `dtype` and what to do, as the end of a sentence that starts with the dtype:
// "cannot be summed; cast it to an integer or float dtype first". Empty when it is accepted.
const char* DtypeRefusal(OpType op);
// Whether the op concatenates along dimension 0, so its tensors need a rank of at least 1.
bool NeedsDimensionZero(OpType op);

// How reducescatter splits dimension 0 (as Horovod does): every rank gets rows / size rows, and
// the first rows % size ranks one more. Rank r keeps rows [FirstRow, FirstRow + Rows).
int64_t ReducescatterRows(int64_t rows, int size, int rank);
int64_t ReducescatterFirstRow(int64_t rows, int size, int rank);

// "bluefog allreduce of tensor 'NAME'": what every error about one request starts with.
std::string OpContext(OpType op, const std::string& name);
// `what` about one request: "bluefog OP of tensor 'NAME': what".
Status OpError(StatusCode code, OpType op, const std::string& name, const std::string& what);
// The same message prefixed with the reporting rank: "rank R: ...". Ranks are added where a
// status leaves the runtime, so a message is prefixed once.
Status WithRank(int rank, const Status& status);

}  // namespace bluefog
