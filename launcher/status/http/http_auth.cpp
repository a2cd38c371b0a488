// The status views' token check (http_auth.hpp).
#include "ddp/status/http_auth.hpp"

#include "ddp/proto/auth.hpp"
#include "ddp/proto/error.hpp"

namespace ddp::status {

namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// The value of `name` in a list of name=value pairs split by `sep` ("" when absent).
std::string_view pair_value(std::string_view list, std::string_view name, char sep) {
  while (!list.empty()) {
    const auto end = list.find(sep);
    const std::string_view one = trim(list.substr(0, end));
    const auto eq = one.find('=');
    if (eq != std::string_view::npos && one.substr(0, eq) == name) return one.substr(eq + 1);
    if (end == std::string_view::npos) break;
    list.remove_prefix(end + 1);
  }
  return {};
}

// %XX and '+' decoded, as a browser encodes a query value.
std::string url_decoded(std::string_view v) {
  std::string out;
  const auto hex = [](char c) {
    return c >= '0' && c <= '9'   ? c - '0'
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                  : -1;
  };
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (v[i] == '%' && i + 2 < v.size() && hex(v[i + 1]) >= 0 && hex(v[i + 2]) >= 0) {
      out += static_cast<char>(hex(v[i + 1]) * 16 + hex(v[i + 2]));
      i += 2;
    } else {
      out += v[i] == '+' ? ' ' : v[i];
    }
  }
  return out;
}

bool matches(std::string_view token, std::string_view shown) {
  return !shown.empty() && proto::auth::same(token, shown);
}

}  // namespace

TokenFrom token_shown(std::string_view token, std::string_view authorization,
                      std::string_view cookie, std::string_view query) {
  if (token.empty()) return TokenFrom::none;
  const std::string_view a = trim(authorization);
  constexpr std::string_view kBearer = "Bearer ";
  if (a.size() > kBearer.size() && a.substr(0, kBearer.size()) == kBearer &&
      matches(token, trim(a.substr(kBearer.size())))) {
    return TokenFrom::header;
  }
  if (matches(token, pair_value(cookie, kTokenCookie, ';'))) return TokenFrom::cookie;
  if (matches(token, url_decoded(pair_value(query, "token", '&')))) return TokenFrom::query;
  return TokenFrom::none;
}

bool token_safe(std::string_view token) {
  if (token.empty()) return false;
  for (const char c : token) {
    if (c <= ' ' || c >= 0x7f || c == '"' || c == ',' || c == ';' || c == '\\') return false;
  }
  return true;
}

std::string views_token(const std::string& token_file, const std::optional<std::string>& secret) {
  if (!token_file.empty()) {
    std::string t;
    try {
      t = proto::auth::read_secret_file(token_file);
    } catch (const ConfigError& e) {
      throw ConfigError(std::string("--http-token-file: ") + e.what());
    }
    if (!token_safe(t)) {
      throw ConfigError("--http-token-file " + token_file +
                        ": a token is printable ASCII without spaces, quotes, commas, "
                        "semicolons or backslashes");
    }
    return t;
  }
  if (!secret) return "";
  if (!token_safe(*secret)) {
    throw ConfigError(
        "the store secret has characters a token cannot carry in a header or a URL, so it "
        "cannot guard the status views: give --http-token-file");
  }
  return *secret;
}

std::string token_cookie(std::string_view token) {
  return std::string(kTokenCookie) + "=" + std::string(token) +
         "; Path=/; HttpOnly; SameSite=Strict";
}

}  // namespace ddp::status
