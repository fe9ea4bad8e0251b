# python/cmake/QvgTorch.cmake — the torch the PyTorch extension qvg._C is built
# against, and whether its CUDA path is built. Included by CMakeLists.txt (when
# QVG_BUILD_PYTHON) before the CUDA backend, because that decision is torch's.
#
# The interpreter is Python_EXECUTABLE (pip / scikit-build-core pass the one that
# runs the build); torch must be importable by it. Torch is located through that
# interpreter, not through find_package(Torch): PyPI's torch is a CUDA build whose
# TorchConfig wants a CUDA toolkit (and an nvcc of the same version as its own)
# even for a CPU-only extension.
#
# The CUDA rule (QVG_TORCH_CUDA = AUTO, the default): the CUDA path — the CUDA
# backend (qvg_cuda) and the device caches of qvg._C — is built when torch is a
# CUDA build and nvcc (PATH, CUDACXX or /usr/local/cuda/bin) has the major version
# of torch.version.cuda; otherwise qvg._C is CPU-only and the configuration prints
# one warning line saying why. QVG_TORCH_CUDA=ON makes that an error, OFF builds
# CPU-only without looking for nvcc.
#
# Sets for python/CMakeLists.txt: QVG_TORCH_VERSION, QVG_TORCH_CUDA_VERSION (empty
# for a CPU build of torch), QVG_TORCH_INCLUDE_DIRS, QVG_TORCH_LIBRARY_DIR,
# QVG_EXT_CUDA (ON/OFF), QVG_NVCC_VERSION; and QVG_ENABLE_CUDA = QVG_EXT_CUDA for
# cmake/QvgCuda.cmake.

set(QVG_TORCH_CUDA "AUTO" CACHE STRING "CUDA path of qvg._C: AUTO (when nvcc's major version is torch's), ON or OFF")
set_property(CACHE QVG_TORCH_CUDA PROPERTY STRINGS AUTO ON OFF)
string(TOUPPER "${QVG_TORCH_CUDA}" _qvg_torch_cuda)
if(NOT _qvg_torch_cuda MATCHES "^(AUTO|ON|OFF)$")
  qvg_fatal("qvg: QVG_TORCH_CUDA must be AUTO, ON or OFF, got '${QVG_TORCH_CUDA}'")
endif()

find_package(Python 3.10 COMPONENTS Interpreter Development.Module)
if(NOT Python_Interpreter_FOUND)
  qvg_fatal("qvg: no Python >= 3.10 interpreter found: pass -DPython_EXECUTABLE=<the python torch is installed for>")
endif()
if(NOT Python_Development.Module_FOUND)
  qvg_fatal("qvg: the headers of Python ${Python_VERSION} (Python.h, for ${Python_EXECUTABLE}) were not found: "
                      "install python3-dev (Debian) or your interpreter's development headers")
endif()

# One line from torch: version;cuda version;C++11 ABI;torch package directory.
execute_process(
  COMMAND "${Python_EXECUTABLE}" -c [=[
import importlib.util, os, sys
if importlib.util.find_spec("torch") is None:
    sys.stdout.write("NO_TORCH")
    sys.exit(0)
import torch
sys.stdout.write(";".join([torch.__version__, torch.version.cuda or "", str(int(torch._C._GLIBCXX_USE_CXX11_ABI)),
                           os.path.dirname(torch.__file__)]))
]=]
  RESULT_VARIABLE _qvg_rc OUTPUT_VARIABLE _qvg_out ERROR_VARIABLE _qvg_err)
if(_qvg_out STREQUAL "NO_TORCH")
  qvg_fatal("qvg: torch is not installed for ${Python_EXECUTABLE}: install torch first (pip install torch), "
                      "then build qvg with pip install --no-build-isolation . (docs/python.md)")
endif()
if(NOT _qvg_rc EQUAL 0)
  string(REGEX REPLACE "\n[ \t]*" " | " _qvg_err "${_qvg_err}")
  qvg_fatal("qvg: ${Python_EXECUTABLE} cannot import torch: ${_qvg_err}")
endif()
list(GET _qvg_out 0 QVG_TORCH_VERSION)
list(GET _qvg_out 1 QVG_TORCH_CUDA_VERSION)
list(GET _qvg_out 2 _qvg_abi)
list(GET _qvg_out 3 _qvg_torch_dir)
if(QVG_TORCH_VERSION VERSION_LESS 2.5)
  qvg_fatal("qvg: qvg.torch needs PyTorch >= 2.5 (it raises torch.OutOfMemoryError, docs/python.md lists the versions built and tested), "
                      "${Python_EXECUTABLE} has torch ${QVG_TORCH_VERSION}")
endif()
set(QVG_TORCH_INCLUDE_DIRS "${_qvg_torch_dir}/include" "${_qvg_torch_dir}/include/torch/csrc/api/include")
set(QVG_TORCH_LIBRARY_DIR "${_qvg_torch_dir}/lib")
# Everything linked into qvg._C (qvg_core included) uses torch's libstdc++ string ABI.
add_compile_definitions(_GLIBCXX_USE_CXX11_ABI=${_qvg_abi})

# ---- the CUDA rule -------------------------------------------------------------
set(QVG_EXT_CUDA OFF)
set(QVG_NVCC_VERSION "")
set(_qvg_cpu_reason "")
if(NOT QVG_TORCH_CUDA_VERSION)
  set(_qvg_cpu_reason "torch ${QVG_TORCH_VERSION} is a CPU build")
elseif(_qvg_torch_cuda STREQUAL "OFF")
  set(_qvg_cpu_reason "QVG_TORCH_CUDA=OFF")
else()
  if(NOT CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX} AND EXISTS /usr/local/cuda/bin/nvcc)
    find_program(_qvg_nvcc nvcc)
    if(NOT _qvg_nvcc)
      set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
    endif()
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(NOT CMAKE_CUDA_COMPILER)
    set(_qvg_cpu_reason "no CUDA compiler found (nvcc on PATH, CUDACXX or /usr/local/cuda/bin/nvcc)")
  else()
    execute_process(COMMAND "${CMAKE_CUDA_COMPILER}" --version OUTPUT_VARIABLE _qvg_nvcc_out ERROR_QUIET)
    string(REGEX MATCH "release ([0-9]+)\\.([0-9]+)" _qvg_m "${_qvg_nvcc_out}")
    set(_qvg_nvcc_major "${CMAKE_MATCH_1}")
    set(QVG_NVCC_VERSION "${CMAKE_MATCH_1}.${CMAKE_MATCH_2}")
    string(REGEX MATCH "^[0-9]+" _qvg_torch_cuda_major "${QVG_TORCH_CUDA_VERSION}")
    if(NOT _qvg_m)
      set(_qvg_cpu_reason "cannot read the version of ${CMAKE_CUDA_COMPILER}")
    elseif(NOT _qvg_nvcc_major STREQUAL _qvg_torch_cuda_major)
      set(_qvg_cpu_reason
          "nvcc ${QVG_NVCC_VERSION} (${CMAKE_CUDA_COMPILER}) and torch's CUDA ${QVG_TORCH_CUDA_VERSION} differ in major version")
    else()
      set(QVG_EXT_CUDA ON)
    endif()
  endif()
  if(NOT QVG_EXT_CUDA AND _qvg_torch_cuda STREQUAL "ON")
    qvg_fatal("qvg: QVG_TORCH_CUDA=ON but the CUDA path cannot be built: ${_qvg_cpu_reason}")
  endif()
  if(NOT QVG_EXT_CUDA)
    qvg_warning("qvg: building qvg.torch CPU-only (CUDA tensors raise NotImplementedError): ${_qvg_cpu_reason}")
  endif()
endif()
set(QVG_ENABLE_CUDA ${QVG_EXT_CUDA})  # for cmake/QvgCuda.cmake (a normal variable: policy CMP0126)
if(QVG_EXT_CUDA)
  message(STATUS "qvg: qvg._C for torch ${QVG_TORCH_VERSION} (CUDA ${QVG_TORCH_CUDA_VERSION}) with its CUDA path "
                 "(nvcc ${QVG_NVCC_VERSION}), Python ${Python_VERSION} (${Python_EXECUTABLE})")
else()
  message(STATUS "qvg: qvg._C for torch ${QVG_TORCH_VERSION}, CPU-only (${_qvg_cpu_reason}), Python ${Python_VERSION} "
                 "(${Python_EXECUTABLE})")
endif()
