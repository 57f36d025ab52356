# Sanitizer builds: cmake -DWS_SANITIZE=address,undefined | thread (default "" = none).
#
# Included from the top-level CMakeLists.txt right after add_compile_options(), so the flags apply
# to every target defined afterwards: the library, the CLI, tests, test helpers and benchmarks.
# One sanitizer configuration per build directory (make sanitize uses build-asan and build-tsan).
#
# UBSan is built with -fno-sanitize-recover=undefined: the first finding aborts the process, so a
# test cannot pass while UBSan printed a report. ASan and TSan abort (ASan) or exit non-zero (TSan,
# exitcode=66) on their own. Runtime options are set by scripts/ci_sanitizers.sh; see docs/ci.md.
set(WS_SANITIZE "" CACHE STRING
    "Sanitizers to build with: \"\" (none), \"address,undefined\" or \"thread\"")
set_property(CACHE WS_SANITIZE PROPERTY STRINGS "" "address,undefined" "thread")

if(WS_SANITIZE)
  # Normalise "undefined,address" etc. and reject anything this project does not test.
  string(REPLACE "," ";" _ws_san_list "${WS_SANITIZE}")
  list(SORT _ws_san_list)
  list(JOIN _ws_san_list "," _ws_san)
  if(NOT _ws_san MATCHES "^(address|undefined|address,undefined|thread)$")
    message(FATAL_ERROR "WS_SANITIZE: expected \"\", \"address,undefined\" or \"thread\", got "
                        "\"${WS_SANITIZE}\"")
  endif()

  # One -fsanitize= per sanitizer, never "address,undefined": nvcc's -Xcompiler=<flag> (see
  # cmake/Cuda.cmake) splits its argument at commas, which would hand "undefined" to the host
  # compiler as an input file.
  set(_ws_san_flags -fno-omit-frame-pointer)
  foreach(_ws_one ${_ws_san_list})
    list(APPEND _ws_san_flags -fsanitize=${_ws_one})
  endforeach()
  if(_ws_san MATCHES "undefined")
    list(APPEND _ws_san_flags -fno-sanitize-recover=undefined)
  endif()
  add_compile_options(${_ws_san_flags})
  if(_ws_san STREQUAL "thread")
    # GCC warns (-Wtsan) at every std::atomic_thread_fence, which TSan does not model; asio's
    # handler fences trigger it dozens of times per build. The library uses no fences itself
    # (a fence added to src/ should be replaced by an atomic with the same order, which TSan sees).
    include(CheckCXXCompilerFlag)
    check_cxx_compiler_flag(-Wno-tsan WS_HAVE_WNO_TSAN)
    if(WS_HAVE_WNO_TSAN)
      add_compile_options(-Wno-tsan)
    endif()
  endif()
  add_link_options(${_ws_san_flags})
  # Every target compiles at -O1 with line tables (-g1) in any build type: -O1 is what the ASan
  # and TSan documentation recommend (the instrumentation, not the optimizer, sets the run time of
  # this suite), and line tables are all a report needs for file:line. Against the build type's
  # -O2 -g it roughly halves the compile time of the big files (tools/command_line.cc under ASan:
  # 42.5 s at -O2 -g, 17.4 s at -O1 -g1; docs/ci.md), and these builds run twice per CI run.
  # Directory options come after CMAKE_CXX_FLAGS_<CONFIG>, so these win.
  add_compile_options(-O1 -g1)
  message(STATUS "weightsync: sanitizers enabled: ${_ws_san}")

  # Canaries: deliberately broken programs, built with exactly these flags, that the CI requires
  # to FAIL with the sanitizer's report (scripts/ci_sanitizers.sh). Not built by default:
  #   cmake --build <dir> --target ws_sanitizer_canaries
  set(_ws_canaries)
  if(_ws_san MATCHES "address")
    list(APPEND _ws_canaries asan_heap_overflow lsan_leak)
  endif()
  if(_ws_san MATCHES "undefined")
    list(APPEND _ws_canaries ubsan_signed_overflow)
  endif()
  if(_ws_san MATCHES "thread")
    list(APPEND _ws_canaries tsan_data_race)
  endif()
  add_custom_target(ws_sanitizer_canaries)
  foreach(_ws_canary ${_ws_canaries})
    add_executable(ws_canary_${_ws_canary} EXCLUDE_FROM_ALL
                   ${CMAKE_CURRENT_LIST_DIR}/../.ci/canaries/${_ws_canary}.cc)
    target_link_libraries(ws_canary_${_ws_canary} PRIVATE Threads::Threads)
    add_dependencies(ws_sanitizer_canaries ws_canary_${_ws_canary})
  endforeach()
  unset(_ws_canary)
  unset(_ws_canaries)
  unset(_ws_one)
  unset(_ws_san_flags)
  unset(_ws_san_list)
  unset(_ws_san)
endif()
