#pragma once

#include <string_view>

namespace strata::make_model {

std::string_view training_corpus();

}  // namespace strata::make_model
