// relu: y[i] = max(x[i], 0) over a contiguous run, VW elements per work-item (fmax keeps NaN:
// OpenCL's fmax returns the other operand for a NaN, so the NaN test is explicit).
// T: the element type; VW: elements per work-item (1, 4, 8, 16).

#define VEC_(t, n) t##n
#define VEC(t, n) VEC_(t, n)

__kernel void relu(__global const T* x, const long x_offset, __global T* y, const long n) {
    const long i = (long)get_global_id(0) * VW;
    __global const T* xs = x + x_offset;
    if (i + VW <= n) {
#if VW == 1
        const T v = xs[i];
        y[i] = v > (T)0 || isnan(v) ? v : (T)0;
#else
        const VEC(T, VW) v = VEC(vload, VW)(0, xs + i);
        const VEC(T, VW) zero = (VEC(T, VW))(0);
        VEC(vstore, VW)(select(zero, v, (v > zero) | isnan(v)), 0, y + i);
#endif
    } else {
        for (long j = i; j < n; ++j) {
            const T v = xs[j];
            y[j] = v > (T)0 || isnan(v) ? v : (T)0;
        }
    }
}
