// Per-block quantization of float32 for compressed collectives: each block of `block` values
// shares one float32 scale (its largest magnitude over 127 for 8 bits, over 7 for 4 bits), and
// each value travels as a signed integer code (-127..127, or -7..7 packed two to a byte, the
// earlier value in the low nibble). Pure logic: no MPI, no TensorFlow.
//
// Contracts:
// - |x - Dequantize(Quantize(x))| <= scale / 2 per block with round to nearest; below scale
//   with stochastic rounding (whose expectation is x).
// - A NaN or an infinity in the input is a BluefogError (kInvalidArgument) naming its index;
//   nothing is written past the blocks before it. With nonfinite_to_nan, the block's scale is
//   NaN instead, so everything dequantized from it is NaN.
// - Lengths need not be a multiple of the block: the last block is shorter. For 4 bits the
//   block must be even, so that every block but the last starts on a byte.
#pragma once

#include <cstdint>

namespace bluefog {
namespace compress {

struct QuantizeOptions {
  int bits = 8;         // 8 or 4
  int64_t block = 256;  // values per scale; even for 4 bits
  bool stochastic = false;
  uint64_t seed = 0;  // stochastic rounding: same seed and input, same codes
  // A block with a NaN or an infinity gets a NaN scale, zero codes and zero error instead of
  // an error, so that a collective carries it to every rank (which then all fail alike).
  bool nonfinite_to_nan = false;
};

// Throws kInvalidArgument for bits other than 8 or 4, or a block that is not positive (or odd
// with 4 bits).
void CheckOptions(const QuantizeOptions& options);
// Scales for `count` values: ceil(count / block).
int64_t ScaleCount(int64_t count, const QuantizeOptions& options);
// Bytes of codes for `count` values: count (8 bits) or ceil(count / 2) (4 bits).
int64_t CodeBytes(int64_t count, const QuantizeOptions& options);

// codes[CodeBytes(count)], scales[ScaleCount(count)] from x[count]. When `error` is not null,
// error[i] = x[i] - dequantized[i] (what error feedback keeps for the next step).
void Quantize(const float* x, int64_t count, const QuantizeOptions& options, uint8_t* codes,
              float* scales, float* error = nullptr);

// out[count] from codes and scales.
void Dequantize(const uint8_t* codes, const float* scales, int64_t count,
                const QuantizeOptions& options, float* out);

// out[i] = sum over s < sources of the dequantized value i of source s, whose codes start at
// codes + s * code_stride and scales at scales + s * scale_stride: the reduction of n ranks'
// quantized chunks in one pass. Then multiplied by `factor` (1 / n for a mean).
void DequantizeSum(const uint8_t* codes, int64_t code_stride, const float* scales,
                   int64_t scale_stride, int sources, int64_t count, const QuantizeOptions& options,
                   float factor, float* out);

}  // namespace compress
}  // namespace bluefog
