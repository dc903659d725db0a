// The dashboard's static files (server/dashboard/), embedded into the binary at build time by
// embed_dashboard.sh, so the page is served the same wherever megatraind is installed.
#pragma once

#include <optional>

#include "absl/strings/string_view.h"

namespace megatrain::server {

struct DashboardAsset {
  absl::string_view content_type;
  absl::string_view body;
};

// The file named `name` ("index.html", "dashboard.js", "dashboard.css"); nullopt for others.
std::optional<DashboardAsset> FindDashboardAsset(absl::string_view name);

}  // namespace megatrain::server
