#include "audit/safetensors.h"

#include <bit>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "kernels/reference/bf16.h"

namespace gaugewatch::audit {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; this reader copies bytes as they are");

namespace {

// A header larger than this is not a tensor file (the format caps it at 100 MB).
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw std::runtime_error(path + ": " + what);
}

template <typename T>
SafetensorsTensor pack(const std::vector<T>& values, std::vector<int64_t> shape, std::string dtype) {
  SafetensorsTensor t{std::move(dtype), std::move(shape), {}};
  t.bytes.resize(values.size() * sizeof(T));
  if (!values.empty()) std::memcpy(t.bytes.data(), values.data(), t.bytes.size());
  return t;
}

template <typename T>
std::vector<T> unpack(const SafetensorsTensor& t) {
  std::vector<T> values(t.bytes.size() / sizeof(T));
  if (!values.empty()) std::memcpy(values.data(), t.bytes.data(), values.size() * sizeof(T));
  return values;
}

}  // namespace

int64_t SafetensorsTensor::numel() const {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

int64_t safetensors_dtype_size(const std::string& dtype) {
  if (dtype == "F64" || dtype == "I64" || dtype == "U64") return 8;
  if (dtype == "F32" || dtype == "I32" || dtype == "U32") return 4;
  if (dtype == "BF16" || dtype == "F16" || dtype == "I16" || dtype == "U16") return 2;
  if (dtype == "I8" || dtype == "U8" || dtype == "BOOL" || dtype == "F8_E4M3" || dtype == "F8_E5M2") {
    return 1;
  }
  throw std::invalid_argument("unsupported safetensors dtype '" + dtype + "'");
}

SafetensorsFile read_safetensors(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, "cannot open for reading (does it exist, and is it readable?)");
  in.seekg(0, std::ios::end);
  const auto file_size = static_cast<uint64_t>(in.tellg());
  in.seekg(0);
  uint64_t header_size = 0;
  if (file_size < 8 || !in.read(reinterpret_cast<char*>(&header_size), 8)) {
    fail(path, "too short to be a safetensors file (no 8-byte header length)");
  }
  if (header_size > kMaxHeaderBytes || header_size > file_size - 8) {
    fail(path, "header length " + std::to_string(header_size) +
                   " is larger than the file: not a safetensors file, or truncated");
  }
  std::string header(header_size, '\0');
  in.read(header.data(), static_cast<std::streamsize>(header_size));
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(header);
  } catch (const nlohmann::json::exception& e) {
    fail(path, std::string("header is not valid JSON: ") + e.what());
  }
  if (!json.is_object()) fail(path, "header must be a JSON object");
  const uint64_t data_size = file_size - 8 - header_size;

  SafetensorsFile file;
  for (const auto& [name, entry] : json.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) fail(path, "__metadata__ must be an object of strings");
      for (const auto& [key, value] : entry.items()) {
        if (!value.is_string()) fail(path, "__metadata__ value of '" + key + "' is not a string");
        file.metadata[key] = value.get<std::string>();
      }
      continue;
    }
    try {
      SafetensorsTensor t;
      t.dtype = entry.at("dtype").get<std::string>();
      t.shape = entry.at("shape").get<std::vector<int64_t>>();
      const auto offsets = entry.at("data_offsets").get<std::vector<uint64_t>>();
      if (offsets.size() != 2 || offsets[0] > offsets[1] || offsets[1] > data_size) {
        fail(path, "tensor '" + name + "' has data_offsets outside the data section");
      }
      for (int64_t s : t.shape) {
        if (s < 0) fail(path, "tensor '" + name + "' has a negative dimension");
      }
      const uint64_t expected = static_cast<uint64_t>(t.numel() * safetensors_dtype_size(t.dtype));
      if (offsets[1] - offsets[0] != expected) {
        fail(path, "tensor '" + name + "' holds " + std::to_string(offsets[1] - offsets[0]) +
                       " bytes, its dtype and shape need " + std::to_string(expected));
      }
      t.bytes.resize(expected);
      in.seekg(static_cast<std::streamoff>(8 + header_size + offsets[0]));
      if (expected > 0 && !in.read(reinterpret_cast<char*>(t.bytes.data()),
                                   static_cast<std::streamsize>(expected))) {
        fail(path, "could not read the data of tensor '" + name + "' (truncated file?)");
      }
      file.tensors.emplace(name, std::move(t));
    } catch (const nlohmann::json::exception& e) {
      fail(path, "malformed header entry for '" + name + "': " + e.what());
    } catch (const std::invalid_argument& e) {
      fail(path, "tensor '" + name + "': " + e.what());
    }
  }
  return file;
}

void write_safetensors(const std::string& path, const SafetensorsFile& file) {
  nlohmann::json header = nlohmann::json::object();
  if (!file.metadata.empty()) header["__metadata__"] = file.metadata;
  uint64_t offset = 0;
  for (const auto& [name, t] : file.tensors) {
    if (static_cast<int64_t>(t.bytes.size()) != t.numel() * safetensors_dtype_size(t.dtype)) {
      throw std::invalid_argument("tensor '" + name + "': byte size does not match dtype and shape");
    }
    header[name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.bytes.size()}}};
    offset += t.bytes.size();
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // keep the data 8-byte aligned
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) fail(path, "cannot open for writing");
  const uint64_t header_size = text.size();
  out.write(reinterpret_cast<const char*>(&header_size), 8);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  for (const auto& [name, t] : file.tensors) {
    out.write(reinterpret_cast<const char*>(t.bytes.data()), static_cast<std::streamsize>(t.bytes.size()));
  }
  if (!out.flush()) fail(path, "write failed (disk full?)");
}

SafetensorsTensor make_bf16_tensor(const std::vector<float>& values, std::vector<int64_t> shape) {
  std::vector<uint16_t> bits(values.size());
  for (size_t i = 0; i < values.size(); ++i) bits[i] = reference::float_to_bf16_bits(values[i]);
  return pack(bits, std::move(shape), "BF16");
}
SafetensorsTensor make_f32_tensor(const std::vector<float>& values, std::vector<int64_t> shape) {
  return pack(values, std::move(shape), "F32");
}
SafetensorsTensor make_f64_tensor(const std::vector<double>& values, std::vector<int64_t> shape) {
  return pack(values, std::move(shape), "F64");
}
SafetensorsTensor make_i64_tensor(const std::vector<int64_t>& values, std::vector<int64_t> shape) {
  return pack(values, std::move(shape), "I64");
}

namespace {
float half_to_float(uint16_t h) {
  const uint32_t sign = (h & 0x8000u) << 16;
  uint32_t exponent = (h >> 10) & 0x1fu;
  uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));
  if (exponent == 0) {
    if (mantissa == 0) return std::bit_cast<float>(sign);
    const float magnitude = std::ldexp(static_cast<float>(mantissa), -24);  // subnormal
    return sign ? -magnitude : magnitude;
  }
  return std::bit_cast<float>(sign | ((exponent + 112) << 23) | (mantissa << 13));
}
}  // namespace

std::vector<float> tensor_to_float(const SafetensorsTensor& t) {
  std::vector<float> out;
  if (t.dtype == "F32") return unpack<float>(t);
  if (t.dtype == "BF16") {
    for (uint16_t b : unpack<uint16_t>(t)) out.push_back(reference::bf16_bits_to_float(b));
  } else if (t.dtype == "F16") {
    for (uint16_t b : unpack<uint16_t>(t)) out.push_back(half_to_float(b));
  } else if (t.dtype == "F64") {
    for (double x : unpack<double>(t)) out.push_back(static_cast<float>(x));
  } else {
    throw std::invalid_argument("dtype " + t.dtype + " is not a floating-point type");
  }
  return out;
}

std::vector<int64_t> tensor_to_int64(const SafetensorsTensor& t) {
  if (t.dtype == "I64") return unpack<int64_t>(t);
  if (t.dtype == "I32") {
    std::vector<int64_t> out;
    for (int32_t x : unpack<int32_t>(t)) out.push_back(x);
    return out;
  }
  throw std::invalid_argument("dtype " + t.dtype + " is not I32 or I64");
}

}  // namespace gaugewatch::audit
