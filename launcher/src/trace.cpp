// The Chrome trace of a job (trace.hpp). STUB: owned by a helper.
#include "ddp/launch/trace.hpp"

namespace ddp::launch {

std::string encode_node_trace(const NodeTrace&) { return "{}"; }
NodeTrace decode_node_trace(const std::string&) { return {}; }
std::string chrome_trace(const std::vector<NodeTrace>&) { return "{}"; }

}  // namespace ddp::launch
