# cmake/QvgCuda.cmake — the optional CUDA backend (docs/cuda.md).
#
# QVG_ENABLE_CUDA: AUTO (default: on when check_language(CUDA) finds nvcc), ON
# (an error without nvcc) or OFF. QVG_CUDA_ARCHS: the architectures compiled
# (default sm_90a for H100/H200 plus sm_80, sm_89, sm_100 (B200-class) and sm_120
# (RTX 50-class); no kernel needs an sm_90a-only feature: the assignment's mma.sync
# exists from sm_80 on). When the backend is on:
#   qvg_cuda              static library: the CUDA kernels and launchers
#                         (src/kernels/cuda) and the device-resident packed cache
#                         (src/cache/cuda), linked to qvg_core and CUDA::cudart
#   qvg_cuda_bench        the GPU benchmarks (src/perf/cuda_bench.cpp; evaluation
#                         layer), linked to qvg_cuda and CUDA::cublas
#   qvg_cuda_host_test    host-only test of the __host__ __device__ arithmetic
#                         (runs without a GPU; registered with ctest)
#   qvg_cuda_code_format_test  host-only test of the bodies' code formats (every
#                         row of qvg/code_format.h against spec 1.5; ctest)
#   qvg_cuda_replay_test  host-only test of the GPU tests' encode check: the device
#                         encoder's rules replayed from given assignments (ctest)
#   qvg_cuda_device_errors_test  host-only test of the device packed cache's
#                         argument errors, raised before any CUDA call (ctest;
#                         the policy it runs is checked by the ci preset's
#                         tests/test_cache_plan.cpp, GoogleTest)
#   qvg_cuda_calls_test   host-only test of the device caches' runtime calls over a
#                         recording fake runtime: update() never waits (ctest)
#   qvg_gpu_tests         GPU tests (tiny in-repo harness, no gtest)
#   qvg_gpu_bench         GPU benchmarks (JSON + table)
# QVG_HAVE_CUDA is set to ON or OFF for the rest of the build.
set(QVG_ENABLE_CUDA "AUTO" CACHE STRING "Build the CUDA backend: AUTO (when nvcc is found), ON or OFF")
set_property(CACHE QVG_ENABLE_CUDA PROPERTY STRINGS AUTO ON OFF)
set(QVG_CUDA_ARCHS "90a;80;89;100;120" CACHE STRING "CUDA architectures of the CUDA backend (CMAKE_CUDA_ARCHITECTURES syntax)")

set(QVG_HAVE_CUDA OFF)
string(TOUPPER "${QVG_ENABLE_CUDA}" _qvg_cuda_mode)
if(NOT _qvg_cuda_mode MATCHES "^(AUTO|ON|OFF|TRUE|FALSE|YES|NO|1|0)$")
  message(FATAL_ERROR "QVG_ENABLE_CUDA must be AUTO, ON or OFF, got '${QVG_ENABLE_CUDA}'")
endif()
if(NOT _qvg_cuda_mode MATCHES "^(OFF|FALSE|NO|0)$")
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    set(QVG_HAVE_CUDA ON)
  elseif(NOT _qvg_cuda_mode STREQUAL "AUTO")
    message(FATAL_ERROR "QVG_ENABLE_CUDA=${QVG_ENABLE_CUDA} but no CUDA compiler was found "
                        "(put nvcc on PATH or set CMAKE_CUDA_COMPILER)")
  endif()
endif()
message(STATUS "qvg: CUDA backend: ${QVG_HAVE_CUDA} (QVG_ENABLE_CUDA=${QVG_ENABLE_CUDA})")

if(QVG_HAVE_CUDA)
  set(CMAKE_CUDA_ARCHITECTURES ${QVG_CUDA_ARCHS})
  # Device code is C++17 (CMake 3.25 does not know nvcc 13's C++20 flag); the .cu
  # files include only src/kernels/cuda/* and, through src/core/residual_impl.h, the
  # one public header written for nvcc: qvg/code_format.h (C++17, QVG_HD).
  set(CMAKE_CUDA_STANDARD 17)
  set(CMAKE_CUDA_STANDARD_REQUIRED ON)
  set(CMAKE_CUDA_EXTENSIONS OFF)
  enable_language(CUDA)
  # The runtime is linked explicitly (CUDA::cudart, shared) by qvg_cuda: no implicit
  # cudart_static/cudadevrt for any target that links CUDA objects.
  set(CMAKE_CUDA_RUNTIME_LIBRARY None)
  find_package(CUDAToolkit REQUIRED)
  message(STATUS "qvg: CUDA architectures: ${QVG_CUDA_ARCHS} (nvcc ${CMAKE_CUDA_COMPILER_VERSION})")

  # Host code of .cu files: the library's warnings through -Xcompiler (minus the
  # ones nvcc's generated host code trips), errors when QVG_WERROR.
  # Device code: --fmad=false, so that no multiply-add is contracted anywhere
  # (the decode arithmetic of spec 1.3 is also written with __fmul_rn/__fadd_rn).
  set(QVG_CUDA_FLAGS --fmad=false --expt-relaxed-constexpr -Xcompiler=-Wall,-Wextra,-ffp-contract=off)
  if(QVG_WERROR)
    list(APPEND QVG_CUDA_FLAGS -Werror=all-warnings -Xcompiler=-Werror)
  endif()

  # Device code (.cu) in an object library that sees only src/ and CUDA's headers
  # (fmt's imported include directory /usr/include would break nvcc's host includes);
  # host code (.cpp, C++20, the library's warnings) in qvg_cuda itself.
  set(QVG_CUDA_KERNEL_SOURCES src/kernels/cuda/decode.cu src/kernels/cuda/decode_int2.cu src/kernels/cuda/decode_int3.cu
      src/kernels/cuda/decode_int4.cu src/kernels/cuda/encode_kernels.cu src/kernels/cuda/quantize_kernels.cu
      src/kernels/cuda/span_kernels.cu src/kernels/cuda/kmeanspp_kernels.cu src/kernels/cuda/guard_kernels.cu)
  # Host code: the device runtime (kernels layer), the device encoder's orchestration
  # and the device encoded tensor (codec layer), the device caches (cache layer).
  set(QVG_CUDA_HOST_SOURCES src/kernels/cuda/device.cpp src/codec/cuda/encode.cpp src/codec/cuda/device_encoded.cpp
                            src/cache/cuda/device_cache.cpp src/cache/cuda/device_dense_cache.cpp
                            src/cache/cuda/input_guard.cpp)
  add_library(qvg_cuda_kernels OBJECT ${QVG_CUDA_KERNEL_SOURCES})
  set_target_properties(qvg_cuda_kernels PROPERTIES POSITION_INDEPENDENT_CODE ON)
  target_include_directories(qvg_cuda_kernels PRIVATE ${PROJECT_SOURCE_DIR}/src ${PROJECT_SOURCE_DIR}/include)
  target_link_libraries(qvg_cuda_kernels PRIVATE CUDA::cudart)
  target_compile_options(qvg_cuda_kernels PRIVATE ${QVG_CUDA_FLAGS})

  add_library(qvg_cuda STATIC ${QVG_CUDA_HOST_SOURCES} $<TARGET_OBJECTS:qvg_cuda_kernels>)
  set_target_properties(qvg_cuda PROPERTIES POSITION_INDEPENDENT_CODE ON)
  target_include_directories(qvg_cuda PUBLIC ${PROJECT_SOURCE_DIR}/include PRIVATE ${PROJECT_SOURCE_DIR}/src)
  target_link_libraries(qvg_cuda PUBLIC qvg_core CUDA::cudart PRIVATE fmt::fmt)
  target_compile_definitions(qvg_cuda PUBLIC QVG_HAVE_CUDA=1)
  target_compile_options(qvg_cuda PRIVATE ${QVG_WARNINGS} -ffp-contract=off)

  # Host-side test of the shared arithmetic: no GPU needed.
  add_executable(qvg_cuda_host_test ${PROJECT_SOURCE_DIR}/tests/gpu/host_arith_test.cpp
                                    ${PROJECT_SOURCE_DIR}/tests/gpu/host_kmeanspp_test.cpp)
  target_include_directories(qvg_cuda_host_test PRIVATE ${PROJECT_SOURCE_DIR}/src ${PROJECT_SOURCE_DIR}/tests)
  target_link_libraries(qvg_cuda_host_test PRIVATE qvg_core)
  target_compile_options(qvg_cuda_host_test PRIVATE ${QVG_WARNINGS} -ffp-contract=off)

  # Host-side test of the bodies' code formats: every row of qvg/code_format.h (int2,
  # int3, int4) through the code words, the quantizer's pack passes, the scale search
  # and whole decode launches, against spec 1.5 written in the test.
  add_executable(qvg_cuda_code_format_test ${PROJECT_SOURCE_DIR}/tests/gpu/host_code_format_test.cpp)
  target_include_directories(qvg_cuda_code_format_test PRIVATE ${PROJECT_SOURCE_DIR}/src ${PROJECT_SOURCE_DIR}/tests)
  target_link_libraries(qvg_cuda_code_format_test PRIVATE qvg_core)
  target_compile_options(qvg_cuda_code_format_test PRIVATE ${QVG_WARNINGS} -ffp-contract=off)

  # Host-side test of the GPU tests' encode check: the device encoder's rules
  # replayed on the host from given assignments (tests/gpu/encode_replay.h) must
  # accept every near-tie order and reject every corruption.
  add_executable(qvg_cuda_replay_test ${PROJECT_SOURCE_DIR}/tests/gpu/encode_replay_test.cpp)
  target_include_directories(qvg_cuda_replay_test PRIVATE ${PROJECT_SOURCE_DIR}/src ${PROJECT_SOURCE_DIR}/tests)
  target_link_libraries(qvg_cuda_replay_test PRIVATE qvg_core)
  target_compile_options(qvg_cuda_replay_test PRIVATE ${QVG_WARNINGS} -ffp-contract=off)

  # Host-side test of the device packed cache's argument errors (raised before any
  # CUDA call): no GPU needed. The in-repo harness: the device machine has no GoogleTest.
  add_executable(qvg_cuda_device_errors_test ${PROJECT_SOURCE_DIR}/tests/gpu/device_errors_test.cpp)
  target_include_directories(qvg_cuda_device_errors_test PRIVATE ${PROJECT_SOURCE_DIR}/src ${PROJECT_SOURCE_DIR}/tests)
  target_link_libraries(qvg_cuda_device_errors_test PRIVATE qvg_cuda)
  target_compile_options(qvg_cuda_device_errors_test PRIVATE ${QVG_WARNINGS})

  # Host-side test of the device caches' runtime calls (update() never waits,
  # docs/cuda.md): the executable defines a recording fake of every CUDA runtime
  # function the library calls, so the caches' host code runs without a GPU and each
  # update()'s calls are checked (no synchronization, no host copy); the deferred
  # input check's host half.
  add_executable(qvg_cuda_calls_test ${PROJECT_SOURCE_DIR}/tests/gpu/device_calls_test.cpp)
  target_include_directories(qvg_cuda_calls_test PRIVATE ${PROJECT_SOURCE_DIR}/src ${PROJECT_SOURCE_DIR}/tests)
  target_link_libraries(qvg_cuda_calls_test PRIVATE qvg_cuda)
  target_compile_options(qvg_cuda_calls_test PRIVATE ${QVG_WARNINGS})

  add_executable(qvg_gpu_tests ${PROJECT_SOURCE_DIR}/tests/gpu/gpu_tests.cpp
                               ${PROJECT_SOURCE_DIR}/tests/gpu/all_settings_tests.cpp
                               ${PROJECT_SOURCE_DIR}/tests/gpu/kmeanspp_gpu_tests.cpp
                               ${PROJECT_SOURCE_DIR}/tests/gpu/async_update_tests.cpp
                               ${PROJECT_SOURCE_DIR}/tests/gpu/branch_gpu_tests.cpp)
  target_include_directories(qvg_gpu_tests PRIVATE ${PROJECT_SOURCE_DIR}/src ${PROJECT_SOURCE_DIR}/tests)
  target_link_libraries(qvg_gpu_tests PRIVATE qvg_cuda)
  target_compile_options(qvg_gpu_tests PRIVATE ${QVG_WARNINGS})

  # The GPU benchmarks (evaluation layer): cuBLAS is the matmul peer, linked here only.
  add_library(qvg_cuda_bench STATIC ${PROJECT_SOURCE_DIR}/src/perf/cuda_bench.cpp)
  set_target_properties(qvg_cuda_bench PROPERTIES POSITION_INDEPENDENT_CODE ON)
  target_include_directories(qvg_cuda_bench PUBLIC ${PROJECT_SOURCE_DIR}/src)
  target_link_libraries(qvg_cuda_bench PUBLIC qvg_cuda PRIVATE CUDA::cublas fmt::fmt)
  target_compile_options(qvg_cuda_bench PRIVATE ${QVG_WARNINGS})

  add_executable(qvg_gpu_bench ${PROJECT_SOURCE_DIR}/bench/gpu/qvg_gpu_bench.cpp)
  target_include_directories(qvg_gpu_bench PRIVATE ${PROJECT_SOURCE_DIR}/src)
  target_link_libraries(qvg_gpu_bench PRIVATE qvg_cuda_bench)
  target_compile_options(qvg_gpu_bench PRIVATE ${QVG_WARNINGS})

  enable_testing()
  add_test(NAME cuda.host_arith COMMAND qvg_cuda_host_test)
  add_test(NAME cuda.host_code_format COMMAND qvg_cuda_code_format_test)
  add_test(NAME cuda.host_device_errors COMMAND qvg_cuda_device_errors_test)
  add_test(NAME cuda.host_encode_replay COMMAND qvg_cuda_replay_test)
  add_test(NAME cuda.host_device_calls COMMAND qvg_cuda_calls_test)
endif()
