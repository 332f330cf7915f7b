# The compiled twin has the same public names and signatures as the pure one.
from ._builder_py import Trajectory as Trajectory
from ._builder_py import collate_arrays as collate_arrays
