# Finds LibTorch and defines the interface target `adapt_torch`.
#
# One LibTorch everywhere: PyTorch 2.11's own. On the GPU machines, where CUDA
# is installed, this is PyTorch's CMake package (find_package(Torch)). On a
# machine without CUDA (this project's CI), that package refuses to configure
# because the pip wheel was built with CUDA, so we use the same wheel's CPU
# libraries directly: the headers, libtorch_cpu and libc10.
#
# Where LibTorch is: CMAKE_PREFIX_PATH / Torch_DIR when given, else what
# `${ADAPT_PYTHON} -c 'import torch; print(torch.utils.cmake_prefix_path)'`
# prints (ADAPT_PYTHON defaults to the repository's .venv, then python3).
if(TARGET adapt_torch)
  return()
endif()

if(NOT Torch_DIR)
  if(NOT ADAPT_PYTHON)
    get_filename_component(_adapt_root "${CMAKE_CURRENT_LIST_DIR}/.." ABSOLUTE)
    if(EXISTS "${_adapt_root}/.venv/bin/python")
      set(ADAPT_PYTHON "${_adapt_root}/.venv/bin/python")
    else()
      set(ADAPT_PYTHON python3)
    endif()
  endif()
  execute_process(
    COMMAND ${ADAPT_PYTHON} -c "import torch; print(torch.utils.cmake_prefix_path)"
    OUTPUT_VARIABLE _adapt_torch_prefix OUTPUT_STRIP_TRAILING_WHITESPACE
    RESULT_VARIABLE _adapt_torch_rc ERROR_QUIET)
  if(_adapt_torch_rc EQUAL 0 AND EXISTS "${_adapt_torch_prefix}/Torch")
    set(Torch_DIR "${_adapt_torch_prefix}/Torch" CACHE PATH "LibTorch's CMake package")
  endif()
endif()
if(NOT Torch_DIR OR NOT EXISTS "${Torch_DIR}/TorchConfig.cmake")
  message(FATAL_ERROR "LibTorch not found: set Torch_DIR (or CMAKE_PREFIX_PATH) to "
          "torch.utils.cmake_prefix_path, or run scripts/setup.sh to make .venv")
endif()

add_library(adapt_torch INTERFACE)
find_package(CUDAToolkit QUIET)
if(CUDAToolkit_FOUND)
  find_package(Torch REQUIRED)
  # cudart for the runtime's own kernels (runtime/cuda), linked into trainers.
  target_link_libraries(adapt_torch INTERFACE ${TORCH_LIBRARIES} CUDA::cudart)
  separate_arguments(_adapt_torch_flags UNIX_COMMAND "${TORCH_CXX_FLAGS}")
  target_compile_options(adapt_torch INTERFACE ${_adapt_torch_flags})
  set(ADAPT_TORCH_CUDA ON)
else()
  # Torch_DIR is <site-packages>/torch/share/cmake/Torch.
  get_filename_component(_adapt_torch_root "${Torch_DIR}/../../.." ABSOLUTE)
  find_library(ADAPT_TORCH_CPU torch_cpu PATHS "${_adapt_torch_root}/lib" NO_DEFAULT_PATH REQUIRED)
  find_library(ADAPT_C10 c10 PATHS "${_adapt_torch_root}/lib" NO_DEFAULT_PATH REQUIRED)
  target_include_directories(adapt_torch SYSTEM INTERFACE
    "${_adapt_torch_root}/include"
    "${_adapt_torch_root}/include/torch/csrc/api/include")
  target_link_libraries(adapt_torch INTERFACE ${ADAPT_TORCH_CPU} ${ADAPT_C10})
  target_link_options(adapt_torch INTERFACE "-Wl,-rpath,${_adapt_torch_root}/lib")
  target_compile_definitions(adapt_torch INTERFACE _GLIBCXX_USE_CXX11_ABI=1)
  set(ADAPT_TORCH_CUDA OFF)
  message(STATUS "adapt: LibTorch CPU libraries from ${_adapt_torch_root} (no CUDA toolkit here)")
endif()
target_compile_features(adapt_torch INTERFACE cxx_std_17)
