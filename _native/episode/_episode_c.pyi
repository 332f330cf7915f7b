# The compiled twin has the same public names and signatures as the pure one.
from ._episode_py import SequenceBuffer as SequenceBuffer
from ._episode_py import best_match as best_match
