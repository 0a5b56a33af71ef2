"""The device a run measures: MIG profiles, NVML, the Target (choosing, pinning, verifying), health, emulation, MPS."""
