#pragma once
// The synthetic audit suite: >= 60 named cases covering packing, both causal
// alignments and their boundaries, singleton rows, N != M, long sequences,
// GQA/MQA, every head dim, key padding masks, and sink-like inputs (large common key and query
// offsets, sharp queries). Shared by the suite test and the suite report.

#include <string>
#include <vector>

#include "audit/scenarios.h"

namespace gaugewatch::testing {

enum class CaseFamily {
  kRandom,     // well-conditioned normal inputs
  kStructure,  // packing, singletons, masking boundaries, GQA (random values)
  kSinkLike,   // large common key (and query) offsets with sharp queries
  kGeometry,   // two-key rows, one massive key, key clusters, translations
};

struct SuiteCase {
  std::string name;
  CaseFamily family;
  audit::ScenarioSpec spec;
};

std::vector<SuiteCase> suite_cases();

}  // namespace gaugewatch::testing
