// A non-owning reference to a callable, for the pool's per-phase callbacks: unlike std::function it
// never allocates (a lambda with several captures would, on every token), and it is only valid while
// the callable it was made from lives, which a synchronous call guarantees.
#pragma once

#include <memory>
#include <type_traits>
#include <utility>

namespace strata::arenas {

template <class Signature>
class function_ref;

template <class R, class... Args>
class function_ref<R(Args...)> {
public:
    template <class F>
        requires(!std::is_same_v<std::remove_cvref_t<F>, function_ref> && std::is_invocable_r_v<R, F&, Args...>)
    function_ref(F&& f) noexcept  // NOLINT(google-explicit-constructor): stands in for a callable argument
        : object_(const_cast<void*>(static_cast<const void*>(std::addressof(f)))),
          call_([](void* o, Args... args) -> R {
              return (*static_cast<std::remove_reference_t<F>*>(o))(std::forward<Args>(args)...);
          }) {}

    R operator()(Args... args) const { return call_(object_, std::forward<Args>(args)...); }

private:
    void* object_;
    R (*call_)(void*, Args...);
};

}  // namespace strata::arenas
