// The etcd-v3 backend's command line (cli.cpp, etcd_conf.hpp): torchrun's spellings mapped with a
// note, the members of --rdzv-endpoint, the --rdzv-conf keys taken and those refused by name.
// No etcd: pure parsing (password_file is a real file on the test's own tmp path).
#include "ddp/launch/etcd_conf.hpp"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>

#include "ddp/launch/config.hpp"
#include "ddp/proto/error.hpp"

using namespace ddp::launch;

namespace {

ParseResult parse(std::vector<std::string> args) {
  args.insert(args.begin(), "ddprun");
  return parse_launch_args(args, {});
}

LaunchConfig ok(std::vector<std::string> args) {
  auto r = parse(std::move(args));
  INFO(r.message);
  REQUIRE(r.config.has_value());
  return *r.config;
}

std::string bad(std::vector<std::string> args) {
  auto r = parse(std::move(args));
  REQUIRE_FALSE(r.config.has_value());
  CHECK(r.exit_code == 2);
  return r.message;
}

}  // namespace

TEST_CASE("etcd-v3 takes the etcd members from --rdzv-endpoint", "[unit][launch][etcd]") {
  auto c = ok({"--nnodes=2", "--rdzv-backend=etcd-v3", "--rdzv-endpoint=a:2381,b,[::1]:9",
               "--rdzv-id=j", "x"});
  CHECK(c.etcd());
  REQUIRE(c.etcd_members.size() == 3);
  CHECK(c.etcd_members[0].host == "a");
  CHECK(c.etcd_members[0].port == 2381);
  CHECK(c.etcd_members[1].port == 2379);  // etcd's client port by default
  CHECK(c.etcd_members[2].host == "::1");
  CHECK(c.endpoint().host == "a");
  auto s = etcd_settings(c, std::chrono::milliseconds(4000));
  CHECK(s.options.endpoints.size() == 3);
  CHECK(s.options.timeout == std::chrono::milliseconds(4000));
  CHECK(s.key_prefix.empty());
}

TEST_CASE("torchrun's etcd spellings run as etcd-v3 with a one-line note", "[unit][launch][etcd]") {
  for (const char* name : {"etcd", "etcd-v2"}) {
    auto r = parse({"--nnodes=2", std::string("--rdzv-backend=") + name, "--rdzv-endpoint=h", "x"});
    REQUIRE(r.config);
    CHECK(r.config->rdzv_backend == "etcd-v3");
    CHECK_THAT(r.notice,
               Catch::Contains(std::string("--rdzv-backend=") + name + " runs as etcd-v3"));
    CHECK(r.notice.find('\n') == std::string::npos);
  }
}

TEST_CASE("etcd-v3's bad endpoints and conf are named", "[unit][launch][etcd]") {
  CHECK_THAT(bad({"--nnodes=2", "--rdzv-backend=etcd-v3", "x"}),
             Catch::Contains("--rdzv-endpoint is required for --rdzv-backend=etcd-v3"));
  CHECK_THAT(bad({"--nnodes=2", "--rdzv-backend=etcd-v3", "--rdzv-endpoint=a:1,b:x", "x"}),
             Catch::Contains("--rdzv-endpoint=a:1,b:x"));
  CHECK_THAT(bad({"--nnodes=2", "--rdzv-backend=etcd-v3", "--rdzv-endpoint=https://a:1", "x"}),
             Catch::Contains("https"));
  const std::string base = "--rdzv-endpoint=h";
  auto conf = [&](const std::string& kv) {
    return bad({"--nnodes=2", "--rdzv-backend=etcd-v3", base, "--rdzv-conf=" + kv, "x"});
  };
  CHECK_THAT(conf("protocol=https"),
             Catch::Contains("protocol=https") && Catch::Contains("TLS is not built in"));
  CHECK_THAT(conf("cacert=/ca.pem"), Catch::Contains("cacert"));
  CHECK_THAT(conf("cert=/c.pem"), Catch::Contains("cert: TLS"));
  CHECK_THAT(conf("key=/k.pem"), Catch::Contains("key: TLS"));
  CHECK_THAT(conf("ssl_cert=/c.pem"), Catch::Contains("ssl_cert: TLS"));  // etcd-v2 spellings
  CHECK_THAT(conf("key_prefix=" + std::string(300, 'p')), Catch::Contains("over 256"));
  CHECK_THAT(conf("key_prefix=/a,etcd_prefix=/b"), Catch::Contains("not both"));
  CHECK_THAT(conf("password=x"), Catch::Contains("password without user"));
  CHECK_THAT(conf("user=u,password=x,password_file=/f"), Catch::Contains("not both"));
  CHECK_THAT(conf("user="), Catch::Contains("user: empty"));
  // protocol=http is torchrun's default and is accepted.
  CHECK(
      ok({"--nnodes=2", "--rdzv-backend=etcd-v3", base, "--rdzv-conf=protocol=http", "x"}).etcd());
}

TEST_CASE("etcd-v3 reads the key prefix and the credentials", "[unit][launch][etcd]") {
  auto c = ok({"--nnodes=2", "--rdzv-backend=etcd-v3", "--rdzv-endpoint=h",
               "--rdzv-conf=etcd_prefix=/team,user=alice,password=s3", "x"});
  auto s = etcd_settings(c, std::chrono::milliseconds(1000));
  CHECK(s.key_prefix == "/team");
  CHECK(s.options.user == "alice");
  CHECK(s.options.password == "s3");

  const auto dir =
      std::filesystem::temp_directory_path() / ("ddp-etcd-conf-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto file = (dir / "pw").string();
  std::ofstream(file) << "from-file\r\nsecond line ignored\n";
  auto f = ok({"--nnodes=2", "--rdzv-backend=etcd-v3", "--rdzv-endpoint=h",
               "--rdzv-conf=key_prefix=/k,user=bob,password_file=" + file, "x"});
  auto fs = etcd_settings(f, std::chrono::milliseconds(1000));
  CHECK(fs.key_prefix == "/k");
  CHECK(fs.options.password == "from-file");
  std::ofstream(file, std::ios::trunc) << std::string(5000, 'x');
  CHECK_THROWS_WITH(etcd_settings(f, std::chrono::milliseconds(1000)),
                    Catch::Contains("over 4096 bytes"));
  std::ofstream(file, std::ios::trunc) << "\n";
  CHECK_THROWS_WITH(etcd_settings(f, std::chrono::milliseconds(1000)),
                    Catch::Contains("no password"));
  std::filesystem::remove_all(dir);
  CHECK_THROWS_WITH(etcd_settings(f, std::chrono::milliseconds(1000)),
                    Catch::Contains("cannot be read"));
}
