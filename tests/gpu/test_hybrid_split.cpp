// The hybrid decomposition on the CPU alone: for a routing split by the expert cache, the CPU pool's
// complement (resident ids rewritten to -1) plus the resident experts' weighted sum equals the full MoE
// output, whatever the residency and however the adaptive tier moved experts. This is the arithmetic
// the stream manager relies on, checked without a GPU (the resident share is computed by the same CPU
// pool with the complementary ids standing in for the GPU).
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>

#include "expert_pool.hpp"
#include "generate.hpp"
#include "gpu/expert_cache.hpp"
#include "model/forward.hpp"
#include "model/weights.hpp"
#include "topology.hpp"

namespace strata::engine::gpu {
namespace {

class instant_copier final : public expert_copier {
public:
    ticket start(int, expert_key) override { return next_++; }
    bool landed(ticket) override { return true; }
    void wait(ticket) override {}

private:
    ticket next_ = 0;
};

TEST(HybridSplit, ComplementPlusResidentEqualsTheFullMoe) {
    make_model::model_spec spec = make_model::preset("tiny");
    auto file = gguf::reader::from_bytes(make_model::build_model(spec).write_to_memory());
    const hparams hp = read_hparams(file);
    const model_weights w = bind_weights(file, hp);
    const std::vector<arenas::moe_layer> layers = moe_layers(w);
    const arenas::mapped_expert_rows rows(layers);
    arenas::pool_flags flags;
    flags.numa_pool = "off";
    flags.pool_workers = 2;
    const auto env = [](std::string_view) -> std::optional<std::string> { return std::nullopt; };
    auto pool = arenas::expert_pool::create(arenas::load_machine_topology(), arenas::read_pool_requests(env, flags));
    arenas::moe_runner runner(*pool, {hp.n_embd, hp.n_ff_exp, hp.n_expert, hp.n_expert_used}, layers, rows);

    const int n_tok = 5, k = hp.n_expert_used, n_embd = hp.n_embd;
    std::mt19937 rng(3);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    std::vector<float> x(static_cast<size_t>(n_tok * n_embd));
    for (float& v : x) v = dist(rng);
    std::vector<int32_t> ids(static_cast<size_t>(n_tok * k));
    std::vector<float> weights(ids.size());
    for (int t = 0; t < n_tok; ++t) {
        std::vector<float> logits(static_cast<size_t>(hp.n_expert));
        for (float& v : logits) v = dist(rng);
        route_token(logits.data(), hp.n_expert, k, true, ids.data() + t * k, weights.data() + t * k);
    }

    instant_copier copier;
    for (int n_slots : {0, 3, hp.n_layer * hp.n_expert / 2, hp.n_layer * hp.n_expert}) {
        expert_cache cache(hp.n_layer, hp.n_expert, n_slots, {.every = 1, .swaps = 2, .async = false}, copier);
        cache.fill(fill_order(hp.n_layer, hp.n_expert, nullptr));
        for (int step = 0; step < 3; ++step) {  // adaptive swaps between steps move experts around
            for (int il = 0; il < hp.n_layer; ++il) {
                std::vector<float> full(x.size()), cpu(x.size()), gpu(x.size());
                runner.run(il, n_tok, x.data(), ids.data(), weights.data(), full.data());
                std::vector<int32_t> complement(ids.size());
                std::vector<resident_job> resident;
                cache.split(il, n_tok, k, ids.data(), weights.data(), complement.data(), resident);
                // The GPU's share: exactly the resident slots, i.e. the ids the complement skipped.
                std::vector<int32_t> resident_ids(ids.size(), -1);
                for (const resident_job& r : resident) {
                    const size_t i = static_cast<size_t>(r.token * k + r.slot_in_token);
                    ASSERT_EQ(complement[i], -1);
                    ASSERT_EQ(r.weight, weights[i]);
                    ASSERT_EQ(cache.slot_content(r.slot), (expert_key{il, ids[i]}));
                    resident_ids[i] = ids[i];
                }
                for (size_t i = 0; i < ids.size(); ++i)
                    ASSERT_TRUE(complement[i] == ids[i] || resident_ids[i] == ids[i]) << "slot " << i << " lost";
                runner.run(il, n_tok, x.data(), complement.data(), weights.data(), cpu.data());
                runner.run(il, n_tok, x.data(), resident_ids.data(), weights.data(), gpu.data());
                double err = 0, mag = 0;
                for (size_t i = 0; i < full.size(); ++i) {
                    err = std::max(err, std::abs(double(cpu[i]) + gpu[i] - full[i]));
                    mag = std::max(mag, std::abs(double(full[i])));
                }
                EXPECT_LT(err, 1e-5 * mag) << n_slots << " slots, layer " << il << ", step " << step;
                if (n_slots == 0) {
                    EXPECT_TRUE(resident.empty());
                }
                if (n_slots == hp.n_layer * hp.n_expert) {
                    EXPECT_EQ(resident.size(), ids.size());
                }
            }
            cache.end_decode_step();
        }
    }
}

}  // namespace
}  // namespace strata::engine::gpu
