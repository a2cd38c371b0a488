// Who may read the status views (issue 35, docs/security.md): with a token set, every route but
// the public /healthz asks for it, as `Authorization: Bearer <token>` (Prometheus, curl), as the
// cookie `ddprun_token` (the live page in a browser), or once as `?token=<token>` in the URL,
// whose answer sets that cookie. Compared in constant time. Pure: no sockets.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace ddp::status {

inline constexpr std::string_view kPublicPath = "/healthz";
inline constexpr std::string_view kTokenCookie = "ddprun_token";

enum class TokenFrom { none, header, cookie, query };

// Where a request showed the token (none: it did not, or showed another). `authorization` and
// `cookie` are the headers' values ("" when absent), `query` the URL's after '?'.
TokenFrom token_shown(std::string_view token, std::string_view authorization,
                      std::string_view cookie, std::string_view query);

// The Set-Cookie value that keeps a token shown in the URL for the page's own requests.
std::string token_cookie(std::string_view token);

// Whether `token` can travel in a header, a cookie and a URL as it is: printable ASCII without
// space, '"', ',', ';' or '\\' (RFC 6750's token characters and a few more).
bool token_safe(std::string_view token);

// The views' token: the file's (--http-token-file: the secret file's rules, owner and mode 600,
// 16 to 4096 bytes, and token_safe), else the store secret when there is one (it must be
// token_safe, else ConfigError asks for a token file), else "" (open views). Throws
// ddp::ConfigError naming the file and what is wrong, never the token.
std::string views_token(const std::string& token_file, const std::optional<std::string>& secret);

}  // namespace ddp::status
