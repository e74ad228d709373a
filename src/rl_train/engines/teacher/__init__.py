"""The teacher of on-policy distillation (R-4.10): a model in its own pool that scores every
response token of the student's trajectories (``scoring``), under the run's ``teacher`` section
(``config``), with the student's own tokenizer (``same_tokenizer``)."""
