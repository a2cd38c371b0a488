// Authentication proofs and the job's secret (proto/auth.hpp): HMAC-SHA256 against RFC 4231,
// proofs bound to both nonces and to their side, the secret file's ownership, mode and size
// checks, and where the secret comes from. Files go to a private folder under TMPDIR.
#include "ddp/proto/auth.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "support/hex.hpp"
#include "support/skip.hpp"
#include "ddp/proto/error.hpp"

using namespace ddp::proto::auth;
using ddp::test::hex;

namespace {
struct TempDir {
  std::filesystem::path dir;
  TempDir() {
    char tmpl[] = "/tmp/ddp-auth-test-XXXXXX";
    dir = ::mkdtemp(tmpl);
  }
  ~TempDir() { std::filesystem::remove_all(dir); }
  std::string write(const std::string& name, const std::string& body, mode_t mode) {
    auto p = dir / name;
    std::ofstream(p) << body;
    ::chmod(p.c_str(), mode);
    return p.string();
  }
};
}  // namespace

TEST_CASE("HMAC-SHA256 gives RFC 4231's test case 2", "[unit][auth]") {
  CHECK(hex(hmac_sha256("Jefe", "what do ya want for nothing?")) ==
        "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
}

TEST_CASE("a proof binds the secret, both nonces and its side", "[unit][auth]") {
  const std::string s = "0123456789abcdef-secret", cn(32, 'c'), sn(32, 's');
  const auto p = client_proof(s, cn, sn);
  CHECK(p.size() == kProofBytes);
  CHECK(same(p, client_proof(s, cn, sn)));
  CHECK_FALSE(same(p, client_proof(s + "x", cn, sn)));
  CHECK_FALSE(same(p, client_proof(s, cn, std::string(32, 't'))));  // another connection
  CHECK_FALSE(same(p, client_proof(s, std::string(32, 'd'), sn)));
  CHECK_FALSE(same(p, server_proof(s, cn, sn)));  // the server's proof is not the client's
  // Fields are length-prefixed: moving a byte from one nonce to the other changes the proof.
  CHECK_FALSE(same(client_proof(s, "ab", "c"), client_proof(s, "a", "bc")));
  CHECK_FALSE(same(p, p.substr(0, 31)));
  // The precomputed key gives the one-shot HMAC's proofs, short and long (> 64 bytes) secrets.
  for (const std::string& k : {s, std::string(100, 'L')}) {
    const Key key(k);
    CHECK(same(client_proof(key, cn, sn), client_proof(k, cn, sn)));
    CHECK(same(server_proof(key, cn, sn), server_proof(k, cn, sn)));
  }
  CHECK(hex(Key("Jefe").mac("what do ya want for nothing?")) ==
        "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
}

TEST_CASE("nonces are fresh", "[unit][auth]") {
  const auto a = nonce(), b = nonce();
  CHECK(a.size() == kNonceBytes);
  CHECK(a != b);
}

TEST_CASE("the secret file must be private, a regular file, and of a sane size", "[unit][auth]") {
  TempDir t;
  CHECK(read_secret_file(t.write("ok", "0123456789abcdefXYZ\n", 0600)) == "0123456789abcdefXYZ");
  CHECK(read_secret_file(t.write("ro", "0123456789abcdefXYZ", 0400)) == "0123456789abcdefXYZ");
  CHECK_THROWS_WITH(
      read_secret_file(t.write("open", "0123456789abcdefXYZ", 0644)),
      Catch::Contains("mode 644 lets others read it") && !Catch::Contains("0123456789abcdef"));
  CHECK_THROWS_WITH(read_secret_file(t.write("short", "tiny\n", 0600)),
                    Catch::Contains("has 4 bytes; it must have 16 to 4096"));
  CHECK_THROWS_WITH(read_secret_file(t.write("big", std::string(5000, 'x'), 0600)),
                    Catch::Contains("larger than 4096 bytes"));
  CHECK_THROWS_WITH(read_secret_file((t.dir / "absent").string()),
                    Catch::Contains("cannot open") && Catch::Contains("absent"));
  CHECK_THROWS_WITH(read_secret_file(t.dir.string()), Catch::Contains("not a regular file"));
  ::symlink((t.dir / "ok").c_str(), (t.dir / "link").c_str());
  CHECK_THROWS_AS(read_secret_file((t.dir / "link").string()), ddp::ConfigError);  // O_NOFOLLOW
}

TEST_CASE("a secret file owned by another user is refused, naming the file and the owner",
          "[unit][auth]") {
  TempDir t;
  const std::string path = t.write("theirs", "0123456789abcdefXYZ\n", 0600);
  // Another user's file, private to its owner: uid 65534 ('nobody'), 65533 where this runs as
  // nobody. Giving a file away takes root (CAP_CHOWN); the tests run as root.
  const uid_t other = ::geteuid() == 65534u ? 65533u : 65534u;
  if (::chown(path.c_str(), other, static_cast<gid_t>(-1)) != 0) {
    const std::string why = std::strerror(errno);
    DDP_SKIP("cannot chown a file to uid " << other << " (" << why << "): needs root or CAP_CHOWN");
  }
  CHECK_THROWS_AS(read_secret_file(path), ddp::ConfigError);
  CHECK_THROWS_WITH(
      read_secret_file(path),
      Catch::Contains("store secret file " + path + ": owned by uid " + std::to_string(other) +
                      ", not by this user (uid " + std::to_string(::geteuid()) + ")") &&
          !Catch::Contains("0123456789abcdef"));
  // The control: the same file, given back to this user, is read.
  REQUIRE(::chown(path.c_str(), ::geteuid(), static_cast<gid_t>(-1)) == 0);
  CHECK(read_secret_file(path) == "0123456789abcdefXYZ");
}

TEST_CASE("the job's secret comes from one variable", "[unit][auth]") {
  TempDir t;
  const auto file = t.write("s", "file-secret-0123456789\n", 0600);
  using Env = ddp::knobs::Env;
  const Env none;
  CHECK_FALSE(job_secret(&none).has_value());
  Env by_value{{"DDPRUN_STORE_SECRET", "value-secret-0123456789"}};
  CHECK(job_secret(&by_value) == "value-secret-0123456789");
  Env by_file{{"DDPRUN_STORE_SECRET_FILE", file}};
  CHECK(job_secret(&by_file) == "file-secret-0123456789");
  Env both{{"DDPRUN_STORE_SECRET", "value-secret-0123456789"}, {"DDPRUN_STORE_SECRET_FILE", file}};
  CHECK_THROWS_WITH(job_secret(&both), Catch::Contains("set one of them"));
  Env weak{{"DDPRUN_STORE_SECRET", "short"}};
  CHECK_THROWS_WITH(job_secret(&weak),
                    Catch::Contains("DDPRUN_STORE_SECRET: the store secret has 5"));
}

TEST_CASE("a secret file flag (ddprund's and ddpstore's) or the environment, never both",
          "[unit][auth]") {
  TempDir t;
  const auto file = t.write("s", "file-secret-0123456789\n", 0600);
  using Env = ddp::knobs::Env;
  const Env none;
  CHECK(secret_for(file, &none) == "file-secret-0123456789");
  CHECK_FALSE(secret_for("", &none).has_value());
  const Env by_value{{"DDPRUN_STORE_SECRET", "value-secret-0123456789"}};
  CHECK(secret_for("", &by_value) == "value-secret-0123456789");
  CHECK_THROWS_WITH(secret_for(file, &by_value),
                    Catch::Contains("--secret-file and DDPRUN_STORE_SECRET(_FILE) are both set"));
  const Env by_file{{"DDPRUN_STORE_SECRET_FILE", file}};
  CHECK_THROWS_AS(secret_for(file, &by_file), ddp::ConfigError);
}
