"""Engines: the few primitives the executor needs, one small class per engine.

Each engine offers ``alltoallv`` and ``allgather`` on 1-D uint8 buffers, the small exchanges
of the check, ``barrier`` and ``close``, and its own forms of an exchange (``base.Engine``);
the plans live above them (``reshard.planning.planner``), and the executor (``reshard.execution.execute``) runs
their steps through these.
"""
