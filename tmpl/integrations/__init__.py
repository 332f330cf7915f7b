"""Trainer integrations: tmpl as the tool-calling rollout of an RL trainer.

- :mod:`tmpl.integrations.trl`: a drop-in ``rollout_func`` for TRL's ``GRPOTrainer``
  (:func:`~tmpl.integrations.trl.make_rollout_func`) and an RLOO trainer that accepts one
  (:class:`~tmpl.integrations.trl.ToolRLOOTrainer`).
- :mod:`tmpl.integrations.renderers`: :class:`~tmpl.integrations.renderers.TmplRenderer`, a
  ``renderers`` Renderer (prime-rl, verifiers) whose ``bridge_to_next_turn`` is tmpl's suffix.

Other trainers (verl, slime, a plain PyTorch loop) use :class:`tmpl.Rollout` directly or
consume exported rollouts (:mod:`tmpl.export`); see ``docs/integrations.md``.

Nothing here imports a trainer library until it is used.
"""
