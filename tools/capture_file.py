"""Read and write gaugewatch capture files (safetensors, format
"gaugewatch.capture.v1": q, k, v, out, grad_out BF16 in SDPA's (B, H, N, d)
layout, lse float32 (B, H, N); metadata "causal" = none | top_left |
bottom_right and "scale"), the files the hooks' `capture` command writes and
`gaugewatch audit --input FILE` reads. The safetensors layout is an 8-byte
little-endian header length, a JSON header (dtype, shape, data_offsets per
tensor; "__metadata__"), then the raw data."""

import json
import pathlib
import struct

import torch

_DTYPES = {"BF16": torch.bfloat16, "F32": torch.float32, "F16": torch.float16, "F64": torch.float64}
_NAMES = {v: k for k, v in _DTYPES.items()}
FORMAT = "gaugewatch.capture.v1"


def read(path):
    """(tensors dict, metadata dict) of a safetensors file, tensors on the CPU."""
    data = pathlib.Path(path).read_bytes()
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + length])
    metadata = header.pop("__metadata__", {}) or {}
    base = 8 + length
    tensors = {}
    for name, info in header.items():
        if info["dtype"] not in _DTYPES:
            raise ValueError(f"{path}: tensor '{name}' has dtype {info['dtype']}; expected one of {sorted(_DTYPES)}")
        start, end = info["data_offsets"]
        raw = bytearray(data[base + start:base + end])
        tensors[name] = torch.frombuffer(raw, dtype=_DTYPES[info["dtype"]]).reshape(info["shape"]).clone() \
            if end > start else torch.empty(info["shape"], dtype=_DTYPES[info["dtype"]])
    return tensors, metadata


def write(path, tensors, metadata):
    header, blobs, offset = {}, [], 0
    for name, tensor in tensors.items():
        tensor = tensor.detach().contiguous().cpu()
        raw = tensor.view(torch.uint8).numpy().tobytes() if tensor.numel() else b""
        header[name] = {"dtype": _NAMES[tensor.dtype], "shape": list(tensor.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    header["__metadata__"] = {k: str(v) for k, v in metadata.items()}
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    pathlib.Path(path).write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def write_capture(path, q, k, v, out, lse, grad_out, causal, scale):
    """A capture of one attention call (BF16 operands, lse float32)."""
    bf16 = {n: t.to(torch.bfloat16) for n, t in (("q", q), ("k", k), ("v", v), ("out", out), ("grad_out", grad_out))}
    write(path, {**bf16, "lse": lse.float()}, {"causal": causal, "scale": repr(float(scale)), "format": FORMAT})
