# The interface of the C++ kernel built from _delta_cpu.cpp, for the type checker.

#: The most value channels the kernel runs.
MAX_CHANNELS: int

# update(X, k, v, beta, G, out, dk, dv, dbeta, n, d, dv, erase, backward, float64, threads,
#        packed, beta_max, eps, channels_first): pointers as integers (see _delta_cpu.cpp).
def update(*args: float) -> None: ...
