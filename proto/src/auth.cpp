// Authentication proofs (HMAC-SHA256 through OpenSSL's libcrypto), nonces from getrandom, and
// the job's secret from the environment or a private file (auth.hpp).
#include "ddp/proto/auth.hpp"

#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "ddp/proto/error.hpp"

namespace ddp::proto::auth {

namespace {
constexpr std::string_view kClientLabel = "ddprun-auth-v1 client";
constexpr std::string_view kServerLabel = "ddprun-auth-v1 server";

// Length-prefixed fields: no two (cn, sn) pairs give the same message.
std::string message(std::string_view label, std::string_view cn, std::string_view sn) {
  std::string msg(label);
  auto field = [&msg](std::string_view f) {
    const std::uint64_t n = f.size();
    msg.append(reinterpret_cast<const char*>(&n), sizeof(n));
    msg.append(f);
  };
  field(cn);
  field(sn);
  return msg;
}

const EVP_MD* sha256() {
  static EVP_MD* md = EVP_MD_fetch(nullptr, "SHA256", nullptr);  // fetched once, never freed
  if (md == nullptr) DDP_THROW(IoError, "SHA-256 is not available in libcrypto");
  return md;
}

constexpr std::size_t kBlock = 64;  // SHA-256's block
}  // namespace

struct Key::Ctx {
  EVP_MD_CTX* md = EVP_MD_CTX_new();
  ~Ctx() { EVP_MD_CTX_free(md); }
};

Key::Key(std::string_view secret) : inner_(new Ctx), outer_(new Ctx) {
  std::string k(secret);
  if (k.size() > kBlock) {
    unsigned char d[EVP_MAX_MD_SIZE];
    unsigned int n = 0;
    EVP_Digest(k.data(), k.size(), d, &n, sha256(), nullptr);
    k.assign(reinterpret_cast<const char*>(d), n);
  }
  k.resize(kBlock, '\0');
  std::string ipad(kBlock, '\0'), opad(kBlock, '\0');
  for (std::size_t i = 0; i < kBlock; ++i) {
    ipad[i] = static_cast<char>(k[i] ^ 0x36);
    opad[i] = static_cast<char>(k[i] ^ 0x5c);
  }
  bool ok = inner_->md && outer_->md && EVP_DigestInit_ex(inner_->md, sha256(), nullptr) &&
            EVP_DigestUpdate(inner_->md, ipad.data(), kBlock) &&
            EVP_DigestInit_ex(outer_->md, sha256(), nullptr) &&
            EVP_DigestUpdate(outer_->md, opad.data(), kBlock);
  OPENSSL_cleanse(k.data(), k.size());
  OPENSSL_cleanse(ipad.data(), kBlock);
  OPENSSL_cleanse(opad.data(), kBlock);
  if (!ok) {
    delete inner_;
    delete outer_;
    DDP_THROW(IoError, "HMAC-SHA256 key setup failed in libcrypto");
  }
}

Key::~Key() {
  delete inner_;
  delete outer_;
}

std::string Key::mac(std::string_view msg) const {
  Ctx c;
  unsigned char ih[EVP_MAX_MD_SIZE], out[EVP_MAX_MD_SIZE];
  unsigned int ni = 0, no = 0;
  const bool ok = c.md && EVP_MD_CTX_copy_ex(c.md, inner_->md) &&
                  EVP_DigestUpdate(c.md, msg.data(), msg.size()) &&
                  EVP_DigestFinal_ex(c.md, ih, &ni) && EVP_MD_CTX_copy_ex(c.md, outer_->md) &&
                  EVP_DigestUpdate(c.md, ih, ni) && EVP_DigestFinal_ex(c.md, out, &no);
  if (!ok) DDP_THROW(IoError, "HMAC-SHA256 failed in libcrypto");
  return std::string(reinterpret_cast<const char*>(out), no);
}

std::string nonce() {
  std::string out(kNonceBytes, '\0');
  std::size_t got = 0;
  while (got < out.size()) {
    ssize_t n = ::getrandom(out.data() + got, out.size() - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) DDP_THROW(IoError, std::string("getrandom failed: ") + std::strerror(errno));
    got += static_cast<std::size_t>(n);
  }
  return out;
}

std::string hmac_sha256(std::string_view key, std::string_view message) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
           reinterpret_cast<const unsigned char*>(message.data()), message.size(), md,
           &len) == nullptr) {
    DDP_THROW(IoError, "HMAC-SHA256 failed in libcrypto");
  }
  return std::string(reinterpret_cast<const char*>(md), len);
}

std::string client_proof(std::string_view secret, std::string_view client_nonce,
                         std::string_view server_nonce) {
  return hmac_sha256(secret, message(kClientLabel, client_nonce, server_nonce));
}

std::string server_proof(std::string_view secret, std::string_view client_nonce,
                         std::string_view server_nonce) {
  return hmac_sha256(secret, message(kServerLabel, client_nonce, server_nonce));
}

std::string client_proof(const Key& key, std::string_view client_nonce,
                         std::string_view server_nonce) {
  return key.mac(message(kClientLabel, client_nonce, server_nonce));
}

std::string server_proof(const Key& key, std::string_view client_nonce,
                         std::string_view server_nonce) {
  return key.mac(message(kServerLabel, client_nonce, server_nonce));
}

bool same(std::string_view a, std::string_view b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

std::string checked_secret(std::string secret, std::string_view origin) {
  if (secret.size() < kMinSecretBytes || secret.size() > kMaxSecretBytes) {
    const std::size_t n = secret.size();
    OPENSSL_cleanse(secret.data(), secret.size());
    DDP_THROW(ConfigError, std::string(origin) + ": the store secret has " + std::to_string(n) +
                               " bytes; it must have " + std::to_string(kMinSecretBytes) + " to " +
                               std::to_string(kMaxSecretBytes) +
                               " (make one with: head -c 32 /dev/urandom | base64)");
  }
  return secret;
}

std::string read_secret_file(const std::string& path) {
  const std::string what = "store secret file " + path;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NOCTTY | O_NONBLOCK);
  if (fd < 0) DDP_THROW(ConfigError, what + ": cannot open: " + std::strerror(errno));
  struct stat st {};
  std::string err;
  if (::fstat(fd, &st) != 0) {
    err = std::string("cannot stat: ") + std::strerror(errno);
  } else if (!S_ISREG(st.st_mode)) {
    err = "not a regular file";
  } else if (st.st_uid != ::geteuid()) {
    err = "owned by uid " + std::to_string(st.st_uid) + ", not by this user (uid " +
          std::to_string(::geteuid()) + ")";
  } else if ((st.st_mode & 077) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof(mode), "%03o", static_cast<unsigned>(st.st_mode & 0777));
    err = std::string("mode ") + mode + " lets others read it; chmod 600 it";
  } else if (st.st_size > static_cast<off_t>(kMaxSecretBytes + 2)) {
    err = "larger than " + std::to_string(kMaxSecretBytes) + " bytes";
  }
  std::string secret;
  if (err.empty()) {
    secret.resize(static_cast<std::size_t>(st.st_size));
    std::size_t got = 0;
    while (got < secret.size()) {
      ssize_t n = ::read(fd, secret.data() + got, secret.size() - got);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      got += static_cast<std::size_t>(n);
    }
    secret.resize(got);
  }
  ::close(fd);
  if (!err.empty()) DDP_THROW(ConfigError, what + ": " + err);
  if (!secret.empty() && secret.back() == '\n') secret.pop_back();
  if (!secret.empty() && secret.back() == '\r') secret.pop_back();
  return checked_secret(std::move(secret), what);
}

std::optional<std::string> job_secret(const knobs::Env* env) {
  auto file = knobs::text("DDPRUN_STORE_SECRET_FILE", env);
  auto value = knobs::text("DDPRUN_STORE_SECRET", env);
  if (file && value) {
    DDP_THROW(ConfigError,
              "both DDPRUN_STORE_SECRET and DDPRUN_STORE_SECRET_FILE are set: set one of them");
  }
  if (file) return read_secret_file(*file);
  if (value) return checked_secret(std::move(*value), "DDPRUN_STORE_SECRET");
  return std::nullopt;
}

std::optional<std::string> secret_for(const std::string& secret_file, const knobs::Env* env) {
  if (secret_file.empty()) return job_secret(env);
  if (knobs::text("DDPRUN_STORE_SECRET_FILE", env) || knobs::text("DDPRUN_STORE_SECRET", env)) {
    DDP_THROW(ConfigError,
              "--secret-file and DDPRUN_STORE_SECRET(_FILE) are both set: give one of them");
  }
  return read_secret_file(secret_file);
}

}  // namespace ddp::proto::auth
