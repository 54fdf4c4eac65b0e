#pragma once
// Which backend a fired switch rule puts a layer on, given the backends the
// hook says can correct that layer (Sample/LayerStatus.correcting_backends):
// the rule's backend where the layer can take it; for gproj, center where
// only center can; none where no correcting backend can (the firing is then
// reported, not switched). A hook that reports no correcting backends at all
// (older hooks) gets the rule's backend.

#include <string>
#include <vector>

#include "gaugewatch/v1/types.pb.h"

namespace gaugewatch::agent {

struct Escalation {
  gaugewatch::v1::Backend backend = gaugewatch::v1::BACKEND_UNSPECIFIED;  // UNSPECIFIED: no switch
  std::string why;  // goes into the decision record and the log
};

Escalation choose_backend(gaugewatch::v1::Backend rule_backend,
                          const std::vector<gaugewatch::v1::Backend>& correcting_backends);

}  // namespace gaugewatch::agent
