"""The sources: NVML through the fake binding, sysfs trees, PodResources, the simulated machines."""
