// A string as a JSON string literal: quoted, with quotes, backslashes and control
// characters escaped (UTF-8 passes through). Shared by every JSON troupe writes by
// hand: troupe-run's events, troupe-ckpt's output, the actors' status files.
#pragma once

#include <string>
#include <string_view>

namespace troupe {

std::string json_string(std::string_view text);

}  // namespace troupe
