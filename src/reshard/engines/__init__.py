"""Engine adapters: the few primitives the ops need, one small class per engine.

Each adapter offers ``alltoallv`` and ``allgather`` on 1-D uint8 buffers plus ``barrier`` and
``close``; everything else (packing, shapes, checks) lives above, in ``reshard.ops``.
"""
