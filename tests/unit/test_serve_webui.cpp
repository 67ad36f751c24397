// The web chat's embedded files (src/k3/serve/webui.h): lookup by path, validators, headers.
#include <gtest/gtest.h>

#include "k3/serve/webui.h"

namespace {
using k3::serve::find_web_asset;

TEST(ServeWebUi, EmbeddedFilesHaveTypesAndTags) {
  ASSERT_GE(k3::serve::web_assets().size(), 3u);
  for (const auto& a : k3::serve::web_assets()) {
    EXPECT_FALSE(a.body.empty()) << a.name;
    EXPECT_EQ(a.etag.front(), '"') << a.name;
    EXPECT_EQ(a.etag.back(), '"') << a.name;
    EXPECT_NE(a.content_type.find('/'), std::string_view::npos) << a.name;
  }
  const auto* page = find_web_asset("/");
  ASSERT_NE(page, nullptr);
  EXPECT_EQ(page->name, "index.html");
  EXPECT_EQ(page->content_type, "text/html; charset=utf-8");
  EXPECT_NE(page->body.find("/static/app.js"), std::string_view::npos);
  EXPECT_EQ(find_web_asset("/index.html"), page);
  ASSERT_NE(find_web_asset("/static/app.js"), nullptr);
  EXPECT_EQ(find_web_asset("/static/app.js")->content_type, "text/javascript; charset=utf-8");
  EXPECT_EQ(find_web_asset("/static/style.css")->content_type, "text/css; charset=utf-8");
}

TEST(ServeWebUi, OnlyKnownPathsMatch) {
  for (const char* p : {"/static/", "/static/nope.js", "/static/../index.html", "/static/./app.js", "/app.js",
                        "/static", "//", "", "/static/index.html", "/STATIC/app.js", "/static/app.js/"})
    EXPECT_EQ(find_web_asset(p), nullptr) << p;
}

TEST(ServeWebUi, EtagMatching) {
  const auto& a = *find_web_asset("/");
  const std::string tag(a.etag);
  EXPECT_TRUE(k3::serve::etag_matches(tag, a));
  EXPECT_TRUE(k3::serve::etag_matches("W/" + tag, a));
  EXPECT_TRUE(k3::serve::etag_matches("\"other\", " + tag, a));
  EXPECT_TRUE(k3::serve::etag_matches(" \"x\" ,\t" + tag + " ", a));
  EXPECT_TRUE(k3::serve::etag_matches("*", a));
  EXPECT_FALSE(k3::serve::etag_matches("", a));
  EXPECT_FALSE(k3::serve::etag_matches("\"other\"", a));
  EXPECT_FALSE(k3::serve::etag_matches(tag.substr(1), a));  // unquoted
  EXPECT_FALSE(k3::serve::etag_matches(",,,", a));
}

TEST(ServeWebUi, PageHeadersForbidInlineScriptAndFraming) {
  const std::string page = k3::serve::web_asset_headers(*find_web_asset("/"));
  EXPECT_NE(page.find("Content-Security-Policy: default-src 'none'; script-src 'self';"), std::string::npos);
  EXPECT_EQ(page.find("unsafe"), std::string::npos);
  EXPECT_NE(page.find("frame-ancestors 'none'"), std::string::npos);
  EXPECT_NE(page.find("X-Content-Type-Options: nosniff\r\n"), std::string::npos);
  EXPECT_NE(page.find("Cache-Control: no-cache\r\n"), std::string::npos);
  const std::string js = k3::serve::web_asset_headers(*find_web_asset("/static/app.js"));
  EXPECT_NE(js.find("ETag: \""), std::string::npos);
  EXPECT_EQ(js.find("Content-Security-Policy"), std::string::npos);
}

}  // namespace
