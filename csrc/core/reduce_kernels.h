// Elementwise arithmetic the core does itself: summing (for custom MPI ops and our own
// reductions) and scaling (averaging). Half types are summed in float32 and rounded once.
#pragma once

#include <cstdint>

#include "core/types.h"

namespace bluefog {

float HalfToFloat(uint16_t h);
uint16_t FloatToHalf(float f);
float BFloat16ToFloat(uint16_t b);
uint16_t FloatToBFloat16(float f);

// inout[i] += in[i] for i < count. Throws kInvalidArgument for dtypes without a sum (bool).
void SumInto(void* inout, const void* in, int64_t count, DataType dtype);
// out[i] = a[i] + b[i], then divided by `divisor` when it is above 1, with the same rounding
// as SumInto followed by DivideBy (so every path gives identical results). `out` may equal `a`.
// One pass over memory instead of a copy, a sum and a division.
void SumOf(void* out, const void* a, const void* b, int64_t count, DataType dtype, int64_t divisor);
// out[i] = a[i] op b[i] for min, max and product (sum: SumOf). Half types go through float32
// and are rounded once. Floating-point min and max return NaN when either input is NaN.
// `out` may equal `a`.
void ReduceOf(void* out, const void* a, const void* b, int64_t count, DataType dtype, ReduceOp op);
// One step of a reduction over ranks: SumOf (dividing by `divisor`) for a sum, else ReduceOf
// (`divisor` unused). `out` may equal `a` or `b`: each element is read before it is written.
void ReduceStep(void* out, const void* a, const void* b, int64_t count, DataType dtype, ReduceOp op,
                int64_t divisor);
// data[i] = the identity of `op` for `dtype`: what a rank that takes part without a value
// (a joined rank, bf.join()) contributes so that the others' result is unchanged. 0 for a sum,
// 1 for a product, the largest value (+inf for floats) for min, the lowest (-inf) for max.
// Throws kInvalidArgument for dtypes without the reduction (bool).
void FillIdentity(void* data, int64_t count, DataType dtype, ReduceOp op);
// data[i] /= divisor. Integers use truncating division, as C++ does.
void DivideBy(void* data, int64_t count, DataType dtype, int64_t divisor);
// out[i] = weight * in[i] (+ out[i] when accumulate). Floating-point dtypes only; `in` may
// equal `out`.
void ScaleAdd(void* out, const void* in, int64_t count, DataType dtype, double weight,
              bool accumulate);
// memcpy with non-temporal stores on x86-64: the destination's lines are written past the
// caches, without first reading their old contents (a plain store reads each line it writes),
// and are not left in cache. Ends with a store fence, so a later release (a sync) publishes
// them. Plain memcpy elsewhere. For outputs larger than what stays in cache.
void StreamCopy(void* dst, const void* src, size_t bytes);

}  // namespace bluefog
