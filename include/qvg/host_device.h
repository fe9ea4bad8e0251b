// qvg/host_device.h — QVG_HD, the mark of a function that the host compiler and nvcc
// (host and device) both compile: `__host__ __device__ __forceinline__` under nvcc,
// `inline` elsewhere. Its one definition, for the rules written once for every
// backend (qvg/code_format.h, src/core/numeric_impl.h, src/core/residual_impl.h).
#pragma once

#ifndef QVG_HD
#if defined(__CUDACC__)
#define QVG_HD __host__ __device__ __forceinline__
#else
#define QVG_HD inline
#endif
#endif
