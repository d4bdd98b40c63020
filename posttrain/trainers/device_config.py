"""Device and precision as configuration: the ``device`` and ``dtype`` fields, declared once here.

Every trainer's config takes them (:class:`posttrain.trainers.trainer_config.TrainerConfig` declares them with
:func:`device_field`), and so do the commands that run trainers for the user: the pipeline's top-level ``device`` and
``dtype`` (every training stage's) and ``posttrain lab``'s :class:`DeviceConfig` (every trainer a lab runs), so the
flags, their help and their checks are the same everywhere. What the values do is ``trainers/engine/device.py``.

This module imports no torch (``posttrain lab --list`` builds its flags without it); checking a device does.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from posttrain.knobs import check_fields, knob

DTYPE_NAMES = ("fp32", "bf16", "fp16")
DEVICE_HELP = "where the model trains: auto (CUDA when present, else the CPU) | cpu | cuda | cuda:N"


def check_device(name: str, spec: str) -> None:
    """The ``device`` field's check, when a config is built: ``--device cuda`` on a machine without CUDA is a
    one-line error before anything is written (``engine.device.resolve_device``)."""
    from posttrain.trainers.engine.device import resolve_device

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
