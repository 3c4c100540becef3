"""`Augment`: random crops, flips, rotations and colour jitter for whole uint8 batches on the
device, with per-sample parameters that depend only on (seed, epoch, record index).

Why: per-sample torchvision transforms in DataLoader workers are the CPU-bound path fastload
replaces, and batched torchvision v2 transforms draw one set of parameters for a whole batch.
Here the geometry of every sample (crop, flips, rotation, translation) is one affine matrix
per sample, and the colour jitter one set of factors per sample, applied to the whole batch.

Two paths run the same semantics (bilinear, border padding, align_corners=False, then the
jitter, then the normalisation), chosen in `apply`:

- float32 on the CPU with 1 or 3 channels: `_core.augment` (rust/augment.rs), a fused kernel
  that reads the bilinear taps straight from the uint8 pixels and jitters and normalises each
  output pixel as it is written, on the Rust thread pool (`FASTLOAD_NUM_THREADS`). On the CPU
  the torch ops spend most of their time converting the whole input to float and passing
  over the output again for each step.
- every other device and dtype (CUDA, bfloat16, float64, other channel counts): torch ops,
  one affine grid + `grid_sample` over the float batch, then the jitter in place; there these
  passes cost bandwidth only. The two agree to float32 rounding (tests/test_augment_kernel.py).

Order, fixed: random resized crop -> horizontal flip -> vertical flip -> rotation and
translation (about the output's centre) -> brightness -> contrast -> saturation ->
normalisation. Unlike torchvision's `ColorJitter`, the colour order is not shuffled.

Randomness is counter-based: uniform number `slot` of record `index` in `epoch` is a
splitmix64 hash of (seed, epoch, index, slot), computed in int64 tensor ops on the device.
No generator state is carried, so the same record in the same epoch gets the same
augmentation whatever the batch size, worker count, world size or a mid-epoch resume.
"""

from __future__ import annotations

import math
import numbers
from typing import Dict, Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F

from fastload import _core
from fastload._checks import is_int

# One fixed slot per random number, so enabling one op never changes another's draws.
_CROP_ATTEMPTS = 10  # as torchvision's RandomResizedCrop: the first crop that fits wins
_SCALE, _RATIO = 0, _CROP_ATTEMPTS
_TOP, _LEFT, _HFLIP, _VFLIP, _ANGLE, _SHIFT_X, _SHIFT_Y, _BRIGHTNESS, _CONTRAST, _SATURATION = range(
    2 * _CROP_ATTEMPTS, 2 * _CROP_ATTEMPTS + 10
)
_SLOTS = 2 * _CROP_ATTEMPTS + 10

_GOLDEN = 0x9E3779B97F4A7C15
_MIX1, _MIX2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
_GRAY = (0.2989, 0.587, 0.114)  # ITU-R 601 luma, the weights torchvision's rgb_to_grayscale uses

# On the CPU the torch path (dtypes other than float32) takes a batch in groups of samples whose
# float images fit this many bytes, so each pass over them stays in the cache (one pass over a
# whole 224x224 batch of 64 goes to memory: 1.8x the CPU time). Accelerators take the batch at once.
_CPU_WORKING_SET = 8 << 20

SPEC_TERMS = ("crop", "flip", "vflip", "jitter", "rotate", "translate")
#: Largest output side (a store's sides are below 2**16 too).
MAX_SIDE = 65535

# Brightness and contrast factors are drawn up to 1 + this. A larger strength only whitens more
# of each image (a factor of 101 already takes any pixel above 2 to white), and the bound keeps a
# brightness gain times a contrast factor (10,201 at most) finite even in float16.
MAX_JITTER = 100.0


def _signed(value: int) -> int:
    """A 64-bit pattern as the int64 that torch stores (constants above 2**63 wrap)."""
    value &= (1 << 64) - 1
    return value - (1 << 64) if value >= 1 << 63 else value


def _shift_right(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 (torch's >> is arithmetic)."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def splitmix64(x: torch.Tensor) -> torch.Tensor:
    """The splitmix64 finaliser on int64 tensors (wrapping arithmetic), element-wise."""
    x = x + _signed(_GOLDEN)
    x = (x ^ _shift_right(x, 30)) * _signed(_MIX1)
    x = (x ^ _shift_right(x, 27)) * _signed(_MIX2)
    return x ^ _shift_right(x, 31)


def _splitmix64_int(x: int) -> int:
    """splitmix64 on a Python int, for the per-batch constant (seed, epoch)."""
    mask = (1 << 64) - 1
    x = (x + _GOLDEN) & mask
    x = ((x ^ (x >> 30)) * _MIX1) & mask
    x = ((x ^ (x >> 27)) * _MIX2) & mask
    return x ^ (x >> 31)


def uniforms(seed: int, epoch: int, keys: torch.Tensor, slots: int = _SLOTS) -> torch.Tensor:
    """len(keys) × slots float32 uniforms in [0, 1), a pure function of (seed, epoch, key, slot),
    on keys' device. The top 24 bits of the hash make each float exactly (no float64 needed)."""
    base = _signed(_splitmix64_int(_splitmix64_int(seed) ^ (epoch & ((1 << 64) - 1))))
    per_key = splitmix64(keys.to(torch.int64) ^ base)
    counters = torch.arange(slots, dtype=torch.int64, device=keys.device) * _signed(_GOLDEN)
    bits = _shift_right(splitmix64(per_key[:, None] + counters[None, :]), 40)
    return bits.to(torch.float32) * (1.0 / (1 << 24))


def check_uint8_batch(images: torch.Tensor) -> None:
    if not isinstance(images, torch.Tensor) or images.dtype != torch.uint8 or images.dim() != 4:
        raise TypeError("images must be a uint8 tensor of shape N×H×W×C")


def _number(value, name: str) -> float:
    """`value` as a finite float. NaN or infinity would reach every output pixel, so they are
    refused here by the argument's name; so are bools and strings, which float() would take."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a number, not {value!r}")
    try:
        value = float(value)
    except OverflowError:
        raise ValueError(
            f"{name} must be a finite number, not an integer of {int(value).bit_length()} bits"
        ) from None
    if not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, not {value}")
    return value


def check_epoch(epoch) -> int:
    """`epoch` as a plain int: a NumPy integer would overflow in the hash's 64-bit masking."""
    if not is_int(epoch) or epoch < 0:
        raise ValueError(f"epoch must be a non-negative int, not {epoch!r}")
    return int(epoch)


def _pair(value, name: str) -> Tuple[float, float]:
    try:
        low, high = value
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a (low, high) range, not {value!r}") from None
    low, high = _number(low, name), _number(high, name)
    if low > high:
        raise ValueError(f"{name} must be a (low, high) range with low <= high, not {tuple(value)!r}")
    return low, high


def _probability(value: float, name: str) -> float:
    value = _number(value, name)
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must be a probability between 0 and 1, not {value}")
    return value


def _strength(value: float, name: str, upper: float) -> float:
    value = _number(value, name)
    if not 0.0 <= value <= upper:
        raise ValueError(f"{name} must be between 0 and {upper:g}, not {value}")
    return value


def _size(size) -> Optional[Tuple[int, int]]:
    """Augment's `size` as (height, width), or None."""
    if size is None:
        return None
    if is_int(size):
        pair = (size, size)
    else:
        try:
            pair = tuple(size)
        except TypeError:
            pair = ()
    if len(pair) != 2 or not all(is_int(s) and 1 <= s <= MAX_SIDE for s in pair):
        raise ValueError(f"size must be a positive int or (height, width), at most {MAX_SIDE}, not {size!r}")
    return int(pair[0]), int(pair[1])


def check_normalisation(scale: torch.Tensor, shift: torch.Tensor) -> None:
    """Refuses a per-channel `scale` and `shift` (on the CPU) under which some pixel value
    0-255 would not normalise to a finite number in their dtype, saying where they come from,
    before that becomes inf or NaN pixels or the kernel's last check (which names internal
    values). Tensors on an accelerator are not read: that would wait for its queue; to_device
    checks the mean and std they are made from."""
    if scale.device.type != "cpu" or shift.device.type != "cpu":
        return
    widest = 255 * scale.abs() + shift.abs()  # the largest |x * scale - shift| for x in 0-255
    if not bool(torch.isfinite(widest).all()):
        raise ValueError(
            f"the normalised pixels x * scale - shift (x in 0-255) are not finite in {scale.dtype} with "
            f"scale {scale.flatten().tolist()} and shift {shift.flatten().tolist()}: to_device makes them "
            "1 / (255 std) and mean / std, so give a std further from 0, a mean nearer 0, or a wider dtype"
        )


class Augment:
    """Per-sample random augmentation of uint8 N×H×W×C batches; `Augment()` does nothing.

    - `size`: output (height, width) or side; None keeps the input's size.
    - `scale`, `ratio`: random resized crop of a share `scale` of the area with aspect ratio
      (w/h) drawn log-uniformly in `ratio`, as torchvision's RandomResizedCrop (10 tries, then
      a centre crop); corners are not rounded to whole pixels. `scale=None`: no crop (the whole
      image, resized to `size` if given).
    - `hflip`, `vflip`: probabilities of a horizontal / vertical flip.
    - `degrees`: rotation drawn in [-degrees, degrees] (counter-clockwise, about the centre);
      `translate`: shift drawn in [-translate, translate] × the output's width and height.
      Pixels from outside the image repeat its border.
    - `brightness`, `contrast`, `saturation`: factors drawn in [1 - x, 1 + x] and floored at
      0, as torchvision's ColorJitter (applied in that order, each clamped to the valid range);
      brightness and contrast at most MAX_JITTER (100), saturation at most 1.
    - `seed`: with the epoch and the record index, what decides every draw.
    - `spec`: the text `from_spec` made it from (None otherwise), which a training checkpoint
      records; it changes no draw.

    Resampling is bilinear without antialiasing, so a crop shrunk more than 2x aliases where
    torchvision's antialiased resize would blur.
    """

    def __init__(
        self,
        size: Union[None, int, Sequence[int]] = None,
        scale: Optional[Sequence[float]] = None,
        ratio: Sequence[float] = (3 / 4, 4 / 3),
        hflip: float = 0.0,
        vflip: float = 0.0,
        degrees: float = 0.0,
        translate: float = 0.0,
        brightness: float = 0.0,
        contrast: float = 0.0,
        saturation: float = 0.0,
        seed: int = 0,
        spec: Optional[str] = None,
    ):
        self.size = _size(size)
        self.scale = None if scale is None else _pair(scale, "scale")
        if self.scale is not None and not 0.0 < self.scale[0] <= self.scale[1] <= 1.0:
            raise ValueError(f"scale must lie in (0, 1], not {self.scale!r}")
        self.ratio = _pair(ratio, "ratio")
        if self.ratio[0] <= 0.0:
            raise ValueError(f"ratio must be positive, not {self.ratio!r}")
        self.hflip = _probability(hflip, "hflip")
        self.vflip = _probability(vflip, "vflip")
        self.degrees = _strength(degrees, "degrees", 180.0)
        self.translate = _strength(translate, "translate", 1.0)
        self.brightness = _strength(brightness, "brightness", MAX_JITTER)
        self.contrast = _strength(contrast, "contrast", MAX_JITTER)
        self.saturation = _strength(saturation, "saturation", 1.0)
        if not is_int(seed) or seed < 0:
            raise ValueError(f"seed must be a non-negative int, not {seed!r}")
        self.seed = int(seed)
        if spec is not None and not isinstance(spec, str):
            raise TypeError(f"spec must be a str or None, not {type(spec).__name__}")
        self.spec = spec

    @classmethod
    def from_spec(cls, spec: str, size: Union[None, int, Sequence[int]] = None, seed: int = 0) -> Augment:
        """An Augment from a comma-separated list, for command lines: `crop` (scale 0.08-1),
        `flip` (horizontal, p 0.5), `vflip` (p 0.5), `jitter` (brightness, contrast and
        saturation 0.4), `rotate` (10 degrees), `translate` (0.1); `rotate=DEG`,
        `translate=F`, `crop=MIN_SCALE` set the amount. "" or "none" is no augmentation."""
        options: Dict[str, object] = {}
        for term in (t.strip() for t in spec.split(",")):
            if term in ("", "none"):
                continue
            name, _, amount = term.partition("=")
            if name not in SPEC_TERMS:
                raise ValueError(f"unknown augmentation {name!r} in {spec!r}; known: {', '.join(SPEC_TERMS)}")
            try:
                value = float(amount) if amount else None
            except ValueError:
                raise ValueError(f"augmentation {term!r}: {amount!r} is not a number") from None
            if name == "crop":
                options["scale"] = (0.08 if value is None else value, 1.0)
            elif name == "flip":
                options["hflip"] = 0.5 if value is None else value
            elif name == "vflip":
                options["vflip"] = 0.5 if value is None else value
            elif name == "jitter":
                options.update(
                    dict.fromkeys(("brightness", "contrast", "saturation"), 0.4 if value is None else value)
                )
            elif name == "rotate":
                options["degrees"] = 10.0 if value is None else value
            else:
                options["translate"] = 0.1 if value is None else value
        return cls(size=size, seed=seed, spec=spec, **options)

    def with_size_and_seed(self, size: Union[None, int, Sequence[int]], seed: int) -> Augment:
        """A copy of this augmentation with another output ``size`` and ``seed``: a training run
        binds the one it was given to its image size and data seed without parsing it again."""
        return type(self)(**{**vars(self), "size": size, "seed": seed})

    def __repr__(self) -> str:
        default = Augment.__new__(Augment)
        Augment.__init__(default)
        changed = [f"{k}={v!r}" for k, v in vars(self).items() if k != "spec" and vars(default)[k] != v]
        return f"Augment({', '.join(changed)})"

    @property
    def geometric(self) -> bool:
        return (
            self.scale is not None
            or self.size is not None
            or bool(self.hflip or self.vflip or self.degrees or self.translate)
        )

    @property
    def active(self) -> bool:
        """False for an Augment that changes nothing (then to_device's plain path runs)."""
        return self.geometric or bool(self.brightness or self.contrast or self.saturation)

    def output_size(self, height: int, width: int) -> Tuple[int, int]:
        return self.size if self.size is not None else (height, width)

    def params(self, keys: torch.Tensor, epoch: int, height: int, width: int) -> Dict[str, torch.Tensor]:
        """Each sample's draws, on keys' device: crop box (top, left, height, width in input
        pixels), flips (bool), angle (degrees), shift (output pixels, x and y) and the three
        colour factors. Public so tests and users can see exactly what was drawn."""
        u = uniforms(self.seed, epoch, keys)
        n = len(keys)
        out_h, out_w = self.output_size(height, width)
        if self.scale is None:
            box_h = torch.full((n,), float(height), device=u.device)
            box_w = torch.full((n,), float(width), device=u.device)
        else:
            box_h, box_w = self._crop_sizes(u, height, width)
        params = {
            "box_h": box_h,
            "box_w": box_w,
            "top": u[:, _TOP] * (height - box_h),
            "left": u[:, _LEFT] * (width - box_w),
            "hflip": u[:, _HFLIP] < self.hflip,
            "vflip": u[:, _VFLIP] < self.vflip,
            "angle": (2 * u[:, _ANGLE] - 1) * self.degrees,
            "shift_x": (2 * u[:, _SHIFT_X] - 1) * self.translate * out_w,
            "shift_y": (2 * u[:, _SHIFT_Y] - 1) * self.translate * out_h,
        }
        for name, slot in (("brightness", _BRIGHTNESS), ("contrast", _CONTRAST), ("saturation", _SATURATION)):
            strength = getattr(self, name)
            params[name] = (1 + (2 * u[:, slot] - 1) * strength).clamp_(min=0.0)  # no negative gain
        return params

    def _crop_sizes(self, u: torch.Tensor, height: int, width: int) -> Tuple[torch.Tensor, torch.Tensor]:
        """RandomResizedCrop's box sizes, all 10 tries at once: the first that fits, else the
        centre crop torchvision falls back to."""
        area = float(height * width)
        log_lo, log_hi = math.log(self.ratio[0]), math.log(self.ratio[1])
        target = area * (
            self.scale[0] + (self.scale[1] - self.scale[0]) * u[:, _SCALE : _SCALE + _CROP_ATTEMPTS]
        )
        aspect = torch.exp(log_lo + (log_hi - log_lo) * u[:, _RATIO : _RATIO + _CROP_ATTEMPTS])
        tries_w, tries_h = torch.sqrt(target * aspect), torch.sqrt(target / aspect)
        fits = (tries_w <= width) & (tries_h <= height)
        first = torch.argmax(fits.to(torch.int8), dim=1, keepdim=True)  # 0 where none fits
        any_fits = fits.any(dim=1)
        in_ratio = width / height
        if in_ratio < self.ratio[0]:
            fallback = (width / self.ratio[0], float(width))
        elif in_ratio > self.ratio[1]:
            fallback = (float(height), height * self.ratio[1])
        else:
            fallback = (float(height), float(width))
        box_h = torch.where(any_fits, tries_h.gather(1, first)[:, 0], fallback[0])
        box_w = torch.where(any_fits, tries_w.gather(1, first)[:, 0], fallback[1])
        return box_h, box_w

    def _theta(
        self, p: Dict[str, torch.Tensor], height: int, width: int, out_h: int, out_w: int
    ) -> torch.Tensor:
        """N×2×3 affine_grid matrices: output coordinates (normalised, align_corners=False) to
        input ones, composing rotation/translation, flips and the crop box."""
        angle = torch.deg2rad(p["angle"])
        cos, sin = torch.cos(angle), torch.sin(angle)
        flip_x = 1 - 2 * p["hflip"].to(cos.dtype)
        flip_y = 1 - 2 * p["vflip"].to(cos.dtype)
        # In pixels about the output centre: q -> R^-1 (q - shift) -> flips -> box scale.
        scale_x, scale_y = flip_x * p["box_w"] / out_w, flip_y * p["box_h"] / out_h
        # R^-1 of a counter-clockwise rotation on screen (y down) is [[cos, -sin], [sin, cos]].
        a = torch.stack(
            [
                torch.stack([scale_x * cos, -scale_x * sin], dim=1),
                torch.stack([scale_y * sin, scale_y * cos], dim=1),
            ],
            dim=1,
        )  # N×2×2, output pixels -> input pixels
        shift = torch.stack([p["shift_x"], p["shift_y"]], dim=1)
        centre = torch.stack([p["left"] + p["box_w"] / 2, p["top"] + p["box_h"] / 2], dim=1)
        offset = centre - torch.bmm(a, shift[:, :, None])[:, :, 0]
        # To normalised coordinates with Python numbers: a small tensor made from a list on a
        # GPU would be a synchronous copy, the host waiting for every batch.
        to_norm_in, from_norm_out = (2.0 / width, 2.0 / height), (out_w / 2.0, out_h / 2.0)
        rows = [a[:, i] * to_norm_in[i] for i in range(2)]
        linear = torch.stack(
            [torch.stack([row[:, j] * from_norm_out[j] for j in range(2)], dim=1) for row in rows], dim=1
        )
        translation = torch.stack([offset[:, i] * to_norm_in[i] - 1 for i in range(2)], dim=1)
        return torch.cat([linear, translation[:, :, None]], dim=2)

    def apply(
        self,
        images: torch.Tensor,
        keys,
        epoch: int,
        dtype: torch.dtype = torch.float32,
        scale: Optional[torch.Tensor] = None,
        shift: Optional[torch.Tensor] = None,
        channels_last: bool = True,
    ) -> torch.Tensor:
        """Augments uint8 N×H×W×C `images` where they are and returns N×C×H×W `dtype`,
        `x * scale - shift` of the augmented 0–255 values (`scale`, `shift`: per-channel
        1×C×1×1 tensors on the images' device, as to_device passes them; default x / 255)."""
        n, height, width, channels = images.shape
        keys = torch.as_tensor(keys).to(images.device, non_blocking=True).reshape(-1)
        if len(keys) != n:
            raise ValueError(f"keys must give one record index per image: {len(keys)} keys for {n} images")
        if keys.dtype.is_floating_point or keys.dtype == torch.bool:
            raise TypeError(f"keys must be integer record indices, not {keys.dtype}")
        epoch = check_epoch(epoch)
        if (self.contrast or self.saturation) and channels != 3:
            raise ValueError(f"contrast and saturation jitter need RGB images, not {channels} channels")
        if scale is None:
            scale = torch.full((1, 1, 1, 1), 1.0 / 255.0, dtype=dtype, device=images.device)
        if shift is None:
            shift = torch.zeros((1, 1, 1, 1), dtype=dtype, device=images.device)
        check_normalisation(scale, shift)
        out_h, out_w = self.output_size(height, width)
        native = kernel_runs(images, dtype)
        if native and channels_last and n > 0:
            out = recycled_batch(n, out_h, out_w, channels)
        else:
            layout = torch.channels_last if channels_last else torch.contiguous_format
            out = torch.empty(
                (n, channels, out_h, out_w), dtype=dtype, device=images.device, memory_format=layout
            )
        if n == 0:
            return out
        p = self.params(keys, epoch, height, width)
        theta = self._theta(p, height, width, out_h, out_w).to(dtype) if self.geometric else None
        if native:
            self._apply_native(images, p, theta, scale, shift, out)
        else:
            self._apply_torch(images, p, theta, scale, shift, out)
        return out

    def _apply_native(self, images, p, theta, scale, shift, out: torch.Tensor) -> None:
        """The CPU float32 path: `_core.augment`, which samples straight from the uint8 pixels
        and jitters and normalises each pixel as it is written, on the Rust thread pool."""
        colour = torch.stack([p["brightness"], p["contrast"], p["saturation"]], dim=1)
        run_kernel(images, theta, colour, scale, shift, out)

    def _apply_torch(self, images, p, theta, scale, shift, out: torch.Tensor) -> None:
        """Every other device and dtype (CUDA runs this): one grid_sample over the float batch,
        then the jitter; on the CPU in groups of samples whose floats stay in the cache."""
        n, height, width, channels = images.shape
        out_h, out_w = out.shape[2:]
        dtype = out.dtype
        step = (
            n
            if images.device.type != "cpu"
            else max(
                1, _CPU_WORKING_SET // (height * width + out_h * out_w) // channels // out.element_size()
            )
        )
        for start in range(0, n, step):
            part = slice(start, start + step)
            x = images[part].permute(0, 3, 1, 2).to(dtype)
            if theta is not None:
                grid = affine_grid(theta[part], out_h, out_w)
                x = F.grid_sample(x, grid, mode="bilinear", padding_mode="border", align_corners=False)
            gain = self._jitter(x, {name: value[part] for name, value in p.items()})
            torch.addcmul(-shift, x, scale if gain is None else scale * gain, out=out[part])

    def _jitter(self, x: torch.Tensor, p: Dict[str, torch.Tensor]) -> Optional[torch.Tensor]:
        """Brightness, contrast, saturation in place on 0–255 floats, one factor per sample, in
        as few passes as the clamps allow: brightness b becomes clamp(x, max=255/b) and a gain b
        folded into the next multiplication, which this returns when nothing followed it."""
        gain = None
        if self.brightness:
            gain = p["brightness"].to(x.dtype).view(-1, 1, 1, 1)
            x.clamp_(max=255.0 / gain)  # x >= 0 already: bilinear mixes of 0-255 values
        if self.contrast:
            factor = p["contrast"].to(x.dtype).view(-1, 1, 1, 1)
            mean = _gray(x).mean(dim=(2, 3), keepdim=True)
            coefficient, offset = factor, (1 - factor) * mean
            if gain is not None:
                coefficient, offset, gain = coefficient * gain, offset * gain, None
            torch.addcmul(offset, x, coefficient, out=x).clamp_(0.0, 255.0)
        if self.saturation:
            factor = p["saturation"].to(x.dtype).view(-1, 1, 1, 1)
            coefficient, weight = factor, 1 - factor
            if gain is not None:
                coefficient, weight, gain = coefficient * gain, weight * gain, None
            torch.addcmul(_gray(x).mul_(weight), x, coefficient, out=x).clamp_(0.0, 255.0)
        return gain

    def __call__(
        self, images: torch.Tensor, keys, epoch: int, dtype: torch.dtype = torch.float32
    ) -> torch.Tensor:
        """Augmented N×C×H×W `dtype` in [0, 1] from uint8 N×H×W×C images (on any device);
        to_device(..., augment=) does the same and normalises."""
        check_uint8_batch(images)
        return self.apply(images, keys, epoch, dtype)


def kernel_runs(images: torch.Tensor, dtype: torch.dtype) -> bool:
    """Whether `_core.augment` handles this batch: float32 out of CPU images of 1 or 3 channels."""
    return images.device.type == "cpu" and dtype == torch.float32 and images.shape[3] in (1, 3)


def recycled_batch(n: int, height: int, width: int, channels: int) -> torch.Tensor:
    """An uninitialised N×C×H×W channels_last float32 CPU tensor in memory that returns to
    fastload's pool when it and every view of it are gone, so the next batch reuses its pages
    instead of faulting in fresh ones (which cost as much CPU as the augmentation)."""
    return torch.from_numpy(_core.recycled_float32((n, height, width, channels))).permute(0, 3, 1, 2)


def run_kernel(images, theta, colour, scale, shift, out: torch.Tensor) -> None:
    """`_core.augment` of uint8 N×H×W×C `images` into N×C×H'×W' float32 `out` (theta N×2×3 or
    None, colour N×3 factors, scale and shift 1×C×1×1), the GIL released while it runs."""
    channels = images.shape[3]
    per_channel = [v.reshape(-1).expand(channels).contiguous().numpy() for v in (scale, shift)]
    nhwc = out.permute(0, 2, 3, 1)
    target = nhwc if nhwc.is_contiguous() else torch.empty_like(nhwc, memory_format=torch.contiguous_format)
    _core.augment(
        images.contiguous().numpy(),
        None if theta is None else theta.contiguous().numpy(),
        colour.contiguous().numpy(),
        *per_channel,
        target.numpy(),
    )
    if target is not nhwc:
        nhwc.copy_(target)


def convert(images: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """to_device's CPU float32 conversion, `x * scale - shift`, by the kernel without
    resampling or jitter: one parallel pass into recycled memory instead of three torch passes
    over fresh memory, with the same float32 operations, so the same bits."""
    check_normalisation(scale, shift)
    n, height, width, channels = images.shape
    out = recycled_batch(n, height, width, channels)
    run_kernel(images, None, torch.ones((n, 3)), scale, shift, out)
    return out


def _gray(x: torch.Tensor) -> torch.Tensor:
    """N×1×H×W luma of N×3×H×W images."""
    return torch.mul(x[:, 0:1], _GRAY[0]).add_(x[:, 1:2], alpha=_GRAY[1]).add_(x[:, 2:3], alpha=_GRAY[2])


def affine_grid(theta: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """F.affine_grid(theta, (N, C, height, width), align_corners=False), built by broadcasting:
    on the CPU affine_grid is a batched matmul with an inner size of 3, four times slower."""
    n = theta.shape[0]
    xs = (torch.arange(width, dtype=theta.dtype, device=theta.device) * 2 + 1) / width - 1
    ys = (torch.arange(height, dtype=theta.dtype, device=theta.device) * 2 + 1) / height - 1
    grid = torch.empty((n, height, width, 2), dtype=theta.dtype, device=theta.device)
    for axis in range(2):  # the output's x, then y
        row = theta[:, axis].view(n, 3, 1, 1)
        torch.add(
            row[:, 2] + row[:, 1] * ys.view(1, height, 1),
            row[:, 0] * xs.view(1, 1, width),
            out=grid[..., axis],
        )
    return grid
