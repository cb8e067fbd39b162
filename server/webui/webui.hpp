// The web pages strata-server serves (server/webui): the chat page at /, the live view at /dashboard
// and, under /webui/, their scripts, styles and the Debian browser libraries they use, all compiled
// into the binary at build time (embed.cmake).
#pragma once

#include <span>
#include <string_view>

namespace strata::server::webui {

struct asset {
    std::string_view path;          // the URL path: "/", "/dashboard", "/webui/chat.js", "/webui/lib/marked.js"
    std::string_view content_type;
    std::string_view body;
};

// Every embedded file; empty when strata was configured with -DSTRATA_WEBUI=OFF.
std::span<const asset> assets();

// The asset served at `path`, or null.
const asset* find(std::string_view path);

}  // namespace strata::server::webui
