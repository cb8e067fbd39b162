#include "gpu/expert_cache.hpp"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include <spdlog/fmt/fmt.h>

namespace strata::engine::gpu {

namespace {

constexpr double kMiB = 1024.0 * 1024.0;
constexpr double kGiB = 1024.0 * kMiB;
constexpr const char* kProfileMagic = "strata-expert-profile";

double mib(uint64_t bytes) { return double(bytes) / kMiB; }

}  // namespace

std::optional<double> parse_expert_cache(const std::string& value) {
    if (value == "auto" || value.empty()) return std::nullopt;
    size_t used = 0;
    double gib = -1;
    try {
        gib = std::stod(value, &used);
    } catch (const std::exception&) {
        used = 0;
    }
    if (used != value.size() || !(gib >= 0) || !std::isfinite(gib))
        throw std::invalid_argument(fmt::format("--expert-cache must be 'auto' or a size in GiB (>= 0), got '{}'", value));
    return gib;
}

cache_size size_expert_cache(const vram_budget& b, std::optional<double> gib, uint64_t slot_bytes,
                             int n_experts_total) {
    if (slot_bytes == 0) throw std::invalid_argument("an expert slot of 0 bytes");
    if (b.n_sessions < 1)
        throw std::invalid_argument(fmt::format("--gpu-sessions must be at least 1, got {}", b.n_sessions));
    const uint64_t needed = b.reserve_bytes + b.dense_bytes + b.kv_bytes();
    if (needed > b.free_bytes)
        throw std::runtime_error(fmt::format(
            "the GPU has {:.0f} MiB free, but the dense weights ({:.0f} MiB), the KV cache ({:.0f} MiB for {} "
            "session(s)) and the reserve ({:.0f} MiB) need {:.0f} MiB",
            mib(b.free_bytes), mib(b.dense_bytes), mib(b.kv_bytes()), b.n_sessions, mib(b.reserve_bytes), mib(needed)));
    cache_size s;
    s.slot_bytes = slot_bytes;
    s.available_bytes = b.free_bytes - needed;
    uint64_t bytes = s.available_bytes;
    if (gib) {
        bytes = static_cast<uint64_t>(*gib * kGiB);
        if (bytes > s.available_bytes)
            throw std::runtime_error(fmt::format(
                "--expert-cache {} GiB ({:.0f} MiB) does not fit: {:.0f} MiB free minus dense weights {:.0f} MiB, KV "
                "cache {:.0f} MiB and reserve {:.0f} MiB leaves {:.0f} MiB",
                *gib, mib(bytes), mib(b.free_bytes), mib(b.dense_bytes), mib(b.kv_bytes()), mib(b.reserve_bytes),
                mib(s.available_bytes)));
    }
    s.n_slots = static_cast<int>(std::min<uint64_t>(bytes / slot_bytes, static_cast<uint64_t>(std::max(n_experts_total, 0))));
    return s;
}

void save_profile(const std::string& path, const expert_profile& p) {
    std::ofstream out(path);
    if (!out) throw std::runtime_error("cannot write the expert profile " + path);
    out << kProfileMagic << " 1 " << p.n_layer << ' ' << p.n_expert << '\n';
    for (int l = 0; l < p.n_layer; ++l) {
        for (int e = 0; e < p.n_expert; ++e)
            out << (e ? " " : "") << p.counts[static_cast<size_t>(l) * p.n_expert + e];
        out << '\n';
    }
    if (!out) throw std::runtime_error("writing the expert profile " + path + " failed");
}

expert_profile load_profile(const std::string& path, int n_layer, int n_expert) {
    std::ifstream in(path);
    if (!in) throw std::runtime_error("cannot read the expert profile " + path);
    std::string magic;
    int version = 0;
    expert_profile p;
    in >> magic >> version >> p.n_layer >> p.n_expert;
    if (!in || magic != kProfileMagic || version != 1)
        throw std::runtime_error(fmt::format("{} is not a strata expert profile (expected a first line '{} 1 <n_layer> "
                                             "<n_expert>')", path, kProfileMagic));
    if (p.n_layer != n_layer || p.n_expert != n_expert)
        throw std::runtime_error(fmt::format("the expert profile {} is for {} layers x {} experts, this model has {} x {}",
                                             path, p.n_layer, p.n_expert, n_layer, n_expert));
    p.counts.resize(static_cast<size_t>(n_layer) * n_expert);
    for (size_t i = 0; i < p.counts.size(); ++i)
        if (!(in >> p.counts[i]))
            throw std::runtime_error(fmt::format("the expert profile {} ends after {} of {} counts", path, i,
                                                 p.counts.size()));
    return p;
}

std::vector<expert_key> fill_order(int n_layer, int n_expert, const expert_profile* profile) {
    std::vector<expert_key> order;
    order.reserve(static_cast<size_t>(n_layer) * n_expert);
    for (int e = 0; e < n_expert; ++e)
        for (int l = 0; l < n_layer; ++l) order.push_back({l, e});
    if (profile) {
        auto count = [&](const expert_key& k) { return profile->counts[static_cast<size_t>(k.layer) * n_expert + k.expert]; };
        std::stable_sort(order.begin(), order.end(), [&](const expert_key& a, const expert_key& b) {
            if (count(a) != count(b)) return count(a) > count(b);
            return a.layer != b.layer ? a.layer < b.layer : a.expert < b.expert;
        });
    }
    return order;
}

expert_cache::expert_cache(int n_layer, int n_expert, int n_slots, adapt_options adapt, expert_copier& copier)
    : n_layer_(n_layer),
      n_expert_(n_expert),
      n_slots_(std::clamp(n_slots, 0, n_layer * n_expert)),
      adapt_(adapt),
      copier_(copier),
      table_(static_cast<size_t>(n_layer) * n_expert, -1),
      slots_(static_cast<size_t>(n_slots_), expert_key{-1, -1}),
      recent_(static_cast<size_t>(n_layer) * n_expert, 0) {
    stats_.n_slots = n_slots_;
}

void expert_cache::fill(const std::vector<expert_key>& order) {
    const int n = std::min<int>(n_slots_, static_cast<int>(order.size()));
    for (int s = 0; s < n; ++s) {
        slots_[static_cast<size_t>(s)] = order[static_cast<size_t>(s)];
        pending_.push_back({s, order[static_cast<size_t>(s)], copier_.start(s, order[static_cast<size_t>(s)])});
    }
    drain();
}

void expert_cache::commit(const pending_copy& p) {
    table_[index(p.key.layer, p.key.expert)] = p.slot;
    ++stats_.n_resident;
}

void expert_cache::drain() {
    for (const pending_copy& p : pending_) {
        copier_.wait(p.ticket);
        commit(p);
    }
    pending_.clear();
}

void expert_cache::split(int layer, int n_tok, int k, const int32_t* ids, const float* weights, int32_t* complement,
                         std::vector<resident_job>& resident) {
    resident.clear();
    uint64_t* recent = recent_.data() + static_cast<size_t>(layer) * n_expert_;
    for (int t = 0; t < n_tok; ++t)
        for (int j = 0; j < k; ++j) {
            const size_t i = static_cast<size_t>(t) * k + j;
            const int32_t e = ids[i];
            if (e < 0 || e >= n_expert_)
                throw std::out_of_range(fmt::format("layer {} token {}: routed expert id {} is outside 0..{}", layer, t,
                                                    e, n_expert_ - 1));
            ++recent[e];
            const int slot = table_[index(layer, e)];
            complement[i] = slot >= 0 ? -1 : e;
            if (slot >= 0) resident.push_back({t, j, slot, weights[i]});
        }
    stats_.lookups += static_cast<uint64_t>(n_tok) * k;
    stats_.hits += resident.size();
}

void expert_cache::end_decode_step() {
    // Commit what has landed, keep the rest in flight (in issue order).
    std::erase_if(pending_, [&](const pending_copy& p) {
        if (!copier_.landed(p.ticket)) return false;
        commit(p);
        ++stats_.swaps_landed;
        return true;
    });
    if (adapt_.every <= 0 || n_slots_ == 0 || ++steps_ % adapt_.every != 0) return;
    adapt();
    if (!adapt_.async) {
        stats_.swaps_landed += pending_.size();
        drain();
    }
}

// The most-routed experts not in VRAM (nor on their way) replace the least-routed residents, pair by
// pair while the newcomer was routed strictly more often. Counts then halve, so the tier follows the
// recent routing rather than the whole history.
void expert_cache::adapt() {
    std::vector<bool> busy(static_cast<size_t>(n_slots_), false);
    std::vector<bool> incoming(table_.size(), false);
    for (const pending_copy& p : pending_) {
        busy[static_cast<size_t>(p.slot)] = true;
        incoming[index(p.key.layer, p.key.expert)] = true;
    }
    std::vector<expert_key> candidates, victims;
    for (int l = 0; l < n_layer_; ++l)
        for (int e = 0; e < n_expert_; ++e) {
            const size_t i = index(l, e);
            if (table_[i] >= 0) {
                if (!busy[static_cast<size_t>(table_[i])]) victims.push_back({l, e});
            } else if (!incoming[i] && recent_[i] > 0) {
                candidates.push_back({l, e});
            }
        }
    auto count = [&](const expert_key& k) { return recent_[index(k.layer, k.expert)]; };
    auto before = [](const expert_key& a, const expert_key& b) {
        return a.layer != b.layer ? a.layer < b.layer : a.expert < b.expert;
    };
    std::stable_sort(candidates.begin(), candidates.end(), [&](const expert_key& a, const expert_key& b) {
        return count(a) != count(b) ? count(a) > count(b) : before(a, b);
    });
    std::stable_sort(victims.begin(), victims.end(), [&](const expert_key& a, const expert_key& b) {
        return count(a) != count(b) ? count(a) < count(b) : before(b, a);
    });
    const size_t n = std::min({candidates.size(), victims.size(), static_cast<size_t>(std::max(adapt_.swaps, 0))});
    for (size_t i = 0; i < n && count(candidates[i]) > count(victims[i]); ++i) {
        const size_t vi = index(victims[i].layer, victims[i].expert);
        const int slot = table_[vi];
        table_[vi] = -1;  // out of the table before its slot is overwritten
        --stats_.n_resident;
        slots_[static_cast<size_t>(slot)] = candidates[i];
        pending_.push_back({slot, candidates[i], copier_.start(slot, candidates[i])});
        ++stats_.swaps_started;
    }
    for (uint64_t& c : recent_) c /= 2;
}

}  // namespace strata::engine::gpu
