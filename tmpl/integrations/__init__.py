"""Trainer integrations: tmpl as the tool-calling rollout of an RL trainer.

- :mod:`tmpl.integrations.trl`: a drop-in ``rollout_func`` for TRL's ``GRPOTrainer``
  (:func:`~tmpl.integrations.trl.make_rollout_func`) and an RLOO trainer that accepts one
  (:class:`~tmpl.integrations.trl.ToolRLOOTrainer`).

Other trainers (verl, slime, a plain PyTorch loop) use :class:`tmpl.Rollout` directly or
consume exported rollouts (:mod:`tmpl.export`); see ``docs/integrations.md``.

Nothing here imports a trainer library until it is used.
"""
