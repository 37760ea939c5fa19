// The Delta update's CPU kernel: Y = X + k cᵀ, c = β (v − kᵀX), and its closed-form backward,
// one row (one d × d_v state) at a time, so each row is read from memory once and stays in
// cache between its readout and its update. No temporaries the size of the state. A packed
// call reads a DDL layer's raw generators instead of k, v and β, and normalises the direction
// and applies the gate in the same pass (forward and backward). A row is held channel by
// channel (d_v × d, "channels first") or coordinate by coordinate (d × d_v): the Transformer
// keeps its expanded state channels first, so that each channel is a contiguous d-vector.
//
// Built with the package (`pip install`) as an optional extension; it needs only Python.h and
// a C++17 compiler, never torch: tensors arrive as data pointers of contiguous float32 or
// float64 rows, and the Python side (ddl_dynamics/models/delta_kernels.py) owns shapes, dtypes
// and autograd. Accumulation is in the state's dtype.
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <cmath>
#include <cstdint>

namespace {

// Value channels handled with stack buffers; wider states use the reference path.
constexpr int64_t kMaxChannels = 256;
// Rows of at least this many elements in all are split across threads.
constexpr int64_t kParallelWork = 1 << 16;

template <typename T>
struct Args {
    const T* X;  // (n, d, dv) state, or (n, dv, d) channels first (backward: the forward's input)
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
    if (a.threads == 1 || a.n * row_size < kParallelWork) {  // no thread team to start
        for (int64_t r = 0; r < a.n; ++r) body(r);
        return;
    }
#pragma omp parallel for schedule(static) num_threads(a.threads)
    for (int64_t r = 0; r < a.n; ++r) body(r);
}

// a = kᵀx for one row x (d × dv): one dot product per value channel; with SECOND, also
// b = kᵀy in the same sweep, so that the row is read from memory once.
template <typename T, bool SECOND = false, bool CF = false>
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
    if (CF) {  // one dot product along each contiguous channel
        for (int64_t j = 0; j < dv; ++j) {
            T sa = 0, sb = 0;
#pragma omp simd reduction(+ : sa, sb)
            for (int64_t i = 0; i < d; ++i) {
                sa += k[i] * x[j * d + i];
                if (SECOND) sb += k[i] * y[j * d + i];
            }
            a[j] = sa;
            if (SECOND) b[j] = sb;
        }
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

// One row's forward, y = x + (s k) cᵀ with c = β (v − s kᵀx) (ERASE) or c = β v: the scale s
// turns a raw direction into the unit one without a buffer for it (s = 1: k is unit already).
// DV > 0 fixes the number of value channels at compile time, so the channel loops unroll into
// registers; DV == 0 reads it from dv_rt.
template <typename T, int DV, bool ERASE, bool CF = false>
inline void forward_row(const T* x, const T* k, T s, const T* v, T beta, int64_t d,
                        int64_t dv_rt, T* y) {
    const int64_t dv = DV ? DV : dv_rt;
    T c[DV ? DV : kMaxChannels] = {};
    if (ERASE) readout<T, false, CF>(k, d, dv, x, c);
    for (int64_t j = 0; j < dv; ++j) c[j] = s * beta * (v[j] - s * c[j]);
    if (dv == 1) {  // vectorised over the row rather than over one channel
#pragma omp simd
        for (int64_t i = 0; i < d; ++i) y[i] = x[i] + k[i] * c[0];
        return;
    }
    if (CF) {
        for (int64_t j = 0; j < dv; ++j)
#pragma omp simd
            for (int64_t i = 0; i < d; ++i) y[j * d + i] = x[j * d + i] + k[i] * c[j];
        return;
    }
    for (int64_t i = 0; i < d; ++i)
#pragma omp simd
        for (int64_t j = 0; j < dv; ++j) y[i * dv + j] = x[i * dv + j] + k[i] * c[j];
}

template <typename T>
struct RowGrads {
    T dbeta;  // dβ = eᵀg
    T k_du;  // kᵀdu, for the gradient through a normalisation of k
};

// One row's backward with u = s k the unit direction, g = uᵀG, e = v − uᵀX (write-only: e = v),
// c = β e: dX = G − β u gᵀ, du = G c − β X g, dv = β g (the β terms in dX and du: erase only).
// du is the gradient with respect to the unit direction u.
template <typename T, int DV, bool ERASE, bool CF = false>
inline RowGrads<T> backward_row(const T* gr, const T* x, const T* k, T s, const T* v, T beta,
                                int64_t d, int64_t dv_rt, T* dx, T* du, T* dv_out) {
    const int64_t dv = DV ? DV : dv_rt;
    T g[DV ? DV : kMaxChannels], e[DV ? DV : kMaxChannels] = {};  // e stays 0 write-only
    T c[DV ? DV : kMaxChannels], bg[DV ? DV : kMaxChannels], sbg[DV ? DV : kMaxChannels];
    T dbeta = 0;
    readout<T, ERASE, CF>(k, d, dv, gr, g, x, e);  // e = kᵀX until it becomes v − uᵀX
    for (int64_t j = 0; j < dv; ++j) {
        g[j] *= s;
        e[j] = v[j] - s * e[j];
        c[j] = beta * e[j];
        bg[j] = beta * g[j];
        sbg[j] = s * bg[j];
        dv_out[j] = bg[j];
        dbeta += e[j] * g[j];
    }
    T k_du = 0;
    if (dv == 1) {  // vectorised over the row rather than over one channel
#pragma omp simd reduction(+ : k_du)
        for (int64_t i = 0; i < d; ++i) {
            dx[i] = ERASE ? gr[i] - k[i] * sbg[0] : gr[i];
            du[i] = ERASE ? gr[i] * c[0] - x[i] * bg[0] : gr[i] * c[0];
            k_du += k[i] * du[i];
        }
        return {dbeta, k_du};
    }
    if (CF) {  // along each contiguous channel, du summed over the channels
#pragma omp simd
        for (int64_t i = 0; i < d; ++i) du[i] = 0;
        for (int64_t j = 0; j < dv; ++j) {
            const T* gj = gr + j * d;
            const T* xj = x + j * d;
            T* dxj = dx + j * d;
#pragma omp simd
            for (int64_t i = 0; i < d; ++i) {
                dxj[i] = ERASE ? gj[i] - k[i] * sbg[j] : gj[i];
                du[i] += ERASE ? gj[i] * c[j] - xj[i] * bg[j] : gj[i] * c[j];
            }
        }
#pragma omp simd reduction(+ : k_du)
        for (int64_t i = 0; i < d; ++i) k_du += k[i] * du[i];
        return {dbeta, k_du};
    }
    for (int64_t i = 0; i < d; ++i) {
        T acc = 0;
#pragma omp simd reduction(+ : acc)
        for (int64_t j = 0; j < dv; ++j) {
            const T gij = gr[i * dv + j];
            dx[i * dv + j] = ERASE ? gij - k[i] * sbg[j] : gij;
            acc += ERASE ? gij * c[j] - x[i * dv + j] * bg[j] : gij * c[j];
        }
        du[i] = acc;
        k_du += k[i] * acc;
    }
    return {dbeta, k_du};
}

// The update of unit directions k (n, d) with v (n, dv), beta (n,).
template <typename T, int DV, bool ERASE, bool CF>
void forward(const Args<T>& a) {
    const int64_t d = a.d, m = d * a.dv;
    for_each_row(a, m, [&](int64_t r) {
        forward_row<T, DV, ERASE, CF>(a.X + r * m, a.k + r * d, T(1), a.v + r * a.dv, a.beta[r], d,
                                  a.dv, a.Y + r * m);
    });
}

template <typename T, int DV, bool ERASE, bool CF>
void backward(const Args<T>& a) {
    const int64_t d = a.d, m = d * a.dv;
    for_each_row(a, m, [&](int64_t r) {
        a.dbeta[r] = backward_row<T, DV, ERASE, CF>(a.G + r * m, a.X + r * m, a.k + r * d, T(1),
                                                a.v + r * a.dv, a.beta[r], d, a.dv,
                                                a.Y + r * m, a.dk + r * d, a.dv_out + r * a.dv)
                         .dbeta;
    });
}

// A layer's generators packed in one row, raw = [k̃ (d) | gate logit | v (dv)]: the unit
// direction is k = s k̃ with s = (‖k̃‖² + eps²)^(-1/2), the gate β = beta_max σ(logit).
template <typename T>
struct Packed {
    T beta_max, eps;

    T scale(const T* k_raw, int64_t d) const {
        T sq = 0;
#pragma omp simd reduction(+ : sq)
        for (int64_t i = 0; i < d; ++i) sq += k_raw[i] * k_raw[i];
        return T(1) / std::sqrt(sq + eps * eps);
    }
    T gate(T logit) const { return beta_max / (T(1) + std::exp(-logit)); }
};

// Y = the update of X by the generators in raw (n, d + 1 + dv); the Args' k points at raw.
template <typename T, int DV, bool ERASE>
void packed_forward(const Args<T>& a, const Packed<T>& p) {
    const int64_t d = a.d, m = d * a.dv, w = d + 1 + a.dv;
    for_each_row(a, m, [&](int64_t r) {
        const T* raw = a.k + r * w;
        forward_row<T, DV, ERASE>(a.X + r * m, raw, p.scale(raw, d), raw + d + 1, p.gate(raw[d]),
                                  d, a.dv, a.Y + r * m);
    });
}

// dX into Y and d raw into dk (n, d + 1 + dv): through the unit direction,
// dk̃ = s (du − u (uᵀdu)); through the gate, dlogit = dβ · β (1 − β / beta_max).
template <typename T, int DV, bool ERASE>
void packed_backward(const Args<T>& a, const Packed<T>& p) {
    const int64_t d = a.d, m = d * a.dv, w = d + 1 + a.dv;
    for_each_row(a, m, [&](int64_t r) {
        const T* raw = a.k + r * w;
        T* draw = a.dk + r * w;
        const T s = p.scale(raw, d), beta = p.gate(raw[d]);
        const RowGrads<T> grads = backward_row<T, DV, ERASE>(
            a.G + r * m, a.X + r * m, raw, s, raw + d + 1, beta, d, a.dv, a.Y + r * m, draw,
            draw + d + 1);
        const T along = s * s * s * grads.k_du;  // s · uᵀdu · s, with u = s k̃
#pragma omp simd
        for (int64_t i = 0; i < d; ++i) draw[i] = s * draw[i] - raw[i] * along;
        draw[d] = grads.dbeta * beta * (T(1) - beta / p.beta_max);
    });
}

// Packed generators come with flat (n, d·dv) states, never channels first.
template <typename T, bool ERASE, bool CF>
void run(const Args<T>& a, bool is_backward, const Packed<T>* packed) {
    auto pick = [&](auto fwd, auto bwd, auto pfwd, auto pbwd) {
        if (packed) return is_backward ? pbwd(a, *packed) : pfwd(a, *packed);
        is_backward ? bwd(a) : fwd(a);
    };
#define DDL_KERNELS(DV)                                                                   \
    forward<T, DV, ERASE, CF>, backward<T, DV, ERASE, CF>, packed_forward<T, DV, ERASE>,  \
        packed_backward<T, DV, ERASE>
    switch (a.dv) {
        case 1: return pick(DDL_KERNELS(1));
        case 2: return pick(DDL_KERNELS(2));
        case 4: return pick(DDL_KERNELS(4));
        case 8: return pick(DDL_KERNELS(8));
        default: return pick(DDL_KERNELS(0));
    }
#undef DDL_KERNELS
}

template <typename T>
void dispatch(const Args<T>& a, bool erase, bool is_backward, const Packed<T>* packed,
              bool channels_first) {
    if (channels_first)
        erase ? run<T, true, true>(a, is_backward, nullptr)
              : run<T, false, true>(a, is_backward, nullptr);
    else
        erase ? run<T, true, false>(a, is_backward, packed)
              : run<T, false, false>(a, is_backward, packed);
}

using Ptr = unsigned long long;

template <typename T>
void launch(const Ptr (&p)[9], int64_t n, int64_t d, int64_t dv, bool erase, bool is_backward,
            int threads, bool packed, double beta_max, double eps, bool channels_first) {
    Args<T> a{(const T*)p[0], (const T*)p[1], (const T*)p[2], (const T*)p[3], (const T*)p[4],
              (T*)p[5], (T*)p[6], (T*)p[7], (T*)p[8], n, d, dv, threads};
    const Packed<T> generators{T(beta_max), T(eps)};
    dispatch(a, erase, is_backward, packed ? &generators : nullptr, channels_first);
}

// update(X, k, v, beta, G, out, dk, dv, dbeta, n, d, dv, erase, backward, float64, threads,
//        packed, beta_max, eps, channels_first): pointers as integers; G, dk, dv and dbeta are
// unused (0) in the forward. packed: k points at the rows raw = [k̃ | gate logit | v]
// (n, d + 1 + dv) and dk at their gradient; v, beta, dv and dbeta are unused. channels_first:
// X, G, out (and dX) rows are dv × d (not with packed).
PyObject* update(PyObject*, PyObject* args) {
    Ptr p[9];
    long long n, d, dv;
    int erase, is_backward, float64, threads, packed, channels_first;
    double beta_max, eps;
    if (!PyArg_ParseTuple(args, "KKKKKKKKKLLLpppipddp", &p[0], &p[1], &p[2], &p[3], &p[4], &p[5],
                          &p[6], &p[7], &p[8], &n, &d, &dv, &erase, &is_backward, &float64,
                          &threads, &packed, &beta_max, &eps, &channels_first))
        return nullptr;
    if (packed && channels_first) {
        PyErr_SetString(PyExc_ValueError, "packed generators take flat states, not channels first");
        return nullptr;
    }
    if (n < 0 || d < 1 || dv < 1 || dv > kMaxChannels || threads < 1) {
        PyErr_Format(PyExc_ValueError, "bad sizes n=%lld d=%lld dv=%lld threads=%d", n, d, dv,
                     threads);
        return nullptr;
    }
    Py_BEGIN_ALLOW_THREADS
    (float64 ? launch<double> : launch<float>)(p, n, d, dv, erase, is_backward, threads, packed,
                                                beta_max, eps, channels_first);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

PyMethodDef methods[] = {
    {"update", update, METH_VARARGS, "Forward or backward of the Delta update on raw rows (packed: from raw generators)."},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef module = {PyModuleDef_HEAD_INIT, "_delta_cpu", nullptr, -1, methods};

}  // namespace

PyMODINIT_FUNC PyInit__delta_cpu() {
    PyObject* m = PyModule_Create(&module);
    if (m) PyModule_AddIntConstant(m, "MAX_CHANNELS", kMaxChannels);
    return m;
}
