"""The parts of bench/python_gpu_update.py that need no GPU: arguments, the model's shapes (the
same as the C++ bench's), the table. The bench itself runs on the GPU machine
(scripts/python_gpu_test.sh bench)."""

import importlib.util
import pathlib
import subprocess
import sys

import pytest

BENCH = pathlib.Path(__file__).resolve().parents[2] / "bench"


def load(name):
    sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def bench():
    return load("python_gpu_update")


def test_arguments(bench):
    a = bench.parse_args([])
    assert (a.scale, a.steps, a.mode, a.build, a.dst) == (1.0, 20, "in_place", "build-gpu", None)
    assert a.rows == list(bench.ROWS) and a.ckpt == ".baselines/checkpoint_engine"
    a = bench.parse_args(["--scale", "0.01", "--rows", "python, cpp", "--steps", "5"])
    assert a.scale == 0.01 and a.rows == ["python", "cpp"] and a.steps == 5
    for bad in (["--scale", "0"], ["--scale", "17"], ["--steps", "2"], ["--rows", "python,x"]):
        with pytest.raises(SystemExit):
            bench.parse_args(bad)


def test_shapes_are_the_cpp_presets():
    """339 tensors, 15.23 GB at scale 1; 87 tensors, 5.44 GB at 0.25 (docs/gpu.md's figures of
    ws_gpu_update; the Python port of tools/model_presets.cc was also checked against it tensor
    by tensor at several scales)."""
    shapes = load("model_shapes")
    full = shapes.model_shapes(1.0)
    assert len(full) == 339 and shapes.total_bytes(full) == 15_231_233_024
    assert full[0] == ("model.embed_tokens.weight", (152064, 3584))
    assert full[-1] == ("lm_head.weight", (152064, 3584))
    quarter = shapes.model_shapes(0.25)
    assert len(quarter) == 87 and shapes.total_bytes(quarter) == 5_442_805_760
    tiny = shapes.model_shapes(0.01)
    assert len(tiny) == 15 and shapes.total_bytes(tiny) == 698_694_656
    assert len(shapes.model_shapes(1.0, "qwen2.5-0.5b")) == 290
    with pytest.raises(ValueError):
        shapes.model_shapes(0)


def test_torch_baselines_use_the_same_shapes():
    pytest.importorskip("torch")
    baselines = load("torch_baselines")
    shapes = load("model_shapes")
    assert baselines.qwen7b_like_shapes() == shapes.model_shapes(1.0)
    assert baselines.qwen7b_like_shapes(0.25) == shapes.model_shapes(0.25)


def test_table(bench):
    gb = 15_231_233_024
    results = {
        "limit": {"label": "limit: torch device-to-device copy of the same bytes",
                  "seconds": 0.0080, "bytes": gb},
        "python": {"seconds": 0.0100, "bytes": gb, "path": "cuda-ipc, in_place, one GPU",
                   "tracemalloc_bytes_per_update": 0.0, "blocks_per_update": 0.0},
        "zerocopy": {"seconds": 0.0110, "bytes": gb, "trainer_store_bytes": 8 << 20,
                     "first_update_s": 0.124},
        "zerocopy_expandable": {"skipped": "failed: RuntimeError: expandable=0"},
        "cpp": {"seconds": 0.0099, "bytes": gb},
        "torch_ipc": {"seconds": 0.030, "bytes": gb},
        "nccl": {"skipped": "needs two GPUs"},
        "ckpt": {"update_s": 1.0, "update_keep_pg_s": 0.5, "step_gpu_src_s": 1.3,
                 "seconds": 1.3, "bytes": gb},
    }
    text = "\n".join(bench.table(results))
    print(text)
    assert "weightsync reaches 80% of it" in text
    assert "Python +1.0% vs C++ (target <= +3%)" in text
    assert "3.00x the time (slower)" in text
    assert "130.00x the time (slower)" in text and "50.00x the time (slower)" in text
    assert "torch.distributed NCCL broadcast" in text and "needs two GPUs" in text
    assert "1,523.1" in text  # GB/s of 15.23 GB in 10 ms
    zero_copy = [line for line in text.splitlines() if "caching allocator (cudaMalloc)" in line]
    assert len(zero_copy) == 1 and "1.10x the time (slower)" in zero_copy[0], text
    assert any("store_bytes); first" in line and "8 MiB" in line and "124.0 ms" in line
               for line in text.splitlines()), text
    assert any("expandable segments (cuMem)" in line and "expandable=0" in line
               for line in text.splitlines()), text
    lines = bench.table({"python": {"skipped": "failed: boom"}})
    assert any("skipped" in line and "failed: boom" in line for line in lines)


def test_without_a_gpu_it_says_so():
    pytest.importorskip("torch")
    import weightsync

    if weightsync.cuda_status():
        pytest.skip("a GPU is here: the bench would run")
    out = subprocess.run([sys.executable, str(BENCH / "python_gpu_update.py"), "--scale", "0.01"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "needs a CUDA device" in out.stderr, out.stderr


def test_ipc_read_probe_without_a_gpu_says_so():
    """bench/ipc_read_probe.py needs a GPU: without one it says so and exits 2, measuring nothing."""
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is here: the probe would run")
    out = subprocess.run([sys.executable, str(BENCH / "ipc_read_probe.py"), "--gib", "0.01"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "needs a CUDA device" in out.stderr, out.stderr
    assert out.stdout == "", out.stdout


@pytest.mark.slow
def test_cpu_harness_run(tmp_path):
    """--cpu: the limit and python rows over host memory, end to end (child publisher, table,
    JSON), so this script's own plumbing is checked without a GPU."""
    pytest.importorskip("torch")
    out_json = tmp_path / "bench.json"
    out = subprocess.run([sys.executable, str(BENCH / "python_gpu_update.py"), "--cpu",
                          "--scale", "0.001", "--steps", "4", "--json", str(out_json)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "weightsync through Python (shm (--cpu), in_place)" in out.stdout, out.stdout
    import json
    data = json.loads(out_json.read_text())
    python = data["rows"]["python"]
    assert python["verified"] and python["tensors"] == 15 and python["bytes"] == 54_882_048
    assert python["tracemalloc_bytes_per_update"] < 64, python


def test_checkpoint_engine_row_reads_its_bench(bench, tmp_path):
    """The ckpt row runs <folder>/run.sh with OUT set and reads $OUT/ckpt_engine.jsonl (the
    format of shared/baselines/checkpoint_engine/ckpt_engine_bench.py); a fake run.sh here."""
    folder = tmp_path / "checkpoint_engine"
    folder.mkdir()
    ok = "bit-exact all tensors, every update"
    rows = [
        {"what": "env", "bytes": 15231233024},
        {"what": "checkpoint_engine_broadcast_ws1", "steady_median_s": 1.02, "verify": ok,
         "bytes": 15231233024},
        {"what": "checkpoint_engine_broadcast_ws1", "steady_median_s": 9.9, "verify": ok},
        {"what": "checkpoint_engine_broadcast_ws1_keep_pg", "steady_median_s": 0.56,
         "verify": ok},
        {"what": "checkpoint_engine_step_ws1_gpu_src", "steady_median_s": 1.32, "verify": ok},
    ]
    lines = "\n".join(__import__("json").dumps(r) for r in rows)
    (folder / "run.sh").write_text(f"echo \"$@\" > \"$OUT/args\"\ncat > \"$OUT/ckpt_engine.jsonl\" "
                                   f"<<'END'\n{lines}\nEND\n")
    args = bench.parse_args(["--ckpt", str(folder)])
    r = bench.row_ckpt(args, str(tmp_path / "out"))
    assert (r["update_s"], r["update_keep_pg_s"], r["step_gpu_src_s"]) == (1.02, 0.56, 1.32), r
    assert r["bytes"] == 15231233024 and r["seconds"] == 1.32
    assert (tmp_path / "out" / "args").read_text().split() == bench.CKPT_ARGS.split()
    small = bench.parse_args(["--ckpt", str(folder), "--scale", "0.5"])
    assert "full 7B-like model only" in bench.row_ckpt(small, str(tmp_path / "o2"))["skipped"]
    missing = bench.parse_args(["--ckpt", str(tmp_path / "nowhere")])
    assert "carry it" in bench.row_ckpt(missing, str(tmp_path / "o3"))["skipped"]
