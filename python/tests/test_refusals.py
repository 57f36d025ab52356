"""Refusals name the tensor and the real reason (keeping the producer's own message); no bare C++
exception reaches Python; a failed allocate() leaves nothing behind."""

import re
import subprocess
import sys

import numpy as np
import pytest

import weightsync


@pytest.fixture
def sub(endpoint):
    with weightsync.Subscriber(endpoint) as s:
        yield s


# ---- NumPy arrays whose elements are not numbers weightsync moves ------------------------------

@pytest.mark.parametrize("array,what,todo", [
    (np.zeros(3, np.longdouble), r"float128|longdouble", r"astype\(np\.float64\)"),
    (np.zeros(3, object), r"Python objects \(dtype object\)", r"numeric"),
    (np.array(["ab", "c"]), r"strings \(dtype <U2\)", r"numeric"),
    (np.zeros(3, "datetime64[s]"), r"datetime64\[s\]", r"view\(np\.int64\)"),
    (np.zeros(3, [("a", "<f4"), ("b", "<i4")]), r"structured", r"each field"),
], ids=["float128", "object", "str", "datetime", "structured"])
def test_numpy_dtypes_weightsync_cannot_move(sub, array, what, todo):
    with pytest.raises(weightsync.InvalidArgument) as info:
        sub.register({"x": array})
    msg = str(info.value)
    assert msg.startswith("tensor 'x': "), msg
    assert re.search(what, msg), msg
    assert re.search(todo, msg), msg
    assert "DLPack" in msg  # NumPy's own refusal text is kept


def test_complex_names_itself(sub):
    with pytest.raises(weightsync.InvalidArgument, match=r"tensor 'z': complex64 .*view"):
        sub.register({"z": np.zeros(2, np.complex64)})


# ---- the producer's own refusal, e.g. Paddle and PyTorch --------------------------------------

def test_paddle_parameter_requiring_grad_keeps_paddles_message(endpoint):
    paddle = pytest.importorskip("paddle")
    weight = paddle.nn.Linear(3, 2).weight  # stop_gradient=False: requires grad
    with weightsync.Publisher(endpoint) as pub:
        with pytest.raises(weightsync.InvalidArgument) as info:
            pub.register({"weight": weight})
    msg = str(info.value)
    assert msg.startswith("tensor 'weight': "), msg
    assert "tensor.detach()" in msg and "requires gradients" in msg, msg  # Paddle's own words
    with weightsync.Publisher(endpoint) as pub:
        pub.register({"weight": weight.detach()})  # the way out works


def test_torch_meta_tensor(sub):
    torch = pytest.importorskip("torch")
    with pytest.raises(weightsync.InvalidArgument) as info:
        sub.register({"m": torch.empty(3, device="meta")})
    msg = str(info.value)
    assert msg.startswith("tensor 'm': ") and "meta" in msg and "no data" in msg, msg
    assert "to_empty" in msg, msg
    assert "Cannot pack tensors on meta" in msg, msg  # torch's own words


@pytest.mark.filterwarnings("ignore:.*quantized tensor creation functions")
def test_torch_quantized_tensor(sub):
    torch = pytest.importorskip("torch")
    q = torch.quantize_per_tensor(torch.randn(4), 0.1, 0, torch.qint8)
    with pytest.raises(weightsync.InvalidArgument) as info:
        sub.register({"q": q})
    msg = str(info.value)
    assert msg.startswith("tensor 'q': ") and "quantized" in msg and "torch.qint8" in msg, msg
    assert "int_repr()" in msg and "dequantize()" in msg, msg


def test_torch_sparse_tensor(sub):
    torch = pytest.importorskip("torch")
    with pytest.raises(weightsync.InvalidArgument, match=r"tensor 's': .*sparse.*to_dense\(\)"):
        sub.register({"s": torch.eye(3).to_sparse()})


def test_not_a_tensor_is_still_a_type_error(sub):
    with pytest.raises(TypeError,
                       match=r"'l': expected a tensor with __dlpack__ \(CPU or CUDA\)"):
        sub.register({"l": [1.0, 2.0]})


# ---- arguments nanobind could not convert: clear errors, never a bare std::bad_cast -----------

@pytest.mark.parametrize("shape", [(2**63,), (4, 2**64), 2**63, (-(2**63) - 1,)])
def test_shape_dimension_out_of_int64_range(endpoint, sub, shape):
    for target in (sub, weightsync.Publisher(endpoint)):
        with target:
            with pytest.raises(weightsync.InvalidArgument, match=r"shape: dimension .* int64"):
                target.allocate("x", "float32", shape)


def test_shape_of_wrong_type(sub):
    with pytest.raises(TypeError, match=r"shape: expected an int or a sequence of ints, got float"):
        sub.allocate("x", "float32", (2, 1.5))
    with pytest.raises(TypeError, match=r"shape: expected an int or a sequence of ints, got str"):
        sub.allocate("x", "float32", "34")


BAD = "w\udcff"  # a lone surrogate: a str that has no UTF-8 encoding


def test_non_utf8_names_are_value_errors(endpoint, sub):
    pattern = r"not valid UTF-8"
    with pytest.raises(weightsync.InvalidArgument, match=r"tensor name 'w\\udcff': " + pattern):
        sub.register({BAD: np.zeros(3)})
    with pytest.raises(weightsync.InvalidArgument, match=pattern):
        sub.allocate(BAD, "float32", 3)
    with pytest.raises(weightsync.InvalidArgument, match=pattern):
        sub.register({"x": np.zeros(3, np.uint16)}, dtypes={BAD: "bfloat16"})
    with pytest.raises(weightsync.InvalidArgument, match=r"dtype .*" + pattern):
        sub.allocate("x", "bfloat\udcff", 3)
    with weightsync.Publisher(endpoint) as pub:
        with pytest.raises(weightsync.InvalidArgument, match=pattern):
            pub.allocate(BAD, "float32", 3)
        with pytest.raises(weightsync.InvalidArgument, match=pattern):
            pub.register({BAD: np.zeros(3)})


def test_non_utf8_endpoints_are_value_errors():
    with pytest.raises(weightsync.InvalidArgument, match=r"endpoint .*not valid UTF-8"):
        weightsync.Subscriber("local://" + BAD)
    with pytest.raises(weightsync.InvalidArgument, match=r"endpoint .*not valid UTF-8"):
        weightsync.Subscriber(["local://a", "local://" + BAD])
    with pytest.raises(weightsync.InvalidArgument, match=r"endpoint .*not valid UTF-8"):
        weightsync.Publisher("local://" + BAD)


# ---- JAX arrays are immutable ------------------------------------------------------------------

def test_jax_array_refused_as_publisher_source(endpoint):
    jnp = pytest.importorskip("jax.numpy")
    params = {"w": jnp.ones((2, 3), jnp.float32)}
    with weightsync.Publisher(endpoint) as pub:
        with pytest.raises(weightsync.InvalidArgument) as info:
            pub.register(params)
    msg = str(info.value)
    assert msg.startswith("tensor 'w': a JAX array is immutable"), msg
    assert "pub.allocate('w'" in msg and "np.copyto" in msg and "begin_write()" in msg, msg


def test_jax_array_refused_as_subscriber_destination(sub):
    jnp = pytest.importorskip("jax.numpy")
    before = jnp.zeros(4, jnp.float32)
    with pytest.raises(weightsync.InvalidArgument) as info:
        sub.register({"w": before})
    msg = str(info.value)
    assert msg.startswith("tensor 'w': a JAX array is immutable"), msg
    assert "sub.allocate('w'" in msg and "jnp.array" in msg and "jax.dlpack" in msg, msg


def test_jax_detection_does_not_import_jax(endpoint):
    code = (
        "import sys, numpy as np, weightsync\n"
        "with weightsync.Publisher(sys.argv[1]) as pub:\n"
        "    pub.register({'x': np.zeros(3)})\n"
        "    try:\n"
        "        pub.register({'l': [1.0]})\n"
        "    except TypeError:\n"
        "        pass\n"
        "assert 'jax' not in sys.modules and 'jaxlib' not in sys.modules, 'jax was imported'\n")
    out = subprocess.run([sys.executable, "-c", code, endpoint], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr


# ---- a failed allocate() leaves nothing behind -------------------------------------------------

# (0, 2**62, 8) uint8 holds no bytes, so weightsync accepts it; NumPy refuses the shape ("array is
# too big": it multiplies the dimensions). A failure after the C++ Allocate/Register left the name
# registered, and allocating it again said "duplicate".
NUMPY_REFUSES = (0, 2**62, 8)


def test_failed_publisher_allocate_leaves_nothing_behind(endpoint):
    with weightsync.Publisher(endpoint) as pub:
        with pytest.raises(ValueError, match="too big"):
            pub.allocate("w", "uint8", NUMPY_REFUSES)
        assert pub.manifest == []
        w = pub.allocate("w", "float32", (2, 3))
        assert pub.manifest == [("w", "float32", (2, 3))]
        w[...] = 1.5
        pub.publish(1)
        with weightsync.Subscriber(endpoint) as sub:
            dst = {"w": np.zeros((2, 3), np.float32)}
            sub.register(dst)
            sub.update()
            assert (dst["w"] == 1.5).all()
        del w


@pytest.mark.parametrize("framework", ["numpy", "torch", "dlpack"])
def test_failed_subscriber_allocate_leaves_nothing_behind(endpoint, framework):
    if framework == "torch":
        pytest.importorskip("torch")
    with weightsync.Publisher(endpoint) as pub, weightsync.Subscriber(endpoint) as sub:
        pub.register({"w": np.arange(6, dtype=np.float32).reshape(2, 3)})
        pub.publish(1)
        with pytest.raises(ValueError, match="too big"):
            sub.allocate("w", "uint8", NUMPY_REFUSES, framework=framework)
        with pytest.raises(ValueError, match="negative"):
            sub.allocate("w", "float32", (2, -3), framework=framework)
        sub.allocate("w", "float32", (2, 3), framework=framework)
        (name, w), = sub.receive()  # strict policy: any leftover name would be a mismatch
        assert name == "w" and np.asarray(w).tolist() == [[0, 1, 2], [3, 4, 5]]


# ---- zero-copy publishing: CUDA tensors, on this host ------------------------------------------

@pytest.mark.parametrize("over_tcp", [False, True])
def test_zero_copy_refuses_host_tensors_on_either_link(endpoint, over_tcp):
    # A zero-copy publisher over tcp is built (its sessions broadcast the CUDA tensors over NCCL);
    # what neither link can serve is a host tensor, named in the error.
    with weightsync.Publisher("tcp://127.0.0.1:0" if over_tcp else endpoint, zero_copy=True) as pub:
        with pytest.raises(weightsync.InvalidArgument, match=r"tensor 'w' is on cpu.*zero_copy"):
            pub.register({"w": np.zeros(4, np.float32)})
