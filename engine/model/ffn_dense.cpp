// The dense FFN kind: down(silu(gate xn) * up xn), the leading dense layers' FFN and the shared
// expert's computation.
#include "model/forward.hpp"

namespace strata::engine {

namespace cpu = kernels::cpu;

void dense_ffn::eval(int il, int n_tok, residual_stream& out) {
    forward_pass& f = f_;
    const layer_weights& l = f.w_.layers[static_cast<size_t>(il)];
    arenas::scoped_seconds t(f.seconds(phase_clock::dense_ffn));
    f.add_bytes(phase_clock::dense_ffn, l.ffn_gate.bytes() + l.ffn_up.bytes() + l.ffn_down.bytes());
    run(l.ffn_gate, l.ffn_up, l.ffn_down, f.hp_.n_ff, n_tok);
    out.add(f.tmp_.data(), true, n_tok);
}

void dense_ffn::run(const weight_matrix& gate, const weight_matrix& up, const weight_matrix& down, int n_ff, int n_tok) {
    forward_pass& f = f_;
    const size_t nf = static_cast<size_t>(n_ff);
    f.shexp_up_.resize(static_cast<size_t>(n_tok) * nf);
    const weight_matrix* const w[] = {&gate, &up};
    float* const y[] = {f.tmp2_.data(), f.shexp_up_.data()};
    f.matmul_same_input(w, n_tok, f.xn_.data(), y);
    run_down(down, n_ff, n_tok);
}

void dense_ffn::run_down(const weight_matrix& down, int n_ff, int n_tok) {
    forward_pass& f = f_;
    const size_t nf = static_cast<size_t>(n_ff);
    for (int t = 0; t < n_tok; ++t)
        cpu::silu_mul(f.tmp2_.data() + t * nf, f.shexp_up_.data() + t * nf, static_cast<int64_t>(nf),
                      f.tmp2_.data() + t * nf);
    f.matmul(down, n_tok, f.tmp2_.data(), f.tmp_.data());
}

}  // namespace strata::engine
