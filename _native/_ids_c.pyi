# The compiled twin has the same public names and signatures as the pure one.
from ._ids_py import *  # noqa: F403
