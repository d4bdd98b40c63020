"""Device and precision as configuration: the ``device`` and ``dtype`` fields, declared once here.

Every trainer's config takes them (:class:`posttrain.trainers.trainer_config.TrainerConfig` declares them with
:func:`device_field`), and so do the commands that run trainers for the user: the pipeline's top-level ``device`` and
``dtype`` (every training stage's) and ``posttrain lab``'s :class:`DeviceConfig` (every trainer a lab runs), so the
flags, their help and their checks are the same everywhere. What the values do is ``trainers/engine/device.py``.

This module imports no torch when it is imported (``posttrain lab --list`` builds its flags without it); resolving a
device (:func:`resolve_device`, also the ``device`` field's check) does.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from posttrain.errors import ConfigError, UserError
from posttrain.knobs import check_fields, knob

if TYPE_CHECKING:
    import torch

DTYPE_NAMES = ("fp32", "bf16", "fp16")
DEVICE_HELP = "where the model trains: auto (CUDA when present, else the CPU) | cpu | cuda | cuda:N"
_DEVICE = re.compile(r"^(auto|cpu|cuda|cuda:\d+)$")


def check_device_spec(spec: str) -> None:
    """A ConfigError unless ``spec`` is auto, cpu, cuda or cuda:N (availability is checked by :func:`resolve_device`)."""
    if not isinstance(spec, str) or not _DEVICE.match(spec):
        raise ConfigError(f"device={spec!r} is not valid; choose auto, cpu, cuda or cuda:N")


def resolve_device(spec: str = "auto", local_rank: int | None = None) -> torch.device:
    """``auto`` -> CUDA when present (under torchrun, this rank's ``cuda:LOCAL_RANK``), else the CPU; ``cuda`` /
    ``cuda:N`` without such a device is a one-line :class:`UserError`. Example: on a CPU-only machine
    ``resolve_device("cuda")`` -> "--device cuda: no CUDA device is available (...); use --device cpu or auto"."""
    import torch

    check_device_spec(spec)
    if spec == "cpu" or (spec == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        why = "this torch is built without CUDA" if torch.version.cuda is None else "no GPU is visible"
        raise UserError(f"--device {spec}: no CUDA device is available ({why}); use --device cpu or auto")
    n = torch.cuda.device_count()
    index = int(spec.split(":")[1]) if ":" in spec else (local_rank or 0)
    if index >= n:
        raise UserError(f"--device {spec}: this machine has {n} CUDA device{'s' if n != 1 else ''} (cuda:0..{n - 1})")
    return torch.device("cuda", index)


def check_device(name: str, spec: str) -> None:
    """The ``device`` field's check, when a config is built: :func:`resolve_device` must succeed here, so
    ``--device cuda`` on a machine without CUDA is a one-line error before anything is written."""
    resolve_device(spec)


@dataclass
class DeviceConfig:
    """Where trainers run and in which precision. ``posttrain lab --device cuda --dtype bf16`` builds one and every
    trainer a lab runs gets its values (:meth:`apply`)."""

    device: str = knob("auto", DEVICE_HELP, check=check_device)  # a device this machine has: else exit 2, no output
    dtype: str = knob(
        "fp32",
        "compute precision: fp32 | bf16 | fp16 (weights and optimizer state stay fp32; bf16/fp16 compute under "
        "autocast, fp16 with a dynamic loss scale; with --fsdp the weights are also all-gathered in bf16/fp16 and the "
        "gradients reduced in fp32; checkpoints are written in fp32)",
        choices=DTYPE_NAMES,
    )

    def __post_init__(self):
        check_fields(self)

    def apply(self, cfg):
        """``cfg`` (a trainer config) with this device and dtype."""
        return dataclasses.replace(cfg, device=self.device, dtype=self.dtype)


def device_field(name: str, scope: str = "") -> Any:
    """:class:`DeviceConfig`'s field ``name`` declared in another config, with its default, checks and help (prefixed
    by ``scope``): ``device: str = device_field("device", "every training stage")``."""
    f = {f.name: f for f in dataclasses.fields(DeviceConfig)}[name]
    meta = dict(f.metadata)
    if scope:
        meta["help"] = f"{scope}: {meta['help']}"
    return dataclasses.field(default=f.default, metadata=meta)
