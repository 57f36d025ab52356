"""The generated .pyi stub (nanobind stubgen) ships with the package and matches the module."""

import ast
import pathlib

import weightsync
from weightsync import _weightsync


def public(names):
    return {n for n in names if not n.startswith("_")}


def test_stub_exists_and_matches_module():
    stub = pathlib.Path(_weightsync.__file__).with_name("_weightsync.pyi")
    assert stub.is_file(), f"{stub} missing: stub generation did not run"
    tree = ast.parse(stub.read_text())
    declared = {}
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
            declared[node.name] = node
    assert public(declared) == public(dir(_weightsync)) - {"annotations"}
    for name, node in declared.items():
        if isinstance(node, ast.ClassDef):
            members = {n.name for n in node.body if isinstance(n, ast.FunctionDef)}
            runtime = public(dir(getattr(_weightsync, name)))
            assert public(members) == runtime, name


def test_package_exports_everything_it_lists():
    for name in weightsync.__all__:
        assert hasattr(weightsync, name), name
    assert public(dir(_weightsync)) <= set(weightsync.__all__)


def test_py_typed_marker():
    assert pathlib.Path(weightsync.__file__).with_name("py.typed").is_file()
