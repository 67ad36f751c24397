// CORS (`k3 serve --allowed-origins`): which origin gets which headers, and the origins a server accepts.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "k3/core/error.h"
#include "k3/serve/server.h"

TEST(ServeCors, HeadersOnlyForAllowedOrigins) {
  using k3::serve::cors_headers;
  const std::vector<std::string> none, some = {"https://a.example", "http://localhost:3000"}, any = {"*"};
  EXPECT_EQ(cors_headers(none, "https://a.example", false), "");  // the default: no CORS, browsers block
  EXPECT_EQ(cors_headers(some, "", false), "");                   // not a browser's cross-origin request
  EXPECT_EQ(cors_headers(some, "https://evil.example", false), "");
  EXPECT_EQ(cors_headers(some, "https://a.example.evil", false), "");  // exact match, not a prefix
  EXPECT_EQ(cors_headers(some, "http://localhost:3000", false),
            "Access-Control-Allow-Origin: http://localhost:3000\r\nVary: Origin\r\n");
  EXPECT_EQ(cors_headers(any, "https://whoever.example", false), "Access-Control-Allow-Origin: *\r\nVary: Origin\r\n");
  const std::string pre = cors_headers(some, "https://a.example", true);
  EXPECT_NE(pre.find("Access-Control-Allow-Methods: GET, POST, OPTIONS\r\n"), std::string::npos) << pre;
  EXPECT_NE(pre.find("Access-Control-Allow-Headers: Authorization, Content-Type\r\n"), std::string::npos) << pre;
  EXPECT_EQ(cors_headers(some, "https://evil.example", true), "");
}

TEST(ServeCors, OriginsAreValidated) {
  k3::serve::ServerOptions o;
  o.allowed_origins = {"https://a.example", "*"};
  EXPECT_NO_THROW(k3::serve::validate(o));
  for (const std::string& bad : {std::string(), std::string("a\r\nSet-Cookie: x"), std::string("a\nb"),
                                std::string("a\0b", 3), std::string(2000, 'x')}) {
    o.allowed_origins = {bad};
    EXPECT_THROW(k3::serve::validate(o), k3::Error) << bad.size();
  }
}
