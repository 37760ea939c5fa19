// The Delta update's CPU kernel: Y = X + k cᵀ, c = β (v − kᵀX), and its closed-form backward,
// one row (one d × d_v state) at a time, so each row is read from memory once and stays in
// cache between its readout and its update. No temporaries the size of the state.
//
// Built with the package (`pip install`) as an optional extension; it needs only Python.h and
// a C++17 compiler, never torch: tensors arrive as data pointers of contiguous float32 or
// float64 rows, and the Python side (ddl_dynamics/models/delta_kernels.py) owns shapes, dtypes
// and autograd. Accumulation is in the state's dtype.
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <cstdint>

namespace {

// Value channels handled with stack buffers; wider states use the reference path.
constexpr int64_t kMaxChannels = 256;
// Rows of at least this many elements in all are split across threads.
constexpr int64_t kParallelWork = 1 << 16;

template <typename T>
struct Args {
    const T* X;  // (n, d, dv) state (backward: the forward's input)
    const T* k;  // (n, d) direction
    const T* v;  // (n, dv) target readout
    const T* beta;  // (n,) gate
    const T* G;  // (n, d, dv) upstream gradient (backward only)
    T* Y;  // (n, d, dv) forward output; backward: dX
    T* dk;  // (n, d)
    T* dv_out;  // (n, dv)
    T* dbeta;  // (n,)
    int64_t n, d, dv;
    int threads;
};

// Calls body(r) for every row r, split across threads when there is enough work.
template <typename T, typename Body>
inline void for_each_row(const Args<T>& a, int64_t row_size, Body body) {
#pragma omp parallel for schedule(static) num_threads(a.threads) \
    if (a.threads > 1 && a.n * row_size >= kParallelWork)
    for (int64_t r = 0; r < a.n; ++r) body(r);
}

// a = kᵀx for one row x (d × dv): one dot product per value channel; with SECOND, also
// b = kᵀy in the same sweep, so that the row is read from memory once.
template <typename T, bool SECOND = false>
inline void readout(const T* k, int64_t d, int64_t dv, const T* x, T* a, const T* y = nullptr,
                    T* b = nullptr) {
    if (dv == 1) {
        T sa = 0, sb = 0;
#pragma omp simd reduction(+ : sa, sb)
        for (int64_t i = 0; i < d; ++i) {
            sa += k[i] * x[i];
            if (SECOND) sb += k[i] * y[i];
        }
        a[0] = sa;
        if (SECOND) b[0] = sb;
        return;
    }
    for (int64_t j = 0; j < dv; ++j) {
        a[j] = 0;
        if (SECOND) b[j] = 0;
    }
    for (int64_t i = 0; i < d; ++i)
#pragma omp simd
        for (int64_t j = 0; j < dv; ++j) {
            a[j] += k[i] * x[i * dv + j];
            if (SECOND) b[j] += k[i] * y[i * dv + j];
        }
}

// DV > 0 fixes the number of value channels at compile time, so the channel loops unroll
// into registers; DV == 0 reads it from args. ERASE selects the delta rule over write-only.
template <typename T, int DV, bool ERASE>
void forward(const Args<T>& a) {
    const int64_t d = a.d, dv = DV ? DV : a.dv, m = d * dv;
    for_each_row(a, m, [&](int64_t r) {
        const T *x = a.X + r * m, *k = a.k + r * d;
        T* y = a.Y + r * m;
        T c[DV ? DV : kMaxChannels] = {};
        if (ERASE) readout(k, d, dv, x, c);
        for (int64_t j = 0; j < dv; ++j) c[j] = a.beta[r] * (a.v[r * dv + j] - c[j]);
        for (int64_t i = 0; i < d; ++i)
#pragma omp simd
            for (int64_t j = 0; j < dv; ++j) y[i * dv + j] = x[i * dv + j] + k[i] * c[j];
    });
}

// With g = kᵀG, e = v − kᵀX (write-only: e = v), c = β e:
// dX = G − β k gᵀ, dk = G c − β X g, dv = β g, dβ = eᵀg (the β terms in dX, dk: erase only).
template <typename T, int DV, bool ERASE>
void backward(const Args<T>& a) {
    const int64_t d = a.d, dv = DV ? DV : a.dv, m = d * dv;
    for_each_row(a, m, [&](int64_t r) {
        const T *x = a.X + r * m, *gr = a.G + r * m, *k = a.k + r * d;
        T *dx = a.Y + r * m, *dk = a.dk + r * d;
        T g[DV ? DV : kMaxChannels], e[DV ? DV : kMaxChannels] = {};  // e stays 0 write-only
        T c[DV ? DV : kMaxChannels], bg[DV ? DV : kMaxChannels], dbeta = 0;
        readout<T, ERASE>(k, d, dv, gr, g, x, e);  // e = kᵀX until it becomes v − kᵀX
        const T beta = a.beta[r];
        for (int64_t j = 0; j < dv; ++j) {
            e[j] = a.v[r * dv + j] - e[j];
            c[j] = beta * e[j];
            bg[j] = beta * g[j];
            a.dv_out[r * dv + j] = bg[j];
            dbeta += e[j] * g[j];
        }
        a.dbeta[r] = dbeta;
        if (dv == 1) {  // vectorised over the row rather than over one channel
#pragma omp simd
            for (int64_t i = 0; i < d; ++i) {
                dx[i] = ERASE ? gr[i] - k[i] * bg[0] : gr[i];
                dk[i] = ERASE ? gr[i] * c[0] - x[i] * bg[0] : gr[i] * c[0];
            }
            return;
        }
        for (int64_t i = 0; i < d; ++i) {
            T s = 0;
#pragma omp simd reduction(+ : s)
            for (int64_t j = 0; j < dv; ++j) {
                const T gij = gr[i * dv + j];
                dx[i * dv + j] = ERASE ? gij - k[i] * bg[j] : gij;
                s += ERASE ? gij * c[j] - x[i * dv + j] * bg[j] : gij * c[j];
            }
            dk[i] = s;
        }
    });
}

template <typename T, bool ERASE>
void run(const Args<T>& a, bool is_backward) {
    auto pick = [&](auto fwd, auto bwd) { is_backward ? bwd(a) : fwd(a); };
    switch (a.dv) {
        case 1: return pick(forward<T, 1, ERASE>, backward<T, 1, ERASE>);
        case 2: return pick(forward<T, 2, ERASE>, backward<T, 2, ERASE>);
        case 4: return pick(forward<T, 4, ERASE>, backward<T, 4, ERASE>);
        case 8: return pick(forward<T, 8, ERASE>, backward<T, 8, ERASE>);
        default: return pick(forward<T, 0, ERASE>, backward<T, 0, ERASE>);
    }
}

template <typename T>
void dispatch(const Args<T>& a, bool erase, bool is_backward) {
    erase ? run<T, true>(a, is_backward) : run<T, false>(a, is_backward);
}

using Ptr = unsigned long long;

// update(X, k, v, beta, G, out, dk, dv, dbeta, n, d, dv, erase, backward, float64, threads):
// pointers as integers; G, dk, dv and dbeta are unused (0) in the forward.
PyObject* update(PyObject*, PyObject* args) {
    Ptr X, k, v, beta, G, out, dk, dv_out, dbeta;
    long long n, d, dv;
    int erase, is_backward, float64, threads;
    if (!PyArg_ParseTuple(args, "KKKKKKKKKLLLpppi", &X, &k, &v, &beta, &G, &out, &dk, &dv_out,
                          &dbeta, &n, &d, &dv, &erase, &is_backward, &float64, &threads))
        return nullptr;
    if (n < 0 || d < 1 || dv < 1 || dv > kMaxChannels || threads < 1) {
        PyErr_Format(PyExc_ValueError, "bad sizes n=%lld d=%lld dv=%lld threads=%d", n, d, dv,
                     threads);
        return nullptr;
    }
    Py_BEGIN_ALLOW_THREADS
    if (float64) {
        using T = double;
        Args<T> a{(const T*)X, (const T*)k, (const T*)v, (const T*)beta, (const T*)G, (T*)out,
                  (T*)dk, (T*)dv_out, (T*)dbeta, n, d, dv, threads};
        dispatch(a, erase, is_backward);
    } else {
        using T = float;
        Args<T> a{(const T*)X, (const T*)k, (const T*)v, (const T*)beta, (const T*)G, (T*)out,
                  (T*)dk, (T*)dv_out, (T*)dbeta, n, d, dv, threads};
        dispatch(a, erase, is_backward);
    }
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

PyMethodDef methods[] = {
    {"update", update, METH_VARARGS, "Forward or backward of the Delta update on raw rows."},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef module = {PyModuleDef_HEAD_INIT, "_delta_cpu", nullptr, -1, methods};

}  // namespace

PyMODINIT_FUNC PyInit__delta_cpu() {
    PyObject* m = PyModule_Create(&module);
    if (m) PyModule_AddIntConstant(m, "MAX_CHANNELS", kMaxChannels);
    return m;
}
