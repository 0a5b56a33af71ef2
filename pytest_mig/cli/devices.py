"""``pytest-mig devices``: the GPUs, MIG instances and profiles NVML sees (no GPU: says so)."""

from __future__ import annotations

import argparse
from typing import TextIO

from pytest_mig.cli.common import Command
from pytest_mig.cli.reference import reference_lines
from pytest_mig.device import nvml


def cmd_devices(out: TextIO) -> int:
    """Describe what NVML sees; without a GPU or driver it says so and succeeds."""
    try:
        inv = nvml.discover()
    except Exception as exc:  # no driver, no library, no permission: a machine without a GPU is normal
        print(f"no NVIDIA GPU visible: {exc}", file=out)
        return 0
    lines = list(nvml.describe_inventory(inv))
    for line in lines or ["no NVIDIA GPU visible"]:
        print(line, file=out)
    for line in reference_lines([g.name for g in inv.gpus]):
        print(line, file=out)
    return 0


class Devices(Command):
    name = "devices"
    help = "list GPUs, MIG instances and this GPU's profiles"
    description = "List the GPUs NVML sees, their MIG instances and profiles. Works without a GPU."

    @classmethod
    def run(cls, args: argparse.Namespace, out: TextIO) -> int:
        return cmd_devices(out)
