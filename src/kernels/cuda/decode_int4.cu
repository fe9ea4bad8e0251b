// The vectorised decode kernels for int4 codes (decode_vec.cuh).
#include "kernels/cuda/decode_vec.cuh"

namespace qvg::cuda::kernels {
QVG_DECODE_VEC_WIDTH(4)
}  // namespace qvg::cuda::kernels
