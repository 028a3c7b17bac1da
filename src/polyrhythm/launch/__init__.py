"""Starting the processes of a job: locally (spawn) or via torchrun (polyrhythm.node)."""
