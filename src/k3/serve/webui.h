// The web chat `k3 serve` answers at / (docs/serving.md, "Web chat"): webui/'s files, embedded into the
// binary at build time by cmake/embed_webui.cmake (generated k3_webui_assets.cpp holds web_assets()).
#pragma once
#include <span>
#include <string>
#include <string_view>

namespace k3::serve {

struct WebAsset {
  std::string_view name;          // file name in webui/ ("index.html", "app.js", ...)
  std::string_view content_type;  // from the extension
  std::string_view etag;          // quoted strong validator: a hash of the bytes
  std::string_view body;
};

// Every embedded file (generated).
std::span<const WebAsset> web_assets();

// The asset a request path names: "/" and "/index.html" the page, "/static/NAME" any other file; nullptr
// for anything else (the caller answers 404).
const WebAsset* find_web_asset(std::string_view path);

// The response headers of an asset (each line CRLF-terminated): ETag, Cache-Control (revalidate every
// time: the names carry no hash, so a new binary's files must not be taken from a stale cache), and for
// the page a Content-Security-Policy allowing only this origin's scripts, styles and API (no inline
// script, so text from the model can never run even if it reached the DOM as markup), nosniff, no framing.
std::string web_asset_headers(const WebAsset& asset);

// If-None-Match (a list of entity tags, or *) matches the asset: answer 304.
bool etag_matches(std::string_view if_none_match, const WebAsset& asset);

}  // namespace k3::serve
