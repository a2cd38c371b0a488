// The live web page: an HTML document and its scripts (no CDN, no build step), compiled into
// ddprund and the agents. page.html polls api/status and draws the job summary, the nodes and
// ranks (cards, or the compact view for large jobs: page_compact.js), the metric curves
// (page_charts.js, from api/history) and the restarts (page_main.js).
#pragma once

#include <string_view>

namespace ddp::status {

std::string_view status_page_html();
// The script served at `path` ("/page_main.js", ...); empty when there is none.
std::string_view status_page_asset(std::string_view path);

}  // namespace ddp::status
