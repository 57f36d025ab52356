# The GPU data plane (src/cuda, and every other src/**/*.cu): cmake -DWS_CUDA=AUTO|ON|OFF.
#
# Included from the top-level CMakeLists.txt right after the weightsync library target is defined.
#   AUTO  build the kernels when CMake finds nvcc (CheckLanguage) and the CUDA toolkit
#         (FindCUDAToolkit); otherwise build CPU-only and say why.
#   ON    the same, but a missing compiler or toolkit is a configure error.
#   OFF   CPU-only.
# The weightsync target gets WS_WITH_CUDA=1 or WS_WITH_CUDA=0 (PUBLIC). Every *.cc under src/ is
# host code that builds either way (the library's src/*.cc glob picks them up, CUDA or not); code
# that needs CUDA headers lives in *.cu files, added here only when CUDA is found. In a CPU-only
# build src/cuda/no_cuda.cc answers Unavailable("built without CUDA").
#
# Runtime: CUDA::cudart_static, never libcudart.so, libcuda.so or libnccl.so. The static runtime
# loads the driver only when a call needs it, so every binary (tests included) starts on a machine
# without a driver or GPU, and CUDA calls there fail with an error we map to Unavailable.
#
# Architectures: WS_CUDA_ARCHITECTURES, default "90-real;90-virtual": H100/H200 machine code plus
# compute_90 PTX that newer GPUs compile at load time.
set(WS_CUDA AUTO CACHE STRING
    "GPU data plane: AUTO (if nvcc and the CUDA toolkit are found), ON or OFF")
set_property(CACHE WS_CUDA PROPERTY STRINGS AUTO ON OFF)
set(WS_CUDA_ARCHITECTURES "90-real;90-virtual" CACHE STRING
    "CUDA architectures of the kernels (CMake CUDA_ARCHITECTURES syntax)")

string(TOUPPER "${WS_CUDA}" _ws_cuda)
if(NOT _ws_cuda MATCHES "^(AUTO|ON|OFF)$")
  message(FATAL_ERROR "WS_CUDA: expected AUTO, ON or OFF, got \"${WS_CUDA}\"")
endif()

set(WS_WITH_CUDA OFF)
set(_ws_cuda_why "WS_CUDA=OFF")
if(NOT _ws_cuda STREQUAL "OFF")
  # nvcc is often installed outside PATH (/usr/local/cuda/bin): point CheckLanguage at it.
  if(NOT DEFINED CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX})
    find_program(WS_NVCC nvcc
                 HINTS ENV CUDA_PATH ENV CUDA_HOME ENV CUDAToolkit_ROOT
                 PATH_SUFFIXES bin
                 PATHS /usr/local/cuda/bin)
    if(WS_NVCC)
      set(ENV{CUDACXX} "${WS_NVCC}")
    endif()
  endif()
  if(NOT DEFINED CMAKE_CUDA_HOST_COMPILER)
    set(CMAKE_CUDA_HOST_COMPILER "${CMAKE_CXX_COMPILER}")
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES "${WS_CUDA_ARCHITECTURES}")
    endif()
    enable_language(CUDA)
    find_package(CUDAToolkit QUIET)
    if(CUDAToolkit_FOUND AND TARGET CUDA::cudart_static)
      set(WS_WITH_CUDA ON)
    else()
      set(_ws_cuda_why
          "nvcc found (${CMAKE_CUDA_COMPILER}) but not the CUDA toolkit's static runtime")
    endif()
  else()
    set(_ws_cuda_why "no CUDA compiler (nvcc) found; set CUDACXX or CMAKE_CUDA_COMPILER")
  endif()
  if(NOT WS_WITH_CUDA AND _ws_cuda STREQUAL "ON")
    message(FATAL_ERROR "WS_CUDA=ON: ${_ws_cuda_why}")
  endif()
endif()

if(WS_WITH_CUDA)
  # Every .cu under src/: the kernels (src/cuda) and the CUDA side of GPU transports.
  file(GLOB_RECURSE WS_CUDA_SOURCES CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/src/*.cu)
  target_sources(weightsync PRIVATE ${WS_CUDA_SOURCES})
  target_compile_definitions(weightsync PUBLIC WS_WITH_CUDA=1)
  set_target_properties(weightsync PROPERTIES
    CUDA_ARCHITECTURES "${WS_CUDA_ARCHITECTURES}"
    CUDA_RUNTIME_LIBRARY Static
    CUDA_SEPARABLE_COMPILATION OFF)
  # C++20 in .cu files too (CUDA_STANDARD defaults to the target's CXX_STANDARD). CMake 3.25
  # knows nvcc's flags only up to C++17; nvcc >= 12 takes -std=c++20, so tell CMake.
  if(NOT DEFINED CMAKE_CUDA20_STANDARD_COMPILE_OPTION
     AND CMAKE_CUDA_COMPILER_ID STREQUAL "NVIDIA"
     AND CMAKE_CUDA_COMPILER_VERSION VERSION_GREATER_EQUAL 12.0)
    set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
    set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
    list(APPEND CMAKE_CUDA_COMPILE_FEATURES cuda_std_20)
  endif()
  set_target_properties(weightsync PROPERTIES CUDA_STANDARD 20 CUDA_STANDARD_REQUIRED ON
                                              CUDA_EXTENSIONS OFF)
  # PRIVATE: consumers need no CUDA headers; a static library's link dependencies still reach
  # every executable that links weightsync.
  target_link_libraries(weightsync PRIVATE CUDA::cudart_static)

  # The options add_compile_options() gave the target (-Wall, sanitizers, ...) are host-compiler
  # flags nvcc rejects: keep them for C/C++ and hand them to the host compiler under nvcc.
  get_target_property(_ws_opts weightsync COMPILE_OPTIONS)
  if(_ws_opts)
    set(_ws_split_opts)
    foreach(_ws_opt IN LISTS _ws_opts)
      list(APPEND _ws_split_opts "$<$<COMPILE_LANGUAGE:C,CXX>:${_ws_opt}>")
      # nvcc splits -Xcompiler values at commas: pass -fsanitize=a,b as -fsanitize=a -fsanitize=b.
      if(_ws_opt MATCHES "^(-f[a-z-]*sanitize[a-z-]*)=(.*,.*)$")
        string(REPLACE "," ";" _ws_parts "${CMAKE_MATCH_2}")
        foreach(_ws_part IN LISTS _ws_parts)
          list(APPEND _ws_split_opts
               "$<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=${CMAKE_MATCH_1}=${_ws_part}>")
        endforeach()
      else()
        list(APPEND _ws_split_opts "$<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=${_ws_opt}>")
      endif()
    endforeach()
    set_property(TARGET weightsync PROPERTY COMPILE_OPTIONS ${_ws_split_opts})
  endif()
  # Kernels keep IEEE division and no flush-to-zero: the transforms are specified bit for bit.
  target_compile_options(weightsync PRIVATE
    $<$<COMPILE_LANGUAGE:CUDA>:--prec-div=true --ftz=false --fmad=false>)
  message(STATUS "weightsync: GPU data plane ON: nvcc ${CMAKE_CUDA_COMPILER_VERSION}, "
                 "architectures ${WS_CUDA_ARCHITECTURES}, static CUDA runtime")
else()
  target_compile_definitions(weightsync PUBLIC WS_WITH_CUDA=0)
  message(STATUS "weightsync: GPU data plane OFF (${_ws_cuda_why})")
endif()
unset(_ws_cuda)
unset(_ws_cuda_why)
unset(_ws_opts)
unset(_ws_split_opts)
unset(_ws_parts)
