// hybrid_forward::create() in a build without the CUDA backend.
#include "gpu/device.hpp"
#include "gpu/hybrid_forward.hpp"

namespace strata::engine::gpu {

std::unique_ptr<hybrid_forward> hybrid_forward::create(arenas::expert_pool&, const hparams&, const model_weights&,
                                                       const std::vector<arenas::moe_layer>&, const arenas::expert_rows&,
                                                       const hybrid_options& options, std::string* why) {
    select_device(options.gpu, why);  // says why: no CUDA in this build
    return nullptr;
}

}  // namespace strata::engine::gpu
