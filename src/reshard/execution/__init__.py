"""Execution: one collective call from its arguments to the engine. The call's input, the
cross-rank agreement and replays (``call``, ``agreement``, ``replay_cache``, ``hot_replay``),
the executor that runs a plan's steps as one program (``execute``) through the step forms
(``step_bodies``, ``pieces``, ``buffers``, ``arrays``), the stats it records (``stats``), the
backward (``autograd``), started calls (``handles``) and what each rank is doing (``activity``)."""
