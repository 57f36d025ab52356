"""Tensor contents the GPU tests publish, computed the same way in the publisher child and in the
test that checks what arrived, plus a NumPy reference of the bf16 -> fp8 conversion. Import-light
(NumPy only; ml_dtypes for the reference), so the child starts fast.

A model spec is a list of (name, dtype, shape, kind): `kind` "bits" fills the tensor with random
bytes (NaNs, infinities, subnormals included: a round trip must move any bit pattern), "finite"
(bfloat16 only) with finite values of assorted magnitudes (what a conversion is specified on
bit for bit).
"""

import numpy as np

WIDTH = {"bool": 1, "int8": 1, "uint8": 1, "int16": 2, "uint16": 2, "int32": 4, "uint32": 4,
         "int64": 8, "uint64": 8, "float16": 2, "bfloat16": 2, "float32": 4, "float64": 8,
         "float8_e4m3fn": 1, "float8_e5m2": 1, "float8_e8m0fnu": 1}
UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def nbytes(dtype, shape):
    return numel(shape) * WIDTH[dtype]


def content(index, dtype, shape, kind, seed, step):
    """The bytes (uint8, C order) of tensor number `index` of a spec at `step`."""
    rng = np.random.default_rng([seed, step, index])
    n = nbytes(dtype, shape)
    if kind == "bits":
        return rng.integers(0, 256, n, dtype=np.uint8)
    assert kind == "finite" and dtype == "bfloat16", (kind, dtype)
    count = numel(shape)
    values = rng.standard_normal(count) * np.exp2(rng.integers(-12, 12, count))
    bits = (values.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)  # truncate: finite
    if count >= 4:
        bits[: count // 4] = 0  # some all-zero rows, hence an all-zero block where it is tall
    return bits.view(np.uint8)


def model_bytes(spec, seed, step):
    """{name: bytes} of a whole spec at `step`."""
    return {name: content(i, dtype, shape, kind, seed, step).tobytes()
            for i, (name, dtype, shape, kind) in enumerate(spec)}


# ---- bf16 -> fp8 (float8_e4m3fn) with float32 scales per 128x128 block: docs/gpu.md -----------

def fp8_scale_shape(shape):
    cols = shape[-1]
    rows = numel(shape[:-1])
    return (-(-rows // 128), -(-cols // 128))


def quantize_fp8_reference(bf16_bytes, shape):
    """(fp8 bytes, float32 scale bytes) for finite bfloat16 input, from the format definitions:
    amax per block, scale = amax / 448 in float32 (1 when amax is 0), q = e4m3fn(x / scale)
    rounded to nearest even with saturation at +-448."""
    import ml_dtypes

    cols = shape[-1]
    rows = numel(shape[:-1])
    bits = np.frombuffer(bf16_bytes, np.uint16).astype(np.uint32) << 16
    x = bits.view(np.float32).reshape(rows, cols)
    srows, scols = fp8_scale_shape(shape)
    scales = np.ones((srows, scols), np.float32)
    q = np.empty((rows, cols), ml_dtypes.float8_e4m3fn)
    for bi in range(srows):
        for bj in range(scols):
            block = x[bi * 128:(bi + 1) * 128, bj * 128:(bj + 1) * 128]
            amax = np.float32(np.abs(block).max()) if block.size else np.float32(0)
            scale = np.float32(amax / np.float32(448)) if amax > 0 else np.float32(1)
            scales[bi, bj] = scale
            y = np.clip(block / scale, np.float32(-448), np.float32(448))  # float32 division
            q[bi * 128:(bi + 1) * 128, bj * 128:(bj + 1) * 128] = y.astype(ml_dtypes.float8_e4m3fn)
    return q.view(np.uint8).tobytes(), scales.tobytes()
