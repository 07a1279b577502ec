// Device-side gather of a strided view into a C-contiguous array (the layout-agnostic copy
// behind OpenCLDevice.contiguous). W is an unsigned integer type of the element's size, so the
// copy needs no fp64 / fp16 extension. Views are collapsed on the host to at most 6 dims.

__kernel void strided_copy(__global W* dst, __global const W* src, const long src_off, const long n,
                           const long n0, const long n1, const long n2, const long n3, const long n4,
                           const long n5, const long s0, const long s1, const long s2, const long s3,
                           const long s4, const long s5) {
    long i = get_global_id(0);
    if (i >= n) return;
    long r = i, off = src_off;
    off += (r % n5) * s5; r /= n5;
    off += (r % n4) * s4; r /= n4;
    off += (r % n3) * s3; r /= n3;
    off += (r % n2) * s2; r /= n2;
    off += (r % n1) * s1; r /= n1;
    off += r * s0;
    dst[i] = src[off];
}

// A strided view copied into a strided view of the same shape (concat writes each part into its
// slab of the result this way). Both sides are collapsed together on the host to at most 6 dims;
// offsets and strides are in elements.
__kernel void strided_copy_into(__global W* dst, const long dst_off, __global const W* src, const long src_off,
                                const long n, const long n0, const long n1, const long n2, const long n3,
                                const long n4, const long n5, const long d0, const long d1, const long d2,
                                const long d3, const long d4, const long d5, const long s0, const long s1,
                                const long s2, const long s3, const long s4, const long s5) {
    long i = get_global_id(0);
    if (i >= n) return;
    long r = i, so = src_off, dof = dst_off, k;
    k = r % n5; so += k * s5; dof += k * d5; r /= n5;
    k = r % n4; so += k * s4; dof += k * d4; r /= n4;
    k = r % n3; so += k * s3; dof += k * d3; r /= n3;
    k = r % n2; so += k * s2; dof += k * d2; r /= n2;
    k = r % n1; so += k * s1; dof += k * d1; r /= n1;
    so += r * s0; dof += r * d0;
    dst[dof] = src[so];
}
