"""Decoding a compressed store's records on the accelerator: `DeviceDecoder` turns a batch's
stored bytes (JPEG records, and the raw records a size budget kept) into one uint8 N×H×W×C
batch on the device, with `torchvision.io.decode_jpeg` (nvjpeg, batched, on CUDA).

Why the bytes stay on the host: torchvision's decoder takes its input on the CPU whatever the
device it decodes on. In torchvision 0.29.2, `torchvision/io/image.py`'s `decode_jpeg` raises
"Input list must contain tensors on CPU." for any other input, and its CUDA op checks
`!encoded_image.is_cuda()` ("The input tensor must be on CPU when decoding with nvjpeg",
`torchvision/csrc/io/image/cuda/decode_jpegs_cuda.cpp`): nvjpeg parses each JPEG's headers on
the host and copies the bitstream itself. So what crosses the bus is the compressed bytes, and
the decoded pixels are made on the device. The call returns once the batch is decoded (it
synchronizes nvjpeg's stream), so a batch's decode does not overlap the host's next batch.
"""

from __future__ import annotations

import warnings
from typing import List, Tuple

import numpy as np
import torch

from fastload._checks import import_optional
from fastload.store import Store, StoreError

#: Where a DeviceLoader decodes a compressed store's records: "host" (fastload's Rust threads,
#: libjpeg-turbo, into the batch buffers; the default) or "device" (torchvision's decode_jpeg on
#: the loader's device: nvjpeg on CUDA).
DECODE_MODES = ("host", "device")
#: The torchvision release this decoder was checked with (its CPU decode equals fastload's).
TORCHVISION_CHECKED = "0.29.2"
#: Device types torchvision decodes JPEG on.
DECODE_DEVICES = ("cpu", "cuda")


def decode_mode(decode) -> str:
    """`decode` checked: one of DECODE_MODES, or ValueError naming them."""
    if not isinstance(decode, str) or decode not in DECODE_MODES:
        raise ValueError(f"decode must be one of {', '.join(map(repr, DECODE_MODES))}, not {decode!r}")
    return decode


class DeviceDecoder:
    """Decodes batches of `store`'s records on `device`.

    Refused, before any batch, with what to do instead: a store of raw records (nothing to
    decode: the default decode="host" copies its pixels as they are), torchvision missing, a
    device torchvision cannot decode on. Raw records of a budget store (`StoreWriter(max_size=)`)
    are copied to the device as they are; JPEG records go to `decode_jpeg` in one call per batch
    (nvjpeg batches them). A decoded image of another size than the store's is a damaged record,
    and an error names it.
    """

    def __init__(self, store: Store, device: torch.device):
        if not store.compressed:
            raise ValueError(
                f"{store.path} stores its records raw (uncompressed): there is nothing to decode on "
                "the device; use decode='host' (the default), which copies them as they are, or a "
                "store written with StoreWriter(encoding='jpeg') / fastload pack --encoding jpeg"
            )
        if device.type not in DECODE_DEVICES:
            raise ValueError(
                f"decode='device' decodes with torchvision, which decodes JPEG on the CPU and on CUDA "
                f"only, not on {device}: use decode='host' (the default)"
            )
        io = import_optional(
            "torchvision.io",
            "decode='device'",
            f"pip install torchvision (checked with {TORCHVISION_CHECKED})",
        )
        self.decode_jpeg = io.decode_jpeg
        self.store, self.device = store, device
        self.shape = store.shape
        channels = store.shape[2]
        self.mode = io.ImageReadMode.GRAY if channels == 1 else io.ImageReadMode.RGB
        # Raw records are copied from pinned memory, so their copies do not make the host wait.
        self.pin = device.type == "cuda"

    def read(self, records: np.ndarray) -> Tuple[List[torch.Tensor], np.ndarray]:
        """The stored bytes of `records`, each a slice of one host tensor, and whether each is a
        JPEG: one copy out of the mapping, which makes them writable (torch takes no read-only
        memory) and, decoding on CUDA, pinned, so raw records go from there to the device
        without a wait or a second copy."""
        stored = [self.store.stored(int(i)) for i in records]
        lengths = [len(view) for _, view in stored]
        data = torch.empty(sum(lengths), dtype=torch.uint8, pin_memory=self.pin)
        if stored:
            np.concatenate([view for _, view in stored], out=data.numpy())
        parts, start = [], 0
        for length in lengths:
            parts.append(data[start : start + length])
            start += length
        jpeg = np.fromiter((encoding == "jpeg" for encoding, _ in stored), dtype=bool, count=len(stored))
        return parts, jpeg

    def __call__(self, parts: List[torch.Tensor], jpeg: np.ndarray, records: np.ndarray) -> torch.Tensor:
        """The records whose stored bytes are `parts` (host uint8 tensors, pinned on CUDA; JPEG
        where `jpeg`) as one uint8 N×H×W×C batch on the device, in their order: raw records
        copied into it as they are, JPEG ones decoded by one `decode_jpeg` call (which makes
        each image C×H×W, in memory of its own) and copied into place. An error of the decoder
        (a damaged record, a torchvision built without nvjpeg) names the store and the way back
        to the host decode."""
        h, w, c = self.shape
        encoded = np.flatnonzero(jpeg)
        decoded = None
        if len(encoded):
            with warnings.catch_warnings():
                # torchvision 0.29 warns on every call that its image codecs move to TorchCodec:
                # fastload's choice of decoder, not the user's code to change.
                warnings.simplefilter("ignore", DeprecationWarning)
                try:
                    images = self.decode_jpeg(
                        [parts[k] for k in encoded.tolist()], mode=self.mode, device=self.device
                    )
                except RuntimeError as error:
                    raise RuntimeError(
                        f"{self.store.path}: torchvision's decode_jpeg on {self.device} failed on records "
                        f"{records[encoded][:5].tolist()}{'...' if len(encoded) > 5 else ''}: {error} "
                        "(decode='host', the default, decodes them in fastload's threads)"
                    ) from error
            for k, image in zip(encoded.tolist(), images):
                if tuple(image.shape) != (c, h, w):
                    raise StoreError(
                        f"{self.store.path}: record {int(records[k])} decodes to "
                        f"{image.shape[1]}x{image.shape[2]}x{image.shape[0]}, not the store's "
                        f"{h}x{w}x{c}: the record is damaged (fastload verify --decode)"
                    )
            decoded = [image.permute(1, 2, 0) for image in images]
            if len(encoded) == len(parts):
                return torch.stack(decoded)
        # A mixed batch: each image copied into its place (an index tensor would be a copy from
        # the host, which waits for the stream).
        batch = torch.empty((len(parts), h, w, c), dtype=torch.uint8, device=self.device)
        for k in np.flatnonzero(~jpeg).tolist():
            batch[k].copy_(parts[k].view(h, w, c), non_blocking=self.pin)
        for k, image in zip(encoded.tolist(), decoded or ()):
            batch[k].copy_(image)
        return batch
