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


def _documented_defaults(cls):
    """The keyword defaults the stub (the constructor's signature text) documents for cls."""
    stub = pathlib.Path(_weightsync.__file__).with_name("_weightsync.pyi")
    for node in ast.parse(stub.read_text()).body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for f in node.body:
                if isinstance(f, ast.FunctionDef) and f.name == "__init__":
                    args = f.args.args[len(f.args.args) - len(f.args.defaults):]
                    return {a.arg: ast.literal_eval(d) for a, d in zip(args, f.args.defaults)}
    raise AssertionError(f"{cls}.__init__ not in the stub")


def test_constructor_defaults_are_the_cpp_options_defaults():
    # The keyword defaults are taken from PublisherOptions{} / SubscriberOptions{} in the binding;
    # the signature text (what help() and the stub show) is written by hand and must say the same.
    cpp = _weightsync._option_defaults()
    for cls in ("Publisher", "Subscriber"):
        assert _documented_defaults(cls) == cpp[cls], cls
