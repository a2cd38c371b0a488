// The status views' token (http_auth.hpp): where a request may show it, what a token may hold,
// and the cookie that keeps a URL's token. Pure: no sockets.
#include "ddp/status/http_auth.hpp"

#include <catch2/catch.hpp>

using namespace ddp::status;

TEST_CASE("the views' token is taken from the header, the cookie or the URL, and only as given",
          "[unit][status][auth]") {
  const std::string t = "tok-0123456789abcdef";
  CHECK(token_shown(t, "Bearer " + t, "", "") == TokenFrom::header);
  CHECK(token_shown(t, "  Bearer " + t + " ", "", "") == TokenFrom::header);
  CHECK(token_shown(t, "Basic " + t, "", "") == TokenFrom::none);
  CHECK(token_shown(t, "Bearer " + t + "x", "", "") == TokenFrom::none);
  CHECK(token_shown(t, "Bearer", "", "") == TokenFrom::none);
  CHECK(token_shown(t, "", "a=1; ddprun_token=" + t + "; b=2", "") == TokenFrom::cookie);
  CHECK(token_shown(t, "", "ddprun_token=wrong", "") == TokenFrom::none);
  CHECK(token_shown(t, "", "", "run=x&token=" + t) == TokenFrom::query);
  CHECK(token_shown("a+b/c=", "", "", "token=a%2Bb%2Fc%3D") == TokenFrom::query);  // encoded
  CHECK(token_shown(t, "", "", "token=") == TokenFrom::none);
  CHECK(token_shown(t, "", "", "") == TokenFrom::none);
  CHECK(token_shown("", "Bearer ", "", "token=") == TokenFrom::none);  // no token: nothing shown
  CHECK(token_cookie(t) == "ddprun_token=" + t + "; Path=/; HttpOnly; SameSite=Strict");
}

TEST_CASE("a token must travel in a header, a cookie and a URL as it is", "[unit][status][auth]") {
  CHECK(token_safe("abcDEF0123-._~+/="));
  CHECK_FALSE(token_safe(""));
  CHECK_FALSE(token_safe("has space"));
  CHECK_FALSE(token_safe("semi;colon"));
  CHECK_FALSE(token_safe("com,ma"));
  CHECK_FALSE(token_safe("quo\"te"));
  CHECK_FALSE(token_safe("new\nline"));
  CHECK(views_token("", std::nullopt).empty());  // nothing configured: open views
  CHECK(views_token("", std::string("secret-0123456789")) == "secret-0123456789");
  CHECK_THROWS_WITH(views_token("", std::string("secret with space")),
                    Catch::Contains("give --http-token-file"));
  CHECK_THROWS_WITH(views_token("/nonexistent/token", std::nullopt),
                    Catch::Contains("/nonexistent/token"));
}
