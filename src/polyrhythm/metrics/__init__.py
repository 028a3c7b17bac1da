"""Measuring runs and storing them."""
