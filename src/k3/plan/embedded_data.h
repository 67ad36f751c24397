// Data files compiled into libk3 (generated from resources/ by cmake/embed_data.cmake).
#pragma once
#include <string_view>
#include <vector>

namespace k3::plan {

struct EmbeddedPreset {
  std::string_view name;  // file stem, e.g. "kimi-k3"
  std::string_view config_json;
};

std::string_view embedded_hardware_json();          // resources/hardware.json
std::vector<EmbeddedPreset> embedded_presets();     // resources/presets/*.json

}  // namespace k3::plan
