"""The emulated cluster: hosts as network namespaces on a bridge, links capped by tc, CPU
shares by cgroups (hosts.py, netns.py, cgroups.py), the guard that the emulator was not the
bottleneck (fidelity.py), and the janitor of what a killed run left (janitor.py)."""
