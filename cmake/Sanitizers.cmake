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

  set(_ws_san_flags -fsanitize=${_ws_san} -fno-omit-frame-pointer)
  if(_ws_san MATCHES "undefined")
    list(APPEND _ws_san_flags -fno-sanitize-recover=undefined)
  endif()
  add_compile_options(${_ws_san_flags})
  add_link_options(${_ws_san_flags})
  # Keep debug info in any build type so reports carry file:line.
  add_compile_options(-g)
  message(STATUS "weightsync: sanitizers enabled: ${_ws_san}")
  unset(_ws_san_flags)
  unset(_ws_san_list)
  unset(_ws_san)
endif()
