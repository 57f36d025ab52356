"""register(..., quantization=...): MXFP8 and NVFP4 host destinations (docs/quantized.md).

The expected bytes are worked by hand from the formats' definitions (the same tensors as
tests/cuda/block_scaled_reference_test.cc), not computed by weightsync."""
import numpy as np
import pytest

import weightsync


def bf16(values):
    """float32 values exactly representable in bf16 → their bf16 bits."""
    return (np.asarray(values, dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16)


@pytest.mark.parametrize("mode", ["staged", "in_place"])
def test_mxfp8_values_and_scales_worked_by_hand(endpoint, mode):
    x = np.zeros((2, 64), np.float32)
    x[0, 0], x[0, 1], x[0, 2] = 300, 1, -2.5  # scale 2^0; 300 -> 288
    x[0, 32], x[0, 33] = 500, 3               # scale 2^0; 500 clamps to 448
    x[1, 0], x[1, 1] = 2.0 ** -10, 2.0 ** -13  # scale 2^-18: 256 and 32
    with weightsync.Publisher(endpoint) as pub:
        pub.register({"w": bf16(x)}, dtypes={"w": "bfloat16"})
        pub.publish(1)
        values = np.full((2, 64), 0xEE, np.uint8)
        scales = np.full(512, 0xEE, np.uint8)  # swizzled: [128, 4] padded
        with weightsync.Subscriber(endpoint, mode=mode, verify=True, convert_dtypes=True) as sub:
            sub.register({"w": values, "w.scales": scales}, dtypes={"w": "float8_e4m3fn"},
                         quantization={"w": {"format": "mxfp8", "scale_layout": "swizzled_128x4",
                                             "scales": "w.scales"}})
            assert sub.update().step == 1
    assert list(values[0, :4]) == [0x79, 0x38, 0xC2, 0x00]
    assert list(values[0, 32:34]) == [0x7E, 0x44]
    assert list(values[1, :2]) == [0x78, 0x60]
    want = np.zeros(512, np.uint8)
    want[0], want[1], want[16], want[17] = 127, 127, 127 - 18, 0
    assert scales.tobytes() == want.tobytes()


def test_nvfp4_packed_values_scales_and_global_worked_by_hand(endpoint):
    row0 = [0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.25, 0.75, 2.5, 5, -6, 5.5, 0.1875, -1]
    row1 = [3, -1.5, 0.75] + [0] * 13
    with weightsync.Publisher(endpoint) as pub:
        pub.register({"w": np.array([row0, row1], np.float32)})
        pub.publish(1)
        values = np.full((2, 8), 0xEE, np.uint8)  # 16 fp4 per row, two per byte
        scales = np.full((2, 1), 0xEE, np.uint8)
        glob = np.full(1, -1, np.float32)
        with weightsync.Subscriber(endpoint, convert_dtypes=True) as sub:
            sub.register({"w": values, "w_scale_inv": scales, "w_scale_2": glob},
                         dtypes={"w": "float4_e2m1fn", "w_scale_inv": "float8_e4m3fn"},
                         quantization={"w": "nvfp4"})
            stats = sub.update()
            again = sub.update()  # up to date: nothing moved, nothing converted
    # The update says what it converted (the bytes as published: 32 float32) and where.
    assert (stats.converted_tensors, stats.converted_bytes, stats.converted_on,
            stats.converted_device) == (1, 128, "host", -1)
    assert "converted_tensors=1, converted_bytes=128, converted_on='host'" in repr(stats)
    assert (again.up_to_date, again.converted_tensors, again.converted_on) == (True, 0, "")
    assert values.tobytes() == bytes([0x10, 0x32, 0x54, 0x76, 0x28, 0x64, 0x7F, 0xA0,
                                      0xD7, 0x03, 0, 0, 0, 0, 0, 0])
    assert list(scales.ravel()) == [0x7E, 0x76]  # e4m3 448 and 224
    assert glob[0] == np.float32(6) / np.float32(2688)


def test_bad_quantization_arguments_are_named(endpoint):
    with weightsync.Subscriber(endpoint, convert_dtypes=True) as sub:
        dst = {"w": np.zeros((4, 32), np.uint8)}
        with pytest.raises(ValueError, match=r"format 'fp6': expected 'mxfp8' or 'nvfp4'"):
            sub.register(dst, quantization={"w": "fp6"})
        with pytest.raises(ValueError, match=r"scale_layout 'tiled'"):
            sub.register(dst, quantization={"w": {"format": "mxfp8", "scale_layout": "tiled"}})
        with pytest.raises(ValueError, match=r"unknown key 'layout'"):
            sub.register(dst, quantization={"w": {"format": "mxfp8", "layout": "row_major"}})
        with pytest.raises(ValueError, match=r"quantization names tensors not in this call: 'v'"):
            sub.register(dst, quantization={"v": "mxfp8"})
        with pytest.raises(TypeError, match=r"needs 'format'"):
            sub.register(dst, quantization={"w": {"scales": "s"}})
