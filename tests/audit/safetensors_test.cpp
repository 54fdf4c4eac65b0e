// Capture files: round trips, and a clear error for every malformed input.

#include <gtest/gtest.h>

#include <array>
#include <cmath>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "audit/operands.h"
#include "audit/safetensors.h"
#include "audit/scenarios.h"
#include "kernels/reference/fused_forward_bf16.h"

namespace gaugewatch::testing {
namespace {

namespace fs = std::filesystem;

class CaptureFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("gaugewatch-capture-" + std::to_string(::getpid()) + "-" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  audit::CapturedOperands operands() const {
    audit::ScenarioSpec spec;
    spec.shape = {1, 4, 2, 20, 30, 64};
    spec.causal = reference::CausalMode::kBottomRight;
    spec.q_segments = {8, 12};
    spec.k_segments = {10, 20};
    spec.scale = 0.2;
    audit::CapturedOperands ops;
    ops.inputs = audit::make_inputs(spec);
    ops.saved = reference::forward_fused_bf16(ops.inputs);
    return ops;
  }

  // Writes a capture with one tensor replaced or removed.
  std::string variant(const std::string& name, const std::function<void(audit::SafetensorsFile&)>& change) {
    audit::save_operands(path("good.safetensors"), operands());
    auto file = audit::read_safetensors(path("good.safetensors"));
    change(file);
    audit::write_safetensors(path(name), file);
    return path(name);
  }

  void expect_error(const std::string& file, const std::string& fragment) {
    try {
      audit::load_operands(file);
      FAIL() << "loading " << file << " should fail with '" << fragment << "'";
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(file), std::string::npos) << "errors name the file: " << e.what();
    }
  }

  fs::path dir_;
};

TEST_F(CaptureFiles, RoundTripIsExact) {
  const auto ops = operands();
  audit::save_operands(path("capture.safetensors"), ops);
  const auto back = audit::load_operands(path("capture.safetensors"));
  EXPECT_EQ(back.inputs.q, ops.inputs.q);
  EXPECT_EQ(back.inputs.k, ops.inputs.k);
  EXPECT_EQ(back.inputs.v, ops.inputs.v);
  EXPECT_EQ(back.inputs.grad_out, ops.inputs.grad_out);
  EXPECT_EQ(back.saved.out, ops.saved.out);
  EXPECT_EQ(back.saved.lse, ops.saved.lse);
  EXPECT_EQ(back.inputs.cu_seqlens_q, ops.inputs.cu_seqlens_q);
  EXPECT_EQ(back.inputs.cu_seqlens_k, ops.inputs.cu_seqlens_k);
  EXPECT_EQ(back.inputs.causal, reference::CausalMode::kBottomRight);
  EXPECT_DOUBLE_EQ(back.inputs.scale, 0.2);
  EXPECT_EQ(back.inputs.shape.kv_heads, 2);
}

// attn_mask: a key padding bias round-trips; a BOOL mask (as torch writes a
// bool tensor) loads as 0 / -inf; a mask that does not broadcast is refused.
TEST_F(CaptureFiles, AttnMaskRoundTripsAndLoadsFromBool) {
  audit::ScenarioSpec spec;
  spec.shape = {2, 2, 2, 6, 8, 64};
  spec.valid_keys = {8, 3};
  spec.left_padded = true;
  audit::CapturedOperands ops;
  ops.inputs = audit::make_inputs(spec);
  ops.saved = reference::forward_fused_bf16(ops.inputs);
  audit::save_operands(path("masked.safetensors"), ops);
  const auto back = audit::load_operands(path("masked.safetensors"));
  EXPECT_EQ(back.inputs.bias.values, ops.inputs.bias.values);
  EXPECT_EQ(back.inputs.bias.sizes, ops.inputs.bias.sizes);

  auto file = audit::read_safetensors(path("masked.safetensors"));
  audit::SafetensorsTensor bool_mask;
  bool_mask.dtype = "BOOL";
  bool_mask.shape = {8};
  bool_mask.bytes = {0, 0, 1, 1, 1, 1, 1, 1};
  file.tensors["attn_mask"] = bool_mask;
  audit::write_safetensors(path("bool.safetensors"), file);
  const auto loaded = audit::load_operands(path("bool.safetensors"));
  const std::array<int64_t, 4> keys_only{1, 1, 1, 8};
  EXPECT_EQ(loaded.inputs.bias.sizes, keys_only);
  EXPECT_TRUE(std::isinf(loaded.inputs.bias.values[1]) && loaded.inputs.bias.values[1] < 0);
  EXPECT_EQ(loaded.inputs.bias.values[2], 0.0f);

  bool_mask.shape = {7};
  bool_mask.bytes.resize(7);
  file.tensors["attn_mask"] = bool_mask;
  audit::write_safetensors(path("bad_mask.safetensors"), file);
  expect_error(path("bad_mask.safetensors"), "attn_mask dimension 3");
}

TEST_F(CaptureFiles, MissingTensorIsNamed) {
  expect_error(variant("no_lse.safetensors", [](auto& f) { f.tensors.erase("lse"); }), "missing tensor 'lse'");
}

TEST_F(CaptureFiles, WrongDtypeIsNamed) {
  expect_error(variant("f32_q.safetensors",
                       [](auto& f) {
                         auto& q = f.tensors["q"];
                         q = audit::make_f32_tensor(audit::tensor_to_float(q), q.shape);
                       }),
               "tensor 'q' is F32, expected BF16");
}

TEST_F(CaptureFiles, WrongShapeIsNamed) {
  expect_error(variant("short_v.safetensors",
                       [](auto& f) {
                         auto& v = f.tensors["v"];
                         auto values = audit::tensor_to_float(v);
                         values.resize(values.size() / 2);
                         v = audit::make_bf16_tensor(values, {1, 2, 15, 64});
                       }),
               "tensor 'v' has shape (1, 2, 15, 64)");
}

TEST_F(CaptureFiles, BadMetadataIsNamed) {
  expect_error(variant("bad_causal.safetensors", [](auto& f) { f.metadata["causal"] = "sideways"; }),
               "metadata 'causal'");
  expect_error(variant("bad_scale.safetensors", [](auto& f) { f.metadata["scale"] = "tiny"; }), "metadata 'scale'");
}

TEST_F(CaptureFiles, UnreadableAndTruncatedFiles) {
  expect_error(path("does-not-exist.safetensors"), "cannot open");
  audit::save_operands(path("good.safetensors"), operands());
  const auto size = fs::file_size(path("good.safetensors"));
  fs::copy_file(path("good.safetensors"), path("cut.safetensors"));
  fs::resize_file(path("cut.safetensors"), size - 100);
  expect_error(path("cut.safetensors"), "data_offsets outside");
  std::ofstream(path("junk.safetensors")) << "not a tensor file at all";
  expect_error(path("junk.safetensors"), "header length");
  std::ofstream(path("tiny.safetensors")) << "abc";
  expect_error(path("tiny.safetensors"), "too short");
}

}  // namespace
}  // namespace gaugewatch::testing
