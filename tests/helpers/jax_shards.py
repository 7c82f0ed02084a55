"""JAX's own shards, as the oracle for ordered splits: run as a script in a process of its own
(JAX must see 4 host devices before it starts), it writes, for every case asked, the piece
``jax.device_put`` gives the device at each mesh position."""

from __future__ import annotations

import json
import os
import sys


def main(cases_path: str, out_path: str) -> None:
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
    os.environ["JAX_PLATFORMS"] = "cpu"
    import jax

    jax.config.update("jax_enable_x64", True)
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    cases = json.load(open(cases_path))
    out: dict[str, np.ndarray] = {}
    for k, (mesh_shape, shape, entries) in enumerate(cases):
        devices = np.array(jax.devices()[:4]).reshape(mesh_shape)
        mesh = Mesh(devices, ("a", "b"))
        full = np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape)
        spec = PartitionSpec(*[tuple(e) if isinstance(e, list) else e for e in entries])
        placed = jax.device_put(full, NamedSharding(mesh, spec))
        for shard in placed.addressable_shards:
            position = tuple(int(i) for i in np.argwhere(devices == shard.device)[0])
            rank = int(np.ravel_multi_index(position, mesh_shape))
            out[f"{k}/{rank}"] = np.asarray(shard.data)
    np.savez(out_path, **out)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
