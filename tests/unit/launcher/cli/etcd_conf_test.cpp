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
  CHECK_THAT(
      bad({"--nnodes=2", "--rdzv-backend=etcd-v3", "--rdzv-endpoint=https://a:1,http://b:1", "x"}),
      Catch::Contains("mix http:// and https://"));
  const std::string base = "--rdzv-endpoint=h";
  auto conf = [&](const std::string& kv) {
    return bad({"--nnodes=2", "--rdzv-backend=etcd-v3", base, "--rdzv-conf=" + kv, "x"});
  };
  CHECK_THAT(conf("protocol=ftp"), Catch::Contains("protocol=ftp: expected http or https"));
  CHECK_THAT(conf("cacert=/ca.pem"),
             Catch::Contains("cacert: TLS settings need https") && Catch::Contains("protocol"));
  CHECK_THAT(conf("ssl_cert=/c.pem"), Catch::Contains("ssl_cert: TLS settings need https"));
  CHECK_THAT(conf("protocol=https,cert=/c.pem"), Catch::Contains("cert=/c.pem: a client "
                                                                 "certificate and its key"));
  CHECK_THAT(conf("protocol=https,key=/k.pem,ssl_cert_key=/k2.pem"),
             Catch::Contains("give key or ssl_cert_key, not both"));
  CHECK_THAT(bad({"--nnodes=2", "--rdzv-backend=etcd-v3", "--rdzv-endpoint=https://h",
                  "--rdzv-conf=protocol=http", "x"}),
             Catch::Contains("protocol=http, but --rdzv-endpoint names https://"));
  CHECK_THAT(conf("key_prefix=" + std::string(300, 'p')), Catch::Contains("over 256"));
  CHECK_THAT(conf("key_prefix=/a,etcd_prefix=/b"), Catch::Contains("not both"));
  CHECK_THAT(conf("password=x"), Catch::Contains("password without user"));
  CHECK_THAT(conf("user=u,password=x,password_file=/f"), Catch::Contains("not both"));
  CHECK_THAT(conf("user="), Catch::Contains("user: empty"));
  // protocol=http is torchrun's default and is accepted.
  CHECK(
      ok({"--nnodes=2", "--rdzv-backend=etcd-v3", base, "--rdzv-conf=protocol=http", "x"}).etcd());
}

TEST_CASE("etcd-v3 over TLS: https or protocol=https, files from --rdzv-conf or ETCDCTL_*",
          "[unit][launch][etcd]") {
  const auto tls = [](const std::string& endpoint, const std::string& kv,
                      const ddp::knobs::Env& env) {
    auto c = ok({"--nnodes=2", "--rdzv-backend=etcd-v3", "--rdzv-endpoint=" + endpoint,
                 "--rdzv-conf=" + kv, "x"});
    return etcd_tls(c, &env);
  };
  const ddp::knobs::Env etcdctl = {
      {"ETCDCTL_CACERT", "/e/ca.pem"}, {"ETCDCTL_CERT", "/e/c.pem"}, {"ETCDCTL_KEY", "/e/k.pem"}};
  auto plain = tls("h1,h2", "protocol=http", etcdctl);
  CHECK_FALSE(plain.on);
  CHECK(plain.cacert.path.empty());  // ETCDCTL_* only for an https cluster
  auto from_env = tls("https://h1,https://h2:2400", "join_timeout=5", etcdctl);
  CHECK(from_env.on);
  CHECK(from_env.cacert.path == "/e/ca.pem");
  CHECK(from_env.cacert.from == "ETCDCTL_CACERT");
  CHECK(from_env.key.path == "/e/k.pem");
  auto conf =
      tls("h1", "protocol=https,ca_cert=/t/ca.pem,cert=/t/c.pem,ssl_cert_key=/t/k.pem", etcdctl);
  CHECK(conf.on);
  CHECK(conf.cacert.path == "/t/ca.pem");
  CHECK(conf.cacert.from == "--rdzv-conf ca_cert");
  CHECK(conf.cert.path == "/t/c.pem");
  CHECK(conf.key.from == "--rdzv-conf ssl_cert_key");
  auto system_cas = tls("https://h1", "join_timeout=5", {});
  CHECK(system_cas.on);
  CHECK(system_cas.cacert.path.empty());
  CHECK(system_cas.cert.path.empty());
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
