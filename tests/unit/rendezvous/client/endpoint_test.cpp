// The one endpoint parser: every spelling, default ports, and one error shape naming the flag.
#include <catch2/catch.hpp>

#include "ddp/proto/error.hpp"
#include "ddp/rdzv/endpoint.hpp"

using ddp::rdzv::Endpoint;
using ddp::rdzv::parse_endpoint;

TEST_CASE("endpoints: every spelling, with the default port", "[unit][rdzv][endpoint]") {
  CHECK(parse_endpoint("node1", 29400) == Endpoint{"node1", 29400});
  CHECK(parse_endpoint("node1:5", 29400) == Endpoint{"node1", 5});
  CHECK(parse_endpoint("10.0.0.1:0", 1) == Endpoint{"10.0.0.1", 0});
  CHECK(parse_endpoint("[::1]:5000", 1) == Endpoint{"::1", 5000});
  CHECK(parse_endpoint("[::1]", 7) == Endpoint{"::1", 7});
  CHECK(parse_endpoint("fe80::1", 29400) == Endpoint{"fe80::1", 29400});
  CHECK(Endpoint{"::1", 5}.str() == "[::1]:5");
  CHECK(Endpoint{"h", 5}.str() == "h:5");
}

TEST_CASE("endpoints: errors name the flag, the text and the expected form",
          "[unit][rdzv][endpoint]") {
  auto message = [](const char* text) {
    try {
      (void)parse_endpoint(text, 1, "--rdzv-endpoint");
    } catch (const ddp::ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  CHECK(message("[::1") ==
        "--rdzv-endpoint '[::1': missing ']'; expected HOST, HOST:PORT or "
        "[IPV6]:PORT");
  CHECK_THAT(message("[::1]x"), Catch::Contains("expected ':' after ']'"));
  CHECK_THAT(message("h:70000"), Catch::Contains("the port is out of range"));
  CHECK_THAT(message("h:x"), Catch::Contains("the port is not a number"));
  CHECK_THAT(message("h:"), Catch::Contains("no port after ':'"));
  CHECK_THAT(message(":80"), Catch::Contains("no host"));
  CHECK_THAT(message(""), Catch::Contains("no host"));
}
