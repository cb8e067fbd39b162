// select_device() in a build without the CUDA backend.
#include "gpu/device.hpp"

namespace strata::engine::gpu {

std::optional<device_info> select_device(int index, std::string* why) {
    if (why) *why = "strata was built without CUDA (STRATA_CUDA=OFF or no CUDA Toolkit found), so --gpu " +
                    std::to_string(index) + " is ignored";
    return std::nullopt;
}

}  // namespace strata::engine::gpu
