// The live page's HTML, compiled in from page.html (CMake turns it into page_html.inc).
#include "ddp/status/page.hpp"

namespace ddp::status {

std::string_view status_page_html() {
  static const unsigned char kPage[] = {
#include "page_html.inc"
      0};
  return std::string_view(reinterpret_cast<const char*>(kPage), sizeof(kPage) - 1);
}

}  // namespace ddp::status
