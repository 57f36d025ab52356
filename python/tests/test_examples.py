"""The examples run: trainer and engine as two processes, as a user would start them."""

import os
import pathlib
import subprocess
import sys

import pytest

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"


def run_pair(kind, endpoint, extra_engine=(), steps=4):
    common = ["--endpoint", endpoint, "--steps", str(steps)]
    env = dict(os.environ)
    trainer = subprocess.Popen(
        [sys.executable, f"{kind}_trainer.py", *common, "--interval", "0.02", "--linger", "1"],
        cwd=EXAMPLES, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        engine = subprocess.run(
            [sys.executable, f"{kind}_engine.py", *common, *extra_engine], cwd=EXAMPLES, env=env,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
        out, _ = trainer.communicate(timeout=60)
    finally:
        if trainer.poll() is None:
            trainer.kill()
    assert engine.returncode == 0, engine.stdout
    assert trainer.returncode == 0, out
    return engine.stdout


@pytest.mark.parametrize("style", ["register", "receive"])
def test_numpy_example(endpoint, style):
    out = run_pair("numpy", endpoint, ["--style", style])
    assert "addresses unchanged" in out
    assert "at step   4" in out


def test_numpy_engines_in_a_chain_of_relays(endpoint):
    # trainer -> engine (a relay) -> engine: the second engine dials the first, not the trainer.
    relay_at = endpoint + "-relay"
    common = ["--steps", "4"]
    env = dict(os.environ)
    procs = []

    def start(args):
        p = subprocess.Popen([sys.executable, *args], cwd=EXAMPLES, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        procs.append(p)
        return p

    try:
        trainer = start(["numpy_trainer.py", "--endpoint", endpoint, *common, "--interval", "0.05",
                         "--linger", "2"])
        relay = start(["numpy_engine.py", "--endpoint", endpoint, "--serve", relay_at, *common,
                       "--linger", "3"])
        first = relay.stdout.readline()  # bound at start, before it holds anything
        assert first.startswith(f"engine:  relaying at {relay_at}"), first
        leaf = subprocess.run([sys.executable, "numpy_engine.py", "--endpoint", relay_at,
                               "--verify", *common], cwd=EXAMPLES, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              timeout=120)
        assert leaf.returncode == 0, leaf.stdout
        assert "at step   4" in leaf.stdout and "addresses unchanged" in leaf.stdout, leaf.stdout
        out, _ = relay.communicate(timeout=60)
        assert relay.returncode == 0, first + out
        assert trainer.wait(timeout=60) == 0
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()


@pytest.mark.slow
def test_torch_example(endpoint):
    pytest.importorskip("torch")
    out = run_pair("torch", endpoint)
    assert "addresses unchanged" in out


@pytest.mark.slow
def test_torch_gpu_rl_example_on_the_cpu(endpoint):
    """examples/torch_gpu_rl with --device cpu and a tiny config: the engine's logits equal the
    trainer's bit for bit after every update (scripts/python_gpu_test.sh runs it on the GPU)."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    out = subprocess.run(
        [sys.executable, "-X", "faulthandler", str(EXAMPLES / "torch_gpu_rl" / "run.py"),
         "--device", "cpu", "--config", "tiny", "--steps", "2", "--endpoint", endpoint],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    assert out.returncode == 0, out.stdout
    assert "its logits differ from the trainer's (other initialisation)" in out.stdout, out.stdout
    for step in (1, 2):
        assert f"engine:  step {step:3d} logits bit-exact with the trainer's" in out.stdout, \
            out.stdout
    assert "engine:  2/2 steps bit-exact; parameters updated in place (addresses unchanged)" \
        in out.stdout, out.stdout
    assert "(the same)" in out.stdout, out.stdout


def test_compare_safetensors_bench_runs():
    pytest.importorskip("safetensors")
    bench = EXAMPLES.parent / "bench" / "compare_safetensors.py"
    out = subprocess.run([sys.executable, str(bench), "--scale", "0.001", "--reps", "1"],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
    assert out.returncode == 0, out.stdout
    assert "ratio safetensors.numpy / weightsync" in out.stdout
    try:
        import torch  # noqa: F401
    except ImportError:
        return
    assert "ratio safetensors.torch / weightsync" in out.stdout, out.stdout


@pytest.mark.parametrize("path", ["vllm/trainer.py", "vllm/worker_extension.py",
                                  "sglang/trainer.py"])
def test_engine_examples_name_what_weightsync_has(path):
    """The vLLM and SGLang examples need a GPU, a model download and the engine: here they are
    compiled and every weightsync name they use is checked to exist."""
    import ast
    import importlib

    source = (EXAMPLES / path).read_text()
    tree = ast.parse(compile(source, path, "exec", ast.PyCF_ONLY_AST))
    used = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("weightsync"):
            used += [(node.module, a.name) for a in node.names]
        elif (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute) and
              isinstance(node.value.value, ast.Name) and node.value.value.id == "weightsync"):
            used.append((f"weightsync.{node.value.attr}", node.attr))
    assert used
    for module, name in used:
        try:
            found = importlib.import_module(module)
        except ImportError as e:  # the engine or torch is not installed here
            pytest.skip(f"{module}: {e}")
        assert hasattr(found, name), f"{path}: {module}.{name}"
