"""Simulated machines: profiles, a fake `pynvml` and a fake sysfs tree built from one profile.

They ship in the package so anyone can try the agent without GPUs (`--simulate dgx-h100`). Nothing
here touches the real host or writes to disk (the chart's root filesystem is read-only).
"""
