// The status endpoints (views.hpp). STUB: owned by a helper.
#include "ddp/status/views.hpp"

#include "ddp/rdzv/store.hpp"

namespace ddp::status {

StatusViews::StatusViews(ViewSources sources) : s_(std::move(sources)) {}
StatusViews::~StatusViews() = default;
HttpResponse StatusViews::handle(const HttpRequest&) { return {404, "text/plain", "stub\n"}; }

}  // namespace ddp::status
