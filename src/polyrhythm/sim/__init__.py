"""The simulator: the same strategies on clusters that do not fit on a machine (issue 14).

Its rule holds before its first line does: it drives the pure rules of `strategies`
(consistency policies, cadences) and imports nothing of `comm`, `launch` or
`torch.distributed` (an import-linter contract in pyproject.toml).
"""
