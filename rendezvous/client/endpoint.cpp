// Endpoint parsing and formatting (see endpoint.hpp). Pure: no resolution, no sockets.
#include "ddp/rdzv/endpoint.hpp"

#include <algorithm>
#include <charconv>

#include "ddp/proto/error.hpp"

namespace ddp::rdzv {

std::string Endpoint::str() const {
  const bool v6 = host.find(':') != std::string::npos;
  return (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

Endpoint parse_endpoint(std::string_view text, std::uint16_t default_port, std::string_view what) {
  auto bad = [&](const std::string& why) {
    return ConfigError(std::string(what) + " '" + std::string(text) + "': " + why +
                       "; expected HOST, HOST:PORT or [IPV6]:PORT");
  };
  Endpoint ep;
  std::string_view port;
  if (!text.empty() && text.front() == '[') {
    auto close = text.find(']');
    if (close == std::string_view::npos) throw bad("missing ']'");
    ep.host = std::string(text.substr(1, close - 1));
    if (close + 1 < text.size()) {
      if (text[close + 1] != ':') throw bad("expected ':' after ']'");
      port = text.substr(close + 2);
      if (port.empty()) throw bad("no port after ':'");
    }
  } else if (std::count(text.begin(), text.end(), ':') == 1) {
    auto colon = text.find(':');
    ep.host = std::string(text.substr(0, colon));
    port = text.substr(colon + 1);
    if (port.empty()) throw bad("no port after ':'");
  } else {
    ep.host = std::string(text);  // a bare host, or a bare IPv6 address
  }
  if (ep.host.empty()) throw bad("no host");
  ep.port = default_port;
  if (!port.empty()) {
    unsigned value = 0;
    auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), value);
    if (ec != std::errc() || end != port.data() + port.size())
      throw bad("the port is not a number");
    if (value > 65535) throw bad("the port is out of range (0-65535)");
    ep.port = static_cast<std::uint16_t>(value);
  }
  return ep;
}

}  // namespace ddp::rdzv
