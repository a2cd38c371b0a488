// The live web page: one self-contained HTML document (no CDN, no build step) that polls
// /api/status and draws the nodes, ranks, states, a step-time chart per rank and the restarts.
#pragma once

#include <string_view>

namespace ddp::status {

std::string_view status_page_html();

}  // namespace ddp::status
