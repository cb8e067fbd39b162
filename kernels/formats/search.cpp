// Scale searches shared by the quantizers. All minimise the plain squared error of the block
// (uniform weights), which is what a round-trip RMS test measures.
#include <algorithm>
#include <cmath>

#include "formats/detail.hpp"

namespace strata::formats::detail {

namespace {

constexpr float kTiny = 1e-30f;

// The element with the largest magnitude, with its sign.
float signed_max(int n, const float* x) {
    float amax = 0.0f, max = 0.0f;
    for (int i = 0; i < n; ++i) {
        if (std::fabs(x[i]) > amax) {
            amax = std::fabs(x[i]);
            max = x[i];
        }
    }
    return max;
}

struct symmetric_fit {
    float score = -1.0f;  // sum(x q)^2 / sum(q q): larger is a smaller squared error
    float scale = 0.0f;
    float iscale = 0.0f;  // the inverse scale the codes were rounded with
};

// Codes for inverse scale iscale, then the least-squares scale for those codes.
void try_symmetric(int n, int nmax, const float* x, float iscale, symmetric_fit& best) {
    float sumlx = 0.0f, suml2 = 0.0f;
    for (int i = 0; i < n; ++i) {
        const int l = std::clamp(nearest_int(iscale * x[i]), -nmax, nmax - 1);
        sumlx += x[i] * static_cast<float>(l);
        suml2 += static_cast<float>(l * l);
    }
    if (suml2 <= 0.0f) return;
    const float score = sumlx * sumlx / suml2;
    if (score > best.score) best = {score, sumlx / suml2, iscale};
}

struct iq4_fit {
    float score = -1.0f;
    float scale = 0.0f;
    float iscale = 0.0f;
};

void try_iq4(int n, const float* x, float iscale, iq4_fit& best) {
    float sumqx = 0.0f, sumq2 = 0.0f;
    for (int i = 0; i < n; ++i) {
        const float q = kvalues_iq4nl[nearest_iq4_index(iscale * x[i])];
        sumqx += x[i] * q;
        sumq2 += q * q;
    }
    if (sumq2 <= 0.0f) return;
    const float score = sumqx * sumqx / sumq2;
    if (score > best.score) best = {score, sumqx / sumq2, iscale};
}

struct affine_fit {
    float err = INFINITY;
    float scale = 0.0f;
    float offset = 0.0f;  // x ~ scale * q + offset
};

// Codes from (iscale, offset), then the least-squares (scale, offset) for those codes; the offset is
// kept <= 0 unless free_offset.
void try_affine(int n, int nmax, const float* x, float iscale, float offset, bool free_offset,
                affine_fit& best) {
    float sum_l = 0, sum_l2 = 0, sum_x = 0, sum_lx = 0;
    for (int i = 0; i < n; ++i) {
        const float l = static_cast<float>(std::clamp(nearest_int(iscale * (x[i] - offset)), 0, nmax));
        sum_l += l;
        sum_l2 += l * l;
        sum_x += x[i];
        sum_lx += l * x[i];
    }
    const float fn = static_cast<float>(n);
    const float det = fn * sum_l2 - sum_l * sum_l;
    float scale = 0.0f, off = 0.0f;
    if (det > 0.0f) {
        scale = (fn * sum_lx - sum_l * sum_x) / det;
        off = (sum_l2 * sum_x - sum_l * sum_lx) / det;
    } else if (sum_l2 > 0.0f) {  // all codes equal (a constant block): no offset needed
        scale = sum_lx / sum_l2;
    }
    if (!free_offset && off > 0.0f) {
        off = 0.0f;
        scale = sum_lx / sum_l2;
    }
    if (scale <= 0.0f) return;
    float err = 0.0f;
    const float inv = 1.0f / scale;
    for (int i = 0; i < n; ++i) {
        // Error of the codes the caller will write: re-rounded with the fitted (scale, offset).
        const float l = static_cast<float>(std::clamp(nearest_int(inv * (x[i] - off)), 0, nmax));
        const float diff = scale * l + off - x[i];
        err += diff * diff;
    }
    if (err < best.err) best = {err, scale, off};
}

}  // namespace

float max_abs(int n, const float* x) {
    float amax = 0.0f;
    for (int i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
    return amax;
}

int nearest_iq4_index(float v) {
    int best = 0;
    for (int k = 1; k < 16; ++k)
        if (std::fabs(v - kvalues_iq4nl[k]) < std::fabs(v - kvalues_iq4nl[best])) best = k;
    return best;
}

float fit_symmetric(int n, int nmax, const float* x, uint8_t* codes) {
    const float max = signed_max(n, x);
    if (std::fabs(max) < kTiny) {
        std::fill(codes, codes + n, static_cast<uint8_t>(nmax));
        return 0.0f;
    }
    // Candidates map the largest magnitude to about -nmax (the wider side of the code range).
    symmetric_fit best;
    for (int is = -9; is <= 9; ++is) try_symmetric(n, nmax, x, -(nmax + 0.1f * is) / max, best);
    for (int iter = 0; iter < 3; ++iter) try_symmetric(n, nmax, x, 1.0f / best.scale, best);  // refine
    for (int i = 0; i < n; ++i)
        codes[i] = static_cast<uint8_t>(std::clamp(nearest_int(best.iscale * x[i]), -nmax, nmax - 1) + nmax);
    return best.scale;
}

float fit_affine(int n, int nmax, const float* x, uint8_t* codes, float* offset, bool free_offset) {
    float xmin = *std::min_element(x, x + n);
    const float xmax = *std::max_element(x, x + n);
    if (!free_offset) xmin = std::min(xmin, 0.0f);
    affine_fit best;
    if (xmax - xmin > kTiny) {
        // Spread the codes over [xmin, xmax] with nmax - 1 .. nmax + 1 steps, then refit twice.
        for (int is = 0; is <= 20; ++is)
            try_affine(n, nmax, x, (nmax - 1.0f + 0.1f * is) / (xmax - xmin), xmin, free_offset, best);
        for (int iter = 0; iter < 2 && best.scale > 0.0f; ++iter)
            try_affine(n, nmax, x, 1.0f / best.scale, best.offset, free_offset, best);
    }
    if (best.scale <= 0.0f) {  // constant block: all codes 0, the offset carries the value
        std::fill(codes, codes + n, uint8_t{0});
        *offset = free_offset ? xmin : std::min(xmin, 0.0f);
        return 0.0f;
    }
    const float inv = 1.0f / best.scale;
    for (int i = 0; i < n; ++i)
        codes[i] = static_cast<uint8_t>(std::clamp(nearest_int(inv * (x[i] - best.offset)), 0, nmax));
    *offset = best.offset;
    return best.scale;
}

float fit_iq4(int n, const float* x, uint8_t* codes) {
    const float max = signed_max(n, x);
    if (std::fabs(max) < kTiny) {
        std::fill(codes, codes + n, static_cast<uint8_t>(nearest_iq4_index(0.0f)));
        return 0.0f;
    }
    // The code book is lopsided (-127 .. 113): try the largest magnitude near either end.
    iq4_fit best;
    for (int step = 0; step <= 7; ++step) {
        try_iq4(n, x, (kvalues_iq4nl[0] + step) / max, best);
        try_iq4(n, x, (kvalues_iq4nl[15] - step) / max, best);
    }
    for (int iter = 0; iter < 3; ++iter) try_iq4(n, x, 1.0f / best.scale, best);  // refine
    for (int i = 0; i < n; ++i) codes[i] = static_cast<uint8_t>(nearest_iq4_index(best.iscale * x[i]));
    return best.scale;
}

}  // namespace strata::formats::detail
