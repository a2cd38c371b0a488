// Endpoint: where a store listens, parsed once from the command line's one spelling of it
// ("host", "host:port", "[v6]", "[v6]:port", or a bare v6 address), with one error message.
// Every tool (ddprun's --rdzv-endpoint and --master-addr/--master-port, ddpstore's --endpoint)
// and every client (StoreClient's dialer) uses this type.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace ddp::rdzv {

struct Endpoint {
  std::string host;
  std::uint16_t port = 0;
  // host:port, with [] around an IPv6 address.
  std::string str() const;
  bool operator==(const Endpoint&) const = default;
};

// Throws ddp::ConfigError "<what> '<text>': <why>; expected HOST, HOST:PORT or [IPV6]:PORT".
// A missing port is default_port.
Endpoint parse_endpoint(std::string_view text, std::uint16_t default_port,
                        std::string_view what = "endpoint");

}  // namespace ddp::rdzv
