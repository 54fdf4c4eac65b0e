#pragma once
// Reading and writing the safetensors format (the Hugging Face `safetensors`
// package's): an 8-byte little-endian header length, a JSON header mapping
// each tensor name to {dtype, shape, data_offsets} plus an optional
// "__metadata__" string map, then the raw little-endian tensor bytes.
// Errors are std::runtime_error messages that name the file and the problem.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace gaugewatch::audit {

struct SafetensorsTensor {
  std::string dtype;           // "BF16", "F32", "F64", "I32", "I64", ...
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;  // little-endian, row-major

  int64_t numel() const;
};

struct SafetensorsFile {
  std::map<std::string, SafetensorsTensor> tensors;
  std::map<std::string, std::string> metadata;
};

// Size in bytes of one element of a dtype; throws for unknown dtypes.
int64_t safetensors_dtype_size(const std::string& dtype);

SafetensorsFile read_safetensors(const std::string& path);
void write_safetensors(const std::string& path, const SafetensorsFile& file);

// Conversions between tensors and float/double/int64 vectors.
SafetensorsTensor make_bf16_tensor(const std::vector<float>& values, std::vector<int64_t> shape);
SafetensorsTensor make_f32_tensor(const std::vector<float>& values, std::vector<int64_t> shape);
SafetensorsTensor make_f64_tensor(const std::vector<double>& values, std::vector<int64_t> shape);
SafetensorsTensor make_i64_tensor(const std::vector<int64_t>& values, std::vector<int64_t> shape);
// BF16/F16/F32/F64 -> float (BF16 exactly); throws for other dtypes.
std::vector<float> tensor_to_float(const SafetensorsTensor& tensor);
// I32/I64 -> int64; throws for other dtypes.
std::vector<int64_t> tensor_to_int64(const SafetensorsTensor& tensor);

}  // namespace gaugewatch::audit
