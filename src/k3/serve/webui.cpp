#include "k3/serve/webui.h"

namespace k3::serve {

const WebAsset* find_web_asset(std::string_view path) {
  std::string_view name;
  if (path == "/" || path == "/index.html")
    name = "index.html";
  else if (path.starts_with("/static/") && path != "/static/index.html")
    name = path.substr(8);
  else
    return nullptr;
  for (const WebAsset& a : web_assets())
    if (a.name == name) return &a;
  return nullptr;
}

std::string web_asset_headers(const WebAsset& asset) {
  std::string h = "ETag: " + std::string(asset.etag) + "\r\nCache-Control: no-cache\r\n";
  h += "X-Content-Type-Options: nosniff\r\nReferrer-Policy: no-referrer\r\n";
  if (asset.name == "index.html")
    h += "Content-Security-Policy: default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
         "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'\r\n"
         "X-Frame-Options: DENY\r\n";
  return h;
}

bool etag_matches(std::string_view inm, const WebAsset& asset) {
  // A comma-separated list of (possibly weak, W/"...") tags; weak comparison as RFC 9110 13.1.2 asks.
  while (!inm.empty()) {
    const size_t comma = inm.find(',');
    std::string_view tag = inm.substr(0, comma);
    while (!tag.empty() && (tag.front() == ' ' || tag.front() == '\t')) tag.remove_prefix(1);
    while (!tag.empty() && (tag.back() == ' ' || tag.back() == '\t')) tag.remove_suffix(1);
    if (tag.starts_with("W/")) tag.remove_prefix(2);
    if (tag == "*" || tag == asset.etag) return true;
    if (comma == std::string_view::npos) break;
    inm.remove_prefix(comma + 1);
  }
  return false;
}

}  // namespace k3::serve
