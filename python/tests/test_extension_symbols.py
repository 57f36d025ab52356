"""The built extension keeps any C++ runtime linked into it private. A toolchain that links
libstdc++ statically (the GPU machine's CXX=/opt/gcc/bin/g++) once exported its locale and
iostream machinery from the module, so the process ran two C++ runtimes and the module's never
initialised facets crashed the first publish(); python/CMakeLists.txt links with
--exclude-libs,ALL. Whatever compiler built it, the module must define none of libstdc++'s own
(non-template) symbols in its dynamic symbol table."""

import shutil
import subprocess

import pytest

from weightsync import _weightsync

# Mangled fragments of libstdc++'s locale, iostream and facet classes (std::locale,
# std::ios_base, std::num_put, std::codecvt, std::basic_ostream): defined in the runtime library,
# never instantiated inline by our code.
RUNTIME = ("St6locale", "St8ios_base", "num_put", "codecvt", "St13basic_ostream")


def test_no_libstdcxx_runtime_symbols_are_exported():
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("nm (binutils) not installed")
    out = subprocess.run([nm, "-D", "--defined-only", _weightsync.__file__], check=True,
                         capture_output=True, text=True).stdout
    symbols = [line.split() for line in out.splitlines() if len(line.split()) == 3]
    assert any(name == "PyInit__weightsync" for _, _, name in symbols), out[:2000]
    # Strong definitions (text, data, bss, read-only): a statically linked runtime's own code.
    leaked = [name for _, kind, name in symbols
              if kind in "TDBR" and any(fragment in name for fragment in RUNTIME)]
    assert not leaked, f"the extension exports libstdc++'s runtime: {leaked[:10]}"
