"""Pure-Python twins of the compiled core in ``_native/`` (same names, same results)."""
