"""Data sets and how they are split across workers."""
