#pragma once
// The message of an exception for a one-line log: c10::Error without its
// backtrace, at most 400 characters.

#include <c10/util/Exception.h>

#include <exception>
#include <string>

namespace gaugewatch::hooks {

inline std::string short_what(const std::exception& e) {
  const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
  std::string text = c10_error != nullptr ? c10_error->what_without_backtrace() : e.what();
  if (const auto nl = text.find('\n'); nl != std::string::npos) text.resize(nl);
  if (text.size() > 400) text.resize(400);
  return text;
}

}  // namespace gaugewatch::hooks
