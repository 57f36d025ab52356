"""A DLPack producer for any device, built with ctypes: lets CPU-only tests hand the binding a
tensor that claims to live on a CUDA (or other) device, to check how it is refused without a GPU.
The memory is never touched by the binding before the refusal; CPU ones may point at real memory.
"""

import ctypes


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p)]  # NULL: nothing to free (this object owns it all)


_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]

CPU, CUDA, CUDA_HOST, ROCM, CUDA_MANAGED = 1, 2, 3, 10, 13
FLOAT = 2


class FakeTensor:
    """float32 (by default) elements of `shape` at address `data` on (device_type, device_id).
    Keep it alive while anything may use its capsules."""

    def __init__(self, shape, device_type=CUDA, device_id=0, data=0x7F0000000000, code=FLOAT,
                 bits=32):
        self.shape = (ctypes.c_int64 * len(shape))(*shape)
        self.device = (device_type, device_id)
        self.managed = DLManagedTensor()
        t = self.managed.dl_tensor
        t.data = data
        t.device = DLDevice(device_type, device_id)
        t.ndim = len(shape)
        t.dtype = DLDataType(code, bits, 1)
        t.shape = self.shape
        t.strides = None  # C order
        t.byte_offset = 0

    def __dlpack_device__(self):
        return self.device

    def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
        return _capsule_new(ctypes.addressof(self.managed), b"dltensor", None)
