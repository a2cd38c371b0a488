// The live page's HTML and scripts, compiled in (CMake turns each file into a .inc).
#include "ddp/status/page.hpp"

namespace ddp::status {
namespace {

template <std::size_t N>
std::string_view view(const unsigned char (&bytes)[N]) {
  return std::string_view(reinterpret_cast<const char*>(bytes), N - 1);
}

}  // namespace

std::string_view status_page_html() {
  static const unsigned char kPage[] = {
#include "page_html.inc"
      0};
  return view(kPage);
}

std::string_view status_page_asset(std::string_view path) {
  static const unsigned char kUtil[] = {
#include "page_util_js.inc"
      0};
  static const unsigned char kMain[] = {
#include "page_main_js.inc"
      0};
  static const unsigned char kCharts[] = {
#include "page_charts_js.inc"
      0};
  static const unsigned char kCompact[] = {
#include "page_compact_js.inc"
      0};
  if (path == "/page_util.js") return view(kUtil);
  if (path == "/page_main.js") return view(kMain);
  if (path == "/page_charts.js") return view(kCharts);
  if (path == "/page_compact.js") return view(kCompact);
  return {};
}

}  // namespace ddp::status
