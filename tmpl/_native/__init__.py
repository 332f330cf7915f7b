"""Compiled core, built from ``_native/*.pyx`` by ``setup.py`` (absent in a pure install)."""
