#include "agent/rules/escalation.h"

#include <gtest/gtest.h>

namespace gaugewatch::agent {
namespace {

namespace v1 = gaugewatch::v1;

TEST(Escalation, GprojWhereTheLayerCanTakeIt) {
  const auto e = choose_backend(v1::BACKEND_GPROJ, {v1::BACKEND_CENTER, v1::BACKEND_GPROJ});
  EXPECT_EQ(e.backend, v1::BACKEND_GPROJ);
  EXPECT_NE(e.why.find("among the layer's correcting backends"), std::string::npos) << e.why;
}

TEST(Escalation, CenterWhereOnlyCenterCan) {
  const auto e = choose_backend(v1::BACKEND_GPROJ, {v1::BACKEND_CENTER, v1::BACKEND_FP32});
  EXPECT_EQ(e.backend, v1::BACKEND_CENTER);
  EXPECT_NE(e.why.find("gproj cannot correct this layer"), std::string::npos) << e.why;
}

TEST(Escalation, NoSwitchWhereNoCorrectingBackendFits) {
  const auto e = choose_backend(v1::BACKEND_GPROJ, {v1::BACKEND_FP32});
  EXPECT_EQ(e.backend, v1::BACKEND_UNSPECIFIED);
  EXPECT_NE(e.why.find("not switched"), std::string::npos) << e.why;
}

TEST(Escalation, HooksThatReportNothingGetTheRuleBackend) {
  EXPECT_EQ(choose_backend(v1::BACKEND_GPROJ, {}).backend, v1::BACKEND_GPROJ);
  EXPECT_EQ(choose_backend(v1::BACKEND_FP32, {v1::BACKEND_FP32}).backend, v1::BACKEND_FP32);
}

}  // namespace
}  // namespace gaugewatch::agent
