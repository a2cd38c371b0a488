// libFuzzer target: arbitrary bytes through the decoder, and every request it accepts through
// dispatch into a KvTable, as one connection would. Must never crash, leak or trip UBSan.
#include <cstddef>
#include <cstdint>
#include <string>

#include "ddp/proto/decoder.hpp"
#include "dispatch.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  ddp::proto::Limits lim;
  lim.max_key_bytes = 256;
  lim.max_value_bytes = 4096;
  lim.max_keys_per_request = 64;
  lim.max_request_bytes = 1 << 16;
  ddp::proto::Decoder decoder(lim);
  ddp::proto::Request req;
  ddp::rdzv::KvTable table;
  std::string out;
  ddp::rdzv::Woken woken;
  std::span<const char> rest(reinterpret_cast<const char*>(data), size);
  bool prefix = false;
  ddp::rdzv::Millis now(0);
  while (!rest.empty()) {
    auto r = decoder.decode(rest, req);
    if (r.status != ddp::proto::DecodeStatus::ok) break;
    if (r.consumed == 0 || r.consumed > rest.size()) __builtin_trap();
    if (req.op == ddp::proto::Op::hello) prefix = true;
    if (req.op != ddp::proto::Op::cancel_wait) {
      ddp::rdzv::DispatchContext ctx{table, 1 + (size & 3), now, prefix, out, woken, {}};
      if (ddp::rdzv::dispatch(req, ctx) == ddp::rdzv::Outcome::failed) break;
    } else {
      table.cancel(1 + (size & 3));
    }
    now += ddp::rdzv::Millis(7);
    table.expire(now, woken);                                         // wills fire here
    if ((size & 4) != 0) table.release_owner(1 + (size & 3), woken);  // a connection closes
    rest = rest.subspan(r.consumed);
  }
  return 0;
}
